"""Bad command lines fail with one line naming the flag, key, file or workdir (agentrl.harness.cli).

Each case runs a real `python -m experiments.policy.grpo` process and checks its exit code and that
stderr is a single `error: ...` line (no traceback).
"""
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx

from agentrl import checkpoint
from agentrl import configs
from agentrl.data import jsonl
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.models import hf
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl.train import shutdown
from experiments import eval as evaluation
from experiments.policy import grpo

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "-m", "experiments.policy.grpo", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300,
                        env=dict(os.environ, JAX_PLATFORMS="cpu"))


class CommandLineTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("unknown_key", ["--config=experiments/policy/grpo.py:smoke", "--config.loss.epsilon=0.2"],
       r"--config\.loss\.epsilon: the config has no key 'loss\.epsilon' "
       r"\(experiments/policy/grpo\.py:smoke; --print_config lists them\); "
       r"did you mean --config\.loss\.eps_low\?$"),
      # Without --config the experiment's own file (default preset) is checked.
      ("unknown_key_default_preset", ["--config.optim.lrr=0.1"],
       r"--config\.optim\.lrr: the config has no key 'optim\.lrr' \(experiments/policy/grpo\.py; "
       r"--print_config lists them\); did you mean --config\.optim\.lr\?$"),
      ("missing_file", ["--config=experiments/nope.py"],
       r"--config=experiments/nope\.py: no such file 'experiments/nope\.py'"),
      ("unknown_preset", ["--config=experiments/policy/grpo.py:gpu"],
       r"--config=experiments/policy/grpo\.py:gpu: unknown preset 'gpu'"),
      ("bad_workdir", ["--config=experiments/policy/grpo.py:smoke", "--workdir=/proc/agentrl_x"],
       r"--workdir=/proc/agentrl_x cannot be created"),
  )
  def test_one_line_error(self, args, pattern):
    out = _run(*args)
    self.assertEqual(out.returncode, 2, out.stderr[-2000:])
    lines = [l for l in out.stderr.splitlines() if l.strip() and not l.startswith(("W", "I"))]
    self.assertLen(lines, 1, out.stderr[-2000:])
    self.assertRegex(lines[0], "^error: " + pattern)


class PrintConfigTest(absltest.TestCase):

  def test_print_config_lists_every_key_with_its_schema(self):
    out = _run("--config=experiments/policy/grpo.py:smoke", "--config.optim.lr=0.5",
               "--print_config")
    self.assertEqual(out.returncode, 0, out.stderr[-2000:])
    lines = out.stdout.splitlines()
    self.assertIn("optim.lr = 0.5  # float, in [0.0, ]", lines)
    self.assertIn("loss.agg = 'seq-mean-token-mean'  # str, one of 'token-mean', "
                  "'token-sum', 'seq-mean-token-mean', 'seq-mean-token-sum', "
                  "'seq-mean-token-sum-norm'", lines)
    self.assertIn("total_steps = 2  # int, in [1, ]", lines)
    self.assertIn("SCHEMA", lines[-1])


class EvalFlagsTest(absltest.TestCase):

  def test_pass_at_k_list_from_the_command_line(self):
    for spelling in ("1,4", "[1,4]", "(1, 4)"):
      out = subprocess.run(
          [sys.executable, "-m", "experiments.eval", "--config=experiments/eval.py:smoke",
           f"--config.ks={spelling}", "--config.samples=4", "--print_config"], cwd=ROOT,
          capture_output=True, text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
      self.assertEqual(out.returncode, 0, out.stderr[-2000:])
      self.assertIn(f"ks = {spelling!r}", out.stdout)
      self.assertEqual(evaluation.parse_ks(spelling, 4), [1, 4])
    with self.assertRaisesRegex(configs.ConfigError, r"config.ks='1,9'.*\[1, config.samples=8\]"):
      evaluation.parse_ks("1,9", 8)


def _tmpdir(test) -> str:
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def _run_dir(test) -> str:
  """A workdir holding a GRPO smoke run's config.json and run.json (no checkpoint needed)."""
  run_dir = _tmpdir(test)
  rundir.write_config(grpo.get_config("smoke"), run_dir, experiment="grpo")
  rundir.unlock(run_dir)
  return run_dir


class EvalRunDirTest(absltest.TestCase):

  def test_result_names_tell_apart_runs_of_one_name(self):
    a = evaluation.result_name("/x/sweepA/seed0", "2")
    self.assertRegex(a, r"^eval_seed0-[0-9a-f]{8}_2\.json$")
    self.assertNotEqual(a, evaluation.result_name("/x/sweepB/seed0", "2"))
    self.assertEqual(a, evaluation.result_name("/x/sweepA/./seed0/", "2"))
    self.assertNotEqual(evaluation.result_name("/x/a", "hf:/m/1/hf"),
                        evaluation.result_name("/x/a", "hf:/m/2/hf"))

  def test_a_damaged_run_config_is_one_error_before_anything_is_built(self):
    run_dir = _run_dir(self)
    path = os.path.join(run_dir, "config.json")
    with open(path) as f:
      stored = json.load(f)
    stored["task"]["name"] = "no_such_task"
    with open(path, "w") as f:
      json.dump(stored, f)
    config = evaluation.get_config("smoke")
    config.run_dir = run_dir
    with mock.patch.object(recipe, "build_policy") as build, self.assertRaisesRegex(
        configs.ConfigError, "^" + re.escape(path) +
        r": config\.task\.name must be one of .*, got 'no_such_task'$"):
      evaluation.train(config, _tmpdir(self))
    build.assert_not_called()

  def test_another_experiment_on_a_runs_workdir_is_one_error_line(self):
    run_dir = _run_dir(self)
    out = subprocess.run(
        [sys.executable, "-m", "experiments.policy.ctpo",
         "--config=experiments/policy/ctpo.py:smoke",
         f"--workdir={run_dir}", "--config.total_steps=4"], cwd=ROOT, capture_output=True,
        text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    self.assertEqual(out.returncode, 2, out.stderr[-2000:])
    lines = [l for l in out.stderr.splitlines() if l.strip() and not l.startswith(("W", "I"))]
    self.assertEqual(lines, [f"error: --workdir={run_dir} holds a run of the grpo experiment; "
                             "ctpo cannot continue it (its checkpoints and config are another "
                             "method's). Use another --workdir"])
    self.assertEqual(rundir.read_config(run_dir).total_steps, 2)  # not rewritten


class ExportTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    config = rl_config.rl_config("cpu", smoke=True)
    cls.tok, graphdef, cls.params = recipe.build_policy(config, sharding.make_mesh(config.mesh))
    cls.cfg = nnx.merge(graphdef, cls.params).cfg

  def _export(self, directory, run_dir, overwrite=False):
    with mock.patch("builtins.print"):
      evaluation.export(self.cfg, self.params, self.tok, directory, "2", run_dir=run_dir,
                        overwrite=overwrite)

  def test_another_models_directory_is_refused_and_overwrite_replaces_it_whole(self):
    root = _tmpdir(self)
    directory = os.path.join(root, "hf")
    os.makedirs(directory)
    stale = {"config.json": '{"model_type": "other"}', "model.safetensors.index.json": "{}",
             "model-00001-of-00002.safetensors": "x"}
    for name, text in stale.items():
      with open(os.path.join(directory, name), "w") as f:
        f.write(text)
    with self.assertRaisesRegex(configs.ConfigError,
                                rf"^config\.export_hf='{re.escape(directory)}' is not empty: "
                                r".*--config\.export_overwrite=True to replace it whole$"):
      self._export(directory, "/runs/a")
    self.assertEqual(sorted(os.listdir(directory)), sorted(stale))  # untouched
    self._export(directory, "/runs/a", overwrite=True)
    names = os.listdir(directory)
    self.assertIn("model.safetensors", names)
    self.assertNotIn("model.safetensors.index.json", names)
    self.assertNotIn("model-00001-of-00002.safetensors", names)
    self._export(directory, "/runs/a")  # an earlier export of the same run is replaced
    with self.assertRaisesRegex(configs.ConfigError, r"holds an export of /runs/a"):
      self._export(directory, "/runs/b")
    self.assertEqual(os.listdir(root), ["hf"])  # no temporary directory left behind

  def test_export_never_writes_into_a_run_directory(self):
    run_dir = _run_dir(self)
    before = sorted(os.listdir(run_dir))
    for target in (run_dir, os.path.join(run_dir, "hf")):
      with self.assertRaisesRegex(configs.ConfigError,
                                  rf"config\.export_hf='{re.escape(target)}' is (inside )?the "
                                  rf"run directory {re.escape(os.path.realpath(run_dir))}"):
        self._export(target, run_dir, overwrite=True)
    self.assertEqual(sorted(os.listdir(run_dir)), before)


class DefaultWorkdirTest(absltest.TestCase):

  def test_presets_get_their_own_directories(self):
    with mock.patch.dict(cli._EXPERIMENT, {"file": "experiments/policy/ctpo.py"}):
      self.assertEqual(cli.default_workdir(["x"]), "runs/ctpo")
      self.assertEqual(cli.default_workdir(["x", "--config=experiments/policy/ctpo.py:smoke"]),
                       "runs/ctpo_smoke")
      self.assertEqual(
          cli.default_workdir(["x", "--config", "experiments/policy/ctpo.py:smollm2,smoke"]),
          "runs/ctpo_smollm2_smoke")
      self.assertEqual(cli.default_workdir(["x", "--config=experiments/policy/ctpo.py:p=x/y"]),
                       "runs/ctpo_p-x_y")


class RunTest(absltest.TestCase):

  def _exit_code(self, error):
    def train(config, workdir):
      del config, workdir
      raise error

    def exit_now(code):  # the real one ends the process (os._exit): the test's own
      raise SystemExit(code)

    with self.assertRaises(SystemExit) as raised, mock.patch("sys.stderr"), mock.patch.object(
        cli.shutdown, "exit_now", exit_now):
      cli.run(train, None, tempfile.gettempdir())
    return raised.exception.code

  def test_exit_codes(self):
    self.assertEqual(self._exit_code(configs.ConfigError("config.x is bad")), 2)
    self.assertEqual(self._exit_code(checkpoint.CheckpointError("no checkpoint")), 2)
    self.assertEqual(self._exit_code(hf.ModelFileError("x.gguf: empty file")), 2)
    self.assertEqual(self._exit_code(loop.TrainingStopped("stopped at step 3")), 1)
    self.assertEqual(self._exit_code(KeyboardInterrupt()), 130)
    self.assertEqual(self._exit_code(shutdown.Interrupted(signal.SIGTERM)), 143)
    self.assertEqual(self._exit_code(jsonl.JsonlError("x.jsonl:3: invalid JSON")), 2)
    with self.assertRaises(ZeroDivisionError):  # a bug keeps its traceback
      self._exit_code(ZeroDivisionError())


class SignalTest(parameterized.TestCase):
  """SIGINT and SIGTERM during training: one line naming the last checkpoint, no crash.

  A real smoke run is signalled during step 1 (its compilation: an interpreter teardown racing
  XLA's compile threads segfaults) or after a checkpoint; its saves are async and every step
  saves, so the signal often lands mid-save.
  """

  @parameterized.named_parameters(
      # Without the suite's compilation cache, so step 1 really compiles.
      ("sigint_during_step_1", signal.SIGINT, "step 0/", 130,
       r"interrupted \(SIGINT\); no checkpoint was written yet$"),
      ("sigterm_after_a_checkpoint", signal.SIGTERM, "step 2/", 143,
       r"interrupted \(SIGTERM\); the last checkpoint is step (\d+) in .*/ckpt; the same "
       r"command resumes from it$"),
  )
  def test_signal_stops_with_one_line(self, signum, after, code, pattern):
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    if after == "step 0/":
      env.pop("JAX_COMPILATION_CACHE_DIR", None)
    workdir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, workdir, ignore_errors=True)
    with tempfile.TemporaryFile("w+") as stderr:  # a pipe left unread could fill and block it
      proc = subprocess.Popen(
          [sys.executable, "-m", "experiments.policy.grpo",
           "--config=experiments/policy/grpo.py:smoke", f"--workdir={workdir}",
           "--config.total_steps=1000"], cwd=ROOT, text=True,
          stdout=subprocess.PIPE, stderr=stderr, env=env)
      for line in proc.stdout:
        if line.startswith(after):
          break
      proc.send_signal(signum)
      proc.communicate(timeout=120)
      stderr.seek(0)
      err = stderr.read()
    self.assertEqual(proc.returncode, code, err[-3000:])
    errors = [l for l in err.splitlines() if l.startswith("error:")]
    self.assertLen(errors, 1, err[-3000:])
    match = re.search(pattern, errors[0])
    self.assertIsNotNone(match, errors[0])
    if match.groups():  # the checkpoint named is complete, and no partial one is left behind
      ckpt = os.path.join(workdir, "ckpt")
      self.assertEqual(checkpoint.saved_steps(ckpt)[-1], int(match.group(1)))
      self.assertEqual([d for d in os.listdir(ckpt) if not d.isdigit()], [])


if __name__ == "__main__":
  absltest.main()
