# pylint: disable=invalid-name
"""Importance ratios between the current and the behaviour policy, in log space.

The ratio is the part of a policy-gradient objective that varies most between methods
(docs/algorithms.md §0.2 notation; ℓ_t = logp_t − old_logp_t, r_t = exp(ℓ_t)):

  token_log_ratio            ℓ_t, clamped to ±20 before any exp (verl; PPO, CISPO, CTPO).
  sequence_log_ratio         (1/|y|) Σ_t m ℓ_t: log of GSPO's length-normalised ratio
                             (Zheng et al. 2025, arXiv 2507.18071).
  sequence_token_log_ratio   GSPO-token: value log s_i, gradient ∇logp_t (stop-gradient split).
  cumulative_log_ratio       CTPO (arXiv 2605.07331): log Π_{s≤t} r_s over policy tokens only,
                             value S_t, gradient ∇logp_t.
  holder_log_ratio           HölderPO (arXiv 2605.12058): log of the power mean of r with
                             exponent p; p = 0 is the geometric mean (GSPO ratio).
  rollout_correction_weight  truncated IS weight for the rollout/trainer mismatch
                             (verl `compute_rollout_correction_weights`, docs/algorithms.md §4.12).
  rollout_rejection_mask     masked IS: 0/1, whether that weight lies in [1/threshold, threshold].

Masks are 1 on policy-sampled tokens and 0 on prompt, padding and tool/observation tokens.
Every function treats masked entries as absent: they add nothing to sums, counts or maxima,
and they receive exactly zero gradient, whatever `logp` holds there.
"""
import chex
import jax
import jax.numpy as jnp

_LOG_RATIO_CLAMP = 20.0  # verl clamps per-token log-ratios to ±20 before exp.
_MAX_LOG_RATIO = 10.0  # verl/CTPO clamp stop-gradient-decomposed log-ratios at max 10.
# holder_log_ratio shifts z = p(ℓ − μ) by its max only above this: exp(60) · 1e12 tokens is
# still finite in f32, and a shift costs ~1e-7 · shift / |p| of accuracy in M_p.
_NO_SHIFT_MAX = 60.0
# |p| below this uses the geometric-mean branch. The HölderPO reference switches at 1e-6; the
# centred form below stays accurate much lower, and M_p − M_0 ≈ p Var(ℓ)/2 is negligible here.
_GEOMETRIC_P = 1e-12


def _check(logp_BT: jax.Array, old_logp_BT: jax.Array, mask_BT: jax.Array) -> None:
  chex.assert_rank(logp_BT, 2)
  chex.assert_equal_shape([logp_BT, old_logp_BT, mask_BT])


def token_log_ratio(logp_BT: jax.Array, old_logp_BT: jax.Array, mask_BT: jax.Array, *,
                    clamp: float | None = _LOG_RATIO_CLAMP) -> jax.Array:
  """ℓ_t = clip(logp_t − old_logp_t, −clamp, clamp), exactly 0 where masked. f32 [B, T].

  The gradient through an active clamp is 0 (intended; docs/algorithms.md §0.4). `clamp=None`
  leaves ℓ unclamped (GSPO, GMPO and HölderPO references do not clamp).
  """
  _check(logp_BT, old_logp_BT, mask_BT)
  log_ratio_BT = logp_BT.astype(jnp.float32) - old_logp_BT.astype(jnp.float32)
  if clamp is not None:
    log_ratio_BT = jnp.clip(log_ratio_BT, -clamp, clamp)
  # `where`, not a product: garbage (inf/NaN) log-probs on masked tokens must not leak.
  return jnp.where(mask_BT > 0, log_ratio_BT, 0.0)


def sequence_log_ratio(logp_BT: jax.Array, old_logp_BT: jax.Array,
                       mask_BT: jax.Array) -> jax.Array:
  """GSPO log s_i = (1/|y_i|) Σ_t m_t ℓ_t (unclamped, as verl), f32 [B]; 0 for empty rows."""
  log_ratio_BT = token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=None)
  count_B = (mask_BT > 0).sum(-1).astype(jnp.float32)
  return log_ratio_BT.sum(-1) / jnp.maximum(count_B, 1.0)


def sequence_token_log_ratio(logp_BT: jax.Array, old_logp_BT: jax.Array, mask_BT: jax.Array,
                             *, max_log_ratio: float = _MAX_LOG_RATIO) -> jax.Array:
  """GSPO-token log-ratio: min(sg(log s_i) + logp_t − sg(logp_t), 10), 0 where masked.

  Value log s_i on every token of row i; gradient ∇logp_t only (verl
  `compute_policy_loss_gspo`). With a sequence advantage and seq-mean-token-mean aggregation
  this reproduces the sequence-level GSPO gradient exactly.
  """
  log_seq_B = sequence_log_ratio(logp_BT, old_logp_BT, mask_BT)
  logp_BT = logp_BT.astype(jnp.float32)
  log_BT = (jax.lax.stop_gradient(log_seq_B)[:, None] + logp_BT
            - jax.lax.stop_gradient(logp_BT))
  return jnp.where(mask_BT > 0, jnp.minimum(log_BT, max_log_ratio), 0.0)


def cumulative_log_ratio(logp_BT: jax.Array, old_logp_BT: jax.Array, mask_BT: jax.Array, *,
                         geomean: bool = False, clamp: float = _LOG_RATIO_CLAMP,
                         max_log_ratio: float = _MAX_LOG_RATIO) -> tuple[jax.Array, jax.Array]:
  """CTPO cumulative log-ratio and policy-token position (docs/algorithms.md §1.2 steps 1–4).

  S_t = Σ_{s≤t} m_s ℓ_s and n_t = Σ_{s≤t} m_s run over policy tokens only, so tool and
  observation tokens neither add to the prefix ratio nor advance the position. The returned
  log-ratio is min(sg(S_t) + logp_t − sg(logp_t), max_log_ratio): its value is log Π_{s≤t} r_s
  but token t sends gradient only into logp_t (the prefix is a weight). Differentiating
  through S_t instead would be a different, O(T²)-coupled estimator.

  Args:
    geomean: use S_t / n_t, the log geometric mean of the ratios up to t (CTPO ablation
      `cum-token-geomean`; at the last token it equals GSPO's log s_i).
    clamp: per-token |ℓ| clamp before the cumulative sum (CTPO reference: 20).
    max_log_ratio: upper clamp on the decomposed log-ratio (CTPO reference: 10).

  Returns:
    (log_ratio_BT, n_BT): f32 [B, T] each. log_ratio is 0 where masked; n_BT counts policy
    tokens up to and including t (1 at the first policy token; masked positions hold the
    count so far).
  """
  valid_BT = mask_BT > 0
  log_ratio_BT = token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=clamp)
  cum_BT = jnp.cumsum(log_ratio_BT, axis=-1)  # masked entries are 0: a masked cumsum
  n_BT = jnp.cumsum(valid_BT.astype(jnp.float32), axis=-1)
  if geomean:
    cum_BT = cum_BT / jnp.maximum(n_BT, 1.0)
  logp_BT = logp_BT.astype(jnp.float32)
  log_BT = jax.lax.stop_gradient(cum_BT) + logp_BT - jax.lax.stop_gradient(logp_BT)
  return jnp.where(valid_BT, jnp.minimum(log_BT, max_log_ratio), 0.0), n_BT


def holder_log_ratio(log_ratio_BT: jax.Array, mask_BT: jax.Array, *,
                     p: float | jax.Array) -> jax.Array:
  """Log Hölder (power) mean of the token ratios, M_p = log((1/L) Σ_t r_t^p)^(1/p). f32 [B].

  HölderPO (arXiv 2605.12058, §3; docs/algorithms.md §2.2, §2.7). L is each row's number of valid
  tokens. p = 1 is the arithmetic mean of r, p = −1 the harmonic mean, p → ±∞ the max / min,
  and p = 0 (|p| < 1e-12) the geometric mean (1/L) Σ_t m_t ℓ_t (the function is continuous).
  ∂M_p/∂ℓ_t = softmax_t(p ℓ) over valid tokens.

  Computed relative to the row mean μ of ℓ, with z_t = p (ℓ_t − μ):
    M_p = μ + (s + log((1/L) Σ_t exp(z_t − s))) / p,
  where log(mean(exp(z − s))) is log1p(mean(expm1(z − s))) while that mean is above −1/2
  (else log Σ exp − log L), and s = max_t z_t only if it exceeds 60 (else 0).
  Why: the textbook form (logsumexp(p ℓ) − log L) / p cancels log L against the logsumexp and
  divides the f32 rounding (~1e-7 · log L) by p; at L = 4096 and 1e-6 ≤ |p| ≤ 1e-3 it is off by
  2–240 % of M_p for LLM-sized ℓ. Here M_p − μ ≈ p Var(ℓ)/2 is formed directly: relative
  error ≲ 1e-6 from |p| = 1e-7 up. The shift s only prevents overflow of exp; it is skipped
  otherwise because adding and subtracting it costs ~1e-7 · s / |p|. μ and s are constants
  of the math (M_p does not depend on them), so they are stop-gradient and ∂M_p/∂ℓ_t is the
  softmax exactly. ∂M_p/∂p is finite everywhere but only accurate for |p| ≳ 1e-4 (rounding
  divided by p), and 0 on the geometric branch.

  `p` may be a traced scalar (a schedule inside a jitted step): both branches are computed
  and selected with `where`. Rows with no valid token return 0 with finite (zero) gradients.
  """
  chex.assert_rank(log_ratio_BT, 2)
  chex.assert_equal_shape([log_ratio_BT, mask_BT])
  valid_BT = mask_BT > 0
  count_B = valid_BT.sum(-1).astype(jnp.float32)
  nonempty_B = count_B > 0
  length_B = jnp.maximum(count_B, 1.0)
  x_BT = jnp.where(valid_BT, log_ratio_BT.astype(jnp.float32), 0.0)
  mu_B = jax.lax.stop_gradient(x_BT.sum(-1) / length_B)
  # Masked entries get d = 0 (not −inf), so exp/expm1 below stay finite there: no NaN
  # cotangents behind the `where`s.
  d_BT = jnp.where(valid_BT, x_BT - mu_B[:, None], 0.0)
  # μ + mean(d) is a second pass over the rounding of μ (a compensated mean).
  geometric_B = mu_B + d_BT.sum(-1) / length_B

  p = jnp.asarray(p, jnp.float32)
  near_zero = jnp.abs(p) < _GEOMETRIC_P
  p_safe = jnp.where(near_zero, 1.0, p)  # keeps the unused branch finite (double where)
  z_BT = p_safe * d_BT
  z_max_B = jnp.where(valid_BT, z_BT, -jnp.inf).max(-1)
  shift_B = jax.lax.stop_gradient(
      jnp.where(nonempty_B & (z_max_B > _NO_SHIFT_MAX), z_max_B, 0.0))
  z_BT = z_BT - shift_B[:, None]  # <= 60 on valid tokens: exp stays finite
  sum_B = jnp.where(nonempty_B, jnp.where(valid_BT, jnp.exp(z_BT), 0.0).sum(-1), 1.0)
  # a = mean(exp(z)) − 1, summed as expm1 so the O(p²) part is not lost next to 1. Its gradient
  # comes from the exp sum: jnp.expm1's derivative is expm1 + 1, which rounds away the small
  # exp(z) of tokens far below the max (1e-4 relative error in their softmax weight).
  a_B = jnp.where(valid_BT, jnp.expm1(z_BT), 0.0).sum(-1) / length_B
  mean_exp_B = sum_B / length_B
  a_B = jax.lax.stop_gradient(a_B) + (mean_exp_B - jax.lax.stop_gradient(mean_exp_B))
  # When one token dominates, 1 + a ~ 1/L and loses digits; log of the exp sum is exact then.
  log_mean_B = jnp.where(a_B > -0.5, jnp.log1p(jnp.maximum(a_B, -0.5)),
                         jnp.log(sum_B) - jnp.log(length_B))
  power_B = mu_B + (shift_B + log_mean_B) / p_safe
  return jnp.where(nonempty_B, jnp.where(near_zero, geometric_B, power_B), 0.0)


def rollout_correction_weight(old_logp_BT: jax.Array, sampler_logp_BT: jax.Array,
                              mask_BT: jax.Array, *, level: str = "token",
                              threshold: float = 2.0,
                              batch_normalize: bool = False) -> jax.Array:
  """Truncated IS weight for the sampler/trainer mismatch (verl rollout correction, TIS).

  level="token":    w_t = min(exp(clip(old_logp_t − sampler_logp_t, ±20)), threshold).
  level="sequence": w_i = min(exp(clip(Σ_t m (old_logp_t − sampler_logp_t), ±20)), threshold),
                    broadcast to the row's tokens.
  The weight is detached (it changes the measure, not the objective), 0 where masked, and
  multiplies the per-token policy loss before aggregation. It is a separate factor from any
  method's own ratio (docs/algorithms.md §1.5). verl's default threshold is 2.0; ctpo.sh uses
  level="sequence", threshold=5.0.

  Args:
    batch_normalize: divide by the batch mean weight (over valid tokens for "token", over
      non-empty rows for "sequence") so the weights average to 1, as verl's option does.

  Returns:
    f32 [B, T] weights, no gradient.
  """
  if level not in ("token", "sequence"):
    raise ValueError(f"Unknown rollout correction level {level!r}; use 'token' or 'sequence'.")
  if isinstance(threshold, (int, float)) and threshold <= 0:
    raise ValueError(f"threshold must be positive; got {threshold}.")
  valid_BT = mask_BT > 0
  log_w_BT = token_log_ratio(old_logp_BT, sampler_logp_BT, mask_BT, clamp=None)
  if level == "token":
    w_BT = jnp.exp(jnp.clip(log_w_BT, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
  else:
    log_w_B = jnp.clip(log_w_BT.sum(-1), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    w_BT = jnp.broadcast_to(jnp.exp(log_w_B)[:, None], log_w_BT.shape)
  w_BT = jax.lax.stop_gradient(jnp.where(valid_BT, jnp.minimum(w_BT, threshold), 0.0))
  if batch_normalize:
    if level == "token":
      total, count = w_BT.sum(), valid_BT.sum()
    else:
      nonempty_B = valid_BT.any(-1)
      total, count = jnp.where(nonempty_B, w_BT.max(-1), 0.0).sum(), nonempty_B.sum()
    mean = total / jnp.maximum(count.astype(jnp.float32), 1.0)
    w_BT = jnp.where(mean > 1e-8, w_BT / jnp.maximum(mean, 1e-8), w_BT)
  return w_BT


def rollout_rejection_mask(old_logp_BT: jax.Array, sampler_logp_BT: jax.Array,
                           mask_BT: jax.Array, *, level: str = "token",
                           threshold: float = 2.0) -> jax.Array:
  """Masked IS (verl's rejection sampling): keep a token (level="token") or a whole row
  (level="sequence") only where its weight pi_old / pi_sampler, as in
  `rollout_correction_weight` before truncation, lies in [1 / threshold, threshold].

  Returns f32 [B, T] in {0, 1}, 0 where masked, no gradient. It multiplies the loss mask (the
  dropped tokens leave the aggregation's denominator too) and the advantages.
  """
  if level not in ("token", "sequence"):
    raise ValueError(f"Unknown rollout correction level {level!r}; use 'token' or 'sequence'.")
  if isinstance(threshold, (int, float)) and threshold <= 1:
    raise ValueError(f"threshold must be > 1 (the kept band is [1/threshold, threshold]); "
                     f"got {threshold}.")
  valid_BT = mask_BT > 0
  log_w_BT = token_log_ratio(old_logp_BT, sampler_logp_BT, mask_BT, clamp=None)
  bound = jnp.log(jnp.float32(threshold))
  if level == "sequence":
    log_w_BT = jnp.broadcast_to(log_w_BT.sum(-1, keepdims=True), log_w_BT.shape)
  keep_BT = valid_BT & (jnp.abs(log_w_BT) <= bound)
  return jax.lax.stop_gradient(keep_BT.astype(jnp.float32))
