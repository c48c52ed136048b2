"""Tests for agentrl.rewards.compose, and that agentrl.rewards never imports jax."""
import os
import subprocess
import sys

from absl.testing import absltest

from agentrl.rewards import compose
from agentrl.rewards import format as fmt
from agentrl.rewards import verifiers

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _boom(completion, target):
  raise RuntimeError("bug")


class WeightedTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.reward = compose.Weighted([
        compose.Term("correct", verifiers.numeric_match, 1.0),
        compose.Term("format", lambda c, t: fmt.tags(c, names=("answer",)), 0.1),
    ])

  def test_weighted_sum_and_breakdown(self):
    total, parts = self.reward.breakdown("<answer>7</answer>", "7")
    self.assertAlmostEqual(total, 1.1)
    self.assertEqual(parts, {"correct": 1.0, "format": 1.0, "reward_errors": 0.0})
    self.assertAlmostEqual(self.reward("7", "7"), 1.0)   # right answer, wrong format
    self.assertAlmostEqual(self.reward("<answer>8</answer>", "7"), 0.1)

  def test_raising_or_nonfinite_terms_count_as_errors(self):
    reward = compose.Weighted([compose.Term("boom", _boom), compose.Term(
        "nan", lambda c, t: float("nan")), compose.Term("one", lambda c, t: 1.0, 2.0)])
    total, parts = reward.breakdown("x", None)
    self.assertEqual(total, 2.0)
    self.assertEqual(parts["reward_errors"], 2.0)

  def test_validation(self):
    with self.assertRaisesRegex(ValueError, "at least one"):
      compose.Weighted([])
    with self.assertRaisesRegex(ValueError, "unique"):
      compose.Weighted([compose.Term("a", _boom), compose.Term("a", _boom)])
    with self.assertRaisesRegex(ValueError, "'a'"):
      compose.Weighted([compose.Term("a", _boom, float("inf"))])


class TurnRewardsTest(absltest.TestCase):

  def test_add_outcome_and_return(self):
    turns = compose.add_outcome([0.0, 0.5, 0.0], 1.0, weight=2.0)
    self.assertEqual(turns, [0.0, 0.5, 2.0])
    self.assertEqual(compose.episode_return(turns), 2.5)
    self.assertAlmostEqual(compose.episode_return(turns, gamma=0.5), 0.25 + 0.5)
    with self.assertRaisesRegex(ValueError, "gamma"):
      compose.episode_return(turns, gamma=1.5)
    with self.assertRaisesRegex(ValueError, "at least one"):
      compose.add_outcome([], 1.0)


class NoJaxTest(absltest.TestCase):

  def test_rewards_package_does_not_import_jax(self):
    code = ("import sys\n"
            "from agentrl.rewards import compose, extract, format, verifiers\n"
            "verifiers.math_equal('1', '1')\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib')))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True, env=dict(os.environ, PYTHONPATH=ROOT))
    self.assertEqual(out.stdout.strip().splitlines()[-1], "[]")


if __name__ == "__main__":
  absltest.main()
