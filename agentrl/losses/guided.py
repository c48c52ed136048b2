# pylint: disable=invalid-name
"""Training under the original context on rows sampled under a guided one (docs/algorithms.md
§17; the rows come from agentrl/rollout/guided.py).

A guided row's tokens were drawn from μ(·| guided context) (the sampler's log-probs,
`Batch.sampler_logp_BT`) but the batch stores them after the ORIGINAL prompt, so the trainer's
log-probs `logp_BT` and the score step's `old_logp_BT` are π(·| original context). The
per-token importance weight of a guided row is w_t = π_θ(y_t | x, y_<t) / μ(y_t | x̃, y_<t);
a plain row keeps PPO's ratio against `old_logp_BT`.

  * `behaviour_logp`: the denominator per row (sampler log-probs on guided rows, old ones on
    plain rows).
  * `guided_pg_loss`: weight="clip" is PPO's clipped surrogate with that denominator (the
    on-policy limit: an empty hint gives w = 1 and GRPO's gradient); weight="shaped" is the
    mixed-policy objective of ICPO (arXiv 2510.26519) after LUFFY: plain rows PPO, guided rows
    −A·f(w) with f(w) = w / (w + γ) and no clip.
  * `region_gate`: ICPO's expert-region reject sampling as a row mask [INF: keep guided rows
    whose reward reaches τ]; `expert_bonus`: ICPO's annealed expert-bonus reward [INF: a
    linear decay to 0].
  * `crpo_row_weights`, `crpo_loss`: Lens's Calibrated Rollout Policy Optimization (arXiv
    2601.21244): in a group that received transferred (purified) rows, original successes
    weigh ā, the others 1 − ā (ā the original success rate); PPO's clip on
    ρ = π_θ(y|x) / (w̃ · π_old(y|x_roll)) plus β·KL to the reference.

Token functions take `[B, T]` arrays in `types.Batch`'s layout and return exact zeros on masked
tokens (prompt, hint, padding), whatever the masked entries hold.
"""
import chex
import jax
import jax.numpy as jnp

from agentrl.losses import common
from agentrl.losses import distill
from agentrl.losses import kl
from agentrl.losses import policy
from agentrl.losses import ratios

Metrics = common.Metrics
WEIGHTS = ("clip", "shaped")


def behaviour_logp(old_logp_BT: jax.Array, sampler_logp_BT: jax.Array,
                   guided_B: jax.Array) -> jax.Array:
  """The importance weight's denominator: `sampler_logp_BT` on guided rows (μ under the guided
  context), `old_logp_BT` (π_old under the original one) on the others."""
  chex.assert_equal_shape([old_logp_BT, sampler_logp_BT])
  chex.assert_rank(guided_B, 1)
  return jnp.where(jnp.asarray(guided_B)[:, None] > 0, sampler_logp_BT, old_logp_BT)


def shaped_weight(w_BT: jax.Array, gamma: float) -> jax.Array:
  """LUFFY's regularised importance weight f(w) = w / (w + γ) (γ > 0): bounded by 1, with a
  large gradient f'(w) = γ / (w + γ)² where π_θ gives the token a low probability."""
  return w_BT / (w_BT + gamma)


def guided_pg_loss(logp_BT: jax.Array, old_logp_BT: jax.Array, sampler_logp_BT: jax.Array,
                   adv_BT: jax.Array, mask_BT: jax.Array, guided_B: jax.Array, *,
                   weight: str = "clip", eps_low: float = 0.2, eps_high: float = 0.2,
                   gamma: float = 0.1) -> tuple[jax.Array, Metrics]:
  """Per-token loss `[B, T]` over plain and guided rows (module docstring) and metrics.

  Args:
    logp_BT: π_θ under the original context (the update step's forward).
    old_logp_BT: π_old under the original context (the score step).
    sampler_logp_BT: the sampler's log-probs (under the guided context on guided rows).
    adv_BT: advantages (a scalar or `[B, T]`).
    mask_BT: the loss mask (policy tokens; 0 on prompt and hint tokens).
    guided_B: 1 on rows sampled under the guided context.
    weight: "clip" (PPO on w) or "shaped" (ICPO / LUFFY: −A·w/(w+γ) on guided rows).
    eps_low, eps_high: PPO's clip range (plain rows; guided rows too with weight="clip").
    gamma: the shaping constant γ (LUFFY's 0.1) of weight="shaped".

  Returns:
    (loss_BT, metrics): metrics add guided/frac (fraction of valid tokens on guided rows) and
    guided/weight_mean (mean w over guided valid tokens, 0 with none).
  """
  if weight not in WEIGHTS:
    raise ValueError(f"weight must be one of {WEIGHTS}; got {weight!r}.")
  if weight == "shaped" and not gamma > 0:
    raise ValueError(f"gamma must be > 0 for weight='shaped'; got {gamma}.")
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  den_BT = behaviour_logp(old_logp_BT, sampler_logp_BT, guided_B)
  loss_BT, metrics = policy.ppo_clip(logp_BT, den_BT, adv_BT, mask_BT, eps_low=eps_low,
                                     eps_high=eps_high)
  on_guided_BT = valid_BT & (jnp.asarray(guided_B)[:, None] > 0)
  w_BT = jnp.exp(ratios.token_log_ratio(logp_BT, den_BT, mask_BT, clamp=common.CLAMP))
  if weight == "shaped":
    adv_BT = common.token_adv(adv_BT, logp_BT)
    shaped_BT = -adv_BT * shaped_weight(w_BT, gamma)
    loss_BT = jnp.where(on_guided_BT, shaped_BT, loss_BT)
  n_valid = jnp.maximum(valid_BT.sum(), 1)
  n_guided = on_guided_BT.sum()
  metrics["guided/frac"] = jax.lax.stop_gradient(n_guided / n_valid).astype(jnp.float32)
  metrics["guided/weight_mean"] = jax.lax.stop_gradient(
      jnp.where(on_guided_BT, w_BT, 0.0).sum() / jnp.maximum(n_guided, 1)).astype(jnp.float32)
  return jnp.where(valid_BT, loss_BT, 0.0), metrics


def region_gate(reward_B: jax.Array, guided_B: jax.Array, *, tau: float = 1.0) -> jax.Array:
  """ICPO's expert-region reject sampling as a row mask `[B]` f32: plain rows 1, guided rows
  1 only where their reward reaches τ (KEPO's `distill.quality_gate`). [INF] the criterion: the
  abstract says unreliable guided trajectories are filtered; correctness is the reading here."""
  keep_B = distill.quality_gate(reward_B, tau=tau, keep="success")
  return jnp.where(jnp.asarray(guided_B) > 0, keep_B, 1.0)


def expert_bonus(reward_B: jax.Array, guided_B: jax.Array, step: int | jax.Array, *,
                 bonus: float, anneal_steps: int, tau: float = 1.0) -> jax.Array:
  """ICPO's annealed expert-bonus reward: R + b(step) on guided rows whose reward reaches τ,
  b(step) = bonus · max(0, 1 − step / anneal_steps). [INF] the schedule's shape and the bonus
  value (the abstract names the mechanism only)."""
  if anneal_steps < 1:
    raise ValueError(f"anneal_steps must be >= 1; got {anneal_steps}.")
  b = bonus * jnp.maximum(0.0, 1.0 - jnp.asarray(step, jnp.float32) / anneal_steps)
  hit_B = (jnp.asarray(guided_B) > 0) & (jnp.asarray(reward_B, jnp.float32) >= tau)
  return jnp.asarray(reward_B, jnp.float32) + jnp.where(hit_B, b, 0.0)


def crpo_row_weights(success_B: jax.Array, guided_B: jax.Array, *,
                     group_size: int) -> jax.Array:
  """Lens's sample reweighting, a row weight `[B]` f32 (rows [i·G, (i+1)·G) one group).

  In a group holding transferred rows (`guided_B` = 1, each a purified success in place of an
  original failure), ā = original successes / G; original successes weigh ā, transferred
  rows and the original failures left 1 − ā. Groups without transferred rows weigh 1 [INF:
  the reweighting read as applying to the calibrated groups only, so that a step without
  purification is the base objective]. ā needs no extra input: only failures are replaced,
  so the original successes are the successful rows not flagged guided.
  """
  success_B = jnp.asarray(success_B, jnp.float32)
  guided_B = jnp.asarray(guided_B, jnp.float32)
  chex.assert_equal_shape([success_B, guided_B])
  if success_B.shape[0] % group_size:
    raise ValueError(f"{success_B.shape[0]} rows do not split into groups of {group_size}.")
  orig_success_PG = (success_B * (1.0 - guided_B)).reshape(-1, group_size)
  a_P = orig_success_PG.mean(axis=1)
  calibrated_P = guided_B.reshape(-1, group_size).max(axis=1) > 0
  w_PG = jnp.where(orig_success_PG > 0, a_P[:, None], 1.0 - a_P[:, None])
  return jnp.where(calibrated_P[:, None], w_PG, 1.0).reshape(-1)


def crpo_loss(logp_BT: jax.Array, old_logp_BT: jax.Array, sampler_logp_BT: jax.Array,
              adv_BT: jax.Array, mask_BT: jax.Array, guided_B: jax.Array,
              row_weight_B: jax.Array, ref_logp_BT: jax.Array | None = None, *,
              log_ratio_scale_B: jax.Array | None = None, eps_low: float = 0.2,
              eps_high: float = 0.2, kl_coef: float = 0.0,
              kl_kind: str = "k3") -> tuple[jax.Array, Metrics]:
  """Lens's CRPO per-token loss `[B, T]` and metrics.

  L_t = w_i · max(−A ρ_t, −A clip(ρ_t, 1 − ε_low, 1 + ε_high)) + β · KL_t, with
  ρ_t = π_θ(y_t | x, y_<t) / (w̃_i · π_old(y_t | x_roll, y_<t)): x_roll the prompt the row was
  sampled under (`behaviour_logp`: the sampler's log-probs on transferred rows, the original
  π_old elsewhere), w̃_i = exp(`log_ratio_scale_B`) (default 1 [INF: the paper's w̃(y) is not
  defined in what was read]), w_i `row_weight_B` (`crpo_row_weights`), KL_t `kl.kl_penalty`
  of π_θ against `ref_logp_BT` (β = `kl_coef`; not row-weighted [INF]).

  With no transferred rows, unit weights and no scale this is `policy.ppo_clip` (+ β·KL) bit
  for bit. Metrics: `ppo_clip`'s, guided/frac, guided/weight_mean (as `guided_pg_loss`), and
  kl_loss (token-mean KL_t) with kl_coef > 0.
  """
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  chex.assert_rank(row_weight_B, 1)
  den_BT = behaviour_logp(old_logp_BT, sampler_logp_BT, guided_B)
  if log_ratio_scale_B is not None:
    den_BT = den_BT + jnp.asarray(log_ratio_scale_B, jnp.float32)[:, None]
  pg_BT, metrics = policy.ppo_clip(logp_BT, den_BT, adv_BT, mask_BT, eps_low=eps_low,
                                   eps_high=eps_high)
  loss_BT = jnp.asarray(row_weight_B, jnp.float32)[:, None] * pg_BT
  if kl_coef > 0:
    if ref_logp_BT is None:
      raise ValueError("kl_coef > 0 needs ref_logp_BT (score with the reference).")
    kl_BT = kl.kl_penalty(logp_BT, ref_logp_BT, kl_kind)
    loss_BT = loss_BT + kl_coef * kl_BT
    metrics["kl_loss"] = jax.lax.stop_gradient(
        jnp.where(valid_BT, kl_BT, 0.0).sum() / jnp.maximum(valid_BT.sum(), 1))
  on_guided_BT = valid_BT & (jnp.asarray(guided_B)[:, None] > 0)
  w_BT = jnp.exp(ratios.token_log_ratio(logp_BT, den_BT, mask_BT, clamp=common.CLAMP))
  n_guided = on_guided_BT.sum()
  metrics["guided/frac"] = jax.lax.stop_gradient(
      n_guided / jnp.maximum(valid_BT.sum(), 1)).astype(jnp.float32)
  metrics["guided/weight_mean"] = jax.lax.stop_gradient(
      jnp.where(on_guided_BT, w_BT, 0.0).sum() / jnp.maximum(n_guided, 1)).astype(jnp.float32)
  return jnp.where(valid_BT, loss_BT, 0.0), metrics
