# pylint: disable=invalid-name
"""InfoPO: counterfactual information reward with an outcome-variance gate (arXiv 2603.00656).

InfoPO ("Info-GRPO" in its code) rewards the action that produced an observation by how much
that observation moves the policy's next action: the teacher-forced log-likelihood of the
next action with the real observation against the same context with the observation replaced
by a placeholder. That intrinsic advantage is added to GRPO's outcome advantage through a gate
that opens when a group's outcomes barely vary. Everything follows the authors' code,
kfq20/InfoPO at commit c26e93c2: `verl/trainer/ppo/intrinsic_reward.py`
(`compute_batched_kl_divergence`, `compute_intrinsic_rewards`) and
`verl/trainer/ppo/core_algos.py` (`compute_info_grpo_advantage`), defaults from
`verl/trainer/config/ppo_trainer.yaml` and `ray_trainer.py`. Math: docs/algorithms.md §5.

What the code calls the KL is its teacher-forced one-sample (k1) estimate on the sampled
next-action tokens, mean_j [log pi(a_j | real obs) - log pi(a_j | placeholder)]: it needs two
per-token log-prob arrays [B, T], never a [B, T, V] one. Build the second with one extra
scoring pass per observation: replace observation t's tokens by the placeholder's
(`fit_placeholder`, same length so positions line up), teacher-force the sequence up to the end
of turn t + 1, and keep the log-probs of turn t + 1's tokens; each action is scored in exactly
one counterfactual, so all of them fit in one array `counterfactual_logp_BT`.

Outcome advantage: the launch uses turn credits "Equalized" with trajectory score "Sum", which
reduces to GRPO on the trajectory reward broadcast to every response token
(`agentrl.advantages.estimators.grpo`: unbiased std, eps 1e-6, a size-1 group has mean 0 and std 1).
"""
from collections.abc import Sequence

import jax
import jax.numpy as jnp

from agentrl.advantages import estimators
from agentrl.credit import pooling

PLACEHOLDER = "No information found."


def fit_placeholder(placeholder_ids: Sequence[int], length: int) -> list[int]:
  """The placeholder's token ids at an observation's length (host side, as the official code).

  Truncated when longer, padded by repeating its last token when shorter.
  """
  ids = list(placeholder_ids)
  if not ids or length < 0:
    raise ValueError(f"fit_placeholder needs a non-empty placeholder and a length >= 0; got "
                     f"{len(ids)} ids and length {length}.")
  return (ids + ids[-1:] * length)[:length]


def _turn_sums(x_BT: jax.Array, turn_BT: jax.Array, loss_mask_BT: jax.Array,
               U: int) -> tuple[jax.Array, jax.Array]:
  """Per-turn sums of x and counts over policy tokens, [B, U] each."""
  # A [B, T, U] one-hot is cheap next to the model's activations: U is a few to tens of turns.
  in_turn_BTU = (turn_BT[..., None] == jnp.arange(U)[None, None, :]) & (loss_mask_BT[..., None] > 0)
  in_turn_BTU = in_turn_BTU.astype(jnp.float32)
  sum_BU = jnp.einsum("bt,btu->bu", jnp.where(loss_mask_BT > 0, x_BT, 0.0), in_turn_BTU)
  return sum_BU, in_turn_BTU.sum(axis=1)


def turn_information(logp_BT: jax.Array, counterfactual_logp_BT: jax.Array, turn_BT: jax.Array,
                     loss_mask_BT: jax.Array, feedback_BU: jax.Array) -> jax.Array:
  """InfoPO's intrinsic reward per turn [B, U]: the policy shift observation t causes.

    I_t = mean over the policy tokens j of turn t + 1 of
          (logp_BT[j] - counterfactual_logp_BT[j]),

  credited to turn t, the action that produced the observation (the code rewards getting
  information, not using it). I_t = 0 where turn t got no observation (`feedback_BU` 0, e.g.
  an empty or absent tool result), where turn t or turn t + 1 has no policy token, and on the
  last turn. `turn_BT` is `types.Batch.turn_BT`; masked tokens are never read.

  [INF] A turn's tokens are its policy tokens (`loss_mask_BT` 1); the code uses the span the
  rollout recorded for the assistant message, which can add chat-template tokens. Pass another
  mask to change it.
  """
  if not (logp_BT.shape == counterfactual_logp_BT.shape == turn_BT.shape == loss_mask_BT.shape
          and logp_BT.ndim == 2 and feedback_BU.ndim == 2
          and feedback_BU.shape[0] == logp_BT.shape[0]):
    raise ValueError(f"infopo.turn_information expects four [B, T] arrays and a [B, U] "
                     f"feedback mask; got {logp_BT.shape}, {counterfactual_logp_BT.shape}, "
                     f"{turn_BT.shape}, {loss_mask_BT.shape} and {feedback_BU.shape}.")
  U = feedback_BU.shape[1]
  shift_BT = logp_BT.astype(jnp.float32) - counterfactual_logp_BT.astype(jnp.float32)
  sum_BU, count_BU = _turn_sums(shift_BT, turn_BT, loss_mask_BT, U)
  mean_BU = sum_BU / jnp.maximum(count_BU, 1.0)
  next_mean_BU = jnp.concatenate([mean_BU[:, 1:], jnp.zeros_like(mean_BU[:, :1])], axis=1)
  next_count_BU = jnp.concatenate([count_BU[:, 1:], jnp.zeros_like(count_BU[:, :1])], axis=1)
  live_BU = (feedback_BU > 0) & (count_BU > 0) & (next_count_BU > 0)
  return jnp.where(live_BU, next_mean_BU, 0.0)


def token_information(info_BU: jax.Array, turn_BT: jax.Array,
                      loss_mask_BT: jax.Array) -> jax.Array:
  """I_t / (number of turn t's policy tokens) on each of those tokens, [B, T] (the code's
  per-token layout: a turn's tokens sum to I_t, so longer actions earn no more)."""
  _, count_BU = _turn_sums(jnp.zeros(loss_mask_BT.shape), turn_BT, loss_mask_BT,
                           info_BU.shape[1])
  per_token_BU = info_BU.astype(jnp.float32) / jnp.maximum(count_BU, 1.0)
  return estimators.broadcast_turn_to_tokens(per_token_BU, turn_BT, loss_mask_BT)


def _group_token_zscore(x_BT: jax.Array, loss_mask_BT: jax.Array, group_size: int, *,
                        norm_by_std: bool, eps: float) -> jax.Array:
  """The code's intrinsic normalisation: the non-zero policy-token values of a group's G rows
  are pooled (mean, unbiased std; a single value has std 1) and z-scored; zeros stay 0."""
  B, T = x_BT.shape
  shape_PN = (B // group_size, group_size * T)
  x_PN = x_BT.reshape(shape_PN)
  select_PN = (x_PN != 0) & (loss_mask_BT.reshape(shape_PN) > 0)
  centred_PN, count_P1, sumsq_P1 = pooling.centre(x_PN, select_PN)
  if norm_by_std:
    std_P1 = jnp.sqrt(sumsq_P1 / jnp.maximum(count_P1 - 1.0, 1.0))
    centred_PN = centred_PN / (jnp.where(count_P1 <= 1, 1.0, std_P1) + eps)
  return centred_PN.reshape(B, T)


def _masked_std(x_BT: jax.Array, mask_BT: jax.Array) -> jax.Array:
  """Unbiased std over the masked entries of the whole batch (torch's .std()); 0 for <= 1."""
  valid_BT = mask_BT > 0
  n = valid_BT.sum().astype(jnp.float32)
  mean = jnp.where(valid_BT, x_BT, 0.0).sum() / jnp.maximum(n, 1.0)
  sq = jnp.where(valid_BT, jnp.square(x_BT - mean), 0.0).sum()
  return jnp.sqrt(sq / jnp.maximum(n - 1.0, 1.0))


def token_advantages(outcome_B: jax.Array, info_BU: jax.Array, turn_BT: jax.Array,
                     loss_mask_BT: jax.Array, *, group_size: int,
                     intrinsic_weight: float = 0.1, gate_temperature: float = 0.05,
                     baseline_std: float = 1.0, normalize_intrinsic: bool = True,
                     norm_by_std: bool = True,
                     eps: float = 1e-6) -> tuple[jax.Array, dict[str, jax.Array]]:
  """InfoPO advantages [B, T] and diagnostics: outcome GRPO plus the gated intrinsic term.

    A_out   = grpo(outcome_B) on every policy token
    A_int   = per-group z-score of `token_information(info_BU)` over non-zero policy tokens
    ratio   = min(1, max(std(A_out), baseline_std) / std(A_int))     (batch-wide, + eps each)
    gate_i  = sigmoid(-std_G(outcome) / gate_temperature)            (std 1 for a size-1 group)
    A       = A_out + intrinsic_weight * gate_i * ratio * A_int

  Stds are unbiased (torch's default). `ratio` only ever shrinks the intrinsic term (never
  below the outcome scale, or baseline_std when outcomes are flat); the gate is 0.5 for a
  group with identical outcomes and vanishes as their spread grows. The code's weight decays
  as intrinsic_weight * exp(-intrinsic_decay_rate * epoch) with rate 0 by default: pass the
  decayed value. `normalize_intrinsic=False` is the code's ablation (raw token rewards).

  Because the intrinsic term is there to give signal when outcomes do not, a group of
  identical trajectories gets zero advantage only if its per-token information is uniform too.
  """
  if outcome_B.shape != loss_mask_BT.shape[:1] or info_BU.shape[0] != outcome_B.shape[0]:
    raise ValueError(f"infopo.token_advantages: outcome_B {outcome_B.shape}, info_BU "
                     f"{info_BU.shape} and loss_mask_BT {loss_mask_BT.shape} disagree on B.")
  adv_out_BT = estimators.broadcast_to_tokens(
      estimators.grpo(outcome_B, group_size=group_size, norm_by_std=norm_by_std, eps=eps),
      loss_mask_BT)
  reward_BT = token_information(info_BU, turn_BT, loss_mask_BT)
  adv_int_BT = reward_BT
  if normalize_intrinsic:
    adv_int_BT = _group_token_zscore(reward_BT, loss_mask_BT, group_size,
                                     norm_by_std=norm_by_std, eps=eps)
  outcome_std = _masked_std(adv_out_BT, loss_mask_BT) + eps
  intrinsic_std = _masked_std(adv_int_BT, loss_mask_BT) + eps
  ratio = jnp.minimum(1.0, jnp.maximum(outcome_std, baseline_std) / intrinsic_std)
  outcome_PG = outcome_B.astype(jnp.float32).reshape(-1, group_size)
  if group_size == 1:
    group_std_PG = jnp.ones_like(outcome_PG)
  else:
    spread_PG = outcome_PG - outcome_PG.min(axis=1, keepdims=True)  # exact 0 for equal ones
    group_std_PG = jnp.broadcast_to(jnp.std(spread_PG, axis=1, ddof=1, keepdims=True),
                                    outcome_PG.shape)
  gate_B = jax.nn.sigmoid(-group_std_PG.reshape(-1) / gate_temperature)
  adv_BT = adv_out_BT + intrinsic_weight * gate_B[:, None] * ratio * adv_int_BT
  metrics = {"infopo_gate_mean": gate_B.mean(), "infopo_magnitude_ratio": ratio,
             "infopo_intrinsic_abs_mean": estimators.adv_abs_mean(
                 intrinsic_weight * gate_B[:, None] * ratio * adv_int_BT, loss_mask_BT)}
  return jnp.where(loss_mask_BT > 0, adv_BT, 0.0), metrics
