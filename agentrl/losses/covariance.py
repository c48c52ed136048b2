# pylint: disable=invalid-name
"""Covariance-based entropy-preserving losses: Clip-Cov and KL-Cov.

Cui et al. 2025, "The Entropy Mechanism of Reinforcement Learning for Reasoning Language
Models" (arXiv 2505.22617): policy entropy collapses where the covariance between a token's
log-probability and its advantage is large, so both methods act on the few valid tokens with
the largest covariance (A − Ā)(logp − mean logp), computed over the whole batch and detached.
Clip-Cov drops their gradient; KL-Cov adds a |ℓ| penalty on them (verl
`compute_policy_loss_clip_cov` / `compute_policy_loss_kl_cov`).

Both are token forms returning `loss_BT` [B, T]; aggregate with token-mean. Inputs, masking
and metric keys follow the conventions in the `agentrl.losses.policy` module docstring, which
re-exports both functions (the API contract names them there).
"""
import jax
import jax.numpy as jnp

from agentrl.losses import common
from agentrl.losses import ratios

Metrics = common.Metrics


def _covariance(adv_BT, logp_BT, valid_BT):
  """Per-token (A − mean A)(logp − mean logp) over valid tokens, detached (Cui et al. 2025)."""
  logp_BT = jax.lax.stop_gradient(logp_BT.astype(jnp.float32))
  return ((adv_BT - common.stat_mean(adv_BT, valid_BT))
          * (logp_BT - common.stat_mean(logp_BT, valid_BT)))


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
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  common.check_eps(eps_low, eps_high)
  if not clip_cov_ratio > 0:
    raise ValueError(f"clip_cov_ratio must be > 0; got {clip_cov_ratio}.")
  adv_BT = common.token_adv(adv_BT, logp_BT)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=common.CLAMP)
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
  return loss_BT, common.ratio_metrics(
      ratio_BT, valid_BT, log_ratio_BT, valid_BT, clipfrac=ppo_clipped_BT,
      clipfrac_high=(ratio_BT > 1 + eps_high) & (adv_BT > 0),
      clipfrac_low=(ratio_BT < 1 - eps_low) & (adv_BT < 0), cov_clipfrac=excluded_BT)


def kl_cov(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array,
           *, kl_cov_ratio: float = 2e-4,
           ppo_kl_coef: float = 1.0) -> tuple[jax.Array, Metrics]:
  """KL-Cov (Cui et al. 2025, arXiv 2505.22617; verl `compute_policy_loss_kl_cov`).

  Unclipped surrogate −A r on every token, plus ppo_kl_coef·|logp − old_logp| on the top
  max(1, ⌊kl_cov_ratio·N⌋) valid tokens by covariance (A − Ā)(logp − mean logp), N the number
  of valid tokens. r from ℓ clamped to ±20. Aggregate with token-mean. Metrics add
  ppo_kl_abs (verl's ppo_kl for this loss) and cov_kl_frac (the penalised fraction).
  """
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  if not kl_cov_ratio > 0:
    raise ValueError(f"kl_cov_ratio must be > 0; got {kl_cov_ratio}.")
  adv_BT = common.token_adv(adv_BT, logp_BT)
  log_ratio_BT = ratios.token_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp=common.CLAMP)
  ratio_BT = jnp.exp(log_ratio_BT)
  cov_BT = _covariance(adv_BT, logp_BT, valid_BT)
  n_top = jnp.maximum(jnp.floor(kl_cov_ratio * valid_BT.sum().astype(jnp.float32)), 1.0)
  top_BT = valid_BT & (_ranks(jnp.where(valid_BT, -cov_BT, jnp.inf)) < n_top)
  # sign(ℓ)·ℓ = |ℓ| with gradient sign(ℓ), 0 at ℓ = 0 like torch's abs in verl (jnp.abs has
  # gradient 1 there, which would bias the on-policy gradient away from REINFORCE).
  abs_kl_BT = jnp.sign(log_ratio_BT) * log_ratio_BT
  loss_BT = -adv_BT * ratio_BT + jnp.where(top_BT, ppo_kl_coef * abs_kl_BT, 0.0)
  metrics = common.ratio_metrics(ratio_BT, valid_BT, log_ratio_BT, valid_BT,
                                  cov_kl_frac=top_BT)
  metrics["ppo_kl_abs"] = common.stat_mean(abs_kl_BT, valid_BT)
  return jnp.where(valid_BT, loss_BT, 0.0), metrics
