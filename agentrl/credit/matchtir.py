# pylint: disable=invalid-name
"""MatchTIR: turn-level credit for tool use by matching predicted calls to gold calls.

Qu et al. 2026, arXiv 2601.10712; official code quchangle1/MatchTIR (read at commit f614ce1):
`Code/verl/utils/reward_score/tool.py` (`tool_similarity`, `match_score`,
`hungarian_assignment`, `assign_rewards_hungarian`, `assign_rewards_ot`, `compute_process_KM`,
`compute_process_ot`) and `Code/verl/trainer/ppo/core_algos.py` (`compute_grpo_outcome_advantage`,
where the dual-level advantage lives); `Scripts/run.sh` trains with `compute_process_KM`.
Formulas and pitfalls: docs/algorithms.md §5.2.

Host side (plain Python, numpy and scipy), on already-parsed calls `{"name": str,
"arguments": dict}` (a gold call's arguments may also sit under "parameters", the data's key):

- `call_similarity`: 0 for a different tool name (case-insensitive); otherwise
  (1 + key overlap + number of gold arguments whose value matches) / (2 + #gold arguments).
- `assign_rewards`: one reward per predicted call, by a hard one-to-one matching ("greedy", the
  official `hungarian_assignment`, which despite its name matches pairs greedily by descending
  similarity; or "kuhn_munkres", the optimal assignment of `scipy.optimize.linear_sum_assignment`)
  or by entropic optimal transport ("ot": Sinkhorn with uniform marginals, cost -S, reg 0.1,
  reward = sum_j T_ij S_ij as in `assign_rewards_ot`).
- `turn_rewards`: all calls of a trajectory are matched jointly against the gold calls, then a
  turn's reward is the mean of its calls' rewards (0 for a turn without calls); the answer turn
  carries the answer score instead (token-set F1 in the official code).

Device side: `dual_advantage` (the official fusion) = (A_traj + A_turn) / 2 per turn, with
A_traj the GRPO z-score of the summed turn rewards and A_turn the (prompt, turn index) z-score of
the discounted turn returns with gamma 0.9 (hard-coded `lam = 0.9` there).
"""
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize

from agentrl.advantages import estimators

METHODS = ("greedy", "kuhn_munkres", "ot")


def key_overlap(keys_a: Sequence[Any], keys_b: Sequence[Any]) -> float:
  """The official `match_score`: multiset Jaccard |a ∩ b| / |a ∪ b|; 1 for equal lists."""
  a, b = list(keys_a), list(keys_b)
  if a == b:
    return 1.0
  if not a or not b:
    return 0.0
  count_a: dict[Any, int] = {}
  count_b: dict[Any, int] = {}
  for k in a:
    count_a[k] = count_a.get(k, 0) + 1
  for k in b:
    count_b[k] = count_b.get(k, 0) + 1
  inter = sum(min(n, count_b[k]) for k, n in count_a.items() if k in count_b)
  return inter / (len(a) + len(b) - inter)


def _arguments(call: Mapping[str, Any], *keys: str) -> Mapping[str, Any]:
  for key in keys:
    args = call.get(key)
    if args is not None:
      # A call whose arguments are not an object (a list, a bare string) matches no key.
      return args if isinstance(args, Mapping) else {}
  return {}


def call_similarity(pred: Mapping[str, Any], gold: Mapping[str, Any]) -> float:
  """Similarity in [0, 1] of one predicted call to one gold call (`tool_similarity`)."""
  if str(pred.get("name", "")).lower() != str(gold.get("name", "")).lower():
    return 0.0
  pred_args = _arguments(pred, "arguments")
  gold_args = _arguments(gold, "arguments", "parameters")
  values = sum(1.0 for k, v in gold_args.items() if k in pred_args and pred_args[k] == v)
  score = 1.0 + key_overlap(list(gold_args), list(pred_args)) + values
  return score / (2.0 + len(gold_args))


def similarity_matrix(preds: Sequence[Mapping[str, Any]],
                      golds: Sequence[Mapping[str, Any]]) -> np.ndarray:
  """S [P, G] with S_ij = call_similarity(preds[i], golds[j]), float64."""
  S = np.zeros((len(preds), len(golds)), np.float64)
  for i, p in enumerate(preds):
    for j, g in enumerate(golds):
      S[i, j] = call_similarity(p, g)
  return S


def greedy_assignment(S: np.ndarray) -> list[int | None]:
  """The official `hungarian_assignment`: take pairs by descending S, each row and column once,
  only pairs with S > 0. Ties go in row-major order (the official stable sort on S alone)."""
  P, G = S.shape
  pairs = sorted(((S[i, j], i, j) for i in range(P) for j in range(G)), key=lambda p: p[0],
                 reverse=True)
  match: list[int | None] = [None] * P
  used: set[int] = set()
  for score, i, j in pairs:
    if score > 0 and match[i] is None and j not in used:
      match[i] = j
      used.add(j)
  return match


def kuhn_munkres_assignment(S: np.ndarray) -> list[int | None]:
  """Maximum-total-similarity one-to-one matching (Kuhn-Munkres); pairs with S = 0 unmatched."""
  match: list[int | None] = [None] * S.shape[0]
  if S.size:
    rows, cols = optimize.linear_sum_assignment(S, maximize=True)
    for i, j in zip(rows, cols):
      if S[i, j] > 0:
        match[i] = int(j)
  return match


def sinkhorn(a: np.ndarray, b: np.ndarray, cost: np.ndarray, *, reg: float,
             num_iters: int = 1000, tol: float = 1e-9) -> np.ndarray:
  """Entropic OT plan T = diag(u) K diag(v), K = exp(-cost / reg) (Sinkhorn-Knopp).

  The iteration, stopping rule (marginal error checked every 10 iterations, threshold 1e-9,
  at most 1000 iterations) and the fallback to the previous scalings on a numerical failure
  follow POT's `ot.sinkhorn` default, which the official `assign_rewards_ot` calls.
  """
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  K = np.exp(-np.asarray(cost, np.float64) / reg)
  u, v = np.full(a.shape, 1.0 / a.size), np.full(b.shape, 1.0 / b.size)
  for it in range(num_iters):
    prev_u, prev_v = u, v
    Ktu = K.T @ u
    v = b / Ktu
    u = 1.0 / ((K / a[:, None]) @ v)
    if np.any(Ktu == 0) or not (np.all(np.isfinite(u)) and np.all(np.isfinite(v))):
      u, v = prev_u, prev_v
      break
    if it % 10 == 0 and np.linalg.norm((u[:, None] * K * v[None, :]).sum(0) - b) < tol:
      break
  return u[:, None] * K * v[None, :]


def assign_rewards(preds: Sequence[Mapping[str, Any]], golds: Sequence[Mapping[str, Any]], *,
                   method: str = "greedy", unmatched_penalty: float = 0.0,
                   reg: float = 0.1) -> list[float]:
  """One reward per predicted call.

  Hard matchings give a matched call its similarity and an unmatched one `unmatched_penalty`
  (0 in the official training path `compute_process_KM`; `assign_rewards_hungarian`'s own
  default is -0.5). "ot" gives sum_j T_ij S_ij with T the Sinkhorn plan between uniform
  marginals (each row of T sums to 1/P, so rewards shrink with the number of calls, as in the
  official code); with no gold calls every "ot" reward is 0 [INF: the official call fails].
  """
  if method not in METHODS:
    raise ValueError(f"method={method!r}; expected one of {METHODS}.")
  if not preds:
    return []
  S = similarity_matrix(preds, golds)
  if method == "ot":
    if not golds:
      return [0.0] * len(preds)
    P, G = S.shape
    T = sinkhorn(np.full(P, 1.0 / P), np.full(G, 1.0 / G), -S, reg=reg)
    return (T * S).sum(axis=1).tolist()
  match = greedy_assignment(S) if method == "greedy" else kuhn_munkres_assignment(S)
  return [unmatched_penalty if j is None else float(S[i, j]) for i, j in enumerate(match)]


def turn_rewards(calls_per_turn: Sequence[Sequence[Mapping[str, Any]]],
                 golds: Sequence[Mapping[str, Any]], *, answer_score: float | None = None,
                 method: str = "greedy", unmatched_penalty: float = 0.0,
                 reg: float = 0.1) -> list[float]:
  """Per-turn process rewards of one trajectory (`compute_process_KM` / `compute_process_ot`).

  Args:
    calls_per_turn: the parsed tool calls of each assistant turn, in order.
    golds: the gold calls of the task.
    answer_score: if given, the last turn is the answer turn: its calls are ignored and its
      reward is this score (the official code uses the token-set F1 of the answer).
    method, unmatched_penalty, reg: see `assign_rewards`.
  """
  n = len(calls_per_turn)
  tool_turns = range(n - 1 if answer_score is not None else n)
  flat = [(u, call) for u in tool_turns for call in calls_per_turn[u]]
  rewards = assign_rewards([c for _, c in flat], golds, method=method,
                           unmatched_penalty=unmatched_penalty, reg=reg)
  total, count = [0.0] * n, [0] * n
  for (u, _), r in zip(flat, rewards):
    total[u] += r
    count[u] += 1
  out = [t / c if c else 0.0 for t, c in zip(total, count)]
  if answer_score is not None and n:
    out[-1] = float(answer_score)
  return out


def dual_advantage(turn_reward_BU: jax.Array, turn_mask_BU: jax.Array, *, group_size: int,
                   gamma: float = 0.9, norm_by_std: bool = True, eps: float = 1e-6) -> jax.Array:
  """MatchTIR's dual-level advantage per turn [B, U]: (A_traj + A_turn) / 2; 0 on absent turns.

  A_traj: GRPO of R = sum of the valid turn rewards (std division iff norm_by_std, verl's
  `norm_adv_by_std_in_grpo`, default on). A_turn: the discounted turn returns
  (gamma 0.9, the official hard-coded `lam`) z-scored within each (prompt, turn index) group
  with the unbiased std and eps 1e-6, always divided by the std; a (prompt, turn) group of one
  uses mean 0 and std 1. Valid turns must be a prefix of each row (turn index = position).
  """
  if turn_reward_BU.shape != turn_mask_BU.shape or turn_reward_BU.ndim != 2:
    raise ValueError(f"dual_advantage expects matching [B, U] arrays; got "
                     f"{turn_reward_BU.shape} and {turn_mask_BU.shape}.")
  valid_BU = turn_mask_BU > 0
  reward_BU = jnp.where(valid_BU, turn_reward_BU.astype(jnp.float32), 0.0)
  traj_B = estimators.grpo(reward_BU.sum(axis=1), group_size=group_size,
                           norm_by_std=norm_by_std, eps=eps)
  returns_BU = estimators.discounted_turn_returns(reward_BU, valid_BU, gamma=gamma)
  turn_BU = estimators.turn_group(returns_BU, valid_BU, group_size=group_size, eps=eps)
  return jnp.where(valid_BU, (traj_B[:, None] + turn_BU) / 2.0, 0.0)
