# pylint: disable=invalid-name
"""A rollout tree as data: branching trajectories -> nodes, leaves and a training batch.

The rollout engine's forks give a list of complete root-to-leaf transcripts
(`agent_loop.Trajectory`), row b continuing row `parent[b]` after sharing its first
`fork_at[b]` tokens (-1 and 0 for a root). `build` turns (parent, fork_at, length, group) into
the tree the branching methods credit (docs/algorithms.md §5.9):

  * a **node** is a maximal token span shared by the same set of leaves: a row's own tokens
    [fork_at[b], length[b]) are cut at every position another row forks from it. The span
    lives on one row, its **owner**: the row that sampled those tokens first. A fork at
    fork_at f <= fork_at[parent] shares only tokens the parent itself shares with its own
    parent, so it hangs from the nearest ancestor that owns position f - 1;
  * every group (a prompt: the rows of one task, `group_B`) has a **root node** with the
    empty span, the parent of its rows' first segments; a branch with fork_at 0 shares no
    token and hangs there too;
  * every row ends in its own **leaf** (its last segment), so leaves and rows are the same;
  * nodes are defined by the declared fork points, not by token equality: a branch that
    resamples the same token at its fork point still owns it (it is its own sample).

Flattening (per row, [B, T] with T the packed length): `node_ids` gives each token's node
(-1 on padding); `owned_mask` is 1 where the row owns the token, so training on owned tokens
trains every sampled token exactly once (a branch's shared prefix gets loss weight 0 on the
branch row); `token_weights(mode="paths")` instead trains every row as its own sample, so a
node's tokens count once per leaf under it. Which one each method trains with
(docs/algorithms.md §5.9): TreeRL's released code trains every selected root-to-leaf path as
a row ("paths", and its sqrt(|L|) reweighting offsets the repetition); SPO-tree trains each
edge (a node's own tokens after its parent's text) once ("owned"); R3L masks the shared
prefix of both the original and the retry (`restart.pivotal_mask`); LATR is a rollout method
whose n sequences go to GRPO as independent samples ("paths").

`leaf_mean` (the mean of a per-row value over the leaves under each node, TreeRL's V) and
`child_mean` (the recursive mean over children, SPO-tree's V) are the two node values the
estimators use; `to_tokens` broadcasts a per-node value to the [B, T] batch. All host numpy.
"""
from collections.abc import Sequence
import dataclasses

import numpy as np

from agentrl.rollout import agent_loop

WEIGHT_MODES = ("owned", "paths")


@dataclasses.dataclass(frozen=True)
class Tree:
  """A forest of rollout trees, one per group. Rows are trajectories; N nodes.

  Node ids: the group roots first (in ascending group order), then each row's segments in
  row order and token order.
  """
  parent_B: np.ndarray      # int32: the row each row forked from, -1 for a root
  fork_at_B: np.ndarray     # int32: tokens shared with the parent (0 for a root)
  length_B: np.ndarray      # int32: tokens in the row
  group_B: np.ndarray       # int32: the group (prompt) of each row
  node_row_N: np.ndarray    # int32: the owner row of each node's span, -1 for a group root
  node_start_N: np.ndarray  # int32: the span [start, end) on the owner row (0, 0: a root)
  node_end_N: np.ndarray    # int32
  node_parent_N: np.ndarray  # int32: -1 for a group root
  node_depth_N: np.ndarray  # int32: 0 for a group root
  node_group_N: np.ndarray  # int32
  leaf_B: np.ndarray        # int32: each row's leaf node
  under_NB: np.ndarray      # bool: row b's leaf lies under node n (n is on b's path)

  @property
  def num_rows(self) -> int:
    return int(self.parent_B.shape[0])

  @property
  def num_nodes(self) -> int:
    return int(self.node_row_N.shape[0])

  @property
  def leaf_count_N(self) -> np.ndarray:
    """int64 [N]: |L(n)|, the leaves (rows) under each node."""
    return self.under_NB.sum(axis=1)

  def path(self, b: int) -> np.ndarray:
    """Row b's nodes from its group root to its leaf (ascending depth)."""
    nodes = np.flatnonzero(self.under_NB[:, b])
    return nodes[np.argsort(self.node_depth_N[nodes], kind="stable")]

  def children(self, n: int) -> np.ndarray:
    return np.flatnonzero(self.node_parent_N == n)


def _check_links(parent_B, fork_at_B, length_B, group_B):
  """One clear error for the first bad link (shapes, ranges, cycles, groups)."""
  B = parent_B.shape[0]
  if not (parent_B.shape == fork_at_B.shape == length_B.shape == group_B.shape == (B,)):
    raise ValueError(f"tree.build expects four [B] arrays; got parent {parent_B.shape}, fork_at "
                     f"{fork_at_B.shape}, length {length_B.shape}, group {group_B.shape}.")
  for b in range(B):
    p, f = int(parent_B[b]), int(fork_at_B[b])
    if length_B[b] < 1:
      raise ValueError(f"tree.build: row {b} has no tokens (length {length_B[b]}).")
    if p == -1:
      if f != 0:
        raise ValueError(f"tree.build: root row {b} has fork_at {f}; a root (parent -1) has "
                         "fork_at 0.")
      continue
    if not 0 <= p < B or p == b:
      raise ValueError(f"tree.build: row {b} has parent {p}, not another row in [0, {B}) "
                       "or -1.")
    if not 0 <= f < min(length_B[b], length_B[p]):
      raise ValueError(f"tree.build: row {b} forks at {f}, outside [0, min(own length "
                       f"{length_B[b]}, parent {p}'s length {length_B[p]})): a branch shares "
                       "fewer tokens than either row has.")
    if group_B[b] != group_B[p]:
      raise ValueError(f"tree.build: row {b} is in group {group_B[b]} but its parent {p} is "
                       f"in group {group_B[p]}; a branch belongs to its parent's group.")
  for b in range(B):  # every chain of parents reaches a root within B steps
    p, steps = b, 0
    while p != -1:
      p, steps = int(parent_B[p]), steps + 1
      if steps > B:
        raise ValueError(f"tree.build: the parents of row {b} form a cycle.")


def _attach_row(b, parent_B, fork_at_B):
  """The nearest ancestor owning position fork_at[b] - 1, or -1 (the group root)."""
  f = fork_at_B[b]
  if f == 0:
    return -1
  r = parent_B[b]
  while fork_at_B[r] >= f:  # r shares position f - 1 with its own parent: go up
    r = parent_B[r]
  return int(r)


def build(parent_B, fork_at_B, length_B, *, group_B=None) -> Tree:
  """The tree of rows linked by (parent, fork_at); see the module docstring.

  Args:
    parent_B: int [B], the row each row forked from (-1: a root).
    fork_at_B: int [B], the tokens row b shares with its parent (0 for a root; a branch has
      0 <= fork_at < its own and its parent's length).
    length_B: int [B], tokens per row (>= 1).
    group_B: int [B], the group (prompt) of each row; a branch is in its parent's group.
      Default: one group.
  """
  parent_B = np.asarray(parent_B, np.int64)
  fork_at_B = np.asarray(fork_at_B, np.int64)
  length_B = np.asarray(length_B, np.int64)
  group_B = (np.zeros_like(parent_B) if group_B is None else np.asarray(group_B, np.int64))
  _check_links(parent_B, fork_at_B, length_B, group_B)
  B = parent_B.shape[0]
  groups = np.unique(group_B)
  attach = [_attach_row(b, parent_B, fork_at_B) for b in range(B)]
  row, start, end, first_seg, seg_by_end = _segments(fork_at_B, length_B, attach, len(groups))
  N = len(row)
  node_parent = np.full(N, -1, np.int64)
  for n in range(len(groups), N):
    b = row[n]
    if n != first_seg[b]:
      node_parent[n] = n - 1
    elif attach[b] < 0:
      node_parent[n] = np.searchsorted(groups, group_B[b])  # roots are nodes 0..G-1
    else:
      node_parent[n] = seg_by_end[(attach[b], int(fork_at_B[b]))]
  depth = np.zeros(N, np.int64)
  for n in range(N):  # a node's parent may come later in id order: walk up
    m = n
    while node_parent[m] >= 0:
      m, depth[n] = node_parent[m], depth[n] + 1
  group = np.concatenate([groups, group_B[np.asarray(row[len(groups):], np.int64)]])
  leaf_B = np.array([first_seg[b + 1] - 1 if b + 1 < B else N - 1 for b in range(B)],
                    np.int64)
  under = np.zeros((N, B), bool)
  for b in range(B):
    m = leaf_B[b]
    while m >= 0:
      under[m, b] = True
      m = node_parent[m]
  i32 = lambda x: np.asarray(x, np.int32)
  return Tree(i32(parent_B), i32(fork_at_B), i32(length_B), i32(group_B), i32(row), i32(start),
              i32(end), i32(node_parent), i32(depth), i32(group), i32(leaf_B), under)


def _segments(fork_at_B, length_B, attach, num_groups):
  """Node spans: the group roots (row -1), then each row's own tokens cut at its forks.

  Returns (row, start, end) per node, each row's first segment, and {(row, end): node}.
  """
  B = len(attach)
  splits = [set() for _ in range(B)]
  for b in range(B):
    if attach[b] >= 0:
      splits[attach[b]].add(int(fork_at_B[b]))
  row, start, end = [-1] * num_groups, [0] * num_groups, [0] * num_groups
  first_seg, seg_by_end = [], {}
  for b in range(B):
    bounds = [int(fork_at_B[b])] + sorted(splits[b]) + [int(length_B[b])]
    first_seg.append(len(row))
    for s, e in zip(bounds[:-1], bounds[1:]):
      seg_by_end[(b, e)] = len(row)
      row.append(b)
      start.append(s)
      end.append(e)
  return row, start, end, first_seg, seg_by_end


def root_groups(trajs: Sequence[agent_loop.Trajectory], roots: int) -> np.ndarray:
  """int32 [B]: each row's group (prompt) in an engine run's output, where the roots come
  first, `roots` per prompt, and every branch follows its parent (`Engine.run(brancher=)`):
  a root's is its index // roots, a branch's its parent's."""
  group = np.zeros((len(trajs),), np.int32)
  for b, t in enumerate(trajs):
    if t.parent >= b:
      raise ValueError(f"tree.root_groups: row {b}'s parent {t.parent} does not come before "
                       "it; pass rows in Engine.run's order (roots, then branches).")
    group[b] = group[t.parent] if t.parent >= 0 else b // roots
  return group


def from_trajectories(trajs: Sequence[agent_loop.Trajectory], *, group_B=None,
                      check_prefix: bool = True) -> Tree:
  """`build` from trajectories' (parent, fork_at, len(tokens)).

  With `check_prefix`, a branch whose first fork_at tokens, loss mask or turn indices differ
  from its parent's is an error (the engine promised they are copies).
  """
  parent_B = [t.parent for t in trajs]
  fork_at_B = [t.fork_at for t in trajs]
  tree = build(parent_B, fork_at_B, [len(t.tokens) for t in trajs], group_B=group_B)
  if check_prefix:
    for b, t in enumerate(trajs):
      if t.parent < 0:
        continue
      p, f = trajs[t.parent], t.fork_at
      for name in ("tokens", "loss_mask", "turn"):
        if not np.array_equal(getattr(t, name)[:f], getattr(p, name)[:f]):
          raise ValueError(f"tree.from_trajectories: row {b}'s first {f} {name} differ from "
                           f"its parent {t.parent}'s; a branch's prefix is a copy.")
  return tree


def node_ids(tree: Tree, T: int) -> np.ndarray:
  """int32 [B, T]: the node of every token (-1 past the row's length; rows cut at T)."""
  out = np.full((tree.num_rows, T), -1, np.int32)
  for b in range(tree.num_rows):
    for n in tree.path(b):
      out[b, min(tree.node_start_N[n], T):min(tree.node_end_N[n], T)] = n
  return out


def owned_mask(tree: Tree, T: int) -> np.ndarray:
  """bool [B, T]: the row sampled this token itself (t >= fork_at[b], t < length[b])."""
  t_T = np.arange(T)
  return (t_T[None, :] >= tree.fork_at_B[:, None]) & (t_T[None, :] < tree.length_B[:, None])


def token_weights(tree: Tree, T: int, *, mode: str = "owned") -> np.ndarray:
  """float32 [B, T] loss weights: "owned" (each token once) or "paths" (each row whole).

  Multiply by the loss mask: weights say which copy of a shared token trains, the loss mask
  which tokens are actions.
  """
  if mode not in WEIGHT_MODES:
    raise ValueError(f"token_weights: mode {mode!r}; choose one of {WEIGHT_MODES}.")
  t_T = np.arange(T)
  inside = t_T[None, :] < tree.length_B[:, None]
  keep = owned_mask(tree, T) if mode == "owned" else inside
  return keep.astype(np.float32)


def leaf_mean(tree: Tree, value_B) -> np.ndarray:
  """float64 [N]: the mean of `value_B` over the leaves (rows) under each node."""
  value_B = np.asarray(value_B, np.float64)
  if value_B.shape != (tree.num_rows,):
    raise ValueError(f"leaf_mean: expected a [{tree.num_rows}] value per row, got "
                     f"{value_B.shape}.")
  return (tree.under_NB @ value_B) / tree.leaf_count_N


def child_mean(tree: Tree, value_B) -> np.ndarray:
  """float64 [N]: V(leaf of b) = value_B[b]; V(n) = the mean of V over n's children."""
  value_B = np.asarray(value_B, np.float64)
  if value_B.shape != (tree.num_rows,):
    raise ValueError(f"child_mean: expected a [{tree.num_rows}] value per row, got "
                     f"{value_B.shape}.")
  total = np.zeros(tree.num_nodes)
  count = np.zeros(tree.num_nodes)
  value = np.zeros(tree.num_nodes)
  value[tree.leaf_B] = value_B
  for n in np.argsort(-tree.node_depth_N, kind="stable"):  # children before parents
    if count[n]:
      value[n] = total[n] / count[n]
    p = tree.node_parent_N[n]
    if p >= 0:
      total[p] += value[n]
      count[p] += 1
  return value


def to_tokens(tree: Tree, node_value_N, T: int) -> np.ndarray:
  """float32 [B, T]: every token gets its node's value; 0 past the row's length."""
  node_value_N = np.asarray(node_value_N, np.float64)
  if node_value_N.shape != (tree.num_nodes,):
    raise ValueError(f"to_tokens: expected a [{tree.num_nodes}] value per node, got "
                     f"{node_value_N.shape}.")
  ids_BT = node_ids(tree, T)
  return np.where(ids_BT >= 0, node_value_N[np.maximum(ids_BT, 0)], 0.0).astype(np.float32)
