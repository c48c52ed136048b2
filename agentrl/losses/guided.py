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

Token functions take `[B, T]` arrays in `types.Batch`'s layout and return exact zeros on masked
tokens (prompt, hint, padding), whatever the masked entries hold.
"""
import chex
import jax
import jax.numpy as jnp

from agentrl.losses import common
from agentrl.losses import distill
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
