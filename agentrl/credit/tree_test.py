# pylint: disable=invalid-name
"""Tests for agentrl.credit.tree: node spans on a hand-built tree, flattening with no token
trained twice, the node values, bad links, and zero gradient on every token the tree masks."""
from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.credit import tree
from agentrl.credit import treerl
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.rollout import agent_loop

jax.config.update("jax_numpy_rank_promotion", "raise")

# Row 0 is a root of 10 tokens; row 1 forks from it at 4, row 2 at 7; row 3 forks from row 1 at
# 6; row 4 names row 1 but forks at 3 <= fork_at[1], so it shares only row 0's tokens 0..2.
PARENT, FORK, LENGTH = [-1, 0, 0, 1, 1], [0, 4, 7, 6, 3], [10, 8, 9, 9, 6]
# Row 0 is cut at 3 (row 4), 4 (row 1) and 7 (row 2); row 1 at 6 (row 3):
#   root0
#    └ n1 [0,3) r0         leaves {0,1,2,3,4}
#       ├ n2 [3,4) r0      leaves {0,1,2,3}
#       │  ├ n3 [4,7) r0   leaves {0,2}:  n4 [7,10) r0 (leaf 0), n7 [7,9) r2 (leaf 2)
#       │  └ n5 [4,6) r1   leaves {1,3}:  n6 [6,8) r1 (leaf 1),  n8 [6,9) r3 (leaf 3)
#       └ n9 [3,6) r4      leaf 4
T = 12


def hand_tree():
  return tree.build(PARENT, FORK, LENGTH)


class BuildTest(absltest.TestCase):

  def test_hand_tree_nodes(self):
    t = hand_tree()
    np.testing.assert_array_equal(t.node_row_N, [-1, 0, 0, 0, 0, 1, 1, 2, 3, 4])
    np.testing.assert_array_equal(t.node_start_N, [0, 0, 3, 4, 7, 4, 6, 7, 6, 3])
    np.testing.assert_array_equal(t.node_end_N, [0, 3, 4, 7, 10, 6, 8, 9, 9, 6])
    np.testing.assert_array_equal(t.node_parent_N, [-1, 0, 1, 2, 3, 2, 5, 3, 5, 1])
    np.testing.assert_array_equal(t.node_depth_N, [0, 1, 2, 3, 4, 3, 4, 4, 4, 2])
    np.testing.assert_array_equal(t.leaf_B, [4, 6, 7, 8, 9])
    np.testing.assert_array_equal(t.leaf_count_N, [5, 5, 4, 2, 1, 2, 1, 1, 1, 1])
    np.testing.assert_array_equal(t.path(3), [0, 1, 2, 5, 8])
    np.testing.assert_array_equal(t.children(2), [3, 5])

  def test_flattening_trains_every_token_once(self):
    t = hand_tree()
    ids = tree.node_ids(t, T)
    np.testing.assert_array_equal(ids[4], [1, 1, 1, 9, 9, 9, -1, -1, -1, -1, -1, -1])
    np.testing.assert_array_equal(ids[3], [1, 1, 1, 2, 5, 5, 8, 8, 8, -1, -1, -1])
    owned = tree.owned_mask(t, T)
    # An owned token's node lives on that row, and each node's span is owned exactly once:
    # 3 + 1 + 3 + 3 + 2 + 2 + 2 + 3 + 3 = 22 tokens = 10 + 4 + 2 + 3 + 3 owned.
    rows = np.broadcast_to(np.arange(5)[:, None], (5, T))
    np.testing.assert_array_equal(t.node_row_N[ids[owned]], rows[owned])
    span = t.node_end_N - t.node_start_N
    np.testing.assert_array_equal(np.bincount(ids[owned], minlength=t.num_nodes), span)
    self.assertEqual(owned.sum(), 22)
    np.testing.assert_array_equal(tree.token_weights(t, T), owned.astype(np.float32))
    paths = tree.token_weights(t, T, mode="paths")
    np.testing.assert_array_equal(paths.sum(1), LENGTH)
    # With every row trained whole, node n's tokens count |L(n)| times.
    np.testing.assert_array_equal(np.bincount(ids[paths > 0], minlength=t.num_nodes),
                                  span * t.leaf_count_N)

  def test_node_values(self):
    t = hand_tree()
    v = [1.0, 0.0, 0.0, 1.0, 0.0]
    # Leaf mean: n2 has leaves {0,1,2,3}: 2/4; n3 {0,2}: 1/2; n1 and the root all five: 2/5.
    np.testing.assert_allclose(tree.leaf_mean(t, v)[[0, 1, 2, 3, 5, 9]],
                               [.4, .4, .5, .5, .5, 0.])
    # Child mean: n3 = (1 + 0)/2, n5 = (0 + 1)/2, n2 = (.5 + .5)/2, n1 = (.5 + 0)/2, root = n1.
    np.testing.assert_allclose(tree.child_mean(t, v), [.25, .25, .5, .5, 1, .5, 0, 0, 1, 0])
    np.testing.assert_allclose(tree.to_tokens(t, np.arange(10.0), T)[1],
                               [1, 1, 1, 2, 5, 5, 6, 6, 0, 0, 0, 0])

  def test_groups_forks_at_zero_and_same_point(self):
    # Rows 0, 1 are roots of group 7; row 2 forks from row 0 at 0 (it shares nothing, so it
    # hangs from the group root); rows 3 and 4 both fork from row 0 at 2 (siblings of row 0's
    # rest); row 5 is the root of group 3, whose root node comes first.
    t = tree.build([-1, -1, 0, 0, 0, -1], [0, 0, 0, 2, 2, 0], [4, 3, 2, 5, 3, 2],
                   group_B=[7, 7, 7, 7, 7, 3])
    np.testing.assert_array_equal(t.node_group_N, [3, 7, 7, 7, 7, 7, 7, 7, 3])
    np.testing.assert_array_equal(t.node_parent_N, [-1, -1, 1, 2, 1, 1, 2, 2, 0])
    np.testing.assert_array_equal(t.children(2), [3, 6, 7])
    np.testing.assert_array_equal(t.leaf_count_N[:3], [1, 5, 3])

  def test_bad_links(self):
    with self.assertRaisesRegex(ValueError, "root row 0 has fork_at 2"):
      tree.build([-1], [2], [4])
    with self.assertRaisesRegex(ValueError, "cycle"):
      tree.build([1, 0], [1, 1], [3, 3])
    with self.assertRaisesRegex(ValueError, "forks at 3"):
      tree.build([-1, 0], [0, 3], [3, 5])
    with self.assertRaisesRegex(ValueError, "group"):
      tree.build([-1, 0], [0, 1], [3, 3], group_B=[0, 1])
    with self.assertRaisesRegex(ValueError, "parent 5"):
      tree.build([-1, 5], [0, 1], [3, 3])
    with self.assertRaisesRegex(ValueError, "mode"):
      tree.token_weights(hand_tree(), T, mode="all")

  def test_from_trajectories_checks_the_shared_prefix(self):
    def traj(tokens, parent=-1, fork_at=0):
      n = len(tokens)
      return agent_loop.Trajectory(
          tokens=np.asarray(tokens, np.int32), loss_mask=np.ones(n, np.float32),
          turn=np.zeros(n, np.int32), sampler_logp=np.zeros(n, np.float32), turn_rewards=[1.0],
          reward=1.0, done=True, truncated=False, prompt_len=0, parent=parent, fork_at=fork_at)
    t = tree.from_trajectories([traj([5, 6, 7]), traj([5, 6, 9, 9], 0, 2)])
    np.testing.assert_array_equal(t.length_B, [3, 4])
    with self.assertRaisesRegex(ValueError, "row 1's first 2 tokens differ"):
      tree.from_trajectories([traj([5, 6, 7]), traj([5, 8, 9], 0, 2)])
    # Engine.run's order: 2 prompts x 2 roots, then branches of roots 3 and 0, then one of a
    # branch: each in its root's prompt.
    rows = [traj([1, 2])] * 4 + [traj([1, 2], 3, 1), traj([1, 2], 0, 1), traj([1, 2], 5, 1)]
    np.testing.assert_array_equal(tree.root_groups(rows, 2), [0, 0, 1, 1, 1, 0, 0])
    with self.assertRaisesRegex(ValueError, "parent 2 does not come before"):
      tree.root_groups([traj([1]), traj([1], 2, 1), traj([1])], 1)


class MaskedGradientTest(absltest.TestCase):

  def test_masked_tokens_get_exactly_zero_gradient(self):
    t = hand_tree()
    loss_mask = (np.arange(T)[None, :] >= 2) & (np.arange(T)[None, :] < t.length_B[:, None])
    loss_mask[:, 5] = False  # an observation token
    adv = treerl.token_advantages(t, [1.0, 0.0, 0.0, 1.0, 0.0], T)
    rng = np.random.default_rng(0)
    old = -rng.uniform(0.1, 2.0, (5, T))
    for mode in tree.WEIGHT_MODES:
      mask = loss_mask * tree.token_weights(t, T, mode=mode)
      logp = np.where(mask > 0, old + rng.normal(0, 0.02, old.shape), 40.0)  # garbage off mask
      loss = lambda lp, m=mask: aggregation.aggregate(
          pg.ppo_clip(lp, jnp.asarray(old, jnp.float32), jnp.asarray(adv), jnp.asarray(m))[0],
          jnp.asarray(m), "token-mean")
      g = np.asarray(jax.grad(loss)(jnp.asarray(logp, jnp.float32)))
      self.assertTrue(np.all(g[mask == 0] == 0.0), mode)
      live = (mask > 0) & (adv != 0)  # ratios stay inside the clip window
      self.assertTrue(np.all(g[live] != 0.0), mode)
      if mode == "owned":  # a branch's shared prefix never trains on the branch row
        self.assertTrue(np.all(g[1, :4] == 0.0) and np.all(g[3, :6] == 0.0))


if __name__ == "__main__":
  absltest.main()
