# pylint: disable=invalid-name
"""Tests for agentrl.credit.treerl: hand-computed node rewards in both forms, the chain
(independent samples) limit against RLOO, equal outcomes, leaf order, and EPTree's fork points."""
from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.credit import tree
from agentrl.credit import treerl

# The hand tree of tree_test.py: nodes n1 [0,3) r0, n2 [3,4) r0, n3 [4,7) r0, n4 [7,10) r0
# (leaf 0), n5 [4,6) r1, n6 [6,8) r1 (leaf 1), n7 [7,9) r2 (leaf 2), n8 [6,9) r3 (leaf 3),
# n9 [3,6) r4 (leaf 4); n2 under n1, n3 and n5 under n2, n9 under n1.
PARENT, FORK, LENGTH = [-1, 0, 0, 1, 1], [0, 4, 7, 6, 3], [10, 8, 9, 9, 6]
REWARD = [1.0, 0.0, 0.0, 1.0, 0.0]
T = 12
S2 = np.sqrt(2.0)


def permuted(perm):
  """The hand tree with its rows reordered: new row i is old row perm[i]."""
  inv = np.argsort(perm)
  parent = [int(inv[PARENT[p]]) if PARENT[p] >= 0 else -1 for p in perm]
  return tree.build(parent, np.asarray(FORK)[perm], np.asarray(LENGTH)[perm])


class NodeRewardsTest(absltest.TestCase):

  def test_hand_tree_code_form(self):
    t = tree.build(PARENT, FORK, LENGTH)
    # Leave-one-out outcomes over the 5 leaves (sum 2): r - (2 - r)/4 = .75, -.5, -.5, .75, -.5.
    np.testing.assert_allclose(treerl.leaf_outcomes(t, REWARD), [.75, -.5, -.5, .75, -.5])
    # V = leaf mean: n1 0, n2 (.75-.5-.5+.75)/4 = .125, n3 = n5 = (.75-.5)/2 = .125; leaves as
    # above. V' = V/sqrt|L|: n2 .125/2 = .0625, n3 = n5 = .125/sqrt2; root and n1 0.
    # R = (V' - V'(parent)) + (V' - V'(root)) = 2V' - V'(parent).
    n3 = 2 * .125 / S2 - .0625
    want = [0, 0, .125, n3, 1.5 - .125 / S2, n3, -1 - .125 / S2, -1 - .125 / S2,
            1.5 - .125 / S2, -1.0]
    np.testing.assert_allclose(treerl.node_rewards(t, REWARD), want, atol=1e-12)

  def test_hand_tree_paper_form(self):
    t = tree.build(PARENT, FORK, LENGTH)
    # (GA + LA)/sqrt|L| = (2V - V(parent) - V(root))/sqrt|L| on the unweighted V:
    # n2 (.25 - 0)/2, n3 (.25 - .125)/sqrt2, n4 (1.5 - .125)/1, n7 (-1 - .125), n9 (-1 - 0).
    got = treerl.node_rewards(t, REWARD, form="paper")
    np.testing.assert_allclose(got[[2, 3, 4, 7, 9]], [.125, .125 / S2, 1.375, -1.125, -1.0])
    got = treerl.node_rewards(t, REWARD, reweight="none")
    np.testing.assert_allclose(got[[2, 3, 4]], [.25, .125, 1.375])  # no division at all

  def test_tokens_get_their_node_reward(self):
    t = tree.build(PARENT, FORK, LENGTH)
    r_N = treerl.node_rewards(t, REWARD)
    adv = treerl.token_advantages(t, REWARD, T)
    np.testing.assert_allclose(adv[4], np.r_[[r_N[1]] * 3, [r_N[9]] * 3, [0.0] * 6], rtol=1e-6)

  def test_without_leave_one_out_the_root_is_the_baseline(self):
    t = tree.build(PARENT, FORK, LENGTH)
    # Raw V: root .4, n1 .4, n9 0: R(n9) = (0 - .4) + (0 - .4) = -.8 (reweight none).
    got = treerl.node_rewards(t, REWARD, leave_one_out=False, reweight="none")
    self.assertAlmostEqual(got[9], -0.8)


class InvariantsTest(absltest.TestCase):

  def test_independent_samples_give_twice_rloo(self):
    # No branch: each row is one leaf under the group root, |L| = 1, V'(root) = 0, so
    # R = 2 x leave-one-out outcome = 2 x RLOO, in both forms; groups stay apart.
    reward = np.array([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25])
    t = tree.build([-1] * 8, [0] * 8, [3] * 8, group_B=[0] * 4 + [1] * 4)
    want = 2 * np.asarray(estimators.rloo(jnp.asarray(reward), group_size=4))
    for form in treerl.FORMS:
      got = treerl.node_rewards(t, reward, form=form)[t.leaf_B]
      np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=form)

  def test_equal_outcomes_give_zero(self):
    t = tree.build(PARENT, FORK, LENGTH)
    for form in treerl.FORMS:
      np.testing.assert_array_equal(treerl.node_rewards(t, [.5] * 5, form=form), 0.0)
    # A single-leaf group has nothing to compare with.
    np.testing.assert_array_equal(treerl.node_rewards(tree.build([-1], [0], [4]), [1.0]), 0.0)

  def test_identical_subtree_has_no_local_advantage(self):
    # Leaves 1 and 3 (all of n5's subtree) both succeed: inside it V is constant, so the
    # local part of n6 and n8 vanishes and R = V(n5) - V(root) = V(n5), its global part.
    t = tree.build(PARENT, FORK, LENGTH)
    reward = [0.0, 1.0, 0.0, 1.0, 0.0]
    value = tree.leaf_mean(t, treerl.leaf_outcomes(t, reward))
    got = treerl.node_rewards(t, reward, reweight="none")
    np.testing.assert_allclose(got[[6, 8]], [value[5]] * 2)

  def test_leaf_order_does_not_matter(self):
    t = tree.build(PARENT, FORK, LENGTH)
    want = treerl.token_advantages(t, REWARD, T)
    for perm in ([4, 3, 2, 1, 0], [2, 0, 4, 1, 3]):
      got = treerl.token_advantages(permuted(perm), np.asarray(REWARD)[perm], T)
      np.testing.assert_allclose(got, want[perm], rtol=1e-6)

  def test_bad_arguments(self):
    t = tree.build(PARENT, FORK, LENGTH)
    with self.assertRaisesRegex(ValueError, "reweight"):
      treerl.node_rewards(t, REWARD, reweight="log")
    with self.assertRaisesRegex(ValueError, r"\[5\] reward"):
      treerl.node_rewards(t, REWARD[:4])


class ForkPointsTest(absltest.TestCase):

  def test_largest_surprisal_first(self):
    logp = np.array([[-.1, -2.0, -.5], [-3.0, -.2, -2.0]])
    ok = np.ones((2, 3), bool)
    ok[1, 0] = False
    # (1,0) is not forkable; (0,1) and (1,2) tie at -2: the lower row first; then (0,2).
    rows, cols = treerl.fork_points(logp, ok, num=3)
    np.testing.assert_array_equal(rows, [0, 1, 0])
    np.testing.assert_array_equal(cols, [1, 2, 2])
    rows, _ = treerl.fork_points(logp, np.zeros((2, 3), bool))
    self.assertEqual(rows.size, 0)

  def test_forkable_tokens(self):
    t = tree.build(PARENT, FORK, LENGTH)
    loss_mask = np.broadcast_to(np.arange(T) >= 2, (5, T))
    ok = treerl.forkable_mask(t, loss_mask)
    # Row 0 owns 0..9 (prompt 0..1 masked); row 1 owns 4..7 but 4, its first token, was
    # already a fork point; row 4 owns 3..5 less 3.
    np.testing.assert_array_equal(np.flatnonzero(ok[0]), np.arange(2, 10))
    np.testing.assert_array_equal(np.flatnonzero(ok[1]), [5, 6, 7])
    np.testing.assert_array_equal(np.flatnonzero(ok[4]), [4, 5])


if __name__ == "__main__":
  absltest.main()
