"""Bad command lines fail with one line naming the flag, key, file or workdir (agentrl.cli).

Each case runs a real `python -m experiments.grpo` process and checks its exit code and that
stderr is a single `error: ...` line (no traceback).
"""
import os
import pathlib
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from agentrl import checkpoint
from agentrl import cli
from agentrl import configs
from agentrl import loop
from agentrl.models import hf

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "experiments.grpo", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))


class CommandLineTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("unknown_key", ["--config=experiments/grpo.py:smoke", "--config.loss.epsilon=0.2"],
       r"--config\.loss\.epsilon: config has no key 'loss\.epsilon'; did you mean "
       r"--config\.loss\.eps_low\?"),
      ("missing_file", ["--config=experiments/nope.py"],
       r"--config=experiments/nope\.py: no such file 'experiments/nope\.py'"),
      ("unknown_preset", ["--config=experiments/grpo.py:gpu"],
       r"--config=experiments/grpo\.py:gpu: unknown preset 'gpu'"),
      ("bad_workdir", ["--config=experiments/grpo.py:smoke", "--workdir=/proc/agentrl_x"],
       r"--workdir=/proc/agentrl_x cannot be created"),
  )
  def test_one_line_error(self, args, pattern):
    out = _run(*args)
    self.assertEqual(out.returncode, 2, out.stderr[-2000:])
    lines = [l for l in out.stderr.splitlines() if l.strip() and not l.startswith(("W", "I"))]
    self.assertLen(lines, 1, out.stderr[-2000:])
    self.assertRegex(lines[0], "^error: " + pattern)


class RunTest(absltest.TestCase):

  def _exit_code(self, error):
    def train(config, workdir):
      del config, workdir
      raise error

    with self.assertRaises(SystemExit) as raised, mock.patch("sys.stderr"):
      cli.run(train, None, tempfile.gettempdir())
    return raised.exception.code

  def test_exit_codes(self):
    self.assertEqual(self._exit_code(configs.ConfigError("config.x is bad")), 2)
    self.assertEqual(self._exit_code(checkpoint.CheckpointError("no checkpoint")), 2)
    self.assertEqual(self._exit_code(hf.ModelFileError("x.gguf: empty file")), 2)
    self.assertEqual(self._exit_code(loop.TrainingStopped("stopped at step 3")), 1)
    self.assertEqual(self._exit_code(KeyboardInterrupt()), 130)
    with self.assertRaises(ZeroDivisionError):  # a bug keeps its traceback
      self._exit_code(ZeroDivisionError())


if __name__ == "__main__":
  absltest.main()
