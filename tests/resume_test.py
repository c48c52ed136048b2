"""A run killed with SIGKILL and restarted reproduces the uninterrupted run exactly.

Three real processes of `python -m experiments.policy.grpo` (smoke preset, more steps): one runs
to the end; one is SIGKILLed mid-run, after a few checkpoints, and is then started again with
the same --workdir. The resumed run must restore params, optimizer state, RNG and data position
and write a metrics.jsonl equal to the uninterrupted one (timing fields aside). The processes
share the suite's persistent compilation cache (conftest.py) and the SFT warm start, so only
the first one pays for compiling and SFT. The same for the multi-turn agent
(`experiments.agents.agent`, smoke preset: demonstrations warm start, engine rollouts over
several turns, information-gain probes), with fewer steps, among the slow tests.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from absl.testing import absltest
import pytest

from agentrl.records import metrics
from agentrl.records import study
from agentrl.train import loop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# experiment -> (steps, save_every, kill after this many logged steps, config flags).
RUNS = {
    # A short SFT (to ~10% success) and 8 prompts x 4 samples make rewards, and so gradients,
    # non-zero: a resume that lost the params or optimizer state would show in the records.
    "grpo": (20, 4, 8, ["--config.sft.steps_max=600", "--config.sft.target_success=0.1",
                         "--config.sft.batch_size=64", "--config.sft.eval_every=25",
                         "--config.sft.eval_problems=128", "--config.rollout.prompts_per_step=8",
                         "--config.rollout.group_size=4"]),
    # The information-gain turn rewards make gradients non-zero even where every outcome is 0.
    "agent": (10, 2, 4, ["--config.rollout.prompts_per_step=4"]),
}


def _command(name: str, workdir: str) -> list[str]:
  steps, save_every, _, flags = RUNS[name]
  return [sys.executable, "-m", study.experiment_module(name),
          f"--config={study.experiment_module(name).replace('.', '/')}.py:smoke",
          f"--config.total_steps={steps}", f"--config.log.save_every={save_every}", *flags,
          "--config.log.tensorboard=False", f"--workdir={workdir}"]


def _env() -> dict[str, str]:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  # One device and XLA's default code generation, as a user's run (the SFT phase is
  # compute-bound, so conftest's compile-time flags would slow it down).
  env.pop("XLA_FLAGS", None)
  return env


def _steps_logged(workdir: str) -> int:
  path = os.path.join(workdir, metrics.JSONL)
  records = metrics.read_jsonl(path) if os.path.exists(path) else []
  return sum(r["step"] > 0 for r in records)


# Counts that follow the order env resets return on the engine's worker threads: episodes of
# one group whose resets come back together share one prefill, so this can differ between runs
# whose trajectories are identical.
SCHEDULING_KEYS = ("rollout/prefill_tokens",)


def _reproducible(workdir: str) -> list[dict]:
  records = metrics.read_jsonl(os.path.join(workdir, metrics.JSONL))
  skip = set(metrics.TIMING_KEYS) | set(SCHEDULING_KEYS)
  return [{k: v for k, v in r.items() if k not in skip} for r in records]


class ResumeAfterSigkillTest(absltest.TestCase):

  def test_grpo_killed_and_resumed_matches_uninterrupted(self):
    self._check("grpo")

  # The grpo case covers the kill and resume path and the agent smoke run the agent's
  # rollouts; this case checks them together (run with `-m slow`).
  @pytest.mark.slow
  def test_agent_killed_and_resumed_matches_uninterrupted(self):
    self._check("agent")

  def _check(self, name: str):
    steps, _, kill_after, _ = RUNS[name]
    base = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, base, ignore_errors=True)
    full, killed = (os.path.join(base, d) for d in ("full", "killed"))
    env = _env()
    subprocess.run(_command(name, full), cwd=ROOT, env=env, check=True, capture_output=True)
    records = _reproducible(full)
    self.assertLen(records, steps + 1)  # step 0: the baseline evaluation
    self.assertGreater(sum(r.get("grad_norm", 0) > 0 for r in records), steps // 4)

    # The SFT warm start is cached in the workdir; reuse it, the test is about the RL loop.
    shutil.copytree(os.path.join(full, "warm_start"), os.path.join(killed, "warm_start"))
    proc = subprocess.Popen(_command(name, killed), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while _steps_logged(killed) < kill_after and proc.poll() is None and time.time() < deadline:
      time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    self.assertEqual(proc.returncode, -signal.SIGKILL, "the run ended before it was killed")
    logged = _steps_logged(killed)
    self.assertGreaterEqual(logged, kill_after)
    self.assertLess(logged, steps)

    resumed = subprocess.run(_command(name, killed), cwd=ROOT, env=env, check=True,
                             capture_output=True, text=True)
    self.assertIn("Resumed from", resumed.stdout)
    self.assertEqual(_reproducible(killed), _reproducible(full))


if __name__ == "__main__":
  absltest.main()
