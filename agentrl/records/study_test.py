"""Tests for agentrl.records.study: the bookkeeping of multi-run studies."""
import json
import os
import shutil
import tempfile

from absl.testing import absltest
import numpy as np

from agentrl.records import study


class StudyTest(absltest.TestCase):

  def test_experiment_module_finds_the_family_folder(self):
    self.assertEqual(study.experiment_module("grpo"), "experiments.policy.grpo")
    self.assertEqual(study.experiment_module("agent"), "experiments.agents.agent")
    self.assertEqual(study.experiment_module("eval"), "experiments.eval")
    with self.assertRaisesRegex(ValueError, r"no single experiment named 'nope'.*known: .*grpo"):
      study.experiment_module("nope")

  def test_mean_std_is_over_seeds_with_ddof_1(self):
    self.assertEqual(study.mean_std([0.40, 0.44, 0.42], ".1f", 100.0), "42.0 ± 2.0")
    self.assertEqual(study.mean_std([3.0], ".0f"), "3 ± 0")

  def test_normalized_auc_is_the_mean_level_of_the_curve(self):
    # Trapezoids over uneven steps: (0 + 1) / 2 * 10 + (1 + 1) / 2 * 30 = 35 over 40 steps.
    self.assertAlmostEqual(study.normalized_auc([0, 10, 40], [0.0, 1.0, 1.0]), 35 / 40)
    self.assertAlmostEqual(study.normalized_auc([5], [0.3]), 0.3)
    self.assertTrue(np.isnan(study.normalized_auc([], [])))

  def test_finished_and_shared_warm_start(self):
    base = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, base, ignore_errors=True)
    run, other = os.path.join(base, "a"), os.path.join(base, "b")
    self.assertFalse(study.finished(run, 10))
    os.makedirs(run)
    with open(os.path.join(run, "summary.json"), "w") as f:
      json.dump({"steps": 10}, f)
    self.assertTrue(study.finished(run, 10))
    self.assertFalse(study.finished(run, 20))
    os.makedirs(os.path.join(run, "warm_start"))
    with open(os.path.join(run, "warm_start", "params"), "w") as f:
      f.write("sft")
    study.share_warm_start(other, [os.path.join(base, "missing"), run])
    with open(os.path.join(other, "warm_start", "params")) as f:
      self.assertEqual(f.read(), "sft")
    # No timing for a run this process did not start (e.g. resumed): NaN, not a stale figure.
    self.assertTrue(np.isnan(study.process_time(other)["wall_s"]))


if __name__ == "__main__":
  absltest.main()
