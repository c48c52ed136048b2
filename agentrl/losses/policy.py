# pylint: disable=invalid-name
"""Policy-gradient surrogates for LLM post-training: unreduced, masked, f32.

This module holds the token-level surrogates (REINFORCE, PPO, CTPO, CISPO, SAPO, R2VPO) and
re-exports the sequence-ratio losses of `agentrl.losses.sequence` (GSPO, GMPO, HölderPO) and
the covariance losses of `agentrl.losses.covariance` (Clip-Cov, KL-Cov), because the API
contract (docs/architecture.md §3) names every surrogate as `agentrl.losses.policy.<name>`.

Each function takes `logp_BT` (current policy; the only input meant to be differentiated),
`old_logp_BT` (behaviour policy, data), advantages and the loss mask, and returns
`(loss, metrics)`:

  * Token forms return `loss_BT` [B, T]; sequence forms (`gspo`, `gmpo`, `holder_po`) return
    `loss_B` [B]. Entries are exactly 0 where masked and for rows with no policy token.
  * The caller reduces once with `agentrl.losses.aggregation.aggregate`; the mode is part of
    the algorithm (docs/algorithms.md §0.3). Reference modes: token-mean for `vanilla_pg`,
    `ppo_clip`, `ctpo`, `cispo`, `clip_cov`, `kl_cov`, `r2vpo(level="token")`;
    seq-mean-token-mean for `gspo_token`, `sapo`, `r2vpo(level="sequence")` and the GRPO
    paper; "seq-mean" with `valid_B = mask_BT.sum(-1) > 0` for the sequence forms.
  * Token forms take `adv_BT`: a rank-2 array broadcastable to [B, T] (a sequence advantage
    is passed as `adv_B[:, None]`) or a scalar. Sequence forms take `adv_B` [B]; a rank-2
    token advantage is reduced to its masked row mean, as verl's GMPO and HölderPO's code do.
  * The rollout/trainer mismatch weight (`ratios.rollout_correction_weight`) is a separate
    detached factor: multiply the returned loss by it before aggregating.

Metrics are flat dicts of f32 scalars with no gradient; a name means the same in every loss
(docs/metrics.md lists what each experiment logs):
  ratio_mean, ratio_max  the per-token ratio r_t = π/π_old over valid tokens
  seq_ratio_mean, _max   the loss's sequence ratio (GSPO s_i, GMPO, HölderPO) over valid rows
  cum_ratio_mean, _max   (ctpo) the cumulative-token ratio ρ_t that CTPO clips, over tokens
  ppo_kl                 masked mean of −ℓ over valid tokens (verl)
  clipfrac               valid tokens whose loss term the token-level clip changes: for the
                         pessimistic PPO-style clips, the clipped term is taken (the token's
                         ratio gradient is removed), = clipfrac_high + clipfrac_low; CISPO: the
                         IS weight is truncated; HölderPO "sequence_w_clip": ℓ_t is clamped
  clipfrac_high          A > 0 and the ratio above the upper bound (gradient removed)
  clipfrac_low           A < 0 and the ratio below the lower bound (gradient removed)
  clipfrac_lower         (ppo_clip, ctpo) verl's pg_clipfrac_lower: A < 0 and dual clip active
  seq_clipfrac[_high|_low]  the same over sequences, for a clip on a sequence ratio
"""
import math

import jax
import jax.numpy as jnp

from agentrl.losses import common
from agentrl.losses import covariance
from agentrl.losses import ratios
from agentrl.losses import sequence

Metrics = common.Metrics

# The API contract (docs/architecture.md §3) names these as agentrl.losses.policy.<name>.
gspo = sequence.gspo
gspo_token = sequence.gspo_token
gmpo = sequence.gmpo
holder_po = sequence.holder_po
clip_cov = covariance.clip_cov
kl_cov = covariance.kl_cov


# ---------------------------------------------------------------------------------------------
# REINFORCE and PPO-family token losses.
# ---------------------------------------------------------------------------------------------
def vanilla_pg(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array,
               mask_BT: jax.Array) -> tuple[jax.Array, Metrics]:
  """REINFORCE (Williams 1992): L_t = −A_t · logp_t. `old_logp_BT` only feeds the metrics."""
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  adv_BT = common.token_adv(adv_BT, logp_BT)
  loss_BT = jnp.where(valid_BT, -adv_BT * logp_BT.astype(jnp.float32), 0.0)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=common.CLAMP)
  return loss_BT, common.ratio_metrics(jnp.exp(log_ratio_BT), valid_BT, log_ratio_BT, valid_BT)


def ppo_terms(ratio_BT, clipped_BT, adv_BT, threshold_BT, high_BT, low_BT, valid_BT,
              log_ratio_BT):
  """Dual-clip PPO per token (verl `compute_policy_loss_vanilla`); threshold None: no dual."""
  loss1_BT, loss2_BT = -adv_BT * ratio_BT, -adv_BT * clipped_BT
  loss_BT = jnp.maximum(loss1_BT, loss2_BT)
  dual_BT = jnp.zeros_like(valid_BT)
  if threshold_BT is not None:
    loss3_BT = -adv_BT * threshold_BT
    dual_BT = (loss_BT > loss3_BT) & (adv_BT < 0)
    loss_BT = jnp.where(adv_BT < 0, jnp.minimum(loss_BT, loss3_BT), loss_BT)
  metrics = common.ratio_metrics(
      ratio_BT, valid_BT, log_ratio_BT, valid_BT, clipfrac=loss2_BT > loss1_BT,
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
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  common.check_eps(eps_low, eps_high)
  if dual_clip is not None and not dual_clip > 1.0:
    raise ValueError(f"dual_clip must be > 1 (the dual-clip PPO bound c); got {dual_clip}.")
  adv_BT = common.token_adv(adv_BT, logp_BT)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=common.CLAMP)
  ratio_BT = jnp.exp(log_ratio_BT)
  return ppo_terms(ratio_BT, jnp.clip(ratio_BT, 1.0 - eps_low, 1.0 + eps_high), adv_BT,
                    dual_clip, ratio_BT > 1.0 + eps_high, ratio_BT < 1.0 - eps_low, valid_BT,
                    log_ratio_BT)


def ctpo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array, *,
         a_lo: float = 0.025, a_hi: float = 0.05, a_c: float = 0.05, kappa: float = 0.5,
         geomean: bool = False, clip_mode: str = "log_adaptive", eps_low: float = 0.2,
         eps_high: float = 0.2, dual_clip: float = 3.0) -> tuple[jax.Array, Metrics]:
  """CTPO: PPO with the cumulative-token ratio (arXiv 2605.07331; docs/algorithms.md §1.2).

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
  Metrics: the clip fractions are of ρ_t; `cum_ratio_mean`, `cum_ratio_max` are ρ_t's and
  `ratio_mean`, `ratio_max` the per-token r_t's, as in every loss.
  """
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  if clip_mode not in ("log_adaptive", "standard"):
    raise ValueError(f"Unknown CTPO clip_mode {clip_mode!r}; use 'log_adaptive' (CTPO-LA) or "
                     "'standard' (cum-token-cumprod).")
  adv_BT = common.token_adv(adv_BT, logp_BT)
  log_rho_BT, n_BT = ratios.cumulative_log_ratio(logp_BT, old_logp_BT, mask_BT, geomean=geomean,
                                                 clamp=common.CLAMP)
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
    common.check_eps(eps_low, eps_high)
    if not dual_clip > 1.0:
      raise ValueError(f"dual_clip must be > 1; got {dual_clip}.")
    clipped_BT = jnp.clip(rho_BT, 1.0 - eps_low, 1.0 + eps_high)
    threshold_BT = jnp.full_like(rho_BT, dual_clip)
    high_BT, low_BT = rho_BT > 1.0 + eps_high, rho_BT < 1.0 - eps_low
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=common.CLAMP)
  loss_BT, metrics = ppo_terms(rho_BT, clipped_BT, adv_BT, threshold_BT, high_BT, low_BT,
                                valid_BT, log_ratio_BT)
  # `ratio_*` is r_t in every loss, so the ρ_t that CTPO clips is logged under its own name.
  metrics["cum_ratio_mean"], metrics["cum_ratio_max"] = metrics["ratio_mean"], metrics["ratio_max"]
  ratio_BT = jnp.exp(log_ratio_BT)
  metrics.update(ratio_mean=common.stat_mean(ratio_BT, valid_BT),
                 ratio_max=common.stat_max(ratio_BT, valid_BT))
  return loss_BT, metrics


def cispo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array,
          *, eps_low: float = 10.0, eps_high: float = 0.2) -> tuple[jax.Array, Metrics]:
  """CISPO (MiniMax-M1, arXiv 2506.13585): L_t = −sg(clip(r_t, 1 − eps_low, 1 + eps_high)) A logp_t.

  The clipped IS weight is detached, so every token keeps its gradient (verl
  `compute_policy_loss_cispo`; r from ℓ clamped to ±20). Defaults follow verl's CISPO example:
  eps_low = 10 makes the lower bound inactive, eps_high = 0.2; the paper's own values were not
  verified (docs/algorithms.md §4.8). clipfrac_high / clipfrac_low here count truncated weights
  (regardless of the sign of A), not removed gradients.
  """
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  common.check_eps(eps_low, eps_high)
  adv_BT = common.token_adv(adv_BT, logp_BT)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=common.CLAMP)
  ratio_BT = jnp.exp(log_ratio_BT)
  weight_BT = jax.lax.stop_gradient(jnp.clip(ratio_BT, 1.0 - eps_low, 1.0 + eps_high))
  loss_BT = jnp.where(valid_BT, -weight_BT * adv_BT * logp_BT.astype(jnp.float32), 0.0)
  return loss_BT, common.ratio_metrics(
      ratio_BT, valid_BT, log_ratio_BT, valid_BT, clipfrac=ratio_BT != weight_BT,
      clipfrac_high=ratio_BT > 1 + eps_high, clipfrac_low=ratio_BT < 1 - eps_low)


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
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  if not (tau_pos > 0 and tau_neg > 0):
    raise ValueError(f"tau_pos and tau_neg must be > 0; got {tau_pos}, {tau_neg}.")
  adv_BT = common.token_adv(adv_BT, logp_BT)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=common.CLAMP)
  ratio_BT = jnp.exp(log_ratio_BT)
  tau_BT = jnp.where(adv_BT > 0, tau_pos, tau_neg)
  gate_BT = jax.nn.sigmoid(tau_BT * (ratio_BT - 1.0)) * (4.0 / tau_BT)
  loss_BT = jnp.where(valid_BT, -gate_BT * adv_BT, 0.0)
  metrics = common.ratio_metrics(ratio_BT, valid_BT, log_ratio_BT, valid_BT)
  metrics["gate_mean"] = common.stat_mean(gate_BT, valid_BT)
  return loss_BT, metrics


# ---------------------------------------------------------------------------------------------
# R2VPO (reconstruction).
# ---------------------------------------------------------------------------------------------
def r2vpo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array, *,
          lam: float | jax.Array, delta: float, level: str = "token", center: str = "one",
          staleness_B: jax.Array | None = None, stale_decay: float = 1.0,
          ratio_cap: float | None = None) -> tuple[jax.Array, Metrics]:
  """R2VPO primal loss, ratio-variance penalty instead of clipping (arXiv 2601.03320).

  Reconstruction (docs/algorithms.md §3.2; no official code or paper body was available):
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
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  if level not in ("token", "sequence"):
    raise ValueError(f"Unknown R2VPO level {level!r}; use 'token' or 'sequence'.")
  if center not in ("one", "mean"):
    raise ValueError(f"Unknown R2VPO center {center!r}; use 'one' or 'mean'.")
  if ratio_cap is not None and not ratio_cap > 1.0:
    raise ValueError(f"ratio_cap must be > 1 (or None); got {ratio_cap}.")
  adv_BT = common.token_adv(adv_BT, logp_BT)
  if level == "token":
    log_r_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=common.CLAMP)
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
  c = 1.0 if center == "one" else common.stat_mean(units, unit_valid)
  lam = jax.lax.stop_gradient(jnp.asarray(lam, jnp.float32))
  loss_BT = -adv_BT * r_BT + lam * (r_BT - c) ** 2
  if staleness_B is not None:
    weight_B = jax.lax.stop_gradient(stale_decay ** jnp.asarray(staleness_B, jnp.float32))
    loss_BT = loss_BT * weight_B[:, None]
  ratio_var = common.stat_mean((units - c) ** 2, unit_valid)
  metrics = common.ratio_metrics(units, unit_valid, ratios.token_log_ratio(
      logp_BT, old_logp_BT, mask_BT, clamp=common.CLAMP), valid_BT, seq=level == "sequence")
  metrics.update(ratio_var=ratio_var, constraint_residual=ratio_var - delta, lam=lam,
                 capfrac=common.stat_mean(cap_BT, valid_BT))
  return jnp.where(valid_BT, loss_BT, 0.0), metrics


def r2vpo_dual_update(lam: float | jax.Array, ratio_var: jax.Array, *, delta: float,
                      lr: float) -> jax.Array:
  """Projected dual ascent for R2VPO's multiplier: λ ← max(0, λ + lr (V̂ − δ)). [INF]

  Raises λ while the ratio variance exceeds δ and lowers it otherwise, never below 0. The
  step size, δ and the initial λ are not known from the paper (docs/algorithms.md §3.2).
  """
  lam = jnp.asarray(lam, jnp.float32)
  return jnp.maximum(0.0, lam + lr * (jax.lax.stop_gradient(ratio_var) - delta))
