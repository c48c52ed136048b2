"""Tests for agentrl.rewards.label_free (TTRL, EMPO, self-play win rates).

Expected values are hand-computed from dl-m9/SIOP `siop_process_reward.py`
(`compute_ttrl_majority_rewards`, `compute_empo_cluster_freq_rewards`, commit a871ef9).
"""
from absl.testing import absltest

from agentrl.rewards import label_free


class ClusterTest(absltest.TestCase):

  def test_cluster_ids(self):
    answers = ["4", " 4", None, "5", "", "4 ", "6", "5"]
    self.assertEqual(label_free.cluster_ids(answers), [0, 0, -1, 1, -1, 0, 2, 1])

  def test_custom_equivalence(self):
    same = lambda a, b: float(a) == float(b)
    self.assertEqual(label_free.cluster_ids(["2", "2.0", "3"], same=same), [0, 0, 1])
    # Greedy, like SIOP: each answer joins the first open cluster whose first member accepts it.
    calls = []
    def record(a, b):
      calls.append((a, b))
      return False
    label_free.cluster_ids(["a", "b", "c"], same=record)
    self.assertEqual(calls, [("a", "b"), ("a", "c"), ("b", "c")])


class TtrlEmpoTest(absltest.TestCase):

  ANSWERS = ["4", "5", "4", None, "4", "5", ""]

  def test_majority_vote(self):
    self.assertEqual(label_free.majority_vote_rewards(self.ANSWERS),
                     [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0])
    # A tie goes to the cluster that appears first.
    self.assertEqual(label_free.majority_vote_rewards(["7", "8", "8", "7"]), [1.0, 0.0, 0.0, 1.0])
    self.assertEqual(label_free.majority_vote_rewards([None, ""]), [0.0, 0.0])
    self.assertEqual(label_free.majority_vote_rewards(["x", None]), [1.0, 0.0])

  def test_cluster_frequency(self):
    # 5 valid answers: three "4" (3/5) and two "5" (2/5); missing answers get 0.
    self.assertEqual(label_free.cluster_frequency_rewards(self.ANSWERS),
                     [0.6, 0.4, 0.6, 0.0, 0.6, 0.4, 0.0])
    self.assertEqual(label_free.cluster_frequency_rewards(["x", None]), [1.0, 0.0])
    self.assertEqual(label_free.cluster_frequency_rewards([None]), [0.0])

  def test_per_group(self):
    flat = ["1", "1", "2", "3", "3", "3"]
    self.assertEqual(label_free.per_group(flat, 3, label_free.majority_vote_rewards),
                     [1.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    with self.assertRaisesRegex(ValueError, "multiple of group_size"):
      label_free.per_group(flat, 4, label_free.majority_vote_rewards)


class WinRateTest(absltest.TestCase):

  def test_round_robin_hand_computed(self):
    # The longer answer wins, equal lengths tie: "ccc" beats both, "a" and "b" tie.
    judge = lambda a, b: 1.0 if len(a) > len(b) else (0.5 if len(a) == len(b) else 0.0)
    rates = label_free.round_robin_win_rates(["a", "ccc", "b"], judge)
    self.assertEqual(rates, [0.25, 1.0, 0.25])
    self.assertAlmostEqual(sum(rates) / len(rates), 0.5)
    self.assertEqual(label_free.round_robin_win_rates(["a"], judge), [0.5])

  def test_both_orders_cancel_position_bias(self):
    first_always_wins = lambda a, b: 1.0
    self.assertEqual(label_free.round_robin_win_rates(["x", "y", "z"], first_always_wins),
                     [0.5, 0.5, 0.5])
    self.assertEqual(label_free.round_robin_win_rates(["x", "y", "z"], first_always_wins,
                                                      both_orders=False), [1.0, 0.5, 0.0])

  def test_bad_judge_raises(self):
    with self.assertRaisesRegex(ValueError, r"\[0, 1\]"):
      label_free.round_robin_win_rates(["x", "y"], lambda a, b: 2.0, both_orders=False)


if __name__ == "__main__":
  absltest.main()
