# pylint: disable=invalid-name
"""Self-imitation of good past trajectories: SIL (Oh et al. 2018) and SPEAR (Qin et al. 2025).

SIL (Oh, Guo, Singh, Lee 2018, "Self-Imitation Learning", ICML, eq. 2-4): replayed
trajectories with return R above the value estimate V are imitated,
  L_policy = −log π(a|s) · (R − V)+,   L_value = ½ ((R − V)+)²,
so only better-than-expected past actions are reinforced (the weight of L_value is the
caller's).

SPEAR (Qin et al. 2025, "Learn the Ropes, Then Trust the Wins: Self-imitation with Progressive
Exploration for Agentic RL", arXiv 2509.22601; defaults from the authors' README,
github.com/TencentYoutuResearch/SPEAR): the replayed trajectories' advantages are recalibrated
against the 50th percentile of the last 10240 rewards (or decayed by a factor), the positive
part [INF] is trained with a PPO-clip surrogate whose ratio is π_θ / π_old(stored), and the
entropy control is Clip-Cov on the replayed tokens (clip_cov_ratio 0.02, bounds (1, 40)); the
self-imitation loss is added with a coefficient raised by a cosine schedule over 200 steps.
The buffer side (store if advantage > 1, drop after 10 versions, 2048 rows) is
`agentrl.train.replay_buffer`.

Token forms return `loss_BT` [B, T] (0 on masked tokens); aggregate with token-mean. Inputs
follow the conventions in the `agentrl.losses.policy` module docstring.
"""
import math

import jax
import jax.numpy as jnp

from agentrl.losses import common
from agentrl.losses import covariance

Metrics = common.Metrics


def sil_advantage(return_B: jax.Array, value_B: jax.Array) -> jax.Array:
  """(R − V)+ [B], detached: the SIL weight (Oh et al. 2018, eq. 2)."""
  return jax.lax.stop_gradient(jnp.maximum(return_B - value_B, 0.0).astype(jnp.float32))


def sil_policy(logp_BT: jax.Array, return_B: jax.Array, value_B: jax.Array,
               mask_BT: jax.Array) -> tuple[jax.Array, Metrics]:
  """SIL policy loss (Oh et al. 2018, eq. 3): L_t = −logp_t · (R − V)+ on valid tokens.

  Metrics: sil_active_frac, the fraction of rows with R > V (the rows that send gradient).
  """
  valid_BT = mask_BT > 0
  adv_B = sil_advantage(return_B, value_B)
  loss_BT = jnp.where(valid_BT, -adv_B[:, None] * logp_BT.astype(jnp.float32), 0.0)
  return loss_BT, {"sil_active_frac": jax.lax.stop_gradient((adv_B > 0).mean())}


def sil_value(value_B: jax.Array, return_B: jax.Array) -> jax.Array:
  """SIL value loss (Oh et al. 2018, eq. 4) [B]: ½ ((R − V)+)², gradient only through V."""
  return 0.5 * jnp.square(jnp.maximum(return_B - value_B, 0.0))


def spear_advantage(reward_B: jax.Array, *, baseline: float | jax.Array | None = None,
                    old_adv_B: jax.Array | None = None,
                    decay: float | None = None) -> jax.Array:
  """SPEAR's recalibrated advantage of replayed rows [B], positive part.

  With `baseline` (the authors' default, `weight_decay_trajectory_replay = -1`): R − b, b the
  50th percentile of recent rewards (`replay_buffer.baseline`). With `decay` in (0, 1]: the
  stored advantage times decay. Either way only the positive part is kept (SIL's (·)+), so a
  row no longer better than the baseline sends no gradient.
  """
  if (baseline is None) == (decay is None):
    raise ValueError("spear_advantage takes exactly one of baseline= (percentile mode) or "
                     "decay= (with old_adv_B).")
  if decay is not None:
    if not 0.0 < decay <= 1.0 or old_adv_B is None:
      raise ValueError(f"decay must be in (0, 1] and old_adv_B given; got decay={decay}.")
    adv_B = old_adv_B * decay
  else:
    adv_B = reward_B - baseline
  return jax.lax.stop_gradient(jnp.maximum(jnp.asarray(adv_B, jnp.float32), 0.0))


def spear_sil(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_B: jax.Array, mask_BT: jax.Array,
              *, rng: jax.Array, eps_low: float = 0.2, eps_high: float = 0.28,
              clip_cov_ratio: float = 0.02, clip_cov_lb: float = 1.0,
              clip_cov_ub: float = 40.0) -> tuple[jax.Array, Metrics]:
  """SPEAR's self-imitation loss on replayed rows: Clip-Cov PPO with A = (adv_B)+.

  `old_logp_BT` are the stored behaviour log-probs, so r = π_θ / π_old(stored) is the
  importance ratio of the replayed tokens; clip (1 − 0.2, 1 + 0.28) is Dr.BoT's clip-higher
  and the Clip-Cov settings are the authors' `*_replay` defaults. Aggregate with token-mean
  and scale by `spear_coef(step)`.
  """
  adv_B = jnp.maximum(jnp.asarray(adv_B, jnp.float32), 0.0)
  return covariance.clip_cov(logp_BT, old_logp_BT, adv_B[:, None], mask_BT, rng=rng,
                             eps_low=eps_low, eps_high=eps_high, clip_cov_ratio=clip_cov_ratio,
                             clip_cov_lb=clip_cov_lb, clip_cov_ub=clip_cov_ub)


def spear_coef(step: int | jax.Array, *, coef: float = 1.0, warmup_steps: int = 200) -> jax.Array:
  """The self-imitation coefficient: coef · ½(1 − cos(π min(step / warmup_steps, 1))).

  SPEAR raises its replay loss coefficient with a cosine scheduler over `max_replay_loss_steps`
  (200) up to `replay_loss_coef` (1) [INF: the half-cosine shape from 0].
  """
  if warmup_steps < 1:
    raise ValueError(f"warmup_steps must be >= 1; got {warmup_steps}.")
  frac = jnp.minimum(jnp.asarray(step, jnp.float32) / warmup_steps, 1.0)
  return coef * 0.5 * (1.0 - jnp.cos(math.pi * frac))
