# pylint: disable=invalid-name
"""Sequence-ratio policy losses: GSPO, GMPO and HölderPO.

Each method reduces a response's token ratios to one sequence ratio (GSPO's length-normalised
geometric mean, GMPO's clipped geometric mean, HölderPO's power mean) and clips at the
sequence level. Inputs, masking and metric keys follow the conventions in the
`agentrl.losses.policy` module docstring, which re-exports every function here (the API
contract names them there):

  * `gspo`, `gmpo`, `holder_po` return `loss_B` [B]; aggregate with "seq-mean" over
    non-empty rows (`valid_B = mask_BT.sum(-1) > 0`).
  * `gspo_token` returns `loss_BT` [B, T]; aggregate with seq-mean-token-mean.
  * `adv_B` is [B]; a rank-2 token advantage is reduced to its masked row mean, as verl's GMPO
    and HölderPO's code do.
"""
import math

import jax
import jax.numpy as jnp

from agentrl.losses import common
from agentrl.losses import ratios

Metrics = common.Metrics

HOLDER_CLIP_MODES = ("sequence", "token", "sequence_w_clip")


def _pessimistic(log_ratio, clipped, adv):
  """min(ℓ, ℓ_clip) for A > 0, max for A < 0, ℓ for A = 0 (HölderPO / GMPO selection)."""
  return jnp.where(adv > 0, jnp.minimum(log_ratio, clipped),
                   jnp.where(adv < 0, jnp.maximum(log_ratio, clipped), log_ratio))


def _seq_ppo(log_ratio_B, adv_B, valid_B, lo: float, hi: float):
  """Pessimistic sequence-level PPO in log space: −A exp(min/max(M, clip(M, lo, hi)))."""
  selected_B = _pessimistic(log_ratio_B, jnp.clip(log_ratio_B, lo, hi), adv_B)
  loss_B = -adv_B * jnp.exp(jnp.minimum(selected_B, common.LOG_F32_MAX))
  return jnp.where(valid_B, loss_B, 0.0)


def gspo_token(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array,
               mask_BT: jax.Array, *, eps_low: float = 3e-4,
               eps_high: float = 4e-4) -> tuple[jax.Array, Metrics]:
  """GSPO-token (Zheng et al. 2025, arXiv 2507.18071), per token [B, T].

  s_{i,t} = sg(s_i) · π(y_t)/sg(π(y_t)) (`ratios.sequence_token_log_ratio`, log clamped at 10);
  L_t = max(−A_t s, −A_t clip(s, 1 − eps_low, 1 + eps_high)), no dual clip. Defaults are the
  paper's ε (3e-4, 4e-4): these only make sense for the sequence ratio, never reuse 0.2.
  Aggregate with seq-mean-token-mean (verl forces it); with A_t = A_i this equals `gspo`.
  Metrics: `seq_ratio_*` are of s_i over rows (the value of every s_{i,t} of row i); the clip
  acts per token, so its fractions are over tokens (`clipfrac*`).
  """
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  common.check_eps(eps_low, eps_high)
  adv_BT = common.token_adv(adv_BT, logp_BT)
  ratio_BT = jnp.exp(ratios.sequence_token_log_ratio(logp_BT, old_logp_BT, mask_BT))
  loss1_BT = -adv_BT * ratio_BT
  loss2_BT = -adv_BT * jnp.clip(ratio_BT, 1.0 - eps_low, 1.0 + eps_high)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=None)
  # s_{i,t} has the value s_i on every token: its stats are the sequence ratio's, over rows
  # (`ratio_*` is the per-token π/π_old in every loss).
  valid_B = valid_BT.any(-1)
  metrics = common.ratio_metrics(ratio_BT.max(-1, where=valid_BT, initial=0.0), valid_B,
                                  log_ratio_BT, valid_BT, seq=True)
  metrics.update({k: common.stat_mean(v, valid_BT) for k, v in dict(
      clipfrac=loss2_BT > loss1_BT, clipfrac_high=(ratio_BT > 1 + eps_high) & (adv_BT > 0),
      clipfrac_low=(ratio_BT < 1 - eps_low) & (adv_BT < 0)).items()})
  return jnp.where(valid_BT, jnp.maximum(loss1_BT, loss2_BT), 0.0), metrics


def gspo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_B: jax.Array, mask_BT: jax.Array, *,
         eps_low: float = 3e-4, eps_high: float = 4e-4) -> tuple[jax.Array, Metrics]:
  """GSPO, sequence form (Zheng et al. 2025, arXiv 2507.18071), per sequence [B].

  s_i = exp(min((1/|y_i|) Σ_t m ℓ_t, 10)); L_i = max(−A_i s_i, −A_i clip(s_i, 1 − eps_low,
  1 + eps_high)). Aggregate with "seq-mean" over non-empty rows.
  Ratio stats and fractions are over rows (`seq_*`).
  """
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  common.check_eps(eps_low, eps_high)
  if not eps_low < 1.0:
    raise ValueError(f"GSPO needs eps_low < 1 (window [1 - eps_low, 1 + eps_high]); got {eps_low}.")
  adv_B, valid_B = common.seq_adv(adv_B, mask_BT), valid_BT.any(-1)
  log_ratio_B = jnp.minimum(ratios.sequence_log_ratio(logp_BT, old_logp_BT, mask_BT), 10.0)
  loss_B = _seq_ppo(log_ratio_B, adv_B, valid_B, math.log(1 - eps_low), math.log(1 + eps_high))
  ratio_B = jnp.exp(log_ratio_B)
  high_B, low_B = (ratio_B > 1 + eps_high) & (adv_B > 0), (ratio_B < 1 - eps_low) & (adv_B < 0)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=None)
  return loss_B, common.ratio_metrics(ratio_B, valid_B, log_ratio_BT, valid_BT, seq=True,
                                       clipfrac=high_B | low_B, clipfrac_high=high_B,
                                       clipfrac_low=low_B)


def gmpo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_B: jax.Array, mask_BT: jax.Array, *,
         eps_low: float = 0.4, eps_high: float = 0.4) -> tuple[jax.Array, Metrics]:
  """GMPO, geometric-mean PO (arXiv 2507.20673; verl `geo_mean`), per sequence [B].

  Each ℓ_t is clipped to [−eps_low, eps_high] in log space and the pessimistic value picked by
  the sign of A_i (min for A > 0, max for A < 0); L_i = −A_i exp((1/|y_i|) Σ_t m ℓ̂_t).
  Default ε = 0.4 (verl's example script). Aggregate with "seq-mean". `clipfrac` counts the
  tokens whose clipped ℓ̂ is the one selected (= clipfrac_high + clipfrac_low), as for every
  pessimistic clip here; verl's GMPO logs ℓ outside the window with A > 0 instead, which also
  counts A > 0 tokens below it, where the clip changes nothing. `seq_ratio_*` are of the
  unclipped geometric-mean ratio.
  """
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  common.check_eps(eps_low, eps_high)
  adv_B, valid_B = common.seq_adv(adv_B, mask_BT), valid_BT.any(-1)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=None)
  clipped_BT = jnp.clip(log_ratio_BT, -eps_low, eps_high)
  adv_BT = jnp.broadcast_to(adv_B[:, None], log_ratio_BT.shape)
  selected_BT = jnp.where(valid_BT, _pessimistic(log_ratio_BT, clipped_BT, adv_BT), 0.0)
  length_B = jnp.maximum(valid_BT.sum(-1).astype(jnp.float32), 1.0)
  loss_B = jnp.where(valid_B, -adv_B * jnp.exp(selected_BT.sum(-1) / length_B), 0.0)
  ratio_B = jnp.exp(log_ratio_BT.sum(-1) / length_B)
  metrics = common.ratio_metrics(ratio_B, valid_B, log_ratio_BT, valid_BT, seq=True)
  metrics.update(
      clipfrac=common.stat_mean(selected_BT != log_ratio_BT, valid_BT),
      clipfrac_high=common.stat_mean((log_ratio_BT > eps_high) & (adv_BT > 0), valid_BT),
      clipfrac_low=common.stat_mean((log_ratio_BT < -eps_low) & (adv_BT < 0), valid_BT))
  return loss_B, metrics


def holder_po(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_B: jax.Array, mask_BT: jax.Array,
              *, p: float | jax.Array, eps_low: float = 0.2, eps_high: float = 0.2,
              clip_mode: str = "sequence") -> tuple[jax.Array, Metrics]:
  """HölderPO (arXiv 2605.12058; docs/algorithms.md §2), per sequence [B].

  ρ_i = exp(M_p), M_p the log power mean of the token ratios (`ratios.holder_log_ratio`,
  unclamped ℓ as in the reference). The three clip modes are the authors' maths learner's
  `critic_type_modify` variants (YihangChen9/HolderPO `train_zero_math_holder.py`):

    "sequence" (`holder`, the default; also the ALFWorld code): sequence-level clip in log
      space, L_i = −A_i exp(min(M, clip(M, log(1 − eps_low), log(1 + eps_high)))) for A > 0
      (max for A < 0) = max(−A ρ, −A clip(ρ, 1 − eps_low, 1 + eps_high)).
    "token" (`holder_token`, §2.3): each ℓ_t is first replaced by its pessimistic clip at
      [log(1 − eps_low), log(1 + eps_high)] by the sign of A_i, then L_i = −A_i exp(M_p(ℓ̂)),
      with no sequence clip.
    "sequence_w_clip" (maths learner, commit 73bcbc5): each ℓ_t is clamped to
      [−log(1 + eps_low), log(1 + eps_high)] whatever the sign of A_i (clamped tokens send no
      gradient), then the "sequence" clip is applied to ρ_i = exp(M_p(ℓ̂)). The authors use
      one ε with δ = log(1 + ε) on both sides, so the lower token bound is 1/(1 + ε) (0.833
      at ε = 0.2), not the ratio clip's 1 − ε. A power mean stays within its inputs' range,
      and [1/(1 + eps_low), 1 + eps_high] ⊂ [1 − eps_low, 1 + eps_high], so the sequence clip
      never binds here (kept as in the reference): the trust region is the token clamp.
      [INF] With eps_low ≠ eps_high the lower token bound −log(1 + eps_low) is our
      generalisation; at eps_low = eps_high it is exactly the reference.

  No dual clip. Aggregate with "seq-mean" (one scalar per sequence, no length weighting).
  Metrics: `seq_ratio_*` are of the Hölder ratio ρ that enters the loss (as the authors log
  them); the sequence clip's fractions over rows are `seq_clipfrac*`, the token clip's (mode
  "token", and the token clamp of "sequence_w_clip") over tokens are `clipfrac*`.

  `p` may be traced (e.g. `schedules.holder_p(step, ...)` inside the jitted step); p = 1 gives
  a GRPO-like gradient, p → 0 GSPO's ratio, p > 1 concentrates on tokens whose probability rose.
  On-policy the gradient is −A_i/|y_i| Σ_t ∇logp_t for every p and every clip mode.
  """
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  if clip_mode not in HOLDER_CLIP_MODES:
    raise ValueError(f"Unknown HölderPO clip_mode {clip_mode!r}; use one of {HOLDER_CLIP_MODES}.")
  if not 0.0 <= eps_low < 1.0 or eps_high < 0.0:
    raise ValueError(f"Need 0 <= eps_low < 1 and eps_high >= 0; got {eps_low}, {eps_high}.")
  lo, hi = math.log1p(-eps_low), math.log1p(eps_high)
  adv_B, valid_B = common.seq_adv(adv_B, mask_BT), valid_BT.any(-1)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=None)
  adv_BT = jnp.broadcast_to(adv_B[:, None], log_ratio_BT.shape)
  if clip_mode == "token":
    holder_B = ratios.holder_log_ratio(log_ratio_BT, mask_BT, p=p)
    clipped_BT = jnp.clip(log_ratio_BT, lo, hi)
    selected_BT = _pessimistic(log_ratio_BT, clipped_BT, adv_BT)
    selected_B = ratios.holder_log_ratio(selected_BT, mask_BT, p=p)
    loss_B = -adv_B * jnp.exp(jnp.minimum(selected_B, common.LOG_F32_MAX))
    loss_B = jnp.where(valid_B, loss_B, 0.0)
    fracs = dict(clipfrac=selected_BT != log_ratio_BT,  # the clipped ℓ̂ is the one taken
                 clipfrac_high=(log_ratio_BT > hi) & (adv_BT > 0),
                 clipfrac_low=(log_ratio_BT < lo) & (adv_BT < 0))
    fracs = {k: common.stat_mean(v, valid_BT) for k, v in fracs.items()}
  else:
    token_BT, token_fracs = log_ratio_BT, {}
    if clip_mode == "sequence_w_clip":
      # Masked entries are 0, inside the window, so they stay 0.
      token_BT = jnp.clip(log_ratio_BT, -math.log1p(eps_low), hi)
      token_fracs["clipfrac"] = common.stat_mean(token_BT != log_ratio_BT, valid_BT)
    holder_B = ratios.holder_log_ratio(token_BT, mask_BT, p=p)
    loss_B = _seq_ppo(holder_B, adv_B, valid_B, lo, hi)
    fracs = dict(seq_clipfrac=(holder_B > hi) | (holder_B < lo),
                 seq_clipfrac_high=(holder_B > hi) & (adv_B > 0),
                 seq_clipfrac_low=(holder_B < lo) & (adv_B < 0))
    fracs = {k: common.stat_mean(v, valid_B) for k, v in fracs.items()} | token_fracs
  ratio_B = jnp.exp(jnp.minimum(holder_B, common.LOG_F32_MAX))
  metrics = common.ratio_metrics(ratio_B, valid_B, log_ratio_BT, valid_BT, seq=True)
  metrics.update(fracs, holder_p=jax.lax.stop_gradient(jnp.asarray(p, jnp.float32)))
  return loss_B, metrics
