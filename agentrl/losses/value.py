# pylint: disable=invalid-name
"""Clipped value (critic) loss for PPO (Schulman et al. 2017; verl `compute_value_loss`).

Per token, with V the critic's prediction, V_old the value recorded at rollout time and R the
return target (e.g. `estimators.gae`'s returns), docs/algorithms.md §4.2:

  L_t = 0.5 * max((V_t - R_t)^2, (clip(V_t, V_old_t - c, V_old_t + c) - R_t)^2),   c = 0.5.

The max makes the clip pessimistic: a prediction that moved more than c from V_old cannot
lower the loss further by moving. Reduce with `aggregation.aggregate` (verl: token-mean).
"""
import chex
import jax
import jax.numpy as jnp

from agentrl.losses import aggregation


def clipped_value_loss(value_BT: jax.Array, old_value_BT: jax.Array, ret_BT: jax.Array,
                       mask_BT: jax.Array, *, clip_range: float | None = 0.5,
                       ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Unreduced clipped value loss [B, T] (0 where mask is 0) plus diagnostics.

  Args:
    value_BT: current critic predictions (differentiated).
    old_value_BT: critic values at rollout time (data).
    ret_BT: return targets (data).
    mask_BT: loss mask; the critic is trained on policy tokens only.
    clip_range: c above (verl `cliprange_value`); None gives the unclipped 0.5 * (V - R)^2.

  Returns:
    loss_BT and metrics: `vf_clipfrac` (token-mean of [clipped loss > unclipped loss]) and
    `explained_variance` = 1 - Var[R - V] / Var[R] over unmasked tokens (0 when Var[R] = 0).
  """
  chex.assert_equal_shape([value_BT, old_value_BT, ret_BT, mask_BT])
  value_BT = value_BT.astype(jnp.float32)
  ret_BT = ret_BT.astype(jnp.float32)
  unclipped_BT = jnp.square(value_BT - ret_BT)
  if clip_range is None:
    worst_BT = unclipped_BT
    clipfrac = jnp.zeros((), jnp.float32)
  else:
    old_value_BT = old_value_BT.astype(jnp.float32)
    clipped_value_BT = jnp.clip(value_BT, old_value_BT - clip_range, old_value_BT + clip_range)
    clipped_BT = jnp.square(clipped_value_BT - ret_BT)
    worst_BT = jnp.maximum(unclipped_BT, clipped_BT)
    clipfrac = aggregation.masked_mean((clipped_BT > unclipped_BT).astype(jnp.float32), mask_BT)
  loss_BT = jnp.where(mask_BT > 0, 0.5 * worst_BT, 0.0)
  metrics = {"vf_clipfrac": clipfrac,
             "explained_variance": explained_variance(value_BT, ret_BT, mask_BT)}
  return loss_BT, jax.lax.stop_gradient(metrics)


def explained_variance(value_BT: jax.Array, ret_BT: jax.Array, mask_BT: jax.Array) -> jax.Array:
  """1 - Var[R - V] / Var[R] over unmasked entries; 1 is a perfect critic, 0 a constant one."""
  def masked_var(x_BT):
    mean = aggregation.masked_mean(x_BT, mask_BT)
    return aggregation.masked_mean(jnp.square(x_BT - mean), mask_BT)

  var_ret = masked_var(ret_BT)
  safe_var_ret = jnp.where(var_ret > 0, var_ret, 1.0)
  return jnp.where(var_ret > 0, 1.0 - masked_var(ret_BT - value_BT) / safe_var_ret, 0.0)
