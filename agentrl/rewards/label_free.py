"""Label-free group rewards: TTRL majority vote, EMPO cluster frequency, self-play win rates.

Host Python over one prompt's group of G answers (no jax), like the other reward modules, but
group-level: a function maps the G extracted answers (None or "" when there is none) to G
floats. `per_group` applies one to a flat list whose rows [i*G, (i+1)*G) are prompt i's.
docs/algorithms.md §13.6.

- TTRL (Zuo et al. 2025, arXiv 2504.16084): reward 1 for answers in the majority cluster.
- EMPO (Zhang et al. 2025, arXiv 2504.05812): reward = the frequency of the answer's semantic
  cluster, so maximising it minimises the semantic entropy.
  Both as dl-m9/SIOP `verl/utils/siop/siop_process_reward.py` (`compute_ttrl_majority_rewards`,
  `compute_empo_cluster_freq_rewards`, commit a871ef9): clusters are built greedily over the
  valid answers in order (`nli_clustering.cluster_answers`), frequencies divide by the number
  of valid answers, and answerless rollouts get 0.
- Self-play win rate: each candidate's mean score in a round-robin of pairwise judgements
  against the rest of its group, the group-relative reward of pairwise-judge RL (e.g.
  Tournament-GRPO, arXiv 2605.26958, which plays repeated multi-round tournaments) [INF on the
  single round-robin form].
"""
from collections.abc import Callable, Sequence
from typing import Any

Same = Callable[[str, str], bool]


def _valid(answer: str | None) -> bool:
  return answer is not None and bool(str(answer).strip())


def _exact(a: str, b: str) -> bool:
  return str(a).strip() == str(b).strip()


def cluster_ids(answers: Sequence[str | None], *, same: Same | None = None) -> list[int]:
  """Cluster id per answer, -1 for a missing answer; ids count up in order of appearance.

  Greedy, as SIOP's `cluster_answers`: the first unassigned answer opens cluster c and every
  later unassigned answer that `same(first, later)` accepts joins it. `same` defaults to
  string equality after stripping whitespace; pass a math-equivalence check (e.g. built on
  `agentrl.rewards.verifiers`) or an NLI test (SIOP uses bidirectional entailment) for
  semantic clusters. `same` is called with the cluster's first member first.
  """
  same = same or _exact
  ids = [-1] * len(answers)
  next_id = 0
  for i, answer in enumerate(answers):
    if ids[i] != -1 or not _valid(answer):
      continue
    ids[i] = next_id
    for j in range(i + 1, len(answers)):
      if ids[j] == -1 and _valid(answers[j]) and same(answer, answers[j]):
        ids[j] = next_id
    next_id += 1
  return ids


def _counts(ids: Sequence[int]) -> dict[int, int]:
  counts: dict[int, int] = {}
  for c in ids:
    if c >= 0:
      counts[c] = counts.get(c, 0) + 1
  return counts


def majority_vote_rewards(answers: Sequence[str | None], *,
                          same: Same | None = None) -> list[float]:
  """TTRL: 1.0 for answers in the largest cluster, 0.0 otherwise (and for missing answers).

  A tie between clusters goes to the one that appears first (SIOP's `max` over an
  insertion-ordered dict); a group without any answer gets all zeros.
  """
  ids = cluster_ids(answers, same=same)
  counts = _counts(ids)
  if not counts:
    return [0.0] * len(ids)
  majority = max(counts, key=counts.get)  # first maximum in order of appearance
  return [1.0 if c == majority else 0.0 for c in ids]


def cluster_frequency_rewards(answers: Sequence[str | None], *,
                              same: Same | None = None) -> list[float]:
  """EMPO: |cluster| / K for each answer, K = the number of valid answers; 0.0 if missing.

  A group with a single valid answer gives it 1.0, as SIOP does.
  """
  ids = cluster_ids(answers, same=same)
  counts = _counts(ids)
  k = sum(counts.values())
  return [counts[c] / k if c >= 0 else 0.0 for c in ids]


def round_robin_win_rates(candidates: Sequence[Any], judge: Callable[[Any, Any], float], *,
                          both_orders: bool = True) -> list[float]:
  """Self-play reward: each candidate's mean score against every other one of its group.

  `judge(a, b)` returns a's score against b in [0, 1] (1 win, 0.5 tie, 0 loss). With
  `both_orders` (default) each pair is judged in both presentation orders and
  s_ab = (judge(a, b) + 1 - judge(b, a)) / 2, which cancels a judge's position bias [INF, the
  usual LLM-judge practice]; otherwise each unordered pair is judged once and s_ba = 1 - s_ab.
  The scores are antisymmetric, so the rewards of a group average 0.5. A lone candidate has
  no opponent and gets 0.5.
  """
  n = len(candidates)
  if n < 2:
    return [0.5] * n
  score = [[0.0] * n for _ in range(n)]
  for i in range(n):
    for j in range(i + 1, n):
      s_ij = float(judge(candidates[i], candidates[j]))
      if both_orders:
        s_ij = 0.5 * (s_ij + 1.0 - float(judge(candidates[j], candidates[i])))
      if not 0.0 <= s_ij <= 1.0:
        raise ValueError(f"judge scores must lie in [0, 1]; got {s_ij} for pair ({i}, {j}).")
      score[i][j], score[j][i] = s_ij, 1.0 - s_ij
  return [sum(row) / (n - 1) for row in score]


def per_group(values: Sequence[Any], group_size: int,
              reward_fn: Callable[[Sequence[Any]], list[float]]) -> list[float]:
  """Applies a group reward to a flat list whose rows [i*G, (i+1)*G) are prompt i's samples."""
  if group_size < 1 or len(values) % group_size:
    raise ValueError(f"len(values)={len(values)} is not a multiple of group_size={group_size}.")
  out: list[float] = []
  for start in range(0, len(values), group_size):
    out += reward_fn(values[start:start + group_size])
  return out
