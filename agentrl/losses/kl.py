# pylint: disable=invalid-name
"""KL estimators against a frozen reference policy, and the KL-in-reward helpers.

Per-token estimators of KL(pi_theta || pi_ref) from tokens sampled by the policy (J. Schulman,
"Approximating KL divergence", 2020, http://joschu.net/blog/kl-approx.html), as in verl's
`kl_penalty` (docs/algorithms.md §4.3). With d = ref_logp - logp:

  k1    -d                    unbiased, high variance, can be negative
  k2    d^2 / 2               biased value; its gradient is the unbiased gradient of the KL
  k3    exp(d) - d - 1        "low_var_kl": unbiased and >= 0; d clamped to ±20, result to ±10
  abs   |d|
  k1+, k3+, abs+              straight-through: the base estimator's value, k2's gradient

k3's gradient is not an unbiased estimate of the KL gradient (verl's note), which is why the
"+" forms exist. The estimators return unreduced [B, T] values that are not masked: the caller
masks and reduces them with `agentrl.losses.aggregation` (GRPO's KL loss: token-mean of k3
times `kl_loss_coef`), or feeds them into `kl_in_reward` (PPO, REINFORCE++).

The adaptive coefficient controller is Ziegler et al. 2019 (arXiv 1909.08593).
"""
import chex
import jax
import jax.numpy as jnp

from agentrl.losses import aggregation

KINDS = ("k1", "k2", "k3", "abs", "k1+", "k3+", "abs+")
# verl's alternative spellings; named in the error message, not accepted (one spelling each).
_VERL_NAMES = {"kl": "k1", "mse": "k2", "low_var_kl": "k3", "low_var_kl+": "k3+"}


def _check_kind(kind: str) -> None:
  if kind in _VERL_NAMES:
    raise ValueError(f"KL estimator {kind!r} is verl's name for {_VERL_NAMES[kind]!r}; "
                     f"pass kind={_VERL_NAMES[kind]!r}.")
  if kind not in KINDS:
    raise ValueError(f"Unknown KL estimator kind={kind!r}; expected one of {KINDS}.")


def _forward(logp_BT: jax.Array, ref_logp_BT: jax.Array, kind: str) -> jax.Array:
  d_BT = ref_logp_BT - logp_BT
  if kind == "k1":
    return -d_BT
  if kind == "k2":
    return 0.5 * jnp.square(d_BT)
  if kind == "abs":
    return jnp.abs(d_BT)
  # k3. The clamps are verl's; inside an active clamp the gradient is 0 by design.
  d_BT = jnp.clip(d_BT, -20.0, 20.0)
  # expm1(d) - d avoids the cancellation in exp(d) - 1 - d for small |d| (docs/algorithms.md §6).
  return jnp.clip(jnp.expm1(d_BT) - d_BT, -10.0, 10.0)


def kl_penalty(logp_BT: jax.Array, ref_logp_BT: jax.Array, kind: str) -> jax.Array:
  """Per-token KL estimate `kind` (one of `KINDS`) of KL(pi || pi_ref); unreduced, unmasked.

  Args:
    logp_BT: log-probs of the sampled tokens under the policy being regularised (the current
      policy for a KL loss; `old_logp` for KL-in-reward).
    ref_logp_BT: log-probs of the same tokens under the frozen reference policy (data).
    kind: estimator name; see the module docstring.

  Returns:
    `[B, T]` float32 estimate. Masked positions are not zeroed here; reduce with
    `aggregation.aggregate(kl_BT, loss_mask_BT, mode)`, which ignores them.
  """
  _check_kind(kind)
  chex.assert_equal_shape([logp_BT, ref_logp_BT])
  logp_BT = logp_BT.astype(jnp.float32)
  ref_logp_BT = ref_logp_BT.astype(jnp.float32)
  if not kind.endswith("+"):
    return _forward(logp_BT, ref_logp_BT, kind)
  value_BT = _forward(logp_BT, ref_logp_BT, kind[:-1])
  k2_BT = 0.5 * jnp.square(logp_BT - ref_logp_BT)
  # (k2 - sg(k2)) is exactly 0 in value, so the result equals the base estimator bit for bit
  # while its gradient is k2's.
  return jax.lax.stop_gradient(value_BT) + (k2_BT - jax.lax.stop_gradient(k2_BT))


def adaptive_kl_coef(coef: jax.Array | float, kl: jax.Array | float, *, target: float,
                     horizon: float, n_steps: int | float) -> jax.Array:
  """One update of the adaptive KL controller (Ziegler et al. 2019; verl AdaptiveKLController).

  beta <- beta * (1 + clip(KL / target - 1, -0.2, 0.2) * n_steps / horizon), where `kl` is the
  batch's observed KL and `n_steps` the number of samples it came from (verl passes the batch
  size). A fixed controller is simply not calling this.
  """
  if target <= 0 or horizon <= 0:
    raise ValueError(f"adaptive_kl_coef needs target > 0 and horizon > 0; got target={target}, "
                     f"horizon={horizon}.")
  error = jnp.clip(jnp.asarray(kl, jnp.float32) / target - 1.0, -0.2, 0.2)
  return jnp.asarray(coef, jnp.float32) * (1.0 + error * n_steps / horizon)


def _last_token_onehot(mask_BT: jax.Array) -> jax.Array:
  """1.0 at the last position where `mask_BT` is set in each row; all-zero rows stay zero."""
  mask_BT = mask_BT > 0
  T = mask_BT.shape[-1]
  last_B = T - 1 - jnp.argmax(mask_BT[:, ::-1], axis=-1)
  onehot_BT = jnp.arange(T)[None, :] == last_B[:, None]
  return (onehot_BT & mask_BT.any(-1, keepdims=True)).astype(jnp.float32)


def kl_in_reward(score_B: jax.Array, old_logp_BT: jax.Array, ref_logp_BT: jax.Array,
                 mask_BT: jax.Array, *, beta: jax.Array | float,
                 kind: str = "k1") -> tuple[jax.Array, dict[str, jax.Array]]:
  """Token rewards R_t = score * 1[t = last policy token] - beta * kl_t (verl apply_kl_penalty).

  Used by PPO (Ouyang et al. 2022, eq. 2) and REINFORCE++ (docs/algorithms.md §4.2, §4.10): the
  outcome score sits on the last policy token of each row and every policy token pays the KL
  penalty of the behaviour policy against the reference. Positions with mask 0 get reward 0.

  Returns:
    `[B, T]` rewards and metrics: `kl_in_reward` (mean over rows of each row's token-mean KL,
    the value verl feeds to the adaptive controller; not `kl`, which the score step logs as
    its k3 token mean) and `kl_coef` (beta).
  """
  chex.assert_rank([score_B, mask_BT], [1, 2])
  chex.assert_equal_shape([old_logp_BT, ref_logp_BT, mask_BT])
  kl_BT = jnp.where(mask_BT > 0, kl_penalty(old_logp_BT, ref_logp_BT, kind), 0.0)
  score_BT = score_B.astype(jnp.float32)[:, None] * _last_token_onehot(mask_BT)
  reward_BT = score_BT - beta * kl_BT
  kl_B = aggregation.masked_mean(kl_BT, mask_BT, axis=-1)
  metrics = {"kl_in_reward": jax.lax.stop_gradient(kl_B.mean()),
             "kl_coef": jnp.asarray(beta, jnp.float32)}
  return reward_BT, metrics
