# pylint: disable=invalid-name
"""Plumbing shared by the loss modules (policy, sequence, covariance, distill, ...).

Argument checks, advantage broadcasting and the detached metric helpers behind the metric
conventions documented in `agentrl.losses.policy`. For the loss modules; experiments call the
losses themselves.
"""
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import aggregation

CLAMP = 20.0  # verl clamps per-token log-ratios to ±20 before exp (docs/algorithms.md §0.4)
LOG_F32_MAX = float(np.log(np.finfo(np.float32).max))

Metrics = dict[str, jax.Array]


def check(logp_BT, old_logp_BT, mask_BT) -> jax.Array:
  """Validates the shared [B, T] inputs and returns the boolean valid-token mask."""
  chex.assert_rank(logp_BT, 2)
  chex.assert_equal_shape([logp_BT, old_logp_BT, mask_BT])
  return mask_BT > 0


def check_eps(eps_low: float, eps_high: float) -> None:
  if not 0.0 <= eps_high or not 0.0 <= eps_low:
    raise ValueError(f"eps_low and eps_high must be >= 0; got {eps_low}, {eps_high}.")


def token_adv(adv_BT, like_BT: jax.Array) -> jax.Array:
  """A scalar or rank-2 advantage broadcast to [B, T], f32."""
  adv_BT = jnp.asarray(adv_BT, jnp.float32)
  if adv_BT.ndim not in (0, 2):
    raise ValueError(
        f"adv_BT must be a scalar or a rank-2 array broadcastable to {like_BT.shape}; got shape "
        f"{adv_BT.shape}. Pass a per-sequence advantage as adv_B[:, None].")
  return jnp.broadcast_to(adv_BT, like_BT.shape)


def seq_adv(adv_B, mask_BT: jax.Array) -> jax.Array:
  """A [B] advantage; a rank-2 token advantage becomes its masked row mean (verl GMPO)."""
  adv_B = jnp.asarray(adv_B, jnp.float32)
  if adv_B.ndim == 1 and adv_B.shape == mask_BT.shape[:1]:
    return adv_B
  if adv_B.ndim == 2:
    return aggregation.masked_mean(jnp.broadcast_to(adv_B, mask_BT.shape), mask_BT, axis=-1)
  raise ValueError(f"adv_B must have shape {mask_BT.shape[:1]} (or be a rank-2 token advantage "
                   f"broadcastable to {mask_BT.shape}); got shape {adv_B.shape}.")


def stat_mean(x, valid) -> jax.Array:
  """Detached mean of x over `valid` (0 when nothing is valid): a metric, never a loss."""
  x = jax.lax.stop_gradient(x).astype(jnp.float32)
  return jnp.where(valid, x, 0.0).sum() / jnp.maximum(valid.sum().astype(jnp.float32), 1.0)


def stat_max(x, valid) -> jax.Array:
  """Detached max of x over `valid` (0 when nothing is valid)."""
  x = jax.lax.stop_gradient(x).astype(jnp.float32)
  return jnp.where(valid.any(), jnp.where(valid, x, -jnp.inf).max(), 0.0)


def ratio_metrics(ratio, valid, log_ratio_BT, valid_BT, *, seq: bool = False,
                  **fractions) -> Metrics:
  """ratio stats over `valid`, ppo_kl over tokens, and each boolean fraction over `valid`.

  With `seq` (a sequence-level ratio [B] and row fractions) the ratio and fraction names get a
  `seq_` prefix, so every metric name means one thing across losses: `ratio_mean` and
  `clipfrac` are always over tokens, `seq_ratio_mean` and `seq_clipfrac` over sequences.
  """
  pre = "seq_" if seq else ""
  out = {f"{pre}ratio_mean": stat_mean(ratio, valid), f"{pre}ratio_max": stat_max(ratio, valid),
         "ppo_kl": stat_mean(-log_ratio_BT, valid_BT)}
  out.update({pre + k: stat_mean(v.astype(jnp.float32), valid) for k, v in fractions.items()})
  return out
