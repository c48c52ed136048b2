# pylint: disable=invalid-name
"""Policy regularisers: the entropy bonus and the ratio-variance penalty.

- Entropy bonus (Williams & Peng 1991; Mnih et al. 2016, A3C): add -c * H(pi(.|s_t)) to the loss.
  The per-token entropy comes from the log-prob kernel (`kernels.logprob.token_logprobs(...,
  return_entropy=True)`), so this module only turns it into a masked loss.
- Ratio variance E_mu[(r - 1)^2], r = pi_theta / mu, the quantity R2VPO constrains
  (arXiv 2601.03320; docs/algorithms.md §3.2, where the exact form is [INF]). Centred at 1 it is the
  Pearson chi^2 divergence chi^2(pi_theta || mu); centred at the batch mean it is the plain
  variance, which differs when the data are stale (E_mu[r] = 1 only for the exact mu).
"""
import chex
import jax
import jax.numpy as jnp

from agentrl.losses import aggregation

CENTERS = ("one", "mean")


def entropy_bonus(entropy_BT: jax.Array,
                  mask_BT: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Per-token loss -H_t (minimising it raises entropy); 0 where mask is 0.

  Multiply by the entropy coefficient and reduce with `aggregation.aggregate` in the same mode
  as the policy loss. Metrics: `entropy_loss`, the token-mean entropy over unmasked tokens of
  the policy being updated; `entropy` is the score step's (π_old), and one name has one meaning
  in a step's record (docs/metrics.md), as `kl_loss` stands apart from `kl`.
  """
  chex.assert_equal_shape([entropy_BT, mask_BT])
  entropy_BT = entropy_BT.astype(jnp.float32)
  loss_BT = jnp.where(mask_BT > 0, -entropy_BT, 0.0)
  metrics = {"entropy_loss": jax.lax.stop_gradient(aggregation.masked_mean(entropy_BT, mask_BT))}
  return loss_BT, metrics


def ratio_variance(logp_BT: jax.Array, old_logp_BT: jax.Array, mask_BT: jax.Array, *,
                   center: str = "one") -> tuple[jax.Array, dict[str, jax.Array]]:
  """Token-mean of (r_t - c)^2 over unmasked tokens, r_t = exp(logp_t - old_logp_t).

  Args:
    logp_BT: current policy log-probs (differentiated).
    old_logp_BT: behaviour log-probs (data).
    mask_BT: loss mask.
    center: "one" (c = 1, the chi^2 form) or "mean" (c = masked mean of r, differentiated, so
      this is the biased second central moment of r over the batch).

  Returns:
    The scalar penalty and metrics `ratio_mean`, `ratio_var_one` (E[(r-1)^2]) and
    `ratio_var_mean` (E[(r - mean r)^2]).
  """
  if center not in CENTERS:
    raise ValueError(f"Unknown ratio_variance center={center!r}; expected one of {CENTERS}.")
  chex.assert_equal_shape([logp_BT, old_logp_BT, mask_BT])
  log_ratio_BT = logp_BT.astype(jnp.float32) - old_logp_BT.astype(jnp.float32)
  # Clamp before exp as verl does (docs/algorithms.md §0.4); masked garbage is replaced by 0 first.
  log_ratio_BT = jnp.clip(jnp.where(mask_BT > 0, log_ratio_BT, 0.0), -20.0, 20.0)
  ratio_BT = jnp.exp(log_ratio_BT)
  mean = aggregation.masked_mean(ratio_BT, mask_BT)
  var_one = aggregation.masked_mean(jnp.square(ratio_BT - 1.0), mask_BT)
  var_mean = aggregation.masked_mean(jnp.square(ratio_BT - mean), mask_BT)
  metrics = jax.lax.stop_gradient(
      {"ratio_mean": mean, "ratio_var_one": var_one, "ratio_var_mean": var_mean})
  return (var_one if center == "one" else var_mean), metrics
