# pylint: disable=invalid-name
"""Advantage estimators of the efficiency methods: BRPO, HBPO, DECS and T-PPO's extended GAE.

Rewards are data; nothing here is differentiated. Grouped functions take rows [i*G, (i+1)*G)
as the G samples of prompt i, as `agentrl.advantages.estimators` does. Formulas, defaults and the
code they were checked against: docs/algorithms.md §12.2 and §12.4-§12.6.

- BRPO (AnytimeReasoner, Qi et al. 2025, arXiv 2505.13438; `sail-sg/AnytimeReasoner`
  `verl/verl/trainer/ppo/brpo.py`): `brpo_thinking` (budget-relative advantage of each
  thinking segment), `brpo_cut_index`, `brpo_summary`, `brpo_thinking_tokens`.
- HBPO (Lyu et al. 2025, arXiv 2507.15844; `ZJU-REAL/HBPO`): `hbpo`, the intra- plus
  inter-subgroup advantage.
- DECS (Jiang et al. 2025, arXiv 2509.25827; `pixas/DECS`
  `src_valid/valid_ray_trainer.py`): `decs_token_rewards`, `decs`.
- T-PPO (Fan et al. 2025, arXiv 2506.15050): `truncated_gae`, GAE that bootstraps truncated
  responses, built on `estimators.gae`.

Token-level outputs are 0 wherever the loss mask is 0.
"""
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.rewards import length_rewards
from agentrl import types

BRPO_VARIANCE_REDUCTION = ("brpo", "v1only", "v2only", "none")


def _centre_over_group(x_PGX: jax.Array) -> jax.Array:
  """x - mean over axis 1; exactly 0 where the group's values are equal (min shift first)."""
  d_PGX = x_PGX - x_PGX.min(axis=1, keepdims=True)
  return d_PGX - d_PGX.mean(axis=1, keepdims=True)


def _budget_probs(budget_probs: Sequence[float]) -> jax.Array:
  """The prior over budgets (static numbers), normalised as brpo.py does."""
  p_S = np.asarray(budget_probs, np.float64)
  if p_S.ndim != 1 or p_S.shape[0] < 1 or np.any(p_S < 0) or not p_S.sum() > 0:
    raise ValueError(f"budget_probs must be S >= 1 non-negative numbers with a positive sum; "
                     f"got {budget_probs}.")
  return jnp.asarray(p_S / p_S.sum(), jnp.float32)


# ------------------------------------------------------------------------------------------
# BRPO
# ------------------------------------------------------------------------------------------


def brpo_thinking(budget_score_BS: jax.Array, *, group_size: int, budget_probs: Sequence[float],
                  variance_reduction: str = "brpo", discount: float = 2.0) -> jax.Array:
  """BRPO advantage of each thinking segment [B, S] (`compute_cot_advantage`).

  A_{g,s} = Ret_{g,s} - b_{g,s}, Ret_{g,s} = sum_{j >= s} p_j R_{g,j}, and for "brpo"
  b = (s V1 + (S - s) V2) / S with
    V1 = (sum_{j<s} d^j R_{g,j} / sum_{j<s} d^j) * sum_{j>=s} p_j   (0 at s = 0; d = 2),
    V2 = mean over the group of Ret_{g',s}                           (0 for G = 1).
  "v1only" and "v2only" use one term as b, "none" uses b = 0.

  Args:
    budget_score_BS: R_{g,s}, the mean summary score of row g's thinking cut at budget s (the
      A summaries of that cut; for a budget past the thinking's end, the summaries drawn from
      the complete thinking for that budget).
    group_size: G.
    budget_probs: the prior p_s over budgets (normalised here). The authors' runs use S = 4
      with "linear" (p proportional to the budget), "uniform" or "base" (all mass on the last).
    variance_reduction: one of BRPO_VARIANCE_REDUCTION.
    discount: the weight base d of V1's discounted mean of the row's earlier scores.
  """
  if variance_reduction not in BRPO_VARIANCE_REDUCTION:
    raise ValueError(f"variance_reduction must be one of {BRPO_VARIANCE_REDUCTION}, got "
                     f"{variance_reduction!r}.")
  if budget_score_BS.ndim != 2:
    raise ValueError(f"budget_score_BS must be [B, S]; got shape {budget_score_BS.shape}.")
  S = budget_score_BS.shape[1]
  p_S = _budget_probs(budget_probs)
  if p_S.shape[0] != S:
    raise ValueError(f"budget_probs has {p_S.shape[0]} entries but budget_score_BS has S={S}.")
  R_PGS = types.grouped(budget_score_BS, group_size)
  tail_S = jnp.cumsum(p_S[::-1])[::-1]                           # sum_{j >= s} p_j
  # Shifting each row by its smallest score makes constant scores give Ret - V1 = 0 exactly.
  d_PGS = R_PGS - R_PGS.min(axis=2, keepdims=True)
  w_S = jnp.power(jnp.float32(discount), jnp.arange(S, dtype=jnp.float32))
  w_prefix_S = jnp.cumsum(w_S) - w_S                             # sum_{j < s} d^j
  w_11S, w_prefix_11S = w_S[None, None], w_prefix_S[None, None]
  d_prefix_PGS = jnp.cumsum(d_PGS * w_11S, axis=2) - d_PGS * w_11S
  prev_mean_PGS = jnp.where(w_prefix_11S > 0, d_prefix_PGS / jnp.maximum(w_prefix_11S, 1e-30),
                            0.0)
  # Ret - V1 = sum_{j >= s} p_j (R_j - mean_prev); at s = 0, V1 = 0 and this is Ret itself.
  tail_d_PGS = jnp.cumsum((d_PGS * p_S[None, None])[..., ::-1], axis=2)[..., ::-1]
  ret_PGS = tail_d_PGS + R_PGS.min(axis=2, keepdims=True) * tail_S[None, None]
  minus_v1_PGS = jnp.where(jnp.arange(S)[None, None] > 0,
                           tail_d_PGS - prev_mean_PGS * tail_S[None, None], ret_PGS)
  minus_v2_PGS = _centre_over_group(ret_PGS) if group_size > 1 else ret_PGS
  s_11S = jnp.arange(S, dtype=jnp.float32)[None, None]
  adv_PGS = {"brpo": (s_11S * minus_v1_PGS + (S - s_11S) * minus_v2_PGS) / S,
             "v1only": minus_v1_PGS, "v2only": minus_v2_PGS, "none": ret_PGS
             }[variance_reduction]
  return adv_PGS.reshape(budget_score_BS.shape)


def brpo_cut_index(thinking_len_B: jax.Array, *, budgets: Sequence[int]) -> jax.Array:
  """Which cut each budget slot's summaries come from [B, S] (`sample_partial_cot`).

  Slot s summarises the thinking cut at b_s; a thinking of length L <= b_s is not cut, so all
  such slots share one cut: with k = #{s : b_s < L} + 1 distinct cuts (at most S), slot s uses
  cut min(s, k - 1). Cut k - 1 is also the thinking segment [b_{k-2}, L).
  """
  b_S = jnp.asarray(budgets, jnp.int32)
  L_B = jnp.asarray(thinking_len_B, jnp.int32)
  k_B = jnp.minimum(jnp.sum(b_S[None, :] < L_B[:, None], axis=1) + 1, b_S.shape[0])
  return jnp.minimum(jnp.arange(b_S.shape[0])[None, :], k_B[:, None] - 1)


def brpo_summary(summary_score_BSA: jax.Array, cut_BS: jax.Array, *, group_size: int,
                 summary_method: str = "brpo") -> jax.Array:
  """BRPO advantage of each summary [B, S, A] (`compute_summary_advantage`).

  A summary gets R - baseline. With one summary per budget (A = 1) the baseline is the group
  mean of the scores in the same budget slot; with A > 1 it is the mean of all summaries of
  the row drawn from the same cut (`cut_BS`, from `brpo_cut_index`), as `get_grpo_metrics_dict`
  groups them. summary_method="grpo" keeps only the last slot's last summary (the others 0).
  """
  if summary_method not in ("brpo", "grpo"):
    raise ValueError(f"summary_method must be 'brpo' or 'grpo', got {summary_method!r}.")
  if summary_score_BSA.ndim != 3 or cut_BS.shape != summary_score_BSA.shape[:2]:
    raise ValueError(f"brpo_summary expects scores [B, S, A] and cut_BS [B, S]; got "
                     f"{summary_score_BSA.shape} and {cut_BS.shape}.")
  B, S, A = summary_score_BSA.shape
  scores = summary_score_BSA.astype(jnp.float32)
  if A == 1:
    adv_BSA = _centre_over_group(types.grouped(scores, group_size)).reshape(B, S, A)
  else:
    same_BSS = cut_BS[:, :, None] == cut_BS[:, None, :]          # slots sharing a cut
    # Shift by the cut's lowest score: a cut whose summaries all score alike gets exactly 0.
    low_BS = jnp.where(same_BSS, scores.min(-1)[:, None, :], jnp.inf).min(-1)
    d_BSA = scores - low_BS[..., None]
    total_BS = jnp.einsum("bst,bt->bs", same_BSS.astype(jnp.float32), d_BSA.sum(-1))
    count_BS = same_BSS.sum(-1).astype(jnp.float32) * A
    adv_BSA = d_BSA - (total_BS / count_BS)[..., None]
  if summary_method == "grpo":
    last_SA = (jnp.arange(S)[:, None] == S - 1) & (jnp.arange(A)[None, :] == A - 1)
    adv_BSA = jnp.where(last_SA, adv_BSA, 0.0)
  return adv_BSA


def brpo_thinking_tokens(adv_BS: jax.Array, thinking_mask_BT: jax.Array, *,
                         budgets: Sequence[int]) -> jax.Array:
  """Thinking-segment advantages on the thinking tokens [B, T] (`compute_token_level_advantage`).

  The n-th thinking token of a row (n counted over `thinking_mask_BT`) lies in segment s with
  b_{s-1} <= n < b_s and gets adv_BS[:, s]. Tokens past the last budget, and every token with
  mask 0 (prompt, summary, padding), get 0.
  """
  mask_BT = thinking_mask_BT > 0
  offset_BT = jnp.cumsum(mask_BT, axis=1) - 1
  segment_BT = jnp.searchsorted(jnp.asarray(budgets, jnp.int32), offset_BT, side="right")
  return estimators.broadcast_turn_to_tokens(adv_BS, segment_BT, mask_BT)


# ------------------------------------------------------------------------------------------
# HBPO
# ------------------------------------------------------------------------------------------


def hbpo(reward_B: jax.Array, budget_B: jax.Array, *, group_size: int, intra_coef: float = 1.0,
         max_len: int = 4096, beta: float = 4.0, pi: float = length_rewards.HBPO_PI,
         eps: float = 1e-6) -> jax.Array:
  """HBPO advantages [B]: A_ij = (R_ij - mean R) / (std R + eps) + c (mu_i - f2(b_i)).

  The first term is GRPO over the whole group (unbiased std, `estimators.grpo`); mu_i is the
  mean reward of subgroup i, the rows of the group with budget b_i, and f2(b) =
  `length_rewards.hbpo_budget_reward(b)` (paper Algorithm 1, `core_algos.py`). c = 1 is the
  paper's; the released `compute_grpo_outcome_advantage` adds the intra term twice (c = 2). A
  size-1 group gets R / (1 + eps) and no intra term, as that code. c = 0 is GRPO.
  """
  if reward_B.shape != budget_B.shape or reward_B.ndim != 1:
    raise ValueError(f"hbpo expects two [B] arrays; got {reward_B.shape} and {budget_B.shape}.")
  inter_B = estimators.grpo(reward_B, group_size=group_size, eps=eps)
  if group_size == 1:
    return inter_B
  R_PG = types.grouped(reward_B, group_size)
  b_PG = types.grouped(budget_B, group_size)
  same_PGG = (b_PG[:, :, None] == b_PG[:, None, :]).astype(jnp.float32)
  mu_PG = jnp.einsum("pgh,ph->pg", same_PGG, R_PG) / same_PGG.sum(-1)
  f2_PG = length_rewards.hbpo_budget_reward(b_PG, max_len=max_len, beta=beta, pi=pi)
  return inter_B + intra_coef * (mu_PG - f2_PG).reshape(-1)


# ------------------------------------------------------------------------------------------
# DECS
# ------------------------------------------------------------------------------------------


def decs_token_rewards(score_B: jax.Array, redundant_BT: jax.Array, loss_mask_BT: jax.Array, *,
                       max_response_len: int, beta: float = 0.1) -> jax.Array:
  """DECS's decoupled token rewards [B, T] (`compute_grpo_proc_length_advantage_return`).

  Every position gets s (1 + beta), s the row's outcome score. In a row with s > 0 the span
  from the first to the last token the detector marked redundant (`redundant_BT`: the chunks
  after the first one that reaches the answer) gets s + beta (1 - L / T) instead, with L the
  response length and T = `max_response_len`, the padded response width of the official code.
  beta = `length_reward_beta` = 0.1. Positions outside the response keep s (1 + beta): the
  official per-position baseline sees them too.
  """
  if redundant_BT.shape != loss_mask_BT.shape or score_B.shape != loss_mask_BT.shape[:1]:
    raise ValueError(f"decs_token_rewards shapes disagree: score {score_B.shape}, redundant "
                     f"{redundant_BT.shape}, loss_mask {loss_mask_BT.shape}.")
  if max_response_len < 1:
    raise ValueError(f"max_response_len must be >= 1, got {max_response_len}.")
  s_B1 = score_B.astype(jnp.float32)[:, None]
  L_B1 = (loss_mask_BT > 0).sum(axis=1, keepdims=True).astype(jnp.float32)
  marked_BT = (redundant_BT > 0) & (s_B1 > 0)
  t_1T = jnp.arange(marked_BT.shape[1])[None]
  first_B1 = jnp.min(jnp.where(marked_BT, t_1T, marked_BT.shape[1]), axis=1, keepdims=True)
  last_B1 = jnp.max(jnp.where(marked_BT, t_1T, -1), axis=1, keepdims=True)
  span_BT = (t_1T >= first_B1) & (t_1T <= last_B1)
  return jnp.where(span_BT, s_B1 + beta * (1.0 - L_B1 / max_response_len), s_B1 * (1.0 + beta))


def decs(score_B: jax.Array, redundant_BT: jax.Array, loss_mask_BT: jax.Array, *,
         group_size: int, max_response_len: int, beta: float = 0.1,
         eps: float = 1e-6) -> jax.Array:
  """DECS advantages [B, T]: per-position z-score of `decs_token_rewards` over the group.

  A_t = (r_t - mean_g r_t) / (std_g r_t + eps) at every position t, unbiased std; a group of
  one has mean 0 and std 1. Rows of a group must share their prompt length so that a column is
  the same response position in every row (true of single-turn groups). beta = 0 is GRPO.
  """
  r_BT = decs_token_rewards(score_B, redundant_BT, loss_mask_BT,
                            max_response_len=max_response_len, beta=beta)
  r_PGT = types.grouped(r_BT, group_size)
  if group_size == 1:
    adv_PGT = r_PGT / (1.0 + eps)
  else:
    centred_PGT = _centre_over_group(r_PGT)
    std_P1T = jnp.std(centred_PGT, axis=1, ddof=1, keepdims=True)
    adv_PGT = centred_PGT / (std_P1T + eps)
  return jnp.where(loss_mask_BT > 0, adv_PGT.reshape(r_BT.shape), 0.0)


# ------------------------------------------------------------------------------------------
# T-PPO
# ------------------------------------------------------------------------------------------


def truncated_gae(reward_BT: jax.Array, value_BT: jax.Array, mask_BT: jax.Array,
                  truncated_B: jax.Array, bootstrap_value_B: jax.Array, *, gamma: float = 1.0,
                  lam: float = 1.0) -> tuple[jax.Array, jax.Array, jax.Array]:
  """T-PPO's extended GAE: (advantages [B, T], returns [B, T], value_mask [B, T]).

  A truncated row (cut by the generation window, not finished) bootstraps from the value at
  the truncation point: its last policy token's delta is r + gamma V(s_trunc) - V, i.e.
  `estimators.gae` with gamma * V(s_trunc) added to that token's reward [INF on the exact form,
  docs/algorithms.md §12.6]. Finished rows are plain GAE. value_mask is the loss mask of the
  finished rows only: T-PPO trains the critic on completed responses.

  Args:
    bootstrap_value_B: V(s_trunc), the critic's value of the state after the row's last
      sampled token (with `value_BT` aligned as in experiments/policy/ppo.py, the head's output at
      the last token's hidden state); ignored for finished rows.
  """
  if truncated_B.shape != reward_BT.shape[:1] or bootstrap_value_B.shape != truncated_B.shape:
    raise ValueError(f"truncated_gae expects truncated_B and bootstrap_value_B of shape "
                     f"[B] = {reward_BT.shape[:1]}; got {truncated_B.shape} and "
                     f"{bootstrap_value_B.shape}.")
  valid_BT = mask_BT > 0
  T = valid_BT.shape[1]
  last_B = T - 1 - jnp.argmax(valid_BT[:, ::-1], axis=1)
  is_last_BT = (jnp.arange(T)[None, :] == last_B[:, None]) & valid_BT
  extra_B = jnp.where(truncated_B, gamma * bootstrap_value_B.astype(jnp.float32), 0.0)
  reward_BT = reward_BT.astype(jnp.float32) + jnp.where(is_last_BT, extra_B[:, None], 0.0)
  adv_BT, ret_BT = estimators.gae(reward_BT, value_BT, mask_BT, gamma=gamma, lam=lam)
  value_mask_BT = jnp.where(truncated_B[:, None], 0.0, mask_BT.astype(jnp.float32))
  return adv_BT, ret_BT, value_mask_BT
