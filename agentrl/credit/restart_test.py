# pylint: disable=invalid-name
"""Tests for agentrl.credit.restart: the restart turn, R3L's pivotal mask and amplified scores
on a hand-made group, CSO's verified pairs, and row order."""
from absl.testing import absltest
import numpy as np

from agentrl.credit import restart
from agentrl.credit import tree

# One 10-token layout for every row: prompt 0..1 (turn -1), model turn 0 at 2..3, its
# observation at 4, model turn 1 at 5..6, observation 7, model turn 2 at 8..9.
TURN = np.array([-1, -1, 0, 0, 0, 1, 1, 1, 2, 2])
SAMPLED = np.array([0, 0, 1, 1, 0, 1, 1, 0, 1, 1], np.float32)
# Row 0 failed at turn 1; row 1 retries it from turn 1's first token (5); rows 2, 3 are other
# first attempts of the task.
PARENT, FORK, REWARD = [-1, 0, -1, -1], [0, 5, 0, 0], [0.0, 1.0, 0.2, 0.9]


def group_tree(perm=None):
  perm = np.arange(4) if perm is None else np.asarray(perm)
  inv = np.argsort(perm)
  parent = [int(inv[PARENT[p]]) if PARENT[p] >= 0 else -1 for p in perm]
  return tree.build(parent, np.asarray(FORK)[perm], [10] * 4)


class RestartPointTest(absltest.TestCase):

  def test_first_failing_turn(self):
    infos = [{"error": ""}, {"error": "bad move"}, {"success": False}]
    self.assertEqual(restart.first_failing_turn([0.0, -1.0, 0.0], infos), 1)
    self.assertEqual(restart.first_failing_turn([0.0, 0.0, -1.0], [{}, {}, {}]), 2)
    self.assertEqual(restart.first_failing_turn([0.0, 0.0, 0.0], [{}, {}, {}]), 2)   # last
    self.assertIsNone(restart.first_failing_turn([0.0] * 3, [{}] * 3, fallback="none"))
    self.assertIsNone(restart.first_failing_turn([0.0, 1.0], [{}, {"success": True}]))
    progress = [{"progress": 0.5}, {"progress": 0.0}, {}]
    self.assertEqual(restart.first_failing_turn([0.0] * 3, progress, on_no_progress=True), 1)
    self.assertIsNone(restart.first_failing_turn([], []))
    with self.assertRaisesRegex(ValueError, "infos"):
      restart.first_failing_turn([0.0], [])

  def test_turn_start(self):
    self.assertEqual(restart.turn_start(TURN, SAMPLED, 1), 5)
    self.assertEqual(restart.turn_start(TURN, SAMPLED, 0), 2)
    with self.assertRaisesRegex(ValueError, "turn 3"):
      restart.turn_start(TURN, SAMPLED, 3)


class R3LTest(absltest.TestCase):

  def test_pivotal_mask(self):
    mask = restart.pivotal_mask(group_tree(), np.tile(SAMPLED, (4, 1)))
    # Rows 0 (the original) and 1 (its retry) train only turns 1 and 2; rows 2, 3 everything.
    np.testing.assert_array_equal(np.flatnonzero(mask[0]), [5, 6, 8, 9])
    np.testing.assert_array_equal(np.flatnonzero(mask[1]), [5, 6, 8, 9])
    np.testing.assert_array_equal(np.flatnonzero(mask[2]), [2, 3, 5, 6, 8, 9])

  def test_amplified_scores(self):
    # mean = (0 + 1 + .2 + .9)/4 = .525; row 1 succeeds: 1.0; row 3: (.9 - .525) x 3 = 1.125;
    # rows 0 and 2 stay negative: -.525, -.325.
    np.testing.assert_allclose(restart.r3l_scores(REWARD, [0] * 4),
                               [-.525, 1.0, -.325, 1.125])
    # grpo: unbiased std = sqrt((.525^2 + .475^2 + .325^2 + .375^2)/3) = sqrt(.7475/3).
    std = np.sqrt(.7475 / 3)
    np.testing.assert_allclose(
        restart.r3l_scores(REWARD, [0] * 4, normalize="grpo"),
        [-.525 / (std + 1e-6), 1.0, -.325 / (std + 1e-6), 3 * .375 / (std + 1e-6)])
    # A group of one has baseline 0: a failure keeps its raw reward, .4 is amplified.
    np.testing.assert_allclose(restart.r3l_scores([0.0, .4], [0, 1]), [0.0, 1.2])

  def test_token_advantages_and_row_order(self):
    adv, mask = restart.token_advantages(group_tree(), REWARD, np.tile(SAMPLED, (4, 1)))
    np.testing.assert_allclose(adv[0], np.where(mask[0], -.525, 0.0))
    np.testing.assert_allclose(adv[1, [5, 6, 8, 9]], [1.0] * 4)
    perm = [2, 0, 3, 1]
    adv_p, mask_p = restart.token_advantages(group_tree(perm), np.asarray(REWARD)[perm],
                                             np.tile(SAMPLED, (4, 1)))
    np.testing.assert_allclose(adv_p, adv[perm])
    np.testing.assert_array_equal(mask_p, mask[perm])


class CSOTest(absltest.TestCase):

  def test_verified_pairs_only(self):
    # Row 1 retries row 0's turn 1 and succeeds: a pair. Row 2 retries it and fails; row 3
    # forks inside turn 1 (at 6); neither is a verified critical step.
    t = tree.build([-1, 0, 0, 0], [0, 5, 5, 6], [10] * 4)
    pairs = restart.cso_pairs(t, [0.0, 1.0, 0.0, 1.0], np.tile(TURN, (4, 1)),
                              np.tile(SAMPLED, (4, 1)))
    np.testing.assert_array_equal(pairs.chosen_P, [1])
    np.testing.assert_array_equal(pairs.rejected_P, [0])
    np.testing.assert_array_equal(np.flatnonzero(pairs.chosen_mask_PT[0]), [5, 6])
    np.testing.assert_array_equal(np.flatnonzero(pairs.rejected_mask_PT[0]), [5, 6])
    none = restart.cso_pairs(t, [1.0] * 4, np.tile(TURN, (4, 1)), np.tile(SAMPLED, (4, 1)))
    self.assertEqual(none.chosen_mask_PT.shape, (0, 10))


if __name__ == "__main__":
  absltest.main()
