"""The main experiment's smoke preset on a (data, fsdp, tensor) = (2, 2, 2) mesh of 8 CPU devices.

SFT warm start, sampling, scoring and the jitted update all run with params and Adam state
sharded over fsdp and tensor and batch rows over data x fsdp (agentrl.sharding).
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import math  # pylint: disable=g-import-not-at-top,wrong-import-position
import tempfile

from absl.testing import absltest
import jax

from experiments.policy import grpo


class ExperimentOnMeshTest(absltest.TestCase):

  def test_grpo_smoke_on_2x2x2_mesh(self):
    self.assertGreaterEqual(jax.device_count(), 8)
    config = grpo.get_config("smoke")
    config.mesh = dict(data=2, fsdp=2, tensor=2)
    # The smoke task's character vocabulary (17 ids) does not split in two; replicate it.
    config.sharding_rules = [(name, None if name == "vocab" else axes)
                             for name, axes in config.sharding_rules]
    with tempfile.TemporaryDirectory() as workdir:
      summary = grpo.train(config, workdir)
    self.assertEqual(summary["steps"], config.total_steps)
    self.assertTrue(math.isfinite(summary["final"]["loss"]))
    self.assertEqual(summary["final"]["skipped"], 0.0)


if __name__ == "__main__":
  absltest.main()
