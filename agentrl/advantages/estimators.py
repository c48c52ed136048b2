# pylint: disable=invalid-name
"""Advantage estimators: group baselines, token returns, GAE and turn-level credit.

Rewards are data (from rollout or a reward model); nothing here is differentiated. Grouped
functions take rows [i*G, (i+1)*G) as the G samples of prompt i (`group_size` = G, static).
Formulas and the verl conventions they copy are in docs/algorithms.md §4.2-§4.11 and §5:

- `grpo` (Shao et al. 2024, DeepSeekMath sec. 4.1.2): (R - mean_G) / (std_G + eps), std with
  ddof=1; `norm_by_std=False` is Dr.GRPO (Liu et al. 2025, arXiv 2503.20783).
- `rloo` (Ahmadian et al. 2024, arXiv 2402.14740): leave-one-out mean baseline.
- `opo` (Hao et al. 2025, arXiv 2505.23585): length-weighted group baseline, as verl's
  `compute_opo_outcome_advantage`.
- `reinforce_pp`, `reinforce_pp_baseline` (Hu 2025, arXiv 2501.03262): token returns or
  group-centred scores, whitened over the whole batch.
- `remax`, `remax_token` (Li et al. 2023, arXiv 2310.10505): greedy-response baseline.
- `gae` (Schulman et al. 2016, arXiv 1506.02438) with observation tokens skipped.
- Multi-turn: `information_gain` (IGPO, arXiv 2510.14967), `turn_group` and
  `discounted_turn_returns` (A2TGPO, arXiv 2605.06200), `broadcast_turn_to_tokens`.
- DAPO (Yu et al. 2025, arXiv 2503.14476): `dapo_overlong_penalty`, `group_has_variance`.
- `grpo_step`: GRPO's whole advantage step on a `types.Batch`, for the experiments that keep
  GRPO's estimator; `adv_abs_mean`: the advantage statistic every estimator step logs.

Conventions shared by the group estimators (verl): a group of size 1 has baseline 0 (and std 1
for `grpo`), and a group whose rewards are all equal gets advantage exactly 0, never NaN.
Token-level outputs are 0 wherever the loss mask is 0.
"""
from collections.abc import Callable

import jax
import jax.numpy as jnp

from agentrl.losses import aggregation
from agentrl import types


def grpo(reward_B: jax.Array, *, group_size: int, norm_by_std: bool = True,
         eps: float = 1e-6) -> jax.Array:
  """GRPO advantages [B]: (R_i - mean_G R) / (std_G R + eps), unbiased std.

  docs/algorithms.md §4.3. norm_by_std=False gives Dr.GRPO's R_i - mean_G R (§4.4). As in
  verl, a group of size 1 uses mean 0 and std 1, so its advantage is R / (1 + eps) (or R
  without the std).
  """
  reward_PG = types.grouped(reward_B, group_size)
  if group_size == 1:
    adv_PG = reward_PG
    std_PG = jnp.ones_like(reward_PG)
  else:
    adv_PG = types.centre(reward_PG)
    std_PG = jnp.std(adv_PG, axis=1, ddof=1, keepdims=True)  # jnp's default is ddof=0
  if norm_by_std:
    adv_PG = adv_PG / (std_PG + eps)
  return adv_PG.reshape(-1)


def rloo(reward_B: jax.Array, *, group_size: int) -> jax.Array:
  """RLOO advantages [B]: R_i - mean_{j != i} R_j = G / (G - 1) * (R_i - mean_G R) (§4.9).

  A group of size 1 has no other sample; like verl's `compute_rloo_outcome_advantage` it keeps
  the raw reward (baseline 0).
  """
  reward_PG = types.grouped(reward_B, group_size)
  if group_size == 1:
    return reward_PG.reshape(-1)
  return (group_size / (group_size - 1) * types.centre(reward_PG)).reshape(-1)


def opo(reward_B: jax.Array, length_B: jax.Array, *, group_size: int) -> jax.Array:
  """OPO advantages [B]: R_i - b with b = sum_j |y_j| R_j / sum_j |y_j| over the group.

  Hao et al. 2025 ("On-Policy RL with Optimal Reward Baseline") derive this length-weighted
  baseline as the variance-minimising one when gradient norms grow with length; the formula,
  the inclusion of sample i in its own baseline, and baseline 0 for a size-1 group follow verl's
  `compute_opo_outcome_advantage` [V-verl]. `length_B` is the response length |y_i| (number
  of policy tokens). A group whose lengths are all 0 falls back to the plain mean.
  """
  reward_PG = types.grouped(reward_B, group_size)
  if group_size == 1:
    return reward_PG.reshape(-1)
  length_PG = types.grouped(length_B, group_size)
  d_PG = reward_PG - reward_PG.min(axis=1, keepdims=True)  # exact 0 for equal rewards
  total_P1 = length_PG.sum(axis=1, keepdims=True)
  weighted_P1 = (length_PG * d_PG).sum(axis=1, keepdims=True) / jnp.maximum(total_P1, 1e-30)
  baseline_P1 = jnp.where(total_P1 > 0, weighted_P1, d_PG.mean(axis=1, keepdims=True))
  return (d_PG - baseline_P1).reshape(-1)


def _masked_discounted_sum(x_BX: jax.Array, mask_BX: jax.Array, gamma: float) -> jax.Array:
  """sum_{k >= t, mask_k} gamma^(#valid steps from t to k) x_k, carried across masked steps."""
  valid_BX = mask_BX > 0
  x_BX = jnp.where(valid_BX, x_BX.astype(jnp.float32), 0.0)

  def step(carry_B, inputs):
    x_B, valid_B = inputs
    carry_B = jnp.where(valid_B, x_B + gamma * carry_B, carry_B)
    return carry_B, jnp.where(valid_B, carry_B, 0.0)

  init_B = jnp.zeros(x_BX.shape[:1], jnp.float32)
  _, out_XB = jax.lax.scan(step, init_B, (x_BX.T, valid_BX.T), reverse=True)
  return out_XB.T


def discounted_returns(token_reward_BT: jax.Array, mask_BT: jax.Array, *,
                       gamma: float = 1.0) -> jax.Array:
  """Ret_t = sum_{k >= t} gamma^(k - t) R_k over policy tokens only, [B, T] (§4.10).

  Rewards at masked positions (padding, tool/environment observations) are ignored, the running
  return carries across those positions unchanged, and gamma counts policy tokens only. The
  output is 0 at masked positions. (verl's REINFORCE++ loop resets the running return at every
  masked position, which is the same for right padding but drops later turns' rewards across
  an observation; this follows docs/algorithms.md §4.10 instead.)
  """
  return _masked_discounted_sum(token_reward_BT, mask_BT, gamma)


def reinforce_pp(token_reward_BT: jax.Array, mask_BT: jax.Array, *,
                 gamma: float = 1.0) -> jax.Array:
  """REINFORCE++ advantages [B, T]: `discounted_returns` whitened over the whole batch (§4.10).

  Token rewards usually carry the per-token KL penalty (`losses.kl.kl_in_reward`). Whitening
  uses the masked mean and unbiased variance of all policy tokens in the batch, not per group;
  masked positions are 0.
  """
  ret_BT = discounted_returns(token_reward_BT, mask_BT, gamma=gamma)
  return aggregation.masked_whiten(ret_BT, mask_BT)


def reinforce_pp_baseline(reward_B: jax.Array, mask_BT: jax.Array, *,
                          group_size: int) -> jax.Array:
  """REINFORCE++-baseline advantages [B, T]: (R - group mean), broadcast, batch-whitened.

  A size-1 group has mean 0, as in verl. Masked positions are 0.
  """
  reward_PG = types.grouped(reward_B, group_size)
  centred_B = (reward_PG if group_size == 1 else types.centre(reward_PG)).reshape(-1)
  return aggregation.masked_whiten(broadcast_to_tokens(centred_B, mask_BT), mask_BT)


def remax(reward_B: jax.Array, greedy_reward_B: jax.Array) -> jax.Array:
  """ReMax advantages [B]: R_i - R(greedy response to the same prompt) (§4.11)."""
  if reward_B.shape != greedy_reward_B.shape or reward_B.ndim != 1:
    raise ValueError(f"remax expects two [B] arrays; got {reward_B.shape} and "
                     f"{greedy_reward_B.shape}.")
  return reward_B.astype(jnp.float32) - greedy_reward_B.astype(jnp.float32)


def remax_token(token_reward_BT: jax.Array, greedy_reward_B: jax.Array,
                mask_BT: jax.Array) -> jax.Array:
  """ReMax with per-token rewards, [B, T]: sum_{k >= t} R_k - b_i on policy tokens (verl).

  With an outcome-only reward on the last policy token this is `remax` broadcast to tokens.
  """
  ret_BT = discounted_returns(token_reward_BT, mask_BT, gamma=1.0)
  return ret_BT - broadcast_to_tokens(greedy_reward_B.astype(jnp.float32), mask_BT)


def gae(reward_BT: jax.Array, value_BT: jax.Array, mask_BT: jax.Array, *, gamma: float = 1.0,
        lam: float = 1.0) -> tuple[jax.Array, jax.Array]:
  """GAE advantages and returns [B, T], skipping masked positions (§4.2, §4.10).

  delta_t = R_t + gamma V_next - V_t and A_t = delta_t + gamma lam A_next, where "next" is the
  next *policy* token (V_next = A_next = 0 after the last one): the next value and the running
  GAE carry across masked (observation, padding) positions, as in the CTPO fork of verl, and
  rewards and values at masked positions are never read. Returns are A + V. Both outputs are 0
  at masked positions. The advantages are not whitened here; PPO in verl follows this with
  `aggregation.masked_whiten(adv_BT, mask_BT)`.
  """
  valid_BT = mask_BT > 0
  reward_BT = jnp.where(valid_BT, reward_BT.astype(jnp.float32), 0.0)
  value_BT = jnp.where(valid_BT, value_BT.astype(jnp.float32), 0.0)

  def step(carry, inputs):
    next_value_B, next_adv_B = carry
    reward_B, value_B, valid_B = inputs
    adv_B = reward_B + gamma * next_value_B - value_B + gamma * lam * next_adv_B
    next_value_B = jnp.where(valid_B, value_B, next_value_B)
    next_adv_B = jnp.where(valid_B, adv_B, next_adv_B)
    return (next_value_B, next_adv_B), jnp.where(valid_B, adv_B, 0.0)

  zeros_B = jnp.zeros(reward_BT.shape[:1], jnp.float32)
  _, adv_TB = jax.lax.scan(step, (zeros_B, zeros_B), (reward_BT.T, value_BT.T, valid_BT.T),
                           reverse=True)
  adv_BT = adv_TB.T
  return adv_BT, jnp.where(valid_BT, adv_BT + value_BT, 0.0)


def turn_group(turn_reward_BU: jax.Array, turn_mask_BU: jax.Array, *, group_size: int,
               eps: float = 1e-6) -> jax.Array:
  """A2TGPO turn-group normalisation [B, U]: z-score per (prompt, turn index) group.

  For each prompt and turn index k, the valid turn-k rewards of the G trajectories are
  standardised with their mean and unbiased std (A2TGPO, arXiv 2605.06200, step (i); the
  abstract gives the grouping, the GRPO-style z-score follows docs/algorithms.md §5). A (prompt, k)
  group with a single valid turn uses mean 0 and std 1 like `grpo`; equal rewards give 0;
  invalid turns are 0.
  """
  if turn_reward_BU.shape != turn_mask_BU.shape or turn_reward_BU.ndim != 2:
    raise ValueError(f"turn_group expects matching [B, U] arrays; got {turn_reward_BU.shape} "
                     f"and {turn_mask_BU.shape}.")
  types.grouped(turn_reward_BU[:, 0], group_size)  # validates B against group_size
  U = turn_reward_BU.shape[1]
  reward_PGU = turn_reward_BU.astype(jnp.float32).reshape(-1, group_size, U)
  valid_PGU = (turn_mask_BU > 0).reshape(reward_PGU.shape)
  count_P1U = valid_PGU.sum(axis=1, keepdims=True).astype(jnp.float32)
  low_P1U = jnp.where(valid_PGU, reward_PGU, jnp.inf).min(axis=1, keepdims=True)
  d_PGU = jnp.where(valid_PGU, reward_PGU - jnp.where(count_P1U > 0, low_P1U, 0.0), 0.0)
  centred_PGU = d_PGU - d_PGU.sum(axis=1, keepdims=True) / jnp.maximum(count_P1U, 1.0)
  sq_PGU = jnp.where(valid_PGU, jnp.square(centred_PGU), 0.0)
  std_P1U = jnp.sqrt(sq_PGU.sum(axis=1, keepdims=True) / jnp.maximum(count_P1U - 1.0, 1.0))
  single_P1U = count_P1U == 1
  adv_PGU = jnp.where(single_P1U, reward_PGU, centred_PGU) / (
      jnp.where(single_P1U, 1.0, std_P1U) + eps)
  return jnp.where(valid_PGU, adv_PGU, 0.0).reshape(turn_reward_BU.shape)


def _last_valid_onehot(mask_BX: jax.Array) -> jax.Array:
  valid_BX = mask_BX > 0
  X = valid_BX.shape[-1]
  last_B = X - 1 - jnp.argmax(valid_BX[:, ::-1], axis=-1)
  return (jnp.arange(X)[None, :] == last_B[:, None]) & valid_BX.any(-1, keepdims=True)


def information_gain(answer_logp_BU: jax.Array, answer_len_B: jax.Array,
                     turn_mask_BU: jax.Array, outcome_B: jax.Array) -> jax.Array:
  """IGPO turn rewards [B, U] (arXiv 2510.14967; formulas from a third-party summary [3P]).

  P_k = exp(answer_logp_BU[:, k] / L) is the length-normalised likelihood of the gold answer
  (L = `answer_len_B` tokens) given the context at the *start* of turn k (query plus turns
  < k with their observations). Turn k's reward is its information gain P_{k+1} - P_k; the
  last valid turn gets the outcome score instead (IGPO's r_T, e.g. F1). Valid turns must be a
  prefix of each row (turns 0..n_i-1); invalid turns get 0. Feed the result to `turn_group`
  and `discounted_turn_returns`.

  Args:
    answer_logp_BU: summed log-prob of the gold answer's tokens at the start of each turn.
    answer_len_B: number of gold-answer tokens per row (>= 1).
    turn_mask_BU: 1 on turns that happened.
    outcome_B: outcome score of each trajectory.
  """
  shape = answer_logp_BU.shape
  if len(shape) != 2 or turn_mask_BU.shape != shape or outcome_B.shape != shape[:1] or (
      answer_len_B.shape != shape[:1]):
    raise ValueError(f"information_gain shapes disagree: answer_logp {shape}, turn_mask "
                     f"{turn_mask_BU.shape}, answer_len {answer_len_B.shape}, outcome "
                     f"{outcome_B.shape}; expected [B, U], [B, U], [B], [B].")
  length_B1 = jnp.maximum(answer_len_B.astype(jnp.float32), 1.0)[:, None]
  prob_BU = jnp.exp(answer_logp_BU.astype(jnp.float32) / length_B1)
  next_prob_BU = jnp.concatenate([prob_BU[:, 1:], jnp.zeros_like(prob_BU[:, :1])], axis=1)
  is_last_BU = _last_valid_onehot(turn_mask_BU)
  gain_BU = jnp.where(is_last_BU, outcome_B.astype(jnp.float32)[:, None], next_prob_BU - prob_BU)
  return jnp.where(turn_mask_BU > 0, gain_BU, 0.0)


def discounted_turn_returns(turn_reward_BU: jax.Array, turn_mask_BU: jax.Array, *,
                            gamma: float = 1.0, variance_rescale: bool = False) -> jax.Array:
  """Per-turn returns [B, U]: A_k = sum_{j >= k} gamma^(j - k) r_j over valid turns.

  variance_rescale=True divides by sqrt(number of summed terms), A2TGPO's variance-rescaled
  accumulation: the sum of n unit-variance z-scores has variance n [INF on the exact form,
  docs/algorithms.md §5]. Invalid turns are skipped and get 0.
  """
  ret_BU = _masked_discounted_sum(turn_reward_BU, turn_mask_BU, gamma)
  if variance_rescale:
    n_BU = _masked_discounted_sum(jnp.ones_like(ret_BU), turn_mask_BU, 1.0)
    ret_BU = ret_BU * jax.lax.rsqrt(jnp.maximum(n_BU, 1.0))
  return ret_BU


def broadcast_to_tokens(value_B: jax.Array, loss_mask_BT: jax.Array) -> jax.Array:
  """Sequence-level value [B] copied to every position where the mask is set; 0 elsewhere."""
  return jnp.where(loss_mask_BT > 0, value_B[:, None], 0.0)


def broadcast_turn_to_tokens(value_BU: jax.Array, turn_BT: jax.Array,
                             loss_mask_BT: jax.Array) -> jax.Array:
  """Per-turn values [B, U] -> [B, T] via each token's turn index (`types.Batch.turn_BT`).

  Tokens with mask 0, turn index -1 (prompt) or a turn index >= U get 0.
  """
  U = value_BU.shape[1]
  index_BT = jnp.clip(turn_BT, 0, U - 1).astype(jnp.int32)
  gathered_BT = jnp.take_along_axis(value_BU.astype(jnp.float32), index_BT, axis=1)
  valid_BT = (loss_mask_BT > 0) & (turn_BT >= 0) & (turn_BT < U)
  return jnp.where(valid_BT, gathered_BT, 0.0)


def dapo_overlong_penalty(length_B: jax.Array, *, max_len: int, buffer_len: int,
                          penalty_factor: float = 1.0) -> jax.Array:
  """DAPO's soft overlong punishment [B], added to the reward (docs/algorithms.md §4.5).

  With L_exp = max_len - buffer_len: 0 for |y| <= L_exp, -(|y| - L_exp) / buffer_len *
  penalty_factor inside the buffer, and -penalty_factor beyond max_len (the paper's -1; verl
  omits that floor, which only matters for |y| > max_len).
  """
  if not 0 < buffer_len <= max_len or penalty_factor < 0:
    raise ValueError(f"dapo_overlong_penalty needs 0 < buffer_len <= max_len and "
                     f"penalty_factor >= 0; got max_len={max_len}, buffer_len={buffer_len}, "
                     f"penalty_factor={penalty_factor}.")
  exceed_B = length_B.astype(jnp.float32) - (max_len - buffer_len)
  return jnp.clip(-exceed_B / buffer_len * penalty_factor, -penalty_factor, 0.0)


def group_has_variance(reward_B: jax.Array, *, group_size: int) -> jax.Array:
  """Bool [B]: whether the row's group has any reward spread (DAPO dynamic sampling keeps it).

  Groups with identical rewards (all solved or all failed) give zero GRPO advantage; DAPO drops
  them and samples more prompts (§4.5). Size-1 groups are never kept.
  """
  reward_PG = types.grouped(reward_B, group_size)
  spread_P1 = reward_PG.max(axis=1, keepdims=True) > reward_PG.min(axis=1, keepdims=True)
  return jnp.broadcast_to(spread_P1, reward_PG.shape).reshape(-1)


def adv_abs_mean(adv_BT: jax.Array, loss_mask_BT: jax.Array) -> jax.Array:
  """Mean |A_t| over the response tokens: the metric `adv_abs_mean` of every estimator step.

  Token-level (as verl's advantage metrics), because that is what the policy loss sees and the
  one definition that holds for sequence, turn and token advantages alike.
  """
  return aggregation.masked_mean(jnp.abs(adv_BT), loss_mask_BT)


def grpo_step(group_size: int, *, norm_by_std: bool = True) -> Callable:
  """advantage_fn(batch, extras) -> (batch with adv_BT, metrics): GRPO's outcome advantage.

  `grpo` of `batch.reward_B` on every response token. Metrics: `adv_abs_mean` (over response
  tokens) and `groups_with_signal`, the fraction of rows whose group has any reward spread
  (the rest get advantage exactly 0 and teach nothing). Pure; jit it in the experiment.
  """

  def advantage_fn(batch: types.Batch, extras):
    del extras
    adv_B = grpo(batch.reward_B, group_size=group_size, norm_by_std=norm_by_std)
    live_B = group_has_variance(batch.reward_B, group_size=group_size)
    adv_BT = broadcast_to_tokens(adv_B, batch.loss_mask_BT)
    metrics = {"adv_abs_mean": adv_abs_mean(adv_BT, batch.loss_mask_BT),
               "groups_with_signal": live_B.astype(jnp.float32).mean()}
    return batch.replace(adv_BT=adv_BT), metrics

  return advantage_fn
