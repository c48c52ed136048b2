# pylint: disable=invalid-name
"""Tests for agentrl.rewards.process: hand-computed step ends, Math-Shepherd labels on a small
branching forest, sibling groups and pairs (docs/algorithms.md §15.1)."""
from absl.testing import absltest
import numpy as np

from agentrl.rewards import process

# A forest over one prompt: row 0 a root with 3 steps (fails); rows 1 and 2 fork from row 0
# after its first step (1 succeeds with 3 steps, 2 fails with 2); row 3 forks from row 1 after
# two steps (succeeds, 3 steps); row 4 is a second root with 2 steps (succeeds).
SUCCESS = np.array([0, 1, 0, 1, 1])
NUM_STEPS = np.array([3, 3, 2, 3, 2])
PARENT = np.array([-1, 0, 0, 1, -1])
SHARED = np.array([0, 1, 1, 2, 0])


class StepsTest(absltest.TestCase):

  def test_segment_steps_delimiter_closes_its_step(self):
    turn = process.segment_steps(np.array([5, 9, 1, 9, 2, 3]), np.array([0, 1, 1, 1, 1, 1]),
                                 delimiter_ids=[9])
    np.testing.assert_array_equal(turn, [-1, 0, 1, 1, 2, 2])
    end, mask = process.step_ends(turn[None], np.array([[0, 1, 1, 1, 1, 1]]), max_steps=4)
    np.testing.assert_array_equal(end, [[1, 3, 5, 0]])
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0]])

  def test_step_ends_skip_observation_tokens(self):
    turn = np.array([[-1, -1, 0, 0, 0, 1, 1, 1]])
    loss_mask = np.array([[0, 0, 1, 1, 0, 1, 1, 0]])
    end, mask = process.step_ends(turn, loss_mask, max_steps=2)
    np.testing.assert_array_equal(end, [[3, 6]])
    np.testing.assert_array_equal(mask, [[1, 1]])

  def test_shared_steps_counts_whole_steps_before_the_fork(self):
    end, mask = np.array([3, 6]), np.array([1, 1])
    self.assertEqual(process.shared_steps(end, mask, 4), 1)
    self.assertEqual(process.shared_steps(end, mask, 6), 1)   # step 1 ends at 6: cut, not shared
    self.assertEqual(process.shared_steps(end, mask, 7), 2)
    self.assertEqual(process.shared_steps(end, np.array([1, 0]), 7), 1)


class MonteCarloLabelsTest(absltest.TestCase):

  def counts(self):
    return process.continuation_counts(SUCCESS, NUM_STEPS, max_steps=3, parent_B=PARENT,
                                       shared_B=SHARED)

  def test_counts_golden(self):
    succ, total = self.counts()
    # Row 0's step 0 has three continuations (rows 0, 1, 2; only 1 succeeds); row 1's step 1
    # has rows 1 and 3 (both succeed); shared steps copy their owner's counts.
    np.testing.assert_array_equal(succ, [[1, 0, 0], [1, 2, 1], [1, 0, 0], [1, 2, 1],
                                         [1, 1, 0]])
    np.testing.assert_array_equal(total, [[3, 1, 1], [3, 2, 1], [3, 1, 0], [3, 2, 1],
                                          [1, 1, 0]])

  def test_hard_and_soft_labels(self):
    hard, mask = process.mc_labels(*self.counts(), mode="hard")
    soft, soft_mask = process.mc_labels(*self.counts(), mode="soft")
    np.testing.assert_array_equal(mask, soft_mask)
    np.testing.assert_array_equal(mask, [[1, 1, 1], [1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 0]])
    np.testing.assert_array_equal(hard, [[1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]])
    np.testing.assert_allclose(soft, [[1 / 3, 0, 0], [1 / 3, 1, 1], [1 / 3, 0, 0],
                                      [1 / 3, 1, 1], [1, 1, 0]])
    # hard = [soft > 0] on labelled steps, always.
    np.testing.assert_array_equal(hard, (soft > 0) * mask)

  def test_without_forks_each_step_label_is_the_outcome(self):
    succ, total = process.continuation_counts(np.array([1, 0]), np.array([2, 1]), max_steps=2)
    labels, mask = process.mc_labels(succ, total, mode="soft")
    np.testing.assert_array_equal(labels, [[1, 1], [0, 0]])
    np.testing.assert_array_equal(mask, [[1, 1], [1, 0]])

  def test_bad_mode(self):
    with self.assertRaisesRegex(ValueError, "mode='avg'"):
      process.mc_labels(np.zeros((1, 1)), np.ones((1, 1)), mode="avg")


class OtherLabelsTest(absltest.TestCase):

  def test_progress_labels(self):
    infos = [[{"progress": 0.5}, {"success": False}], [{"progress": 1.0}]]
    labels, mask = process.progress_labels(infos, max_steps=2)
    np.testing.assert_allclose(labels, [[0.5, 0], [1, 0]])
    np.testing.assert_array_equal(mask, [[1, 0], [1, 0]])
    hard, _ = process.progress_labels(infos, max_steps=2, threshold=0.6)
    np.testing.assert_array_equal(hard, [[0, 0], [1, 0]])

  def test_given_labels_cut_and_pad(self):
    labels, mask = process.given_labels([[1, None, 0, 1], []], max_steps=3)
    np.testing.assert_array_equal(labels, [[1, 0, 0], [0, 0, 0]])
    np.testing.assert_array_equal(mask, [[1, 0, 1], [0, 0, 0]])


class SiblingsTest(absltest.TestCase):

  def test_groups_golden(self):
    group = process.sibling_groups(NUM_STEPS, max_steps=3, prompt_B=np.zeros(5, int),
                                   parent_B=PARENT, shared_B=SHARED)
    # Step 0: both roots; step 1 after row 0's step 0: rows 0, 1, 2; step 2 after row 1's
    # step 1: rows 1 and 3; row 0's and row 4's later steps have no sibling.
    np.testing.assert_array_equal(group, [[0, 1, 2], [-1, 1, 3], [-1, 1, -1], [-1, -1, 3],
                                          [0, 4, -1]])

  def test_pairs_from_hard_labels(self):
    group = process.sibling_groups(NUM_STEPS, max_steps=3, prompt_B=np.zeros(5, int),
                                   parent_B=PARENT, shared_B=SHARED)
    hard, mask = process.mc_labels(*process.continuation_counts(
        SUCCESS, NUM_STEPS, max_steps=3, parent_B=PARENT, shared_B=SHARED))
    chosen, rejected = process.sibling_pairs(hard, mask, group)
    # Only group 1 has differing labels: row 1's step 1 (flat 4) beats rows 0 and 2 (1, 7).
    np.testing.assert_array_equal(chosen, [4, 4])
    np.testing.assert_array_equal(rejected, [1, 7])
    none_c, _ = process.sibling_pairs(hard, mask, group, margin=1.0)
    self.assertEqual(none_c.size, 0)

  def test_padded_pairs(self):
    chosen, rejected, mask = process.padded_pairs(np.array([4, 4]), np.array([1, 7]), size=3)
    np.testing.assert_array_equal(chosen, [4, 4, 0])
    np.testing.assert_array_equal(rejected, [1, 7, 0])
    np.testing.assert_array_equal(mask, [1, 1, 0])
    chosen, _, mask = process.padded_pairs(np.array([4, 4]), np.array([1, 7]), size=1)
    np.testing.assert_array_equal(chosen, [4])
    np.testing.assert_array_equal(mask, [1])

  def test_different_prompts_are_not_siblings(self):
    group = process.sibling_groups(np.array([1, 1]), max_steps=1, prompt_B=np.array([0, 1]))
    np.testing.assert_array_equal(group, [[0], [1]])


class VerificationTest(absltest.TestCase):

  def test_solution_scores(self):
    score = np.array([[0.9, 0.2, 0.8], [0.5, 0.4, 0.7], [0.3, 0.3, 0.3]])
    mask = np.array([[1, 1, 1], [1, 1, 0], [0, 0, 0]])
    np.testing.assert_allclose(process.solution_scores(score, mask), [0.2, 0.4, 0.0])
    np.testing.assert_allclose(process.solution_scores(score, mask, reduce="prod"),
                               [0.9 * 0.2 * 0.8, 0.2, 0.0], rtol=1e-6)
    np.testing.assert_allclose(process.solution_scores(score, mask, reduce="last"),
                               [0.8, 0.4, 0.0])
    with self.assertRaisesRegex(ValueError, "reduce='mean'"):
      process.solution_scores(score, mask, reduce="mean")

  def test_weighted_vote(self):
    answers = ["7", "5", "5", None, "7"]
    # Plain majority would tie 7 and 5 (first seen wins); the weights pick 5.
    self.assertEqual(process.weighted_vote(answers, [1, 1, 1, 1, 1]), "7")
    self.assertEqual(process.weighted_vote(answers, [0.1, 0.6, 0.5, 9.0, 0.2]), "5")
    self.assertEqual(process.weighted_vote(answers, [0, 0, 0, 0, 1]), "7")   # best-of-N
    self.assertIsNone(process.weighted_vote([None], [1.0]))

  def test_best_of_n_accuracy_by_hand(self):
    score = np.array([[0.2, 0.9, 0.5, 0.9], [0.7, 0.7, 0.1, 0.8], [0.3, 0.1, 0.6, 0.2]])
    success = np.array([[0, 1, 0, 0], [0, 1, 1, 1], [1, 0, 0, 0]])
    # Chosen samples per k (ties go to the earliest): k=1 (0, 0, 0); k=2 (1, 0 of the 0.7 tie,
    # 0); k=3 (1, 0, 2); k=4 (1 of the 0.9 tie, 3, 2).
    for k, expected in ((1, 1 / 3), (2, 2 / 3), (3, 1 / 3), (4, 2 / 3)):
      self.assertAlmostEqual(process.best_of_n_accuracy(score, success, k=k), expected, msg=k)

  def test_best_of_n_with_an_oracle_verifier_is_any_success(self):
    success = np.random.default_rng(0).random((50, 6)) < 0.3
    for k in (1, 3, 6):
      self.assertAlmostEqual(process.best_of_n_accuracy(success.astype(float), success, k=k),
                             success[:, :k].any(1).mean())

  def test_vote_accuracy_by_hand(self):
    answers = [["7", "5", "5", None], ["3", "3", "4", None], [None] * 4]
    weight = np.array([[0.9, 0.2, 0.3, 1.0], [0.1, 0.2, 0.8, 0.9], [1.0] * 4])
    success = np.array([[1, 0, 0, 0], [0, 0, 1, 0], [0, 0, 0, 0]])   # "7" and "4" are right
    uniform = np.ones_like(weight)
    # k=4 weighted: 7 (0.9 > 0.5) right, 4 (0.8 > 0.3) right, no answer: wrong. Uniform: 5
    # (2 votes) wrong, 3 (2 votes) wrong. k=2 uniform: the 7/5 tie goes to 7 (seen first).
    self.assertAlmostEqual(process.vote_accuracy(answers, weight, success, k=4), 2 / 3)
    self.assertEqual(process.vote_accuracy(answers, uniform, success, k=4), 0.0)
    self.assertAlmostEqual(process.vote_accuracy(answers, weight, success, k=2), 1 / 3)
    self.assertAlmostEqual(process.vote_accuracy(answers, uniform, success, k=2), 1 / 3)
    self.assertAlmostEqual(process.vote_accuracy(answers, weight, success, k=1), 1 / 3)
    # An answer is right when a sample among the k that gave it succeeded.
    self.assertEqual(process.vote_accuracy([["7", "7"]], np.ones((1, 2)), [[0, 1]], k=2), 1.0)
    self.assertEqual(process.vote_accuracy([["7", "7"]], np.ones((1, 2)), [[0, 1]], k=1), 0.0)


if __name__ == "__main__":
  absltest.main()
