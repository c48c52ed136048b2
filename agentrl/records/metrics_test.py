"""Tests for agentrl.records.metrics: JSONL, TensorBoard, lazy W&B, console line, tables."""
import io
import json
import os
import time
import shutil
import struct
import sys
import tempfile
import types as pytypes
from unittest import mock

from absl.testing import absltest
import numpy as np

from agentrl.records import metrics

def _tmpdir(test) -> str:
  # tempfile rather than absltest's create_tempdir, which needs parsed absl flags (pytest).
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def _events(tb_dir: str):
  """Every Event in a TensorBoard directory (TFRecord framing: length, crc, data, crc)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=g-import-not-at-top
  for name in sorted(os.listdir(tb_dir)):
    with open(os.path.join(tb_dir, name), "rb") as f:
      data = f.read()
    pos = 0
    while pos < len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      yield event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4


class WriterTest(absltest.TestCase):

  def test_jsonl_tensorboard_and_console(self):
    d = _tmpdir(self)
    out = io.StringIO()
    w = metrics.Writer(d, total_steps=2, stream=out)
    w.write(1, {"reward": np.float32(0.5), "success": 0.25, "time/rollout": 1.5,
                "skipped": np.bool_(False)})
    w.write(2, {"reward": 0.75, "loss": float("nan")})
    w.close()
    records = metrics.read_jsonl(os.path.join(d, metrics.JSONL))
    self.assertEqual(records, [
        {"step": 1, "reward": 0.5, "success": 0.25, "time/rollout": 1.5, "skipped": 0},
        {"step": 2, "reward": 0.75, "loss": None}])
    lines = out.getvalue().splitlines()
    self.assertEqual(lines[0],
                     "step 1/2 | reward 0.500 | sampled success 25.0% | rollout 1.50s")
    self.assertTrue(os.listdir(os.path.join(d, "tb"))[0].startswith("events.out.tfevents"))

  def test_tensorboard_events_hold_the_config(self):
    d = _tmpdir(self)
    with open(os.path.join(d, "config.json"), "w") as f:
      json.dump({"optim": {"lr": 0.125}, "total_steps": 7}, f)
    w = metrics.Writer(d, total_steps=1, console=False)
    w.write(1, {"reward": 1.0})
    w.close()
    texts = [(e.step, v) for e in _events(os.path.join(d, "tb")) for v in e.summary.value
             if v.metadata.plugin_data.plugin_name == "text"]
    self.assertLen(texts, 1)
    step, value = texts[0]
    self.assertEqual((step, value.tag), (0, "config/text_summary"))
    text = value.tensor.string_val[0].decode()
    self.assertTrue(text.startswith("```json\n") and text.endswith("\n```"), text)
    self.assertEqual(json.loads(text[len("```json"):-len("```")]),
                     {"optim": {"lr": 0.125}, "total_steps": 7})

  def test_resume_drops_later_records_and_torn_lines(self):
    d = _tmpdir(self)
    w = metrics.Writer(d, total_steps=5, console=False, tensorboard=False)
    for step in range(1, 5):
      w.write(step, {"reward": step / 10})
    w.close()
    with open(os.path.join(d, metrics.JSONL), "a") as f:
      f.write('{"step": 5, "rew')  # what a SIGKILL mid-write leaves
    w = metrics.Writer(d, total_steps=5, console=False, tensorboard=False, resume_step=2)
    w.write(3, {"reward": 0.9})
    self.assertEqual([(r["step"], r["reward"]) for r in w.records()],
                     [(1, 0.1), (2, 0.2), (3, 0.9)])
    w.close()

  def test_fresh_run_truncates_old_file(self):
    d = _tmpdir(self)
    for value in (1.0, 2.0):
      w = metrics.Writer(d, total_steps=1, console=False, tensorboard=False)
      w.write(1, {"x": value})
      w.close()
    self.assertEqual(metrics.read_jsonl(os.path.join(d, metrics.JSONL)), [{"step": 1, "x": 2.0}])

  def test_wandb_is_imported_only_when_configured(self):
    d = _tmpdir(self)
    with mock.patch.dict(sys.modules, {"wandb": None}):  # importing it would now fail
      metrics.Writer(d, total_steps=1, console=False, tensorboard=False).close()
    run = mock.MagicMock()
    fake = pytypes.SimpleNamespace(init=mock.MagicMock(return_value=run))
    with mock.patch.dict(sys.modules, {"wandb": fake}):
      w = metrics.Writer(d, total_steps=1, console=False, tensorboard=False,
                         wandb={"project": "p"})
      w.write(1, {"reward": 1.0, "loss": float("inf")})
      w.close()
    fake.init.assert_called_once_with(dir=d, project="p")
    run.log.assert_called_once_with({"reward": 1.0}, step=1)
    run.finish.assert_called_once()

  def test_non_scalar_is_rejected(self):
    with self.assertRaisesRegex(ValueError, "must be scalars"):
      metrics.to_python(np.zeros(3))


class FormattingTest(absltest.TestCase):

  def test_progress_line_full(self):
    line = metrics.progress_line(3, 10, {
        "reward": 0.42, "success": 0.4, "eval/success": 0.5, "kl": 1e-3, "entropy": 1.234,
        "clipfrac": 0.05, "rollout/turn_cut_frac": 0.25, "rollout/tokens_per_s": 12345.6,
        "update/tokens_per_s": 800.0, "time/rollout": 0.5, "time/score": 0.1,
        "time/update": 0.25, "time/step": 0.85, "time/eval": 2.0, "skipped": 1},
                                 note="includes compilation")
    self.assertEqual(
        line, "step 3/10 | reward 0.420 | sampled success 40.0% | held-out greedy success 50.0%"
        " | kl 1.00e-03 | ent 1.234 | clip 0.050 | cut 25% | rollout 0.50s (12,346 tok/s) + "
        "score 0.10s + update 0.25s (800 tok/s) = step 0.85s | eval 2.00s"
        " | SKIPPED (non-finite loss) (includes compilation)")

  def test_heartbeat_prints_while_a_phase_runs(self):
    out = io.StringIO()
    with metrics.Heartbeat(0.2, stream=out) as beat:
      beat.phase("step 1: rollout")
      time.sleep(0.75)
      beat.phase(None)
      time.sleep(0.4)  # idle: nothing more is printed
    lines = out.getvalue().splitlines()
    self.assertGreaterEqual(len(lines), 2)
    self.assertTrue(all(l.startswith("  step 1: rollout: ") for l in lines), lines)

  def test_tables(self):
    table = metrics.format_table(["name", "value"], [["a", 1.23456], ["bb", 2]])
    self.assertEqual(table.splitlines(), ["name  value", "----  -----", "a     1.235",
                                          "bb    2"])
    records = [{"step": 1, "r": 0.0}, {"step": 2, "r": 1.0, "s": None}, {"step": 3, "r": 0.5}]
    summary = metrics.summary_table(records).splitlines()
    self.assertEqual(summary[0].split(), ["metric", "first", "last", "min", "max", "mean"])
    self.assertEqual(summary[2].split(), ["r", "0", "0.5", "0", "1", "0.5"])
    self.assertLen(summary, 3)  # "s" has no numeric value and is left out

  def test_timed_accumulates(self):
    times = {}
    with metrics.timed(times, "update"):
      pass
    with metrics.timed(times, "update"):
      pass
    self.assertEqual(list(times), ["time/update"])
    self.assertGreaterEqual(times["time/update"], 0.0)


class JsonTest(absltest.TestCase):

  def test_records_are_valid_json(self):
    self.assertEqual(json.loads(json.dumps({"x": metrics.to_python(np.int64(3))})), {"x": 3})


if __name__ == "__main__":
  absltest.main()
