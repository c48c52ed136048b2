# pylint: disable=invalid-name
"""Policy-gradient surrogates for LLM post-training: unreduced, masked, f32.

Each function takes `logp_BT` (current policy; the only input meant to be differentiated),
`old_logp_BT` (behaviour policy, data), advantages and the loss mask, and returns
`(loss, metrics)`:

  * Token forms return `loss_BT` [B, T]; sequence forms (`gspo`, `gmpo`, `holder_po`) return
    `loss_B` [B]. Entries are exactly 0 where masked and for rows with no policy token.
  * The caller reduces once with `agentrl.losses.aggregation.aggregate`; the mode is part of
    the algorithm (algorithms.md §0.3). Reference modes: token-mean for `vanilla_pg`,
    `ppo_clip`, `ctpo`, `cispo`, `clip_cov`, `kl_cov`, `r2vpo(level="token")`;
    seq-mean-token-mean for `gspo_token`, `sapo`, `r2vpo(level="sequence")` and the GRPO
    paper; "seq-mean" with `valid_B = mask_BT.sum(-1) > 0` for the sequence forms.
  * Token forms take `adv_BT`: a rank-2 array broadcastable to [B, T] (a sequence advantage
    is passed as `adv_B[:, None]`) or a scalar. Sequence forms take `adv_B` [B]; a rank-2
    token advantage is reduced to its masked row mean, as verl's GMPO and HölderPO's code do.
  * The rollout/trainer mismatch weight (`ratios.rollout_correction_weight`) is a separate
    detached factor: multiply the returned loss by it before aggregating.

Metrics are flat dicts of f32 scalars with no gradient:
  ratio_mean, ratio_max  over valid tokens (valid sequences for sequence forms)
  ppo_kl                 masked mean of −ℓ over valid tokens (verl)
  clipfrac               the fraction verl logs as pg_clipfrac for that loss
  clipfrac_high          A > 0 and the ratio above the upper bound (gradient removed)
  clipfrac_low           A < 0 and the ratio below the lower bound (gradient removed)
  clipfrac_lower         (ppo_clip, ctpo) verl's pg_clipfrac_lower: A < 0 and dual clip active
"""
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import aggregation
from agentrl.losses import ratios

_CLAMP = 20.0  # verl clamps per-token log-ratios to ±20 before exp (algorithms.md §0.4)
_LOG_F32_MAX = float(np.log(np.finfo(np.float32).max))

Metrics = dict[str, jax.Array]


# ---------------------------------------------------------------------------------------------
# Shared plumbing.
# ---------------------------------------------------------------------------------------------
def _check(logp_BT, old_logp_BT, mask_BT) -> jax.Array:
  chex.assert_rank(logp_BT, 2)
  chex.assert_equal_shape([logp_BT, old_logp_BT, mask_BT])
  return mask_BT > 0


def _token_adv(adv_BT, like_BT: jax.Array) -> jax.Array:
  adv_BT = jnp.asarray(adv_BT, jnp.float32)
  if adv_BT.ndim not in (0, 2):
    raise ValueError(
        f"adv_BT must be a scalar or a rank-2 array broadcastable to {like_BT.shape}; got shape "
        f"{adv_BT.shape}. Pass a per-sequence advantage as adv_B[:, None].")
  return jnp.broadcast_to(adv_BT, like_BT.shape)


def _seq_adv(adv_B, mask_BT: jax.Array) -> jax.Array:
  adv_B = jnp.asarray(adv_B, jnp.float32)
  if adv_B.ndim == 1 and adv_B.shape == mask_BT.shape[:1]:
    return adv_B
  if adv_B.ndim == 2:
    return aggregation.masked_mean(jnp.broadcast_to(adv_B, mask_BT.shape), mask_BT, axis=-1)
  raise ValueError(f"adv_B must have shape {mask_BT.shape[:1]} (or be a rank-2 token advantage "
                   f"broadcastable to {mask_BT.shape}); got shape {adv_B.shape}.")


def _mean(x, valid) -> jax.Array:
  x = jax.lax.stop_gradient(x).astype(jnp.float32)
  return jnp.where(valid, x, 0.0).sum() / jnp.maximum(valid.sum().astype(jnp.float32), 1.0)


def _max(x, valid) -> jax.Array:
  x = jax.lax.stop_gradient(x).astype(jnp.float32)
  return jnp.where(valid.any(), jnp.where(valid, x, -jnp.inf).max(), 0.0)


def _metrics(ratio, valid, log_ratio_BT, valid_BT, **fractions) -> Metrics:
  """ratio stats over `valid`, ppo_kl over tokens, and each boolean fraction over `valid`."""
  out = {"ratio_mean": _mean(ratio, valid), "ratio_max": _max(ratio, valid),
         "ppo_kl": _mean(-log_ratio_BT, valid_BT)}
  out.update({k: _mean(v.astype(jnp.float32), valid) for k, v in fractions.items()})
  return out


def _clip_bounds(eps_low: float, eps_high: float) -> None:
  if not 0.0 <= eps_high or not 0.0 <= eps_low:
    raise ValueError(f"eps_low and eps_high must be >= 0; got {eps_low}, {eps_high}.")


def _pessimistic(log_ratio, clipped, adv):
  """min(ℓ, ℓ_clip) for A > 0, max for A < 0, ℓ for A = 0 (HölderPO / GMPO selection)."""
  return jnp.where(adv > 0, jnp.minimum(log_ratio, clipped),
                   jnp.where(adv < 0, jnp.maximum(log_ratio, clipped), log_ratio))


# ---------------------------------------------------------------------------------------------
# REINFORCE and PPO-family token losses.
# ---------------------------------------------------------------------------------------------
def vanilla_pg(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array,
               mask_BT: jax.Array) -> tuple[jax.Array, Metrics]:
  """REINFORCE (Williams 1992): L_t = −A_t · logp_t. `old_logp_BT` only feeds the metrics."""
  valid_BT = _check(logp_BT, old_logp_BT, mask_BT)
  adv_BT = _token_adv(adv_BT, logp_BT)
  loss_BT = jnp.where(valid_BT, -adv_BT * logp_BT.astype(jnp.float32), 0.0)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=_CLAMP)
  return loss_BT, _metrics(jnp.exp(log_ratio_BT), valid_BT, log_ratio_BT, valid_BT)


def _ppo_terms(ratio_BT, clipped_BT, adv_BT, threshold_BT, high_BT, low_BT, valid_BT,
               log_ratio_BT):
  """Dual-clip PPO per token (verl `compute_policy_loss_vanilla`); threshold None: no dual."""
  loss1_BT, loss2_BT = -adv_BT * ratio_BT, -adv_BT * clipped_BT
  loss_BT = jnp.maximum(loss1_BT, loss2_BT)
  dual_BT = jnp.zeros_like(valid_BT)
  if threshold_BT is not None:
    loss3_BT = -adv_BT * threshold_BT
    dual_BT = (loss_BT > loss3_BT) & (adv_BT < 0)
    loss_BT = jnp.where(adv_BT < 0, jnp.minimum(loss_BT, loss3_BT), loss_BT)
  metrics = _metrics(ratio_BT, valid_BT, log_ratio_BT, valid_BT, clipfrac=loss2_BT > loss1_BT,
                     clipfrac_high=high_BT & (adv_BT > 0), clipfrac_low=low_BT & (adv_BT < 0),
                     clipfrac_lower=dual_BT)
  return jnp.where(valid_BT, loss_BT, 0.0), metrics


def ppo_clip(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array,
             *, eps_low: float = 0.2, eps_high: float = 0.2,
             dual_clip: float | None = None) -> tuple[jax.Array, Metrics]:
  """PPO clipped surrogate (Schulman et al. 2017, eq. 7), asymmetric clip (DAPO), dual clip.

  r = exp(clip(ℓ, ±20)); L = max(−A r, −A clip(r, 1 − eps_low, 1 + eps_high)); with
  `dual_clip=c` (Ye et al. 2020, c > 1; verl default 3.0) L ← min(L, −A c) where A < 0.
  Defaults are the PPO paper's ε = 0.2 with no dual clip; DAPO uses eps_high=0.28.
  """
  valid_BT = _check(logp_BT, old_logp_BT, mask_BT)
  _clip_bounds(eps_low, eps_high)
  if dual_clip is not None and not dual_clip > 1.0:
    raise ValueError(f"dual_clip must be > 1 (the dual-clip PPO bound c); got {dual_clip}.")
  adv_BT = _token_adv(adv_BT, logp_BT)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=_CLAMP)
  ratio_BT = jnp.exp(log_ratio_BT)
  return _ppo_terms(ratio_BT, jnp.clip(ratio_BT, 1.0 - eps_low, 1.0 + eps_high), adv_BT,
                    dual_clip, ratio_BT > 1.0 + eps_high, ratio_BT < 1.0 - eps_low, valid_BT,
                    log_ratio_BT)


def ctpo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array, *,
         a_lo: float = 0.025, a_hi: float = 0.05, a_c: float = 0.05, kappa: float = 0.5,
         geomean: bool = False, clip_mode: str = "log_adaptive", eps_low: float = 0.2,
         eps_high: float = 0.2, dual_clip: float = 3.0) -> tuple[jax.Array, Metrics]:
  """CTPO: PPO with the cumulative-token ratio (arXiv 2605.07331; algorithms.md §1.2).

  ρ_t = Π_{s≤t} r_s over policy tokens (`ratios.cumulative_log_ratio`; value of the prefix
  product, gradient ρ_t ∇logp_t only). clip_mode="log_adaptive" is CTPO-LA
  (`cum-token-cumprod-la`, the released default): with n_t the policy-token position and
  scale_t = max(n_t, 1)^kappa, ρ̄_t = exp(clip(log ρ_t, −a_lo·scale_t, a_hi·scale_t)) and the
  dual-clip threshold for A < 0 is exp(a_c·scale_t); at kappa = 0.5 the window is
  [0.9753, 1.0513] at t = 1 and [0.7788, 1.6487] at t = 100. clip_mode="standard" is
  `cum-token-cumprod`: ρ̄ = clip(ρ, 1 − eps_low, 1 + eps_high), dual clip `dual_clip`.
  `geomean=True` uses the geometric mean of the ratios up to t (`cum-token-geomean[-la]`;
  the reference recommends kappa = −0.5 there). Aggregate with token-mean.

  Pitfall: kappa defaults to 0.5 as in ctpo.sh; the reference `ActorConfig` default is 0.0
  (a uniform log-space window), so runs that relied on the dataclass used 0.0.
  With a_c = a_hi, negative-advantage tokens above the window get zero gradient.
  """
  valid_BT = _check(logp_BT, old_logp_BT, mask_BT)
  if clip_mode not in ("log_adaptive", "standard"):
    raise ValueError(f"Unknown CTPO clip_mode {clip_mode!r}; use 'log_adaptive' (CTPO-LA) or "
                     "'standard' (cum-token-cumprod).")
  adv_BT = _token_adv(adv_BT, logp_BT)
  log_rho_BT, n_BT = ratios.cumulative_log_ratio(logp_BT, old_logp_BT, mask_BT, geomean=geomean,
                                                 clamp=_CLAMP)
  rho_BT = jnp.where(valid_BT, jnp.exp(log_rho_BT), 0.0)
  if clip_mode == "log_adaptive":
    if min(a_lo, a_hi, a_c) <= 0:
      raise ValueError(f"a_lo, a_hi, a_c must be > 0; got {a_lo}, {a_hi}, {a_c}.")
    scale_BT = jnp.maximum(n_BT, 1.0) ** kappa
    lo_BT, hi_BT = a_lo * scale_BT, a_hi * scale_BT
    clipped_BT = jnp.where(valid_BT, jnp.exp(jnp.clip(log_rho_BT, -lo_BT, hi_BT)), 0.0)
    threshold_BT = jnp.where(valid_BT, jnp.exp(a_c * scale_BT), 1.0)
    high_BT, low_BT = log_rho_BT > hi_BT, log_rho_BT < -lo_BT
  else:
    _clip_bounds(eps_low, eps_high)
    if not dual_clip > 1.0:
      raise ValueError(f"dual_clip must be > 1; got {dual_clip}.")
    clipped_BT = jnp.clip(rho_BT, 1.0 - eps_low, 1.0 + eps_high)
    threshold_BT = jnp.full_like(rho_BT, dual_clip)
    high_BT, low_BT = rho_BT > 1.0 + eps_high, rho_BT < 1.0 - eps_low
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=_CLAMP)
  return _ppo_terms(rho_BT, clipped_BT, adv_BT, threshold_BT, high_BT, low_BT, valid_BT,
                    log_ratio_BT)


def cispo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array,
          *, eps_low: float = 10.0, eps_high: float = 0.2) -> tuple[jax.Array, Metrics]:
  """CISPO (MiniMax-M1, arXiv 2506.13585): L_t = −sg(clip(r_t, 1 − eps_low, 1 + eps_high)) A logp_t.

  The clipped IS weight is detached, so every token keeps its gradient (verl
  `compute_policy_loss_cispo`; r from ℓ clamped to ±20). Defaults follow verl's CISPO example:
  eps_low = 10 makes the lower bound inactive, eps_high = 0.2; the paper's own values were not
  verified (algorithms.md §4.8). clipfrac_high / clipfrac_low here count truncated weights
  (regardless of the sign of A), not removed gradients.
  """
  valid_BT = _check(logp_BT, old_logp_BT, mask_BT)
  _clip_bounds(eps_low, eps_high)
  adv_BT = _token_adv(adv_BT, logp_BT)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=_CLAMP)
  ratio_BT = jnp.exp(log_ratio_BT)
  weight_BT = jax.lax.stop_gradient(jnp.clip(ratio_BT, 1.0 - eps_low, 1.0 + eps_high))
  loss_BT = jnp.where(valid_BT, -weight_BT * adv_BT * logp_BT.astype(jnp.float32), 0.0)
  return loss_BT, _metrics(ratio_BT, valid_BT, log_ratio_BT, valid_BT,
                           clipfrac=ratio_BT != weight_BT, clipfrac_high=ratio_BT > 1 + eps_high,
                           clipfrac_low=ratio_BT < 1 - eps_low)


def sapo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array,
         *, tau_pos: float = 1.0, tau_neg: float = 1.05) -> tuple[jax.Array, Metrics]:
  """SAPO, Soft Adaptive Policy Optimization (Qwen 2025, arXiv 2511.20347).

  A smooth gate replaces the hard clip: L_t = −A_t · f(r_t), f(r) = σ(τ (r − 1)) · 4/τ, with
  τ = tau_pos where A > 0 and tau_neg otherwise (verl `compute_policy_loss_sapo`; r from ℓ
  clamped to ±20; defaults tau_pos = 1.0, tau_neg = 1.05 from verl's ActorConfig).
  Derivation: ∂f/∂logp = 4 σ(1 − σ) r = r · sech²(τ (r − 1)/2), which is exactly 1 at r = 1, so
  the on-policy gradient is REINFORCE's −A ∇logp; the weight decays smoothly as r leaves 1,
  faster for larger τ (negative advantages get the slightly larger τ). The loss value at
  r = 1 is −2A/τ, a constant that does not affect the gradient.
  [INF]: that the paper's per-token objective is exactly verl's gate with A = 0 grouped with
  the negative temperature, and that the paper aggregates with seq-mean-token-mean (verl
  forces that mode for SAPO), are taken from verl, not from the paper body.
  """
  valid_BT = _check(logp_BT, old_logp_BT, mask_BT)
  if not (tau_pos > 0 and tau_neg > 0):
    raise ValueError(f"tau_pos and tau_neg must be > 0; got {tau_pos}, {tau_neg}.")
  adv_BT = _token_adv(adv_BT, logp_BT)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=_CLAMP)
  ratio_BT = jnp.exp(log_ratio_BT)
  tau_BT = jnp.where(adv_BT > 0, tau_pos, tau_neg)
  gate_BT = jax.nn.sigmoid(tau_BT * (ratio_BT - 1.0)) * (4.0 / tau_BT)
  loss_BT = jnp.where(valid_BT, -gate_BT * adv_BT, 0.0)
  metrics = _metrics(ratio_BT, valid_BT, log_ratio_BT, valid_BT)
  metrics["gate_mean"] = _mean(gate_BT, valid_BT)
  return loss_BT, metrics


# ---------------------------------------------------------------------------------------------
# Sequence-ratio losses: GSPO, GMPO, HölderPO.
# ---------------------------------------------------------------------------------------------
def gspo_token(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array,
               mask_BT: jax.Array, *, eps_low: float = 3e-4,
               eps_high: float = 4e-4) -> tuple[jax.Array, Metrics]:
  """GSPO-token (Zheng et al. 2025, arXiv 2507.18071), per token [B, T].

  s_{i,t} = sg(s_i) · π(y_t)/sg(π(y_t)) (`ratios.sequence_token_log_ratio`, log clamped at 10);
  L_t = max(−A_t s, −A_t clip(s, 1 − eps_low, 1 + eps_high)), no dual clip. Defaults are the
  paper's ε (3e-4, 4e-4): these only make sense for the sequence ratio, never reuse 0.2.
  Aggregate with seq-mean-token-mean (verl forces it); with A_t = A_i this equals `gspo`.
  """
  valid_BT = _check(logp_BT, old_logp_BT, mask_BT)
  _clip_bounds(eps_low, eps_high)
  adv_BT = _token_adv(adv_BT, logp_BT)
  ratio_BT = jnp.exp(ratios.sequence_token_log_ratio(logp_BT, old_logp_BT, mask_BT))
  loss1_BT = -adv_BT * ratio_BT
  loss2_BT = -adv_BT * jnp.clip(ratio_BT, 1.0 - eps_low, 1.0 + eps_high)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=None)
  return jnp.where(valid_BT, jnp.maximum(loss1_BT, loss2_BT), 0.0), _metrics(
      ratio_BT, valid_BT, log_ratio_BT, valid_BT, clipfrac=loss2_BT > loss1_BT,
      clipfrac_high=(ratio_BT > 1 + eps_high) & (adv_BT > 0),
      clipfrac_low=(ratio_BT < 1 - eps_low) & (adv_BT < 0))


def _seq_ppo(log_ratio_B, adv_B, valid_B, lo: float, hi: float):
  """Pessimistic sequence-level PPO in log space: −A exp(min/max(M, clip(M, lo, hi)))."""
  selected_B = _pessimistic(log_ratio_B, jnp.clip(log_ratio_B, lo, hi), adv_B)
  loss_B = -adv_B * jnp.exp(jnp.minimum(selected_B, _LOG_F32_MAX))
  return jnp.where(valid_B, loss_B, 0.0)


def gspo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_B: jax.Array, mask_BT: jax.Array, *,
         eps_low: float = 3e-4, eps_high: float = 4e-4) -> tuple[jax.Array, Metrics]:
  """GSPO, sequence form (Zheng et al. 2025, arXiv 2507.18071), per sequence [B].

  s_i = exp(min((1/|y_i|) Σ_t m ℓ_t, 10)); L_i = max(−A_i s_i, −A_i clip(s_i, 1 − eps_low,
  1 + eps_high)). Aggregate with "seq-mean" over non-empty rows. Fractions are over rows.
  """
  valid_BT = _check(logp_BT, old_logp_BT, mask_BT)
  _clip_bounds(eps_low, eps_high)
  if not eps_low < 1.0:
    raise ValueError(f"GSPO needs eps_low < 1 (window [1 - eps_low, 1 + eps_high]); got {eps_low}.")
  adv_B, valid_B = _seq_adv(adv_B, mask_BT), valid_BT.any(-1)
  log_ratio_B = jnp.minimum(ratios.sequence_log_ratio(logp_BT, old_logp_BT, mask_BT), 10.0)
  loss_B = _seq_ppo(log_ratio_B, adv_B, valid_B, math.log(1 - eps_low), math.log(1 + eps_high))
  ratio_B = jnp.exp(log_ratio_B)
  high_B, low_B = (ratio_B > 1 + eps_high) & (adv_B > 0), (ratio_B < 1 - eps_low) & (adv_B < 0)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=None)
  return loss_B, _metrics(ratio_B, valid_B, log_ratio_BT, valid_BT, clipfrac=high_B | low_B,
                          clipfrac_high=high_B, clipfrac_low=low_B)


def gmpo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_B: jax.Array, mask_BT: jax.Array, *,
         eps_low: float = 0.4, eps_high: float = 0.4) -> tuple[jax.Array, Metrics]:
  """GMPO, geometric-mean PO (arXiv 2507.20673; verl `geo_mean`), per sequence [B].

  Each ℓ_t is clipped to [−eps_low, eps_high] in log space and the pessimistic value picked by
  the sign of A_i (min for A > 0, max for A < 0); L_i = −A_i exp((1/|y_i|) Σ_t m ℓ̂_t).
  Default ε = 0.4 (verl's example script). Aggregate with "seq-mean". `clipfrac` is verl's
  (ℓ outside the window and A > 0); ratio stats use the unclipped geometric-mean ratio.
  """
  valid_BT = _check(logp_BT, old_logp_BT, mask_BT)
  _clip_bounds(eps_low, eps_high)
  adv_B, valid_B = _seq_adv(adv_B, mask_BT), valid_BT.any(-1)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=None)
  clipped_BT = jnp.clip(log_ratio_BT, -eps_low, eps_high)
  adv_BT = jnp.broadcast_to(adv_B[:, None], log_ratio_BT.shape)
  selected_BT = jnp.where(valid_BT, _pessimistic(log_ratio_BT, clipped_BT, adv_BT), 0.0)
  length_B = jnp.maximum(valid_BT.sum(-1).astype(jnp.float32), 1.0)
  loss_B = jnp.where(valid_B, -adv_B * jnp.exp(selected_BT.sum(-1) / length_B), 0.0)
  ratio_B = jnp.exp(log_ratio_BT.sum(-1) / length_B)
  metrics = _metrics(ratio_B, valid_B, log_ratio_BT, valid_BT)
  metrics.update(
      clipfrac=_mean((log_ratio_BT != clipped_BT) & (adv_BT > 0), valid_BT),
      clipfrac_high=_mean((log_ratio_BT > eps_high) & (adv_BT > 0), valid_BT),
      clipfrac_low=_mean((log_ratio_BT < -eps_low) & (adv_BT < 0), valid_BT))
  return loss_B, metrics


def holder_po(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_B: jax.Array, mask_BT: jax.Array,
              *, p: float | jax.Array, eps_low: float = 0.2, eps_high: float = 0.2,
              token_clip: bool = False) -> tuple[jax.Array, Metrics]:
  """HölderPO (arXiv 2605.12058; official ALFWorld code), per sequence [B].

  ρ_i = exp(M_p), M_p the log power mean of the token ratios (`ratios.holder_log_ratio`,
  unclamped ℓ as in the reference). Default (`holder_seq`): sequence-level clip in log space,
  L_i = −A_i exp(min(M, clip(M, log(1 − eps_low), log(1 + eps_high)))) for A > 0 (max for
  A < 0) = max(−A ρ, −A clip(ρ, 1 − eps_low, 1 + eps_high)). `token_clip=True`
  (`holder_token`, §2.3): each ℓ_t is first replaced by its pessimistic clip at
  [log(1 − eps_low), log(1 + eps_high)] by the sign of A_i, then L_i = −A_i exp(M_p(ℓ̂)).
  No dual clip. Aggregate with "seq-mean" (one scalar per sequence, no length weighting).

  `p` may be traced (e.g. `schedules.holder_p(step, ...)` inside the jitted step); p = 1 gives
  a GRPO-like gradient, p → 0 GSPO's ratio, p > 1 concentrates on tokens whose probability rose.
  On-policy the gradient is −A_i/|y_i| Σ_t ∇logp_t for every p.
  """
  valid_BT = _check(logp_BT, old_logp_BT, mask_BT)
  if not 0.0 <= eps_low < 1.0 or eps_high < 0.0:
    raise ValueError(f"Need 0 <= eps_low < 1 and eps_high >= 0; got {eps_low}, {eps_high}.")
  lo, hi = math.log1p(-eps_low), math.log1p(eps_high)
  adv_B, valid_B = _seq_adv(adv_B, mask_BT), valid_BT.any(-1)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=None)
  holder_B = ratios.holder_log_ratio(log_ratio_BT, mask_BT, p=p)
  adv_BT = jnp.broadcast_to(adv_B[:, None], log_ratio_BT.shape)
  if token_clip:
    clipped_BT = jnp.clip(log_ratio_BT, lo, hi)
    selected_BT = _pessimistic(log_ratio_BT, clipped_BT, adv_BT)
    selected_B = ratios.holder_log_ratio(selected_BT, mask_BT, p=p)
    loss_B = jnp.where(valid_B, -adv_B * jnp.exp(jnp.minimum(selected_B, _LOG_F32_MAX)), 0.0)
    fracs = dict(clipfrac=log_ratio_BT != clipped_BT,
                 clipfrac_high=(log_ratio_BT > hi) & (adv_BT > 0),
                 clipfrac_low=(log_ratio_BT < lo) & (adv_BT < 0))
    fracs = {k: _mean(v, valid_BT) for k, v in fracs.items()}
  else:
    loss_B = _seq_ppo(holder_B, adv_B, valid_B, lo, hi)
    fracs = dict(clipfrac=(holder_B > hi) | (holder_B < lo),
                 clipfrac_high=(holder_B > hi) & (adv_B > 0),
                 clipfrac_low=(holder_B < lo) & (adv_B < 0))
    fracs = {k: _mean(v, valid_B) for k, v in fracs.items()}
  ratio_B = jnp.exp(jnp.minimum(holder_B, _LOG_F32_MAX))
  metrics = _metrics(ratio_B, valid_B, log_ratio_BT, valid_BT)
  metrics.update(fracs, holder_p=jax.lax.stop_gradient(jnp.asarray(p, jnp.float32)))
  return loss_B, metrics


# ---------------------------------------------------------------------------------------------
# R2VPO (reconstruction) and entropy-mechanism losses.
# ---------------------------------------------------------------------------------------------
def r2vpo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array, *,
          lam: float | jax.Array, delta: float, level: str = "token", center: str = "one",
          staleness_B: jax.Array | None = None, stale_decay: float = 1.0,
          ratio_cap: float | None = None) -> tuple[jax.Array, Metrics]:
  """R2VPO primal loss, ratio-variance penalty instead of clipping (arXiv 2601.03320).

  Reconstruction (algorithms.md §3.2; no official code or paper body was available):
    L_t = w_i · (−A_t r_t + sg(λ) (r_t − c)²)
  with the Lagrangian max E[rA] s.t. E[(r − c)²] ≤ δ. The per-token gradient is
  −w r (A − 2λ(r − c)) ∇logp: drifted samples get a smoothly shrunk or reversed effective
  advantage rather than a zero gradient. λ is detached here and updated by
  `r2vpo_dual_update(lam, metrics["ratio_var"], delta=..., lr=...)`.

  Every option below is [INF] (a design proposal, not the paper's confirmed choice):
    level: "token" uses r_t = exp(clip(ℓ_t, ±20)) (aggregate token-mean); "sequence" uses
      GSPO's s_i on every token with gradient s_i ∇logp_t (aggregate seq-mean-token-mean,
      which then equals the sequence-level objective).
    center: "one" uses c = 1 (E_μ[r] = 1, Pearson χ²); "mean" uses c = sg(batch mean ratio)
      (exact variance gradient under the matching aggregation; differs from "one" when stale).
    staleness_B, stale_decay: stale-sample reweighting w_i = stale_decay ** staleness_B
      (detached; staleness in policy versions). Default: no reweighting.
    ratio_cap: optional safety cap r ← min(r, cap) (gradient 0 above it); default none.
    delta: the constraint level δ, used for the logged `constraint_residual` = ratio_var − δ.

  Metrics add ratio_var (V̂: mean of (r − c)² over valid tokens, or rows at sequence level),
  constraint_residual, lam, and capfrac (fraction at the cap).
  """
  valid_BT = _check(logp_BT, old_logp_BT, mask_BT)
  if level not in ("token", "sequence"):
    raise ValueError(f"Unknown R2VPO level {level!r}; use 'token' or 'sequence'.")
  if center not in ("one", "mean"):
    raise ValueError(f"Unknown R2VPO center {center!r}; use 'one' or 'mean'.")
  if ratio_cap is not None and not ratio_cap > 1.0:
    raise ValueError(f"ratio_cap must be > 1 (or None); got {ratio_cap}.")
  adv_BT = _token_adv(adv_BT, logp_BT)
  if level == "token":
    log_r_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=_CLAMP)
    unit_valid = valid_BT  # the variance is estimated over tokens
  else:
    log_r_BT = ratios.sequence_token_log_ratio(logp_BT, old_logp_BT, mask_BT)
    unit_valid = valid_BT.any(-1)  # ... or over sequences
  cap_BT = jnp.zeros_like(valid_BT)
  if ratio_cap is not None:
    cap_BT = log_r_BT > math.log(ratio_cap)
    log_r_BT = jnp.minimum(log_r_BT, math.log(ratio_cap))
  r_BT = jnp.exp(log_r_BT)
  units = r_BT if level == "token" else r_BT.max(-1, where=valid_BT, initial=0.0)
  c = 1.0 if center == "one" else _mean(units, unit_valid)
  lam = jax.lax.stop_gradient(jnp.asarray(lam, jnp.float32))
  loss_BT = -adv_BT * r_BT + lam * (r_BT - c) ** 2
  if staleness_B is not None:
    weight_B = jax.lax.stop_gradient(stale_decay ** jnp.asarray(staleness_B, jnp.float32))
    loss_BT = loss_BT * weight_B[:, None]
  ratio_var = _mean((units - c) ** 2, unit_valid)
  metrics = _metrics(units, unit_valid, ratios.token_log_ratio(
      logp_BT, old_logp_BT, mask_BT, clamp=_CLAMP), valid_BT)
  metrics.update(ratio_var=ratio_var, constraint_residual=ratio_var - delta, lam=lam,
                 capfrac=_mean(cap_BT, valid_BT))
  return jnp.where(valid_BT, loss_BT, 0.0), metrics


def r2vpo_dual_update(lam: float | jax.Array, ratio_var: jax.Array, *, delta: float,
                      lr: float) -> jax.Array:
  """Projected dual ascent for R2VPO's multiplier: λ ← max(0, λ + lr (V̂ − δ)). [INF]

  Raises λ while the ratio variance exceeds δ and lowers it otherwise, never below 0. The
  step size, δ and the initial λ are not known from the paper (algorithms.md §3.2).
  """
  lam = jnp.asarray(lam, jnp.float32)
  return jnp.maximum(0.0, lam + lr * (jax.lax.stop_gradient(ratio_var) - delta))


def _covariance(adv_BT, logp_BT, valid_BT):
  """Per-token (A − mean A)(logp − mean logp) over valid tokens, detached (Cui et al. 2025)."""
  logp_BT = jax.lax.stop_gradient(logp_BT.astype(jnp.float32))
  return (adv_BT - _mean(adv_BT, valid_BT)) * (logp_BT - _mean(logp_BT, valid_BT))


def _ranks(key_BT):
  """Rank of each entry in ascending order of `key_BT`, over the flattened batch (stable)."""
  flat = key_BT.reshape(-1)
  return jnp.argsort(jnp.argsort(flat)).reshape(key_BT.shape)


def clip_cov(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array,
             *, rng: jax.Array, eps_low: float = 0.2, eps_high: float = 0.2,
             clip_cov_ratio: float = 2e-4, clip_cov_lb: float = 1.0,
             clip_cov_ub: float = 5.0) -> tuple[jax.Array, Metrics]:
  """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617).

  PPO clip (no dual clip) plus: among valid tokens not already clipped whose covariance
  (A − Ā)(logp − mean logp) lies in (clip_cov_lb, clip_cov_ub), max(1, ⌊clip_cov_ratio·N⌋)
  tokens (N valid tokens in the batch), chosen uniformly at random with `rng`, are excluded:
  their loss is multiplied by 0, so they send no gradient but stay in the token-mean
  denominator (verl `compute_policy_loss_clip_cov`). Aggregate with token-mean.
  Metrics add cov_clipfrac (verl's pg_clipfrac for this loss: the excluded fraction).
  """
  valid_BT = _check(logp_BT, old_logp_BT, mask_BT)
  _clip_bounds(eps_low, eps_high)
  if not clip_cov_ratio > 0:
    raise ValueError(f"clip_cov_ratio must be > 0; got {clip_cov_ratio}.")
  adv_BT = _token_adv(adv_BT, logp_BT)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=_CLAMP)
  ratio_BT = jnp.exp(log_ratio_BT)
  loss1_BT = -adv_BT * ratio_BT
  loss2_BT = -adv_BT * jnp.clip(ratio_BT, 1.0 - eps_low, 1.0 + eps_high)
  ppo_clipped_BT = loss2_BT > loss1_BT
  cov_BT = _covariance(adv_BT, logp_BT, valid_BT)
  candidate_BT = valid_BT & ~ppo_clipped_BT & (cov_BT > clip_cov_lb) & (cov_BT < clip_cov_ub)
  n_valid = valid_BT.sum().astype(jnp.float32)
  n_clip = jnp.maximum(jnp.floor(clip_cov_ratio * n_valid), 1.0)
  # A uniformly random subset of min(n_clip, #candidates): rank candidates by a uniform key.
  key_BT = jnp.where(candidate_BT, jax.random.uniform(rng, candidate_BT.shape), 2.0)
  excluded_BT = candidate_BT & (_ranks(key_BT) < n_clip)
  loss_BT = jnp.where(valid_BT & ~excluded_BT, jnp.maximum(loss1_BT, loss2_BT), 0.0)
  return loss_BT, _metrics(ratio_BT, valid_BT, log_ratio_BT, valid_BT,
                           clipfrac=ppo_clipped_BT,
                           clipfrac_high=(ratio_BT > 1 + eps_high) & (adv_BT > 0),
                           clipfrac_low=(ratio_BT < 1 - eps_low) & (adv_BT < 0),
                           cov_clipfrac=excluded_BT)


def kl_cov(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array,
           *, kl_cov_ratio: float = 2e-4,
           ppo_kl_coef: float = 1.0) -> tuple[jax.Array, Metrics]:
  """KL-Cov (Cui et al. 2025, arXiv 2505.22617; verl `compute_policy_loss_kl_cov`).

  Unclipped surrogate −A r on every token, plus ppo_kl_coef·|logp − old_logp| on the top
  max(1, ⌊kl_cov_ratio·N⌋) valid tokens by covariance (A − Ā)(logp − mean logp), N the number
  of valid tokens. r from ℓ clamped to ±20. Aggregate with token-mean. Metrics add
  ppo_kl_abs (verl's ppo_kl for this loss) and cov_kl_frac (the penalised fraction).
  """
  valid_BT = _check(logp_BT, old_logp_BT, mask_BT)
  if not kl_cov_ratio > 0:
    raise ValueError(f"kl_cov_ratio must be > 0; got {kl_cov_ratio}.")
  adv_BT = _token_adv(adv_BT, logp_BT)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=_CLAMP)
  ratio_BT = jnp.exp(log_ratio_BT)
  cov_BT = _covariance(adv_BT, logp_BT, valid_BT)
  n_top = jnp.maximum(jnp.floor(kl_cov_ratio * valid_BT.sum().astype(jnp.float32)), 1.0)
  top_BT = valid_BT & (_ranks(jnp.where(valid_BT, -cov_BT, jnp.inf)) < n_top)
  # sign(ℓ)·ℓ = |ℓ| with gradient sign(ℓ), 0 at ℓ = 0 like torch's abs in verl (jnp.abs has
  # gradient 1 there, which would bias the on-policy gradient away from REINFORCE).
  abs_kl_BT = jnp.sign(log_ratio_BT) * log_ratio_BT
  loss_BT = -adv_BT * ratio_BT + jnp.where(top_BT, ppo_kl_coef * abs_kl_BT, 0.0)
  metrics = _metrics(ratio_BT, valid_BT, log_ratio_BT, valid_BT, cov_kl_frac=top_BT)
  metrics["ppo_kl_abs"] = _mean(abs_kl_BT, valid_BT)
  return jnp.where(valid_BT, loss_BT, 0.0), metrics
