"""scripts/plan_pod.py: the verdict and table from compiled plans; real compiles for a TPU
topology where the `tpu-plan` extra (libtpu) is installed and for a GPU target where the
`gpu-plan` one (the CUDA PJRT plugin, without NVIDIA's libraries) is.

The compile cases need those wheels, which CI does not install (with libtpu, every JAX process
first tries to start a TPU runtime; docs/scaling.md §4 has the commands). They compile GRPO's
real update step and the engine's decode step for the tiny preset on v5e:2x2 (and on two such
slices) and on 4xh100 (where the update step must call cuDNN's flash attention and the Triton
log-prob kernel, as a GPU run does), check that the per-chip figures are positive and fit, and
that the same plan is reported as not fitting when the chip is given less memory than it needs.
"""
import functools
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

from absl.testing import absltest

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_SCRIPT = os.path.join(_ROOT, "scripts", "plan_pod.py")
GIB = 2.0**30


@functools.cache
def _load_script():
  # Once per process: the script defines its absl flags when it is executed.
  spec = importlib.util.spec_from_file_location("plan_pod", _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


class VerdictTest(absltest.TestCase):

  def test_the_largest_total_decides(self):
    plan_pod = _load_script()
    update = plan_pod.Plan("update", arguments=2 * GIB, outputs=2 * GIB, temporaries=5 * GIB,
                           aliased=2 * GIB)
    decode = plan_pod.Plan("decode", arguments=3 * GIB, held=1 * GIB)
    self.assertEqual(update.total, 7 * GIB)
    self.assertEqual(plan_pod.verdict([update, decode], 16.0),
                     (True, "fits: yes, 7.00 GiB of 16 GiB per chip (update)"))
    self.assertEqual(plan_pod.verdict([update, decode], 6.5),
                     (False, "fits: no, 7.00 GiB of 6.5 GiB per chip (update)"))

  def test_a_compile_that_ran_out_of_memory_does_not_fit(self):
    plan_pod = _load_script()
    oom = plan_pod.Plan("update", error="Ran out of memory in memory space hbm. Used 20.1G")
    fits, line = plan_pod.verdict([oom, plan_pod.Plan("decode", arguments=GIB)], 16.0)
    self.assertFalse(fits)
    self.assertEqual(line, "fits: no, update ran out of the chip's 16 GiB")
    self.assertIn("| update | does not fit: Ran out of memory", plan_pod.table([oom], 16.0))


def _installed(*modules: str) -> bool:
  try:
    return all(importlib.util.find_spec(m) for m in modules)
  except ModuleNotFoundError:   # a missing parent package of a dotted name
    return False


def _plan(topology: str, *extra: str) -> tuple[str, dict]:
  """Runs the script on the tiny preset over 4 chips; (its stdout, its --json plans)."""
  command = [sys.executable, _SCRIPT, f"--topology={topology}", "--programs=update,decode",
             "--config=experiments/policy/grpo.py:pod", "--config.model.variant=tiny",
             "--config.mesh.data=1", "--config.mesh.fsdp=4",
             "--config.rollout.prompts_per_step=4", "--config.rollout.group_size=2",
             "--config.rollout.max_len=64", "--config.rollout.max_new_tokens=32",
             "--config.rollout.slots=8", "--config.updates.minibatches=1",
             "--config.updates.score_minibatches=1", *extra]
  path = os.path.join(tempfile.mkdtemp(), "plan.json")
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("XLA_PYTHON_CLIENT_MEM_FRACTION", None)   # a GPU plan's budget: JAX's default share
  out = subprocess.run([*command, f"--json={path}"], cwd=_ROOT, capture_output=True,
                       text=True, check=True, env=env, timeout=600)
  with open(path) as f:
    return out.stdout, json.load(f)


@absltest.skipIf(not _installed("libtpu"), "needs libtpu: pip install -e '.[tpu-plan]'")
class CompileTest(absltest.TestCase):

  def test_tiny_grpo_compiles_for_v5e_and_fits(self):
    out, plans = _plan("v5e:2x2")
    self.assertTrue(plans["fits"])
    self.assertEqual([p["name"] for p in plans["plans"]], ["update", "decode"])
    for p in plans["plans"]:
      for key in ("arguments", "outputs", "code", "total"):
        self.assertGreater(p[key], 0, (p["name"], key))
      self.assertIn("all-gather", p["collectives"])   # fsdp gathers the sharded weights
    self.assertGreater(plans["plans"][0]["aliased"], 0)   # the update step donates its state
    self.assertRegex(out.splitlines()[-1], r"^fits: yes, [\d.]+ GiB of 16 GiB per chip")

  def test_two_slices_split_the_data_axis(self):
    out, plans = _plan("v5e:2x2", "--num_slices=2", "--config.mesh.data=2")
    self.assertIn("8 chips", out.splitlines()[0])
    self.assertIn("mesh {'data': 2, 'fsdp': 4, 'tensor': 1}", out.splitlines()[0])
    self.assertTrue(plans["fits"])

  def test_too_little_memory_does_not_fit(self):
    out, plans = _plan("v5e:2x2", "--hbm_gib=0.001")
    self.assertFalse(plans["fits"])
    self.assertRegex(out.splitlines()[-1], r"^fits: no, [\d.]+ GiB of 0.001 GiB per chip")


@absltest.skipIf(not _installed("jax_plugins.xla_cuda12", "jax_cuda12_plugin"),
                 "needs the CUDA PJRT plugin: pip install -e '.[gpu-plan]'")
class GpuCompileTest(absltest.TestCase):

  def test_tiny_grpo_compiles_for_h100_with_its_kernels_and_fits(self):
    out, plans = _plan("4xh100")
    self.assertIn("4 chips (NVIDIA H100 80GB HBM3, 59.332 GiB each)", out.splitlines()[0])
    self.assertTrue(plans["fits"])
    update, decode = plans["plans"]
    for p in (update, decode):
      for key in ("arguments", "outputs", "temporaries", "total"):
        self.assertGreater(p[key], 0, (p["name"], key))
      self.assertIn("all-gather", p["collectives"])
    kernels = " ".join(update["kernels"])
    self.assertIn("__cudnn$fmha", kernels)    # model.attention=fused: cuDNN's flash attention
    self.assertIn("triton", kernels)          # logprob_impl=auto: the Pallas GPU kernel
    self.assertRegex(out.splitlines()[-1], r"^fits: yes, [\d.]+ GiB of 59.332 GiB per chip")

  def test_too_little_memory_does_not_fit(self):
    # A GPU compile does not fail on memory: the verdict compares XLA's figures with the card.
    out, plans = _plan("4xh100", "--programs=decode", "--hbm_gib=0.0001")
    self.assertFalse(plans["fits"])
    self.assertRegex(out.splitlines()[-1], r"^fits: no, [\d.]+ GiB of 0.0001 GiB per chip")


if __name__ == "__main__":
  absltest.main()
