# pylint: disable=invalid-name
"""Process reward model (PRM) losses on per-step logits (docs/algorithms.md §15.2).

z_{b,k} is the PRM's logit for step k of row b (`heads.StepHead`, read at the step's last
token), p = sigmoid(z) its probability that the step is good.

- Per-step classification (Math-Shepherd, Wang et al. 2024, arXiv 2312.08935; Lightman et al.
  2023, arXiv 2305.20050, on human labels): binary cross-entropy against the step label y in
  [0, 1] (hard labels in {0, 1}, or Math-Shepherd's soft estimate),
    L_{b,k} = -[y log p + (1 - y) log(1 - p)].
- Bradley-Terry between steps: for a pair (c, r) of sibling steps (generated after the same
  prefix, `rewards.process.sibling_pairs`) with y_c > y_r,
    L = -log sigmoid(z_c - z_r - margin)   (`preference.bradley_terry`).
  Siblings after one prefix, as Tree-PLV (He et al. 2024, arXiv 2407.00390) pairs the
  children of a reasoning-tree node [INF on the exact pairing rule].

Both are unreduced ([B, U] and [N pairs]) and masked: an unlabelled step or a padding pair
contributes exactly 0 to the loss and its gradient, even where its logit is NaN or inf.
Reduce with `aggregation.masked_mean` (per-step mean over labelled steps).
"""
import chex
import jax
import jax.numpy as jnp

from agentrl.losses import aggregation
from agentrl.losses import preference


def step_bce(logit_BU: jax.Array, label_BU: jax.Array, mask_BU: jax.Array,
             ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Per-step binary cross-entropy [B, U] (0 where mask is 0) plus diagnostics.

  Args:
    logit_BU: PRM logits (differentiated).
    label_BU: step labels in [0, 1] (data).
    mask_BU: 1 on labelled steps.

  Returns:
    loss_BU and metrics: `step_accuracy` (labelled steps with [p > 0.5] == [y > 0.5]) and
    `step_prob` (mean p), both over labelled steps.
  """
  chex.assert_equal_shape([logit_BU, label_BU, mask_BU])
  valid_BU = mask_BU > 0
  z_BU = jnp.where(valid_BU, logit_BU.astype(jnp.float32), 0.0)
  y_BU = jnp.where(valid_BU, label_BU.astype(jnp.float32), 0.0)
  loss_BU = -(y_BU * jax.nn.log_sigmoid(z_BU) + (1.0 - y_BU) * jax.nn.log_sigmoid(-z_BU))
  loss_BU = jnp.where(valid_BU, loss_BU, 0.0)
  agree_BU = ((z_BU > 0) == (y_BU > 0.5)).astype(jnp.float32)
  metrics = {"step_accuracy": aggregation.masked_mean(agree_BU, mask_BU),
             "step_prob": aggregation.masked_mean(jax.nn.sigmoid(z_BU), mask_BU)}
  return loss_BU, jax.lax.stop_gradient(metrics)


def step_bradley_terry(logit_BU: jax.Array, chosen_N: jax.Array, rejected_N: jax.Array,
                       pair_mask_N: jax.Array, *, margin: float = 0.0,
                       ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Per-pair loss [N] -log sigmoid(z_chosen - z_rejected - margin); 0 on padding pairs.

  Args:
    logit_BU: PRM logits (differentiated).
    chosen_N, rejected_N: int flat indices into [B * U] (`rewards.process.sibling_pairs`,
      padded to a fixed N with `rewards.process.padded_pairs`).
    pair_mask_N: 1 on real pairs.
    margin: Llama 2's margin (`preference.bradley_terry`).

  Returns:
    loss_N and metrics: `pair_accuracy` (real pairs with z_c > z_r) and `pair_margin` (mean
    z_c - z_r over real pairs).
  """
  chex.assert_equal_shape([chosen_N, rejected_N, pair_mask_N])
  valid_N = pair_mask_N > 0
  z_M = logit_BU.astype(jnp.float32).reshape(-1)
  pick = lambda idx_N: jnp.where(valid_N, z_M[jnp.clip(idx_N, 0, z_M.shape[0] - 1)], 0.0)
  chosen_z_N, rejected_z_N = pick(chosen_N), pick(rejected_N)
  loss_N, _ = preference.bradley_terry(chosen_z_N, rejected_z_N, margin=margin)
  diff_N = chosen_z_N - rejected_z_N
  metrics = {"pair_accuracy": aggregation.masked_mean((diff_N > 0).astype(jnp.float32),
                                                      pair_mask_N),
             "pair_margin": aggregation.masked_mean(diff_N, pair_mask_N)}
  return jnp.where(valid_N, loss_N, 0.0), jax.lax.stop_gradient(metrics)
