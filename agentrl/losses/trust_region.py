# pylint: disable=invalid-name
"""PPO surrogates whose clip window moves per token: HAPO (entropy) and ETR (signal quality).

Both keep verl's dual-clip PPO form (`policy.ppo_clip`) and change only the window
[1 - eps_low_t, 1 + eps_high_t] of each token, so at their neutral setting they are
`ppo_clip` exactly. Inputs, masks, aggregation and metric names follow the
`agentrl.losses.policy` conventions; both return `loss_BT` [B, T] (aggregate with token-mean).

- HAPO, Heterogeneous Adaptive Policy Optimization (Liu et al. 2025, arXiv 2509.16591; code
  starriver030515/HAPO `verl/trainer/ppo/core_algos.py`, commit 7671dde): the normalised
  token entropy `hapo_entropy_signal`, asymmetric adaptive clipping `hapo_clip_bounds`,
  differential advantage redistribution `hapo_redistribute_advantage`, all in `hapo_ppo`.
  HAPO's token-level group average advantage is
  `agentrl.advantages.shaping.hapo_group_token_advantage`; its adaptive sampling temperature reuses
  `hapo_entropy_signal` (docs/algorithms.md §13.3). Not the length-reward HAPO of arXiv 2505.11225
  (`agentrl.rewards.length_rewards`).
- ETR, Elastic Trust Regions (Zhang et al. 2026, arXiv 2601.03723; abstract only): the window
  scales with |A| (micro) and with the group's reward variance (macro), `etr_ppo`
  (docs/algorithms.md §13.4).
"""
import jax
import jax.numpy as jnp

from agentrl.losses import common
from agentrl.losses import policy
from agentrl.losses import ratios

Metrics = common.Metrics


def _adaptive_ppo(logp_BT, old_logp_BT, adv_BT, mask_BT, eps_low_BT, eps_high_BT, dual_clip,
                  ratio_fn=None):
  """verl's dual-clip PPO with a per-token window; `ratio_fn(ratio_BT)` may reshape A first."""
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  if dual_clip is not None and not dual_clip > 1.0:
    raise ValueError(f"dual_clip must be > 1 (the dual-clip PPO bound c); got {dual_clip}.")
  adv_BT = common.token_adv(adv_BT, logp_BT)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=common.CLAMP)
  ratio_BT = jnp.exp(log_ratio_BT)
  if ratio_fn is not None:
    adv_BT = jax.lax.stop_gradient(ratio_fn(jax.lax.stop_gradient(ratio_BT), adv_BT))
  lo_BT, hi_BT = 1.0 - eps_low_BT, 1.0 + eps_high_BT
  # The shared PPO terms of `policy` keep the loss and the metric definitions identical.
  loss_BT, metrics = policy.ppo_terms(
      ratio_BT, jnp.clip(ratio_BT, lo_BT, hi_BT), adv_BT, dual_clip, ratio_BT > hi_BT,
      ratio_BT < lo_BT, valid_BT, log_ratio_BT)
  metrics["eps_low_mean"] = common.stat_mean(eps_low_BT, valid_BT)
  metrics["eps_high_mean"] = common.stat_mean(eps_high_BT, valid_BT)
  return loss_BT, metrics


# ---------------------------------------------------------------------------------------------
# HAPO.
# ---------------------------------------------------------------------------------------------
def hapo_entropy_signal(entropy_BT: jax.Array, mask_BT: jax.Array, *, pivot: float = 0.8,
                        signed: bool = False, eps: float = 1e-8) -> jax.Array:
  """HAPO's normalised entropy h_hat [B, T] over the valid tokens of the batch (0 elsewhere).

  As `compute_entropy_h`: l_t = log(max(H_t, eps)); m = the `pivot` quantile of l over valid
  tokens by the nearest rank (sorted index round(pivot (N - 1)), ties to even);
  h_t = (l_t - m) / s with s = sqrt(max(mean_valid (l - m)^2, eps)) (root mean square about
  the pivot, not the standard deviation); then h > 0 is divided by the largest positive h and
  h <= 0 by the most negative one, neg_min = min(min h, -eps). Defaults: pivot 0.8 (every
  launcher; the function's own default is 0.5), eps 1e-8.

  Pitfall (reproduced by default): dividing a negative h by the negative neg_min gives a
  positive value, so the released h_hat lies in [0, 1] for every token (|h| over its side's
  maximum) and is <= 0 only at h = 0 exactly; the low-entropy branches of
  `hapo_clip_bounds` and `hapo_redistribute_advantage` are then nearly never taken.
  [INF] signed=True divides by |neg_min| instead, giving h_hat in [-1, 1] with low-entropy
  tokens negative, which is what the paper's description of those branches implies.
  """
  median, rms, pos_max, neg_min = hapo_entropy_stats(entropy_BT, mask_BT, pivot=pivot, eps=eps)
  valid_BT = mask_BT > 0
  log_h_BT = jnp.log(jnp.maximum(jax.lax.stop_gradient(entropy_BT).astype(jnp.float32), eps))
  h_BT = (log_h_BT - median) / rms
  low_BT = h_BT / (-neg_min if signed else neg_min)
  return jnp.where(valid_BT, jnp.where(h_BT > 0, h_BT / pos_max, low_BT), 0.0)


def hapo_entropy_stats(entropy_BT: jax.Array, mask_BT: jax.Array, *, pivot: float = 0.8,
                       eps: float = 1e-8) -> jax.Array:
  """float32[4] (m, s, pos_max, neg_min): the statistics `hapo_entropy_signal` normalises by.

  m is the `pivot` quantile of l = log(max(H, eps)) over the valid tokens, s the root mean
  square of l - m, pos_max = max(max h, eps) and neg_min = min(min h, -eps) for
  h = (l - m) / s. All zero-gradient. The rollout's adaptive temperature
  (`sampler.entropy_temperature`) reads them from the previous update.
  """
  if not 0.0 <= pivot <= 1.0:
    raise ValueError(f"pivot must be a quantile level in [0, 1]; got {pivot}.")
  valid_BT = mask_BT > 0
  log_h_BT = jnp.log(jnp.maximum(jax.lax.stop_gradient(entropy_BT).astype(jnp.float32), eps))
  log_h_BT = jnp.where(valid_BT, log_h_BT, 0.0)
  n = valid_BT.sum()
  sorted_N = jnp.sort(jnp.where(valid_BT, log_h_BT, jnp.inf).reshape(-1))
  index = jnp.clip(jnp.round(pivot * (n - 1).astype(jnp.float32)), 0, sorted_N.size - 1)
  median = jnp.where(n > 0, sorted_N[index.astype(jnp.int32)], 0.0)
  h_BT = jnp.where(valid_BT, log_h_BT - median, 0.0)
  rms = jnp.sqrt(jnp.maximum(jnp.square(h_BT).sum() / jnp.maximum(n, 1).astype(jnp.float32), eps))
  h_BT = h_BT / rms
  pos_max = jnp.maximum(jnp.where(valid_BT & (h_BT > 0), h_BT, 0.0).max(), eps)
  neg_min = jnp.minimum(jnp.where(valid_BT & (h_BT < 0), h_BT, 0.0).min(), -eps)
  return jnp.stack([median, rms, pos_max, neg_min])


def hapo_clip_bounds(h_hat_BT: jax.Array, *, eps_low: float = 0.2, eps_high: float = 0.2,
                     clip_alpha: float = 1.0) -> tuple[jax.Array, jax.Array]:
  """HAPO asymmetric adaptive clipping (`ada_clip`): per-token (eps_low_t, eps_high_t).

  Where h_hat <= 0: eps_low_t = eps_low (1 - clip_alpha h_hat) (a wider lower bound, so noisy
  low-entropy tokens can be pushed down further), eps_high_t = eps_high. Where h_hat > 0:
  eps_high_t = eps_high (1 + clip_alpha h_hat), eps_low_t = eps_low. clip_alpha = 0 gives the
  fixed window; the launchers use clip_alpha = 1 and eps 0.2 / 0.2.
  """
  h_hat_BT = h_hat_BT.astype(jnp.float32)
  low_BT = jnp.where(h_hat_BT <= 0, eps_low * (1.0 - clip_alpha * h_hat_BT), eps_low)
  high_BT = jnp.where(h_hat_BT > 0, eps_high * (1.0 + clip_alpha * h_hat_BT), eps_high)
  return low_BT, high_BT


def hapo_redistribute_advantage(adv_BT: jax.Array, h_hat_BT: jax.Array, ratio_BT: jax.Array,
                                eps_low_BT: jax.Array, eps_high_BT: jax.Array, *,
                                adv_beta: float = 1.0) -> jax.Array:
  """HAPO differential advantage redistribution (`ada_advantage`), [B, T].

  With A_ent = A (1 + adv_beta h_hat) and the neutral band 1 - eps_low_t / 2 < r < 1 +
  eps_high_t / 2 (open): high-entropy tokens (h_hat > 0) keep A inside the band and get A_ent
  outside it; the others get A_ent inside and keep A outside. The ratio is the current one,
  detached. adv_beta = 0 returns A (the launchers use 1).
  """
  adv_BT = adv_BT.astype(jnp.float32)
  scaled_BT = adv_BT * (1.0 + adv_beta * h_hat_BT)
  in_band_BT = (ratio_BT > 1.0 - eps_low_BT / 2.0) & (ratio_BT < 1.0 + eps_high_BT / 2.0)
  high_BT = jnp.where(in_band_BT, adv_BT, scaled_BT)
  low_BT = jnp.where(in_band_BT, scaled_BT, adv_BT)
  return jnp.where(h_hat_BT > 0, high_BT, low_BT)


def hapo_ppo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array,
             *, entropy_BT: jax.Array, eps_low: float = 0.2, eps_high: float = 0.2,
             dual_clip: float | None = 10.0, pivot: float = 0.8, clip_alpha: float = 1.0,
             adv_beta: float = 1.0, signed: bool = False) -> tuple[jax.Array, Metrics]:
  """HAPO's policy loss (`compute_policy_loss` with adaptive_clip and adaptive_advantage).

  h_hat = `hapo_entropy_signal(entropy_BT, mask_BT)` over the batch passed (the reference
  computes it per micro-batch from the current policy's entropy, detached), the window from
  `hapo_clip_bounds`, A from `hapo_redistribute_advantage` (with the current ratio, detached),
  then dual-clip PPO: L = max(-A r, -A clip(r, 1 - eps_low_t, 1 + eps_high_t)), and for
  A < 0 min(L, -A c). Defaults are the launchers' (recipe/*.sh): eps 0.2 / 0.2, c = 10,
  pivot 0.8, clip_alpha = adv_beta = 1; aggregate with token-mean. r comes from log-ratios
  clamped at ±20 (the reference does not clamp; docs/algorithms.md §0.4).

  clip_alpha = adv_beta = 0 is `policy.ppo_clip(..., dual_clip=dual_clip)` exactly. With the
  reference sign (`signed=False`) the on-policy gradient is REINFORCE's (r = 1 is inside every
  band and the low-entropy branch only fires at h_hat = 0); with `signed=True` low-entropy
  tokens inside the band get A (1 + adv_beta h_hat) on-policy too.
  Metrics add `entropy_signal_mean` (mean h_hat), `eps_low_mean`, `eps_high_mean`.
  """
  common.check_eps(eps_low, eps_high)
  if entropy_BT.shape != mask_BT.shape:
    raise ValueError(f"entropy_BT must match mask_BT {mask_BT.shape}; got {entropy_BT.shape}.")
  h_hat_BT = hapo_entropy_signal(entropy_BT, mask_BT, pivot=pivot, signed=signed)
  eps_low_BT, eps_high_BT = hapo_clip_bounds(h_hat_BT, eps_low=eps_low, eps_high=eps_high,
                                             clip_alpha=clip_alpha)
  redistribute = lambda ratio_BT, adv: hapo_redistribute_advantage(
      adv, h_hat_BT, ratio_BT, eps_low_BT, eps_high_BT, adv_beta=adv_beta)
  loss_BT, metrics = _adaptive_ppo(logp_BT, old_logp_BT, adv_BT, mask_BT, eps_low_BT,
                                   eps_high_BT, dual_clip, ratio_fn=redistribute)
  metrics["entropy_signal_mean"] = common.stat_mean(h_hat_BT, mask_BT > 0)
  return loss_BT, metrics


# ---------------------------------------------------------------------------------------------
# ETR.
# ---------------------------------------------------------------------------------------------
def etr_ppo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array,
            *, group_var_B: jax.Array, alpha: float, beta: float, eps_low: float = 0.2,
            eps_high: float = 0.2, dual_clip: float | None = None) -> tuple[jax.Array, Metrics]:
  """ETR: PPO with the window scaled by signal quality (arXiv 2601.03723; a reconstruction).

  The abstract states the two levels (micro: clip bounds grow with the advantage magnitude,
  "to accelerate learning from high-confidence paths"; macro: the group variance gives larger
  budgets to tasks "in the optimal learning zone"); every functional form below is [INF]:
    eps_t = eps (1 + alpha |A_t|) (1 + beta 4 Var_G(R)),
  for both eps_low and eps_high, with Var_G(R) the population variance of the row's group
  rewards (`agentrl.advantages.shaping.group_reward_variance`; 4 p (1 - p) in [0, 1] for 0/1
  rewards, largest at pass rate 1/2). alpha and beta have no published values, so they are
  required; alpha = beta = 0 is `policy.ppo_clip` exactly. The scale is data (detached).
  Aggregate with token-mean (GRPO's verl default) or the caller's mode. Metrics add `eps_low_mean`, `eps_high_mean`.
  """
  common.check_eps(eps_low, eps_high)
  if alpha < 0 or beta < 0:
    raise ValueError(f"ETR alpha and beta must be >= 0; got {alpha}, {beta}.")
  if group_var_B.shape != mask_BT.shape[:1]:
    raise ValueError(f"group_var_B must have shape {mask_BT.shape[:1]}; got "
                     f"{group_var_B.shape}.")
  adv_full_BT = jax.lax.stop_gradient(common.token_adv(adv_BT, logp_BT))
  var_B1 = jax.lax.stop_gradient(group_var_B.astype(jnp.float32))[:, None]
  scale_BT = (1.0 + alpha * jnp.abs(adv_full_BT)) * (1.0 + beta * 4.0 * var_B1)
  return _adaptive_ppo(logp_BT, old_logp_BT, adv_BT, mask_BT, eps_low * scale_BT,
                       eps_high * scale_BT, dual_clip)
