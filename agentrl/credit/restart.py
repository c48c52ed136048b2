# pylint: disable=invalid-name
"""Failure-point restarts: R3L's retry from the failing turn with pivotal credit (Shi et al.
2026, arXiv 2601.03715), and CSO's verified critical-step pairs (Li et al. 2026, arXiv
2602.03412).

R3L (reflect-then-retry): a failed episode is replayed up to the turn where it went wrong and
retried from there; the retry branches from the original at that turn (`fork_at` = the turn's
first token). Pivotal credit trains only the diverging suffix: the first k turns are masked in
*both* the original and the retry, where the contrastive signal is (`pivotal_mask`). Positive
amplification reshapes the group advantage so that successes lead (`r3l_scores`).

Official code: shiweijiezero/R3L (read at commit d503f6c),
`trinity/common/workflows/envs/R3L/alfworld/R3L_workflow.py` (`run`,
`_adjust_action_mask_for_retry`), `.../alfworld/utils.py` (`second_rollout`,
`validate_reflect_report`), `trinity/algorithm/advantage_fn/opmd_advantage.py`
(`opmd_reweight_adv`), `trinity/algorithm/advantage_fn/grpo_advantage.py`
(`grpo_reweight_adv`), the launches `examples/R3L/*/opmd_R3L_*.yaml`. Defaults [code]:
  * half of the 8 samples per task are first attempts, each followed by at most one retry
    (`repeat_times: 8`, `self.n // 2`); the group is the task's first attempts and retries;
  * restart turn k (0-based, 0 <= k < the attempt's turns): chosen by the model's own
    reflection ("retry_from_step"); a success judged perfect is not retried. Here, without a
    reflection model, `first_failing_turn` picks the first turn with an env error or a
    negative reward, else the last turn [INF];
  * the retry replays turns [0, k) and continues; its first k assistant turns, and the
    original's, are masked out of the loss (k > 0);
  * advantage: score = r - mean_group(r) ("mean" OPMD baseline; a group of one: baseline 0);
    r >= 1 gives score 1.0, else a score >= 0 is multiplied by 3, a negative one is kept;
    `grpo_reweight_adv` instead z-scores first ((r - mean) / (std + 1e-6), unbiased std), then
    reshapes the same way. The full method trains with OPMD's loss; with PPO use "grpo";
  * the retry trained is the "distilled" one: rendered without the reflection's guidance, so
    the policy learns the corrected turns from the plain context (our branches have no
    guidance to strip).

CSO (critical step optimisation) differs in the credit: a process reward model proposes
candidate critical steps of a failed trajectory, an expert model proposes an alternative
action there, the policy continues from it; only alternatives that then succeed are kept, and
the training signal is a DPO pair at that one step (chosen: the alternative action, rejected:
the original), nothing before or after it. `cso_pairs` gives those two masks from a tree whose
branches are such alternatives (here sampled by the policy, not an expert). CSO's released
repository holds no training code; its choices here are [INF] from the paper's abstract.
"""
from collections.abc import Sequence
import dataclasses

import numpy as np

from agentrl.credit import tree as tree_lib

NORMALIZE = ("mean", "grpo")
FALLBACKS = ("last", "none")


def first_failing_turn(turn_rewards: Sequence[float], infos: Sequence[dict], *,
                       on_error: bool = True, on_negative_reward: bool = True,
                       on_no_progress: bool = False, skip_success: bool = True,
                       fallback: str = "last") -> int | None:
  """The turn to restart a failed episode from, or None (no retry) [INF].

  R3L asks the model's reflection for this turn; without one, the first turn whose
  info["error"] is set (`on_error`), whose reward is negative (`on_negative_reward`) or whose
  info["progress"] is <= 0 (`on_no_progress`, off: many envs give 0 progress to turns without
  a tool call) is taken; with no such turn, `fallback` "last" retries the last turn (the final
  answer) and "none" gives None. An episode whose last info has "success" True is not retried
  (`skip_success`), as R3L's reflection skips a perfect attempt.
  """
  if fallback not in FALLBACKS:
    raise ValueError(f"first_failing_turn: fallback {fallback!r}; choose one of {FALLBACKS}.")
  n = len(turn_rewards)
  if len(infos) != n:
    raise ValueError(f"first_failing_turn: {n} turn rewards but {len(infos)} infos.")
  if n == 0 or (skip_success and infos[-1].get("success")):
    return None
  for u in range(n):
    info = infos[u]
    if ((on_error and info.get("error")) or (on_negative_reward and turn_rewards[u] < 0)
        or (on_no_progress and "progress" in info and info["progress"] <= 0)):
      return u
  return n - 1 if fallback == "last" else None


def turn_start(turn_T, loss_mask_T, u: int) -> int:
  """The first sampled token of model turn u: the fork_at that retries turn u (the prefix
  holds the prompt, turns < u and the observation that answers turn u - 1)."""
  turn_T, loss_mask_T = np.asarray(turn_T), np.asarray(loss_mask_T)
  hits = np.flatnonzero((turn_T == u) & (loss_mask_T > 0))
  if not hits.size:
    raise ValueError(f"turn_start: the trajectory has no sampled token in turn {u}.")
  return int(hits[0])


def pivotal_mask(tree: tree_lib.Tree, loss_mask_BT) -> np.ndarray:
  """bool [B, T]: sampled tokens at or after each row's pivot [code].

  A row's pivot is the later of its own fork point (a retry trains only what it sampled) and
  the earliest fork point of its direct branches (an original trains only the turns its retry
  redid), so the shared prefix trains on neither row. Several retries of one row, at different
  turns, use the earliest [INF]; a row without branches trains all its own tokens.
  """
  loss_mask_BT = np.asarray(loss_mask_BT)
  B, T = loss_mask_BT.shape
  if B != tree.num_rows:
    raise ValueError(f"pivotal_mask: {B} mask rows for a tree of {tree.num_rows} rows.")
  pivot_B = tree.fork_at_B.astype(np.int64).copy()
  for b in range(B):
    kids = np.flatnonzero(tree.parent_B == b)
    if kids.size:
      pivot_B[b] = max(pivot_B[b], tree.fork_at_B[kids].min())
  t_T = np.arange(T)
  return ((t_T[None, :] >= pivot_B[:, None]) & (t_T[None, :] < tree.length_B[:, None])
          & (loss_mask_BT > 0))


def r3l_scores(reward_B, group_B, *, normalize: str = "mean", success_reward: float = 1.0,
               success_score: float = 1.0, amplify: float = 3.0, eps: float = 1e-6) -> np.ndarray:
  """float64 [B]: R3L's positive-amplified group advantage [code].

  score = r - mean_group (normalize "mean", OPMD's baseline) or (r - mean) / (std + eps) with
  the unbiased std ("grpo"); a group of one has mean 0 (and std 1). Then r >= success_reward
  gives `success_score`, a score >= 0 is multiplied by `amplify`, a negative one is kept.
  """
  if normalize not in NORMALIZE:
    raise ValueError(f"r3l_scores: normalize {normalize!r}; choose one of {NORMALIZE}.")
  reward_B, group_B = np.asarray(reward_B, np.float64), np.asarray(group_B)
  if reward_B.shape != group_B.shape or reward_B.ndim != 1:
    raise ValueError(f"r3l_scores expects [B] rewards and groups; got {reward_B.shape}, "
                     f"{group_B.shape}.")
  score_B = np.zeros_like(reward_B)
  for g in np.unique(group_B):
    rows = group_B == g
    r = reward_B[rows]
    mean, std = (r.mean(), r.std(ddof=1)) if r.size > 1 else (0.0, 1.0)
    score_B[rows] = (r - mean) / (std + eps) if normalize == "grpo" else r - mean
  score_B = np.where(score_B >= 0, amplify * score_B, score_B)
  return np.where(reward_B >= success_reward, success_score, score_B)


def token_advantages(tree: tree_lib.Tree, reward_B, loss_mask_BT, **kwargs
                     ) -> tuple[np.ndarray, np.ndarray]:
  """(adv_BT float32, mask_BT bool): `r3l_scores` over the tree's groups on each row's
  `pivotal_mask` tokens (0 elsewhere); use mask_BT as the loss mask. kwargs go to
  `r3l_scores`."""
  mask_BT = pivotal_mask(tree, loss_mask_BT)
  score_B = r3l_scores(reward_B, tree.group_B, **kwargs)
  return np.where(mask_BT, score_B[:, None], 0.0).astype(np.float32), mask_BT


@dataclasses.dataclass(frozen=True)
class CSOPairs:
  """DPO pairs at verified critical steps: P pairs over the batch's rows."""
  chosen_P: np.ndarray        # int32: the branch row (its alternative turn succeeded)
  rejected_P: np.ndarray      # int32: the row it branched from (which failed)
  chosen_mask_PT: np.ndarray  # bool: the alternative turn's sampled tokens on chosen_P
  rejected_mask_PT: np.ndarray  # bool: the original turn's sampled tokens on rejected_P


def cso_pairs(tree: tree_lib.Tree, reward_B, turn_BT, loss_mask_BT, *,
              success_reward: float = 1.0) -> CSOPairs:
  """CSO's verified critical steps as DPO pairs [INF].

  A branch b forked at the first token of a model turn u of its parent p is verified when b
  succeeds (reward >= success_reward) and p does not; the pair is b's turn u (chosen) against
  p's turn u (rejected). Feed `losses.preference.sequence_logp` with the two masks.
  """
  reward_B = np.asarray(reward_B, np.float64)
  turn_BT, loss_mask_BT = np.asarray(turn_BT), np.asarray(loss_mask_BT)
  if turn_BT.shape != loss_mask_BT.shape or turn_BT.shape[0] != tree.num_rows:
    raise ValueError(f"cso_pairs: turn {turn_BT.shape} and mask {loss_mask_BT.shape} must be "
                     f"[{tree.num_rows}, T].")
  rows = []
  for b in np.flatnonzero(tree.parent_B >= 0):
    p, f = tree.parent_B[b], tree.fork_at_B[b]
    if f >= turn_BT.shape[1] or loss_mask_BT[b, f] <= 0:
      continue
    u = turn_BT[b, f]
    starts_turn = f == 0 or turn_BT[b, f - 1] != u or loss_mask_BT[b, f - 1] <= 0
    if starts_turn and reward_B[b] >= success_reward > reward_B[p]:
      rows.append((b, p, u))
  sampled = lambda r, u: (turn_BT[r] == u) & (loss_mask_BT[r] > 0)
  T = turn_BT.shape[1]
  return CSOPairs(
      np.array([b for b, _, _ in rows], np.int32), np.array([p for _, p, _ in rows], np.int32),
      np.array([sampled(b, u) for b, _, u in rows], bool).reshape(-1, T),
      np.array([sampled(p, u) for _, p, u in rows], bool).reshape(-1, T))
