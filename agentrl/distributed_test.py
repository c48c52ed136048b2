"""agentrl.distributed: a single process is left alone; launchers are read from the env.

The real two-process run (gloo over loopback) is in tests/sharding_test.py.
"""
import os
from unittest import mock

from absl.testing import absltest
import jax

from agentrl import distributed

LAUNCHER_VARS = ("SLURM_NTASKS", "SLURM_STEP_NODELIST", "OMPI_COMM_WORLD_SIZE",
                 "TPU_PROCESS_ADDRESSES", "TPU_WORKER_HOSTNAMES", "JAX_COORDINATOR_ADDRESS",
                 "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def _clean_env(**env):
  patched = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
  return mock.patch.dict(os.environ, {**patched, **env}, clear=True)


class DistributedTest(absltest.TestCase):

  def test_single_process_is_a_noop(self):
    with _clean_env(), mock.patch.object(distributed, "_on_cloud_tpu_vm", return_value=False):
      self.assertFalse(distributed.initialize_distributed())
    with _clean_env(JAX_NUM_PROCESSES="1", JAX_COORDINATOR_ADDRESS="10.0.0.1:1234"):
      self.assertFalse(distributed.initialize_distributed())
    with _clean_env(SLURM_NTASKS="1", SLURM_STEP_NODELIST="n1"):
      self.assertIsNone(distributed.cluster_launcher())
    self.assertFalse(jax.distributed.is_initialized())
    with _clean_env(JAX_NUM_PROCESSES="two"):
      with self.assertRaisesRegex(ValueError, "JAX_NUM_PROCESSES='two' must be an integer"):
        distributed.initialize_distributed()

  def test_launchers_are_detected_from_standard_env_vars(self):
    cases = [({"SLURM_NTASKS": "16", "SLURM_STEP_NODELIST": "gpu[1-2]"}, "slurm"),
             ({"OMPI_COMM_WORLD_SIZE": "4"}, "openmpi"),
             ({"TPU_WORKER_HOSTNAMES": "t0,t1,t2,t3"}, "tpu")]
    for env, launcher in cases:
      with _clean_env(**env):
        self.assertEqual(distributed.cluster_launcher(), launcher)


if __name__ == "__main__":
  absltest.main()
