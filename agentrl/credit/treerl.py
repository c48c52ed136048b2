# pylint: disable=invalid-name
"""TreeRL: process rewards from an on-policy tree (Hou et al. 2025, arXiv 2506.11902).

A node's value is the mean outcome of the leaves under it; the global advantage compares it
with the root, the local one with its parent, and every token of the node gets
R(s) = GA(s) + LA(s), each value first divided by sqrt(|L(s)|) so that early nodes, repeated in
many training paths, do not dominate (docs/algorithms.md §5.9).

Official code: THUDM/TreeRL (read at commit f0edbea), `openrlhf/trainer/ppo_utils/tree_node.py`
(`build_into_tree_format`, `leaf_normalize`, `compute_weighted_update`,
`get_max_entropy_tokens`), `openrlhf/trainer/ppo_utils/parallel_mcts.py`
(`path_from_root_to_node`, `gather_paths`),
`openrlhf/trainer/ppo_utils/entropy_chain_local_manager.py` (EPTree: `entropy_guided_chain`),
`train_reinforce_ray.py` (flag defaults) and the launch `scripts/treerl-qw14b.sh`.
Defaults [code]:
  * leaf outcome R_l = r_l - mean_{j != l} r_j over all leaves of the prompt's forest
    (`leaf_normalize`, leave-one-out, always on); so V(root) = 0;
  * V(s) = sum_{l in L(s)} R_l / |L(s)| (`accumulated_value / terminal_in_subtree`);
  * `--use_weighted_value --weighted_value_style sqrt`: every node's accumulated value is
    divided by sqrt(|L(s)|) *before* the differences, V'(s) = V(s) / sqrt(|L(s)|);
  * `--use_state_value_reward`: R(s) = (V'(s) - V'(parent)) + V'(s), the second term the
    global advantage because V'(root) = 0 (`gather_paths`); `form="paper"` is the paper's
    R(s) = (GA(s) + LA(s)) / sqrt(|L(s)|) with unweighted V (the difference: the code divides
    the parent's value by the parent's count);
  * the token advantage is R(s) itself (REINFORCE, no whitening, KL 0 in the launch);
  * every selected leaf's whole path is a training row (`tree.token_weights(mode="paths")`):
    16 of the forest's leaves in the launch (`num_trace_per_sample`), all of them here;
  * EPTree forks at the N tokens of largest -log p (the sampled token's surprisal, "entropy"
    in the code) among the tokens of each tree not yet forked at, M = 6 trees, N = 2 fork
    points, L = 1 iteration, T = 2 branches per point (`--m 6 --n 2 --l 1 --t 2`); a branch's
    first token is never a fork point again (`TreeNode.mask[0]`).
"""
import numpy as np

from agentrl.credit import tree as tree_lib

REWEIGHTS = ("sqrt", "uniform", "none")
FORMS = ("code", "paper")


def leaf_outcomes(tree: tree_lib.Tree, reward_B, *, leave_one_out: bool = True) -> np.ndarray:
  """float64 [B]: each leaf's outcome, leave-one-out centred within its group [code].

  A group with one leaf has no other sample to compare with: its outcome is 0 [INF] (the
  official code asserts at least two leaves).
  """
  reward_B = np.asarray(reward_B, np.float64)
  if reward_B.shape != (tree.num_rows,):
    raise ValueError(f"treerl: expected a [{tree.num_rows}] reward per row, got "
                     f"{reward_B.shape}.")
  if not leave_one_out:
    return reward_B
  out = np.zeros_like(reward_B)
  for g in np.unique(tree.group_B):
    rows = tree.group_B == g
    n = rows.sum()
    if n > 1:
      out[rows] = reward_B[rows] - (reward_B[rows].sum() - reward_B[rows]) / (n - 1)
  return out


def _weight(count_N, reweight):
  if reweight == "sqrt":
    return np.sqrt(count_N)
  if reweight == "uniform":
    return count_N.astype(np.float64)
  return np.ones_like(count_N, np.float64)


def node_rewards(tree: tree_lib.Tree, reward_B, *, leave_one_out: bool = True,
                 reweight: str = "sqrt", form: str = "code") -> np.ndarray:
  """float64 [N]: R(s) for every node (0 at the group roots, which hold no tokens).

  Args:
    tree: the rollout tree (`tree.build`).
    reward_B: each row's (leaf's) outcome.
    leave_one_out: centre each leaf by the mean of the other leaves of its group [code].
    reweight: "sqrt" [code launch], "uniform" (1 / |L(s)|) or "none".
    form: "code", R = (V'(s) - V'(p)) + (V'(s) - V'(root)) with V' = V / w(|L|); or "paper",
      R = (GA + LA) / w(|L(s)|) on the unweighted V.
  """
  if reweight not in REWEIGHTS or form not in FORMS:
    raise ValueError(f"treerl.node_rewards: reweight {reweight!r} / form {form!r}; choose "
                     f"from {REWEIGHTS} / {FORMS}.")
  value_N = tree_lib.leaf_mean(tree, leaf_outcomes(tree, reward_B, leave_one_out=leave_one_out))
  w_N = _weight(tree.leaf_count_N, reweight)
  root_N = np.searchsorted(np.unique(tree.group_B), tree.node_group_N)  # roots come first
  parent_N = np.where(tree.node_parent_N >= 0, tree.node_parent_N, np.arange(tree.num_nodes))
  if form == "code":
    v_N = value_N / w_N
    r_N = (v_N - v_N[parent_N]) + (v_N - v_N[root_N])
  else:
    r_N = (2 * value_N - value_N[parent_N] - value_N[root_N]) / w_N
  return np.where(tree.node_parent_N >= 0, r_N, 0.0)


def token_advantages(tree: tree_lib.Tree, reward_B, T: int, **kwargs) -> np.ndarray:
  """float32 [B, T]: R of each token's node on every token of every row (0 past its end).

  Multiply the loss mask by `tree.token_weights(tree, T, mode=...)`: "paths" is the code's
  training set, "owned" trains each shared token once. kwargs go to `node_rewards`.
  """
  return tree_lib.to_tokens(tree, node_rewards(tree, reward_B, **kwargs), T)


def forkable_mask(tree: tree_lib.Tree, loss_mask_BT) -> np.ndarray:
  """bool [B, T]: sampled tokens a new fork may start at: owned, and not a branch's first
  token (EPTree never forks twice at one point) [code]."""
  loss_mask_BT = np.asarray(loss_mask_BT)
  B, T = loss_mask_BT.shape
  if B != tree.num_rows:
    raise ValueError(f"forkable_mask: {B} mask rows for a tree of {tree.num_rows} rows.")
  first_BT = (np.arange(T)[None, :] == tree.fork_at_B[:, None]) & (tree.parent_B[:, None] >= 0)
  return tree_lib.owned_mask(tree, T) & (loss_mask_BT > 0) & ~first_BT


def fork_points(logp_BT, forkable_BT, *, num: int = 2) -> tuple[np.ndarray, np.ndarray]:
  """EPTree's fork points: the `num` forkable tokens of largest -log p, over all rows given
  (one tree's rows) [code]. Returns (row, position) int arrays, most uncertain first; ties go
  to the lower row, then the earlier token. A branch from (b, t) shares tokens[b][:t] and
  resamples token t (fork_at = t). Fewer than `num` candidates give fewer points.
  """
  logp_BT, forkable_BT = np.asarray(logp_BT, np.float64), np.asarray(forkable_BT, bool)
  if logp_BT.shape != forkable_BT.shape or logp_BT.ndim != 2 or num < 0:
    raise ValueError(f"fork_points expects two [B, T] arrays and num >= 0; got "
                     f"{logp_BT.shape}, {forkable_BT.shape}, num={num}.")
  rows, cols = np.nonzero(forkable_BT)  # row-major: ties keep this order (stable sort)
  order = np.argsort(logp_BT[rows, cols], kind="stable")[:num]  # lowest logp = largest -logp
  return rows[order].astype(np.int32), cols[order].astype(np.int32)
