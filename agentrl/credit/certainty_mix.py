# pylint: disable=invalid-name
"""Certainty mix: MAPO of Huang et al. 2025 (arXiv 2509.18849, "Mixed Advantage Policy
Optimization"), named by its mechanism here so that `agentrl.credit.mapo` names the
long-horizon dialogue method of the same acronym (arXiv 2603.06194).

A_i = (1 - lambda(p)) (R_i - mu) / (sigma + eps) + lambda(p) (R_i - mu) / (mu + eps), with mu
and sigma (unbiased) the group's reward mean and std and p the group's *trajectory certainty*,
the fraction of its G rollouts whose reward equals 1. For groups that are nearly all right or
all wrong (p near 0 or 1) the percent deviation (R - mu) / mu replaces the z-score, whose
division by a tiny sigma inflates near-certain groups ("advantage reversion / mirror").

Official code: WenkeHuang/MAPO (read at commit debcfd3), `code/verl/trainer/ray_trainer.py`,
estimator `grpomixpro` ("Proposed Method"): the std weight is 4 p (1 - p) and the mean weight
lambda(p) = 1 - 4 p (1 - p) [code]; `compute_grpo_outcome_advantage` (z-score, eps 1e-6) and
`compute_grpo_mean_outcome_advantage` ((R - mu) / (mu + eps), and p from the count of rewards
exactly 1.0) in `code/verl/trainer/core_algos.py`. The `grpomixair` ablation uses the linear
lambda(p) = 1 - 2 min(p, 1 - p) (`weighting="linear"`). Both branches assert G > 1.
Docs: docs/algorithms.md §5.4.
"""
import jax
import jax.numpy as jnp

from agentrl.advantages import estimators

WEIGHTINGS = ("quadratic", "linear")


def mix_weight(certainty_B: jax.Array, *, weighting: str = "quadratic") -> jax.Array:
  """lambda(p), the weight of the percent-deviation advantage: 1 - 4p(1-p) or 1 - 2min(p, 1-p)."""
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting={weighting!r}; expected one of {WEIGHTINGS}.")
  p = certainty_B.astype(jnp.float32)
  if weighting == "quadratic":
    return 1.0 - 4.0 * p * (1.0 - p)
  return 1.0 - 2.0 * jnp.minimum(p, 1.0 - p)


def trajectory_certainty(reward_B: jax.Array, *, group_size: int,
                         success_value: float = 1.0) -> jax.Array:
  """p per row [B]: the fraction of the row's group whose reward equals `success_value`."""
  if group_size < 1 or reward_B.ndim != 1 or reward_B.shape[0] % group_size:
    raise ValueError(f"Expected a [B] array with B divisible by group_size={group_size}; got "
                     f"shape {reward_B.shape}.")
  hit_PG = (reward_B == success_value).reshape(-1, group_size).astype(jnp.float32)
  return jnp.repeat(hit_PG.mean(axis=1), group_size)


def certainty_mix(reward_B: jax.Array, *, group_size: int, eps: float = 1e-6,
                  success_value: float = 1.0, weighting: str = "quadratic",
                  lam: float | None = None) -> jax.Array:
  """Certainty-mixed advantages [B] (MAPO's `grpomixpro`).

  Args:
    reward_B: outcome rewards; rows [i*G, (i+1)*G) are prompt i's samples.
    group_size: G >= 2 (the official code asserts it).
    eps: 1e-6 in both denominators [code].
    success_value: the reward that counts as a success for p (1.0 [code]).
    weighting: "quadratic" (MAPO) or "linear" (the `grpomixair` ablation).
    lam: a fixed lambda overriding lambda(p): 0 is GRPO, 1 the pure percent deviation
      (`grpomean`).
  """
  if group_size < 2:
    raise ValueError(f"certainty_mix needs group_size >= 2 (a group's std and mean); got "
                     f"{group_size}.")
  z_B = estimators.grpo(reward_B, group_size=group_size, eps=eps)
  centred_B = estimators.grpo(reward_B, group_size=group_size, norm_by_std=False)
  mean_B = jnp.repeat(reward_B.astype(jnp.float32).reshape(-1, group_size).mean(axis=1),
                      group_size)
  percent_B = centred_B / (mean_B + eps)
  if lam is None:
    lam_B = mix_weight(trajectory_certainty(reward_B, group_size=group_size,
                                            success_value=success_value), weighting=weighting)
  else:
    lam_B = jnp.full(reward_B.shape, lam, jnp.float32)
  return (1.0 - lam_B) * z_B + lam_B * percent_B
