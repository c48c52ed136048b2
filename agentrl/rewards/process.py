# pylint: disable=invalid-name
"""Step labels for process reward models (PRMs), host side (numpy, no jax).

A PRM scores every step of a trajectory. Steps here:
- multi-turn: the model turns of a trajectory (`Trajectory.turn`, -1 on the prompt); step k is
  the sampled tokens of turn k;
- single-turn: segments of the completion, each ending at a delimiter token (a newline, or a
  step tag such as Math-Shepherd's "ки"): `segment_steps` builds a turn-like array from the
  token ids so the same code serves both.
A step's score is read at its last sampled token (`step_ends`), where the model has seen the
whole step (docs/algorithms.md §15.1).

Labels come from three sources, each returned as float32 [B, U] labels with a [B, U] mask
(1 where the step exists and has a label):
- Monte-Carlo continuations (Math-Shepherd, Wang et al. 2024, arXiv 2312.08935): with
  N continuations sampled from the prefix ending at step k, of which n_k reach the gold
  answer, hard estimation labels the step 1 if n_k > 0 and soft estimation labels it n_k / N
  (`mc_labels`). `continuation_counts` gathers n_k and N from a branching rollout
  (rollout/engine.py forks: a row continues its parent after sharing its first steps).
- the environment's progress signal: info["progress"] in [0, 1] of each step (envs/base.py),
  soft as given or hard with a threshold (`progress_labels`);
- given labels: one list per trajectory, None for an unlabelled step (`given_labels`).
`sibling_groups` and `sibling_pairs` build the step pairs of the Bradley-Terry PRM loss
(losses/process.py). `solution_scores` and `weighted_vote` use a trained PRM as a verifier
(best-of-N and PRM-weighted majority voting, Math-Shepherd's verification);
`best_of_n_accuracy` and `vote_accuracy` score those choices over problems (experiments/eval.py).
"""
from collections.abc import Sequence

import numpy as np

LABEL_MODES = ("hard", "soft")
REDUCES = ("min", "last", "prod")


def segment_steps(tokens_T: np.ndarray, loss_mask_T: np.ndarray,
                  delimiter_ids: Sequence[int]) -> np.ndarray:
  """Int32 [T] step index of each sampled token of a single-turn completion; -1 elsewhere.

  A delimiter token ends its step (it belongs to the step it closes); sampled tokens after the
  last delimiter form a final step. The result stands in for `Trajectory.turn` in `step_ends`.
  """
  sampled_T = np.asarray(loss_mask_T) > 0
  is_delim_T = np.isin(np.asarray(tokens_T), np.asarray(list(delimiter_ids))) & sampled_T
  closed_before_T = np.cumsum(is_delim_T) - is_delim_T   # delimiters strictly before t
  return np.where(sampled_T, closed_before_T, -1).astype(np.int32)


def step_ends(turn_BT: np.ndarray, loss_mask_BT: np.ndarray, *, max_steps: int):
  """Index of each step's last sampled token, int32 [B, U] (0 where absent), and its mask.

  Args:
    turn_BT: the step index of each token (`Trajectory.turn` or `segment_steps`), -1 off steps.
    loss_mask_BT: 1 on sampled tokens; observation and prompt tokens are not part of a step.
    max_steps: U; later steps are dropped.
  """
  turn_BT, sampled_BT = np.asarray(turn_BT), np.asarray(loss_mask_BT) > 0
  end_BU = np.zeros((turn_BT.shape[0], max_steps), np.int32)
  mask_BU = np.zeros((turn_BT.shape[0], max_steps), np.float32)
  for b in range(turn_BT.shape[0]):
    for k in range(max_steps):
      where = np.nonzero(sampled_BT[b] & (turn_BT[b] == k))[0]
      if where.size:
        end_BU[b, k], mask_BU[b, k] = where[-1], 1.0
  return end_BU, mask_BU


def shared_steps(step_end_U: np.ndarray, step_mask_U: np.ndarray, fork_at: int) -> int:
  """How many whole steps of a parent a fork shares: steps whose last token is before fork_at.

  A step cut by the fork point is the child's own (its tokens after fork_at are new).
  """
  return int(np.sum((np.asarray(step_mask_U) > 0) & (np.asarray(step_end_U) < fork_at)))


def _owner(row: int, step: int, parent_B: np.ndarray, shared_B: np.ndarray) -> int:
  """The row that generated `row`'s step `step` (walks up while the step is shared)."""
  while parent_B[row] >= 0 and step < shared_B[row]:
    row = int(parent_B[row])
  return row


def continuation_counts(success_B: np.ndarray, num_steps_B: np.ndarray, *, max_steps: int,
                        parent_B: np.ndarray | None = None,
                        shared_B: np.ndarray | None = None):
  """Per step, how many sampled continuations from its prefix succeeded, and how many there are.

  Every row is a continuation of each prefix it extends by sampling: a root (parent -1) of the
  prefixes ending at each of its steps; a fork that shares its parent's first m steps of the
  prefix ending at its parent's step m - 1 (owned by the row that generated it) and of each of
  its own steps. A step's own row is therefore one of its continuations (the one the policy
  actually took) and its last step's label is that row's outcome, as in Math-Shepherd.
  Shared steps get their owner's counts.

  Args:
    success_B: 1 where the row reached the gold answer (outcome), else 0.
    num_steps_B: steps of each row (shared ones included).
    max_steps: U.
    parent_B: `Trajectory.parent` of each row (index into the same batch, -1 for a root).
    shared_B: whole steps shared with the parent (`shared_steps` of `Trajectory.fork_at`).

  Returns:
    (successes_BU, totals_BU), float32; 0 for steps that do not exist.
  """
  success_B = np.asarray(success_B, np.float32)
  b = success_B.shape[0]
  parent_B = np.full(b, -1) if parent_B is None else np.asarray(parent_B)
  shared_B = np.zeros(b, int) if shared_B is None else np.asarray(shared_B)
  num_steps_B = np.minimum(np.asarray(num_steps_B), max_steps)
  succ_BU = np.zeros((b, max_steps), np.float32)
  total_BU = np.zeros((b, max_steps), np.float32)
  for row in range(b):
    first = max(int(shared_B[row]) - 1, 0) if parent_B[row] >= 0 else 0
    for step in range(first, int(num_steps_B[row])):
      owner = _owner(row, step, parent_B, shared_B)
      succ_BU[owner, step] += success_B[row]
      total_BU[owner, step] += 1.0
  for row in range(b):
    for step in range(min(int(shared_B[row]), int(num_steps_B[row]))):
      owner = _owner(row, step, parent_B, shared_B)
      succ_BU[row, step], total_BU[row, step] = succ_BU[owner, step], total_BU[owner, step]
  return succ_BU, total_BU


def mc_labels(successes_BU: np.ndarray, totals_BU: np.ndarray, *, mode: str = "hard"):
  """Math-Shepherd step labels from continuation counts: (labels_BU, mask_BU), float32.

  hard: y_k = 1 if any continuation from step k reached the gold answer, else 0;
  soft: y_k = (continuations that did) / (continuations). Steps with no continuation are
  masked (label 0).
  """
  if mode not in LABEL_MODES:
    raise ValueError(f"mc_labels mode={mode!r}; expected one of {LABEL_MODES}.")
  successes_BU = np.asarray(successes_BU, np.float32)
  totals_BU = np.asarray(totals_BU, np.float32)
  mask_BU = (totals_BU > 0).astype(np.float32)
  if mode == "hard":
    labels_BU = (successes_BU > 0).astype(np.float32)
  else:
    labels_BU = successes_BU / np.maximum(totals_BU, 1.0)
  return labels_BU * mask_BU, mask_BU


def given_labels(rows: Sequence[Sequence[float | None]], *, max_steps: int):
  """(labels_BU, mask_BU) float32 from one list of step labels per row (None: unlabelled)."""
  labels_BU = np.zeros((len(rows), max_steps), np.float32)
  mask_BU = np.zeros((len(rows), max_steps), np.float32)
  for b, row in enumerate(rows):
    for k, label in enumerate(list(row)[:max_steps]):
      if label is not None:
        labels_BU[b, k], mask_BU[b, k] = float(label), 1.0
  return labels_BU, mask_BU


def progress_labels(infos_rows: Sequence[Sequence[dict]], *, max_steps: int,
                    key: str = "progress", threshold: float | None = None):
  """(labels_BU, mask_BU) from each step's info[key] (`Trajectory.infos`); a step without the
  key is unlabelled. threshold=None keeps the soft value; otherwise label = value >= threshold.
  """
  labels_BU, mask_BU = given_labels([[info.get(key) for info in infos] for infos in infos_rows],
                                    max_steps=max_steps)
  if threshold is not None:
    labels_BU = (labels_BU >= threshold).astype(np.float32) * mask_BU
  return labels_BU, mask_BU


def sibling_groups(num_steps_B: np.ndarray, *, max_steps: int, prompt_B: np.ndarray,
                   parent_B: np.ndarray | None = None,
                   shared_B: np.ndarray | None = None) -> np.ndarray:
  """Int32 [B, U] group id of each step generated after the same prefix; -1 elsewhere.

  Step k of row r and step k of row r' are siblings when both rows generated it (it is not
  shared from a parent) after the same prefix: the same prompt for k = 0, the same owner of
  step k - 1 otherwise. Roots of one prompt are siblings at step 0 (a GRPO group); forks
  from the same point are siblings of each other and of the parent's next step.
  """
  b = len(num_steps_B)
  parent_B = np.full(b, -1) if parent_B is None else np.asarray(parent_B)
  shared_B = np.zeros(b, int) if shared_B is None else np.asarray(shared_B)
  ids, group_BU = {}, np.full((b, max_steps), -1, np.int32)
  for row in range(b):
    own_from = int(shared_B[row]) if parent_B[row] >= 0 else 0
    for step in range(own_from, min(int(num_steps_B[row]), max_steps)):
      prefix = ("prompt", int(prompt_B[row])) if step == 0 else (
          "row", _owner(row, step - 1, parent_B, shared_B))
      group_BU[row, step] = ids.setdefault((prefix, step), len(ids))
  return group_BU


def sibling_pairs(labels_BU: np.ndarray, mask_BU: np.ndarray, group_BU: np.ndarray, *,
                  margin: float = 0.0):
  """Bradley-Terry pairs (chosen_N, rejected_N), int32 flat indices into [B * U].

  Every ordered pair of sibling steps (same `sibling_groups` id, both labelled) whose labels
  differ by more than `margin`, the higher-labelled step chosen.
  """
  labels_N = np.asarray(labels_BU, np.float32).reshape(-1)
  group_N = np.where(np.asarray(mask_BU).reshape(-1) > 0, np.asarray(group_BU).reshape(-1), -1)
  chosen, rejected = [], []
  for g in np.unique(group_N[group_N >= 0]):
    members = np.nonzero(group_N == g)[0]
    for i in members:
      for j in members:
        if labels_N[i] - labels_N[j] > margin:
          chosen.append(i)
          rejected.append(j)
  return np.asarray(chosen, np.int32), np.asarray(rejected, np.int32)


def padded_pairs(chosen_N: np.ndarray, rejected_N: np.ndarray, *, size: int):
  """(chosen, rejected, mask) padded (or cut) to `size` pairs, so a jitted loss keeps its shape;
  padding pairs point at index 0 and have mask 0."""
  chosen = np.zeros(size, np.int32)
  rejected = np.zeros(size, np.int32)
  mask = np.zeros(size, np.float32)
  n = min(len(chosen_N), size)
  chosen[:n], rejected[:n], mask[:n] = chosen_N[:n], rejected_N[:n], 1.0
  return chosen, rejected, mask


def solution_scores(score_BU: np.ndarray, mask_BU: np.ndarray, *,
                    reduce: str = "min") -> np.ndarray:
  """Float32 [B] score of each solution from its step scores (probabilities).

  "min" (Math-Shepherd and Lightman et al.'s verifier use the lowest step score; Lightman et
  al. also report the product), "prod", or "last" (the last step's score). A row without
  steps scores 0.
  """
  if reduce not in REDUCES:
    raise ValueError(f"solution_scores reduce={reduce!r}; expected one of {REDUCES}.")
  score_BU = np.asarray(score_BU, np.float64)
  valid_BU = np.asarray(mask_BU) > 0
  has_B = valid_BU.any(1)
  if reduce == "min":
    out_B = np.where(valid_BU, score_BU, np.inf).min(1)
  elif reduce == "prod":
    out_B = np.where(valid_BU, score_BU, 1.0).prod(1)
  else:
    last_B = score_BU.shape[1] - 1 - np.argmax(valid_BU[:, ::-1], axis=1)
    out_B = score_BU[np.arange(len(last_B)), last_B]
  return np.where(has_B, out_B, 0.0).astype(np.float32)


def weighted_vote(answers: Sequence, weights: Sequence[float]):
  """PRM-weighted majority vote: argmax_a sum_i [a_i = a] w_i over the N answers; None
  answers (unparsed) do not vote. Ties go to the answer seen first. Returns None if nobody
  votes. Uniform weights give plain majority voting (self-consistency); a one-hot weight on
  the best-scored solution gives best-of-N.
  """
  totals = {}
  for answer, weight in zip(answers, weights):
    if answer is not None:
      totals[answer] = totals.get(answer, 0.0) + float(weight)
  return max(totals, key=totals.get) if totals else None


def best_of_n_accuracy(score_PN: np.ndarray, success_PN: np.ndarray, *, k: int) -> float:
  """Best-of-k with a verifier: per problem, the success of the highest-scored of its first k
  samples, averaged over the P problems. Ties go to the earliest sample (np.argmax)."""
  score_PK = np.asarray(score_PN, np.float64)[:, :k]
  chosen_P = np.argmax(score_PK, axis=1)
  return float(np.mean(np.asarray(success_PN, bool)[np.arange(len(chosen_P)), chosen_P]))


def vote_accuracy(answers_PN: Sequence[Sequence], weight_PN: np.ndarray,
                  success_PN: np.ndarray, *, k: int) -> float:
  """Fraction of problems whose `weighted_vote` over their first k samples is a correct answer.

  The voted answer is correct when a sample among those k that gave it succeeded (one answer
  has one verdict; the earliest-seen answer wins ties, as in `weighted_vote`). A problem where
  no sample gave an answer counts as wrong. Uniform weights give plain majority voting.
  """
  weight_PN, success_PN = np.asarray(weight_PN, np.float64), np.asarray(success_PN, bool)
  hits = []
  for p, answers in enumerate(answers_PN):
    answers = list(answers)[:k]
    voted = weighted_vote(answers, weight_PN[p, :k])
    hits.append(voted is not None and any(
        a == voted and s for a, s in zip(answers, success_PN[p, :k])))
  return float(np.mean(hits))
