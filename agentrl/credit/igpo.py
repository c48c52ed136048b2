# pylint: disable=invalid-name
"""IGPO: information-gain turn rewards and IGPO's turn-level advantage (arXiv 2510.14967).

Wang et al., "Information Gain-based Policy Optimization" (ICLR 2026). Everything here follows
the authors' code, GuoqingWang1/IGPO at commit 49a8c4ec: the gain in
`scrl/llm_agent/generation.py` (`run_llm_loop`), the advantage in
`verl/trainer/ppo/core_algos.py` (`compute_grpo_outcome_advantage`,
`_compute_turn_level_advantage`), the settings in `verl/trainer/ppo/ray_trainer.py`; the
rewards' token placement in `verl/utils/reward_score/info_gain.py` (read at bdceb82). Math and
defaults: docs/algorithms.md §5.

Pipeline: `turn_rewards` (one [B, U] reward per turn: the gold answer's information gain, the
outcome score on the last turn) -> `turn_advantages` (group z-scores, turn-level discounted
sum) -> `token_advantages` (the same, broadcast to each turn's policy tokens).

Defaults are the authors' launch settings (`info_gain_type=log_prob_diff`,
`info_gain_norm_mode=separate`, `gamma=1.0`); their code's fallbacks when a setting is absent
are `prob_diff` and `joint`. The optional curriculum weights of the code (off by default)
scale the rewards before normalisation: multiply `turn_reward_BU` by them before calling.
"""
import jax
import jax.numpy as jnp

from agentrl.advantages import estimators
from agentrl.credit import pooling

INFO_GAIN_TYPES = ("log_prob_diff", "prob_diff")
NORM_MODES = ("separate", "joint")
# compute_group_stats: std = sqrt(population variance + 1e-8), then (x - mean) / (std + eps).
_VAR_FLOOR = 1e-8


def _turn_arrays(turn_BU: jax.Array, turn_mask_BU: jax.Array, group_size: int | None,
                 name: str) -> jax.Array:
  """Validates a [B, U] turn array against its mask; returns the valid-turn bool mask."""
  if turn_BU.ndim != 2 or turn_mask_BU.shape != turn_BU.shape:
    raise ValueError(f"{name} expects matching [B, U] turn arrays; got {turn_BU.shape} and "
                     f"turn mask {turn_mask_BU.shape}.")
  if group_size is not None and (group_size < 1 or turn_BU.shape[0] % group_size):
    raise ValueError(f"{name}: B={turn_BU.shape[0]} is not a multiple of group_size="
                     f"{group_size}. Rows [i*G, (i+1)*G) must hold prompt i's trajectories.")
  return turn_mask_BU > 0


def last_turn(turn_mask_BU: jax.Array) -> jax.Array:
  """Bool [B, U]: the last valid turn of each row (all False for a row without turns)."""
  valid_BU = turn_mask_BU > 0
  U = valid_BU.shape[1]
  last_B = U - 1 - jnp.argmax(valid_BU[:, ::-1], axis=1)
  return (jnp.arange(U)[None, :] == last_B[:, None]) & valid_BU.any(axis=1, keepdims=True)


def turn_rewards(answer_logp_BU: jax.Array, turn_mask_BU: jax.Array, outcome_B: jax.Array, *,
                 info_gain_type: str = "log_prob_diff") -> jax.Array:
  """IGPO turn rewards [B, U]: information gain on each turn, the outcome on the last one.

  `answer_logp_BU[:, k]` is the *mean* per-token log-prob of the gold answer's tokens given
  the context at the start of turn k (the prompt, then turns < k with their observations),
  scored as IGPO's pseudo-response "\\nNow there's enough information to answer\\n</think>\\n
  <answer>\\n{gold}\\n</answer><|im_end|>" with the mean taken over the gold tokens only.
  Column 0 is therefore the prompt-only baseline. With v_k = that mean log-prob
  (`log_prob_diff`) or exp of it, the length-normalised likelihood (`prob_diff`):

    r_k = v_{k+1} - v_k for every valid turn but the last;   r_last = outcome_B.

  Valid turns are a prefix of each row; invalid turns get 0. The last turn (the answer) gets
  the outcome only (IGPO's F1, -2.0 on a format error in their reward), no gain of its own.

  Relation to `agentrl.advantages.estimators.information_gain`: that function is this one with
  `info_gain_type="prob_diff"`, taking the summed log-prob and the answer length instead of
  the mean (`information_gain(s, L, m, R) == turn_rewards(s / L, m, R,
  info_gain_type="prob_diff")`, tested); the authors now launch with `log_prob_diff`.
  """
  if info_gain_type not in INFO_GAIN_TYPES:
    raise ValueError(f"info_gain_type must be one of {INFO_GAIN_TYPES}; got {info_gain_type!r}.")
  valid_BU = _turn_arrays(answer_logp_BU, turn_mask_BU, None, "igpo.turn_rewards")
  if outcome_B.shape != answer_logp_BU.shape[:1]:
    raise ValueError(f"igpo.turn_rewards: outcome_B has shape {outcome_B.shape}; expected "
                     f"[{answer_logp_BU.shape[0]}].")
  value_BU = answer_logp_BU.astype(jnp.float32)
  if info_gain_type == "prob_diff":
    value_BU = jnp.exp(value_BU)
  next_BU = jnp.concatenate([value_BU[:, 1:], jnp.zeros_like(value_BU[:, :1])], axis=1)
  reward_BU = jnp.where(last_turn(turn_mask_BU), outcome_B.astype(jnp.float32)[:, None],
                        next_BU - value_BU)
  return jnp.where(valid_BU, reward_BU, 0.0)


def _group_zscore(x_BU: jax.Array, select_BU: jax.Array, group_size: int, *,
                  norm_by_std: bool, eps: float) -> jax.Array:
  """IGPO's compute_group_stats: z-score the selected entries of each group, pooled over turns.

  All selected (row, turn) entries of a group's G rows share one mean and one population std
  sqrt(var + 1e-8), or std 1 when the group has at most one entry. Unselected entries get 0.
  """
  B, U = x_BU.shape
  shape_PN = (B // group_size, group_size * U)
  centred_PN, count_P1, sumsq_P1 = pooling.centre(x_BU.reshape(shape_PN),
                                                  select_BU.reshape(shape_PN))
  if norm_by_std:
    var_P1 = sumsq_P1 / jnp.maximum(count_P1, 1.0)
    centred_PN = centred_PN / (jnp.where(count_P1 <= 1, 1.0, jnp.sqrt(var_P1 + _VAR_FLOOR))
                               + eps)
  return centred_PN.reshape(B, U)


def _turn_returns(x_BU: jax.Array, boundary_BU: jax.Array, valid_BU: jax.Array,
                  gamma: float) -> jax.Array:
  """A_k = x_k + gamma * A_next over boundary turns; a valid non-boundary turn shares A_next.

  As `_compute_turn_level_advantage`: a turn ends at a reward position, and the tokens of a
  turn without one belong to the next turn that has one (no discount step between them).
  """

  def step(next_B, inputs):
    x_B, boundary_B, valid_B = inputs
    value_B = jnp.where(boundary_B, x_B + gamma * next_B, next_B)
    return value_B, jnp.where(valid_B, value_B, 0.0)

  init_B = jnp.zeros(x_BU.shape[:1], jnp.float32)
  _, out_UB = jax.lax.scan(step, init_B, (x_BU.T, boundary_BU.T, valid_BU.T), reverse=True)
  return out_UB.T


def turn_advantages(turn_reward_BU: jax.Array, turn_mask_BU: jax.Array, *, group_size: int,
                    norm_mode: str = "separate", gamma: float = 1.0, norm_by_std: bool = True,
                    eps: float = 1e-6, skip_zero_gain: bool = True) -> jax.Array:
  """IGPO advantages per turn [B, U] from `turn_rewards`: group z-scores, then discounted sums.

  1. Normalise within each group of G trajectories. `norm_mode="separate"`: the G outcome
     rewards (last turns) and, separately, all gain rewards of the group's turns are each
     z-scored with their pooled mean and population std sqrt(var + 1e-8) (std 1 for a single
     entry), (x - mean) / (std + eps). `"joint"`: one pool holds both.
     `norm_by_std=False` only centres.
  2. A_k = r~_k + gamma * A_{k+1} over the row's turns, from the last one back.

  `skip_zero_gain` (the official behaviour): a non-final turn whose gain is exactly 0 carries
  no reward in IGPO's token layout, so it is neither in the statistics nor a turn boundary: it
  gets the advantage of the next turn that has a reward, with no discount step. False treats
  it as a turn with reward 0 (pooled and discounted). Invalid turns get 0.

  With all gains 0 this is the outcome-only group z-score on every turn, for any gamma.
  """
  if norm_mode not in NORM_MODES:
    raise ValueError(f"norm_mode must be one of {NORM_MODES}; got {norm_mode!r}.")
  valid_BU = _turn_arrays(turn_reward_BU, turn_mask_BU, group_size, "igpo.turn_advantages")
  reward_BU = jnp.where(valid_BU, turn_reward_BU.astype(jnp.float32), 0.0)
  is_last_BU = last_turn(turn_mask_BU)
  gain_BU = valid_BU & ~is_last_BU
  if skip_zero_gain:
    gain_BU = gain_BU & (reward_BU != 0)
  boundary_BU = is_last_BU | gain_BU
  zscore = lambda sel_BU: _group_zscore(reward_BU, sel_BU, group_size, norm_by_std=norm_by_std,
                                        eps=eps)
  if norm_mode == "separate":
    normed_BU = jnp.where(is_last_BU, zscore(is_last_BU), zscore(gain_BU))
  else:
    normed_BU = zscore(boundary_BU)
  return _turn_returns(normed_BU, boundary_BU, valid_BU, gamma)


def token_advantages(turn_reward_BU: jax.Array, turn_mask_BU: jax.Array, turn_BT: jax.Array,
                     loss_mask_BT: jax.Array, *, group_size: int, **kwargs) -> jax.Array:
  """`turn_advantages` broadcast to tokens [B, T]; prompt, observation and padding tokens get 0.

  `turn_BT` is `types.Batch.turn_BT` (the turn index of each token, -1 on the prompt); keyword
  arguments go to `turn_advantages`.
  """
  adv_BU = turn_advantages(turn_reward_BU, turn_mask_BU, group_size=group_size, **kwargs)
  return estimators.broadcast_turn_to_tokens(adv_BU, turn_BT, loss_mask_BT)
