# pylint: disable=invalid-name
"""Tests for agentrl.credit.latr: the branch condition, the capacity order, the pruning rule
and the schedules, on hand-made values following the official rollout worker."""
from absl.testing import absltest
import numpy as np

from agentrl.credit import latr


class BranchTest(absltest.TestCase):

  def test_probability_condition(self):
    top = np.array([[.50, .40], [.60, .30], [.30, .20], [.35, .25]])
    # .40 > .25 and .50 - .40 < .15: branch; .60 - .30 = .3 is too far; .20 is too unlikely;
    # .25 is not > .25 (strict, as the official filter).
    np.testing.assert_array_equal(latr.branch_candidates(top), [[True], [False], [False],
                                                                [False]])
    np.testing.assert_array_equal(latr.branch_candidates(top, rel_thres=None)[:, 0],
                                  [True, True, False, False])
    # m = 3: both alternatives of (.40, .30, .28) qualify (.10 and .12 below .15).
    np.testing.assert_array_equal(latr.branch_candidates([.40, .30, .28]), [True, True])
    with self.assertRaisesRegex(ValueError, "M >= 2"):
      latr.branch_candidates([[0.9]])

  def test_capacity_admits_rank_then_row(self):
    ok = np.array([[True, True], [False, False], [True, False]])   # 3 rows, m = 3
    # Capacity 5, 3 rows held: 2 new branches, in the order (rank 1, row 0), (rank 1, row 2),
    # (rank 2, row 0): the first two.
    np.testing.assert_array_equal(latr.step_branches(ok, 5),
                                  [[True, False], [False, False], [True, False]])
    np.testing.assert_array_equal(latr.step_branches(ok, 3), np.zeros((3, 2), bool))
    np.testing.assert_array_equal(latr.step_branches(ok, 10), ok)


class PruneTest(absltest.TestCase):

  def test_edit_distance(self):
    self.assertEqual(latr.edit_distance([1, 2, 3, 4, 5, 6], [7, 2, 3, 4, 8, 6, 9]), 3)
    self.assertEqual(latr.edit_distance([], [1, 2]), 2)

  def test_copy_is_pruned_and_a_real_alternative_kept(self):
    rng = np.random.default_rng(0)
    parent = rng.integers(0, 1000, 70)
    copy = parent.copy()
    copy[10] = 1001   # the forced alternative token, then the same continuation
    # At r = 20 after the birth at 10: 1 edit / 20 = .05 < .4: pruned.
    self.assertTrue(latr.should_prune(copy, parent, 10))
    other = np.r_[parent[:10], rng.integers(2000, 3000, 60)]   # every token differs
    self.assertFalse(latr.should_prune(other, parent, 10))
    # Too young for any window (19 tokens since birth), or every window holds a stop id.
    self.assertFalse(latr.should_prune(copy[:29], parent, 10))
    stopped = copy.copy()
    stopped[12] = 7
    self.assertFalse(latr.should_prune(stopped, parent, 10, stop_ids=[7]))
    # A near copy (8 edits of 20 = .4 is not < .4) survives r = 20, then r = 30 prunes it
    # (8 / 30 < .4).
    near = copy.copy()
    near[11:18] = 2000 + np.arange(7)
    self.assertFalse(latr.should_prune(near[:39], parent, 10))
    self.assertTrue(latr.should_prune(near, parent, 10))


class ScheduleTest(absltest.TestCase):

  def test_mix_ratio(self):
    sched = {0: 1.0, 10: .75, 20: .5, 80: .25, 200: 0.0}   # the Countdown GRPO launch
    self.assertEqual([latr.mix_ratio(s, sched) for s in (0, 9, 10, 79, 500)],
                     [1.0, 1.0, .75, .5, 0.0])
    self.assertEqual(latr.mix_ratio(3), 1.0)
    with self.assertRaisesRegex(ValueError, "step 0"):
      latr.mix_ratio(3, {5: 1.0})

  def test_tree_full(self):
    # thres = .98 - .05 * 100/1000 = .975; 2 trees of capacity 8: round(15.6) = 16 rows; a
    # finished tree counts as full.
    kw = dict(capacity=8, step=100, max_new_tokens=1000, thres_decay=0.05)
    self.assertTrue(latr.tree_full([8, 5], [False, True], 51, **kw))
    self.assertFalse(latr.tree_full([8, 5], [False, True], 50, **kw))   # a branch is too young
    self.assertFalse(latr.tree_full([7, 5], [False, False], 51, **kw))


if __name__ == "__main__":
  absltest.main()
