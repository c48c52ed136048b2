"""Tests for agentrl.records.rundir: workdir creation and locking, config.json on resume,
summary."""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from unittest import mock

from absl.testing import absltest

from agentrl import configs
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.records import metrics
from agentrl.records import rundir


def _tmpdir(test) -> str:
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def _config():
  c = rl_config.rl_config("cpu", smoke=True)
  c.loss = dict(eps=0.2)
  return c


class LockTest(absltest.TestCase):

  def test_a_second_process_is_refused_with_the_holder_named(self):
    workdir = _tmpdir(self)
    rundir.lock(workdir)
    self.addCleanup(rundir.unlock, workdir)
    code = ("import sys; from agentrl.records import rundir\n"
            "try:\n  rundir.lock(sys.argv[1])\nexcept rundir.WorkdirError as e:\n"
            "  print(e); sys.exit(3)\n")
    out = subprocess.run([sys.executable, "-c", code, workdir], capture_output=True, text=True)
    self.assertEqual(out.returncode, 3, out.stderr)
    self.assertIn(f"is in use by pid {os.getpid()} on ", out.stdout)
    with open(os.path.join(workdir, rundir.LOCK_FILE)) as f:
      self.assertEqual(json.load(f)["pid"], os.getpid())
    rundir.lock(workdir)  # re-entrant in the holding process

  def test_the_lock_of_a_dead_process_is_taken_over(self):
    workdir = _tmpdir(self)
    code = ("import os, sys; from agentrl.records import rundir; rundir.lock(sys.argv[1]); "
            "os._exit(0)")
    subprocess.run([sys.executable, "-c", code, workdir], check=True)
    self.assertTrue(os.path.exists(os.path.join(workdir, rundir.LOCK_FILE)))  # left behind
    rundir.lock(workdir)
    self.addCleanup(rundir.unlock, workdir)
    with open(os.path.join(workdir, rundir.LOCK_FILE)) as f:
      self.assertEqual(json.load(f)["pid"], os.getpid())

  def test_unwritable_workdir_is_one_clear_error(self):
    with self.assertRaisesRegex(rundir.WorkdirError,
                                r"--workdir=/proc/agentrl_run cannot be created"):
      rundir.prepare("/proc/agentrl_run")


class ConfigTest(absltest.TestCase):

  def test_config_json_round_trips_and_is_written_atomically(self):
    workdir = os.path.join(_tmpdir(self), "run")
    config = _config()
    rundir.write_config(config, workdir, experiment="grpo")
    self.addCleanup(rundir.unlock, workdir)
    # JSON has no tuples: compare both sides as JSON.
    self.assertEqual(json.loads(rundir.read_config(workdir).to_json()),
                     json.loads(config.to_json()))
    self.assertEqual(sorted(os.listdir(workdir)), ["LOCK", "config.json", rundir.RUN_FILE])

  def test_resume_refuses_a_changed_model_before_writing(self):
    workdir = _tmpdir(self)
    rundir.write_config(_config(), workdir, experiment="grpo")
    self.addCleanup(rundir.unlock, workdir)
    changed = _config()
    changed.model.width = 128
    with mock.patch.object(rundir, "has_checkpoints", return_value=True), \
         self.assertRaisesRegex(configs.ConfigError,
                                r"holds a run with a different model or task "
                                r"\(config\.model\.width: 64 -> 128\)"):
      rundir.write_config(changed, workdir, experiment="grpo")
    self.assertEqual(rundir.read_config(workdir).model.width, 64)  # untouched

  def test_a_run_without_checkpoints_may_change_its_model(self):
    # e.g. the first attempt's model failed to load: nothing was saved, nothing is resumed.
    workdir = _tmpdir(self)
    rundir.write_config(_config(), workdir, experiment="grpo")
    self.addCleanup(rundir.unlock, workdir)
    self.assertFalse(rundir.has_checkpoints(workdir))
    changed = _config()
    changed.model.width = 128
    with mock.patch("builtins.print"):
      rundir.write_config(changed, workdir, experiment="grpo")
    self.assertEqual(rundir.read_config(workdir).model.width, 128)

  def test_resume_may_change_how_the_model_is_computed(self):
    workdir = _tmpdir(self)
    older = _config()
    del older.model["unroll_layers"]   # a run made before the key existed
    rundir.write_config(older, workdir, experiment="grpo")
    self.addCleanup(rundir.unlock, workdir)
    changed = _config()
    changed.model.unroll_layers = True
    with mock.patch("builtins.print") as printed:
      rundir.write_config(changed, workdir, experiment="grpo")
    self.assertIn("config.model.unroll_layers changed: None -> True",
                  printed.call_args_list[0].args[0])
    self.assertTrue(rundir.read_config(workdir).model.unroll_layers)

  def test_resume_logs_hyperparameter_changes(self):
    workdir = _tmpdir(self)
    rundir.write_config(_config(), workdir, experiment="grpo")
    self.addCleanup(rundir.unlock, workdir)
    changed = _config()
    changed.optim.lr = 5e-4
    changed.total_steps = 9
    with mock.patch("builtins.print") as printed:
      rundir.write_config(changed, workdir, experiment="grpo")
    lines = [call.args[0] for call in printed.call_args_list]
    self.assertEqual(len(lines), 2)
    self.assertIn("config.optim.lr changed: 0.001 -> 0.0005", lines[0])
    self.assertEqual(rundir.read_config(workdir).optim.lr, 5e-4)

  def test_another_experiment_is_refused_before_writing(self):
    workdir = _tmpdir(self)
    rundir.write_config(_config(), workdir, experiment="grpo")
    self.addCleanup(rundir.unlock, workdir)
    with open(os.path.join(workdir, "config.json")) as f:
      stored = f.read()
    other = _config()
    other.loss = dict(eps_low=0.2, tau=1.0)
    with self.assertRaisesRegex(rundir.WorkdirError,
                                rf"^--workdir={workdir} holds a run of the grpo "
                                r"experiment; ctpo cannot continue it"):
      rundir.write_config(other, workdir, experiment="ctpo")
    with open(os.path.join(workdir, "config.json")) as f:
      self.assertEqual(f.read(), stored)
    self.assertEqual(rundir.experiment_of(workdir), "grpo")

  def test_a_run_without_run_file_resumes_and_records_its_experiment(self):
    workdir = _tmpdir(self)
    rundir.write_config(_config(), workdir, experiment="grpo")
    self.addCleanup(rundir.unlock, workdir)
    os.remove(os.path.join(workdir, rundir.RUN_FILE))  # a run made before run.json existed
    self.assertIsNone(rundir.experiment_of(workdir))
    rundir.write_config(_config(), workdir, experiment="grpo")
    self.assertEqual(rundir.experiment_of(workdir), "grpo")

  def test_a_damaged_config_json_is_one_error_naming_the_file_and_key(self):
    workdir = _tmpdir(self)
    rundir.write_config(_config(), workdir, experiment="grpo")
    self.addCleanup(rundir.unlock, workdir)
    path = os.path.join(workdir, "config.json")
    with open(path) as f:
      text = f.read()
    wrong_type = json.loads(text) | {"total_steps": "many"}
    no_task = json.loads(text)
    no_task["task"]["name"] = "no_such_task"
    cases = [
        (text[:len(text) // 2], r"is not valid JSON \(.* at line \d+ column \d+; truncated"),
        ("[1, 2]", r"must hold a JSON object of config keys, got a list"),
        (json.dumps(wrong_type), r": config\.total_steps must be int, got str 'many'$"),
        (json.dumps(no_task), r": config\.task\.name must be one of .*got 'no_such_task'$"),
        (json.dumps({**no_task, "rollout": 3}), r": config\.rollout must be a dict, got int 3$"),
    ]
    for content, pattern in cases:
      with open(path, "w") as f:
        f.write(content)
      with self.assertRaisesRegex(configs.ConfigError, "^" + re.escape(path) + ".*" + pattern):
        rundir.read_config(workdir, rl_config.RL_SCHEMA, required=("rollout.max_len",))
    with open(path, "w") as f:
      f.write(text[:-3])
    with self.assertRaisesRegex(configs.ConfigError, "^" + re.escape(path) + " is not valid"):
      rundir.write_config(_config(), workdir, experiment="grpo")  # a resume reads it too
    with open(path, "w") as f:
      json.dump({k: v for k, v in json.loads(text).items() if k != "rollout"}, f)
    with self.assertRaisesRegex(configs.ConfigError, r"config\.rollout\.max_len is missing"):
      rundir.read_config(workdir, rl_config.RL_SCHEMA, required=("rollout.max_len",))


class SummaryTest(absltest.TestCase):

  def test_summary_table_and_files(self):
    workdir = _tmpdir(self)
    records = [{"step": s, "reward": 0.1 * s, "success": 0.1 * s, "loss": 1.0 / s,
                "time/step": 1.0} for s in (1, 2)]
    writer = metrics.Writer(workdir, total_steps=2, tensorboard=False, console=False)
    for r in records:
      writer.write(r["step"], {k: v for k, v in r.items() if k != "step"})
    writer.close()
    result = types.SimpleNamespace(
        step=2, records=metrics.read_jsonl(writer.path), steps_run=2,
        evals={"0": {"eval/success": 0.25}, "2": {"eval/success": 0.5}})
    with mock.patch("builtins.print"):
      summary = rundir.write_summary(workdir, result, name="TEST", start=0.0,
                                     sft_info={"seconds": 3.0})
    self.assertEqual((summary["success_before"], summary["success_after"]), (0.25, 0.5))
    self.assertEqual(summary["method"], "TEST")
    self.assertNotIn("time/step", summary["final"])
    self.assertEqual(summary["seconds"]["train"], 2.0)   # summed over the records
    self.assertEqual(summary["seconds"]["sft"], 3.0)
    for name in ("summary.json", "curves.png"):
      self.assertTrue(os.path.exists(os.path.join(workdir, name)), name)
    # Re-running a finished run (no step ran) keeps its summary and figures.
    with open(os.path.join(workdir, "summary.json")) as f:
      written = f.read()
    with mock.patch("builtins.print") as printed:
      again = rundir.write_summary(workdir, types.SimpleNamespace(**{**vars(result),
                                                                    "steps_run": 0}),
                                   name="TEST", start=0.0)
    with open(os.path.join(workdir, "summary.json")) as f:
      self.assertEqual(f.read(), written)
    self.assertEqual(again, json.loads(written))
    self.assertIn("already complete", printed.call_args_list[0].args[0])

  def test_a_replay_writes_its_update_and_no_curves(self):
    workdir = _tmpdir(self)
    result = types.SimpleNamespace(step=5, records=[{"step": 5, "loss": 0.5}], steps_run=0,
                                   evals={}, replay="/runs/x:5")
    summary = rundir.write_summary(workdir, result, name="TEST", start=0.0)
    self.assertEqual(summary, {"method": "TEST", "replay": "/runs/x:5", "step": 5,
                               "update": {"step": 5, "loss": 0.5}})
    with open(os.path.join(workdir, "summary.json")) as f:
      self.assertEqual(json.load(f), summary)
    self.assertFalse(os.path.exists(os.path.join(workdir, "curves.png")))


if __name__ == "__main__":
  absltest.main()
