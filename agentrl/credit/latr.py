# pylint: disable=invalid-name
"""LATR: lookahead tree-based rollouts (Xing et al. 2025, arXiv 2510.24302), the branching rule.

LATR grows each prompt's n responses as a tree while decoding: at a step where the second most
likely token is both likely and close to the first, the row keeps the top token and a new
branch takes the alternative; a branch whose continuation after r more steps is too similar to
its parent's (normalized edit distance below a threshold) is pruned. Between branch points a
row decodes greedily. When the tree is full (or after a step budget) every row is finished by
ordinary sampling, and the n sequences train as independent GRPO samples
(`tree.token_weights(mode="paths")`). Only the rollout changes; these pure functions are what
the engine calls (docs/algorithms.md §5.9).

Official code: starreeze/latr (read at commit 2adb0ed), `model/sample_filter.py` (`ProbFilter`,
`RolloutFilter`), `model/generation.py` (`_sample_new_sequence_with_rollout`, the stop rule in
`generate`), `model/utils.py` (`BranchDynamicParam`, `KeyTokenGenConfigMixin` defaults) and the
launches `scripts/grpo-kt-countdown.sh`, `scripts/grpo-kt-math.sh`. Defaults [code]:
  * m = 2 candidates per step (`max_n_branch_per_token`), from the unprocessed distribution
    (softmax of the logits, no temperature or top-p);
  * candidate i >= 1 branches when p_i > 0.25 (tau_abs) and p_0 - p_i < 0.15 (tau_rel) (the
    module and Countdown defaults; the MATH launch uses 0.15 and 0.25);
  * capacity: a prompt's tree holds at most n rows (`rollout.n = 8` times the mix ratio);
    the alternatives of one step are admitted rank first, then row order, until it is full;
  * between branch points a row takes the top token (`sample_nk="none"`);
  * pruning at r in (20, 30, 50) steps after a branch's birth: edit_distance(branch's last r
    tokens, parent's) / r < 0.4 removes the branch (tau_ed, Countdown; the MATH launch uses a
    suffix-match 0.2 and ROUGE-L 0.5 rule instead); windows with an EOS are not compared;
  * the tree returns when its rows (finished rows' trees count as full) reach
    round(capacity x (0.98 - 0.05 step / max_new_tokens)) and no branch is younger than 50
    steps, or at `force_return_step` (512 Countdown, 1024 MATH);
  * `mix_ratio_schedule`: the fraction of the n samples drawn by LATR ({0: 1.0} by default;
    Countdown GRPO {0: 1, 10: .75, 20: .5, 80: .25, 200: 0}, MATH {0: 1, 100: .75, 200: .5,
    300: .25}), the rest by plain sampling.
"""
from collections.abc import Mapping, Sequence

import numpy as np


def branch_candidates(top_probs_XM, *, abs_thres: float | None = 0.25,
                      rel_thres: float | None = 0.15) -> np.ndarray:
  """bool [..., M-1]: which alternatives (ranks 1..M-1) qualify as branches.

  Args:
    top_probs_XM: the M largest token probabilities at each position, descending, from the
      unprocessed softmax (temperature 1) [code].
    abs_thres: p_i > abs_thres (None: no condition).
    rel_thres: p_0 - p_i < rel_thres (None: no condition).
  """
  p = np.asarray(top_probs_XM, np.float64)
  if p.ndim < 1 or p.shape[-1] < 2:
    raise ValueError(f"branch_candidates expects [..., M >= 2] top probabilities; got {p.shape}.")
  ok = np.ones(p[..., 1:].shape, bool)
  if abs_thres is not None:
    ok &= p[..., 1:] > abs_thres
  if rel_thres is not None:
    ok &= p[..., :1] - p[..., 1:] < rel_thres
  return ok


def step_branches(alt_ok_RK, capacity: int) -> np.ndarray:
  """bool [R, K]: the alternatives admitted as new branches at one decode step of one tree.

  Args:
    alt_ok_RK: `branch_candidates` for each of the tree's R current rows (all-False for a
      finished row, which still holds its place), K = M - 1 alternatives per row.
    capacity: the most rows the tree may hold (n x mix ratio).

  Every row keeps its top token; the alternatives are admitted in (rank, row) order while the
  tree has room, as the official capacity assignment.
  """
  ok = np.asarray(alt_ok_RK, bool)
  if ok.ndim != 2:
    raise ValueError(f"step_branches expects [R, K] candidates; got {ok.shape}.")
  room = max(capacity - ok.shape[0], 0)
  rank, row = np.nonzero(ok.T)  # rank-major, then row: the admission order
  out = np.zeros_like(ok)
  out[row[:room], rank[:room]] = True
  return out


def edit_distance(a: Sequence[int], b: Sequence[int]) -> int:
  """Levenshtein distance between two token sequences (unit insert, delete, substitute)."""
  a, b = list(a), list(b)
  prev = np.arange(len(b) + 1)
  for i, x in enumerate(a, 1):
    cur = np.empty_like(prev)
    cur[0] = i
    for j, y in enumerate(b, 1):
      cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y))
    prev = cur
  return int(prev[-1])


def should_prune(branch_tokens, parent_tokens, fork_at: int, *,
                 steps: Sequence[int] = (20, 30, 50), edit_dist_thres: float = 0.4,
                 stop_ids: Sequence[int] = ()) -> bool:
  """True when the branch born at `fork_at` (its first own token) copies its parent.

  For each r in `steps` that both rows have reached (tokens [fork_at, fork_at + r) exist on
  both): compare the two r-token windows; a window holding a stop id is skipped (the official
  check skips EOS); edit_distance / r < edit_dist_thres prunes [code]. Call it as the branch
  grows; the answer for a window never changes once the tokens exist.
  """
  branch, parent = np.asarray(branch_tokens), np.asarray(parent_tokens)
  stops = np.asarray(list(stop_ids))
  for r in steps:
    end = fork_at + r
    if r < 1 or len(branch) < end or len(parent) < end:
      continue
    a, b = branch[fork_at:end], parent[fork_at:end]
    if np.isin(a, stops).any() or np.isin(b, stops).any():
      continue
    if edit_distance(a, b) / r < edit_dist_thres:
      return True
  return False


def mix_ratio(step: int, schedule: Mapping[int, float] | None = None) -> float:
  """The fraction of a prompt's samples drawn by LATR at training step `step`: the value of
  the last schedule entry at or before it ({0: 1.0} by default) [code]."""
  schedule = {0: 1.0} if schedule is None else schedule
  keys = sorted(schedule)
  if not keys or keys[0] > step:
    raise ValueError(f"mix_ratio: the schedule {dict(schedule)} has no entry at or before "
                     f"step {step}; start it at step 0.")
  return float(schedule[max(k for k in keys if k <= step)])


def tree_full(rows_per_tree: Sequence[int], tree_done: Sequence[bool], youngest_age: int, *,
              capacity: int, step: int, max_new_tokens: int, thres_init: float = 0.98,
              thres_decay: float = 0.0, prune_steps: Sequence[int] = (20, 30, 50)) -> bool:
  """Whether the batch of trees stops branching and finishes by plain sampling [code].

  Args:
    rows_per_tree: each tree's current rows (finished ones included).
    tree_done: whether every row of the tree has finished (such a tree counts as full).
    youngest_age: decode steps since the most recent branch (or the start) was born.
    capacity: the most rows a tree may hold.
    step, max_new_tokens: the decode step and the token budget (the threshold decays over it).
    thres_init, thres_decay: 0.98 and 0 [code defaults]; both launches set the decay to 0.05.
    prune_steps: the pruning windows; pruning must have run on every branch.

  The batch stops when the counted rows reach
  round(capacity x trees x (thres_init - thres_decay x step / max_new_tokens)) and
  youngest_age > max(prune_steps).
  """
  counted = sum(capacity if done else n for n, done in zip(rows_per_tree, tree_done))
  thres = thres_init - thres_decay * step / max_new_tokens
  return (counted >= round(capacity * len(rows_per_tree) * thres)
          and youngest_age > max(prune_steps))
