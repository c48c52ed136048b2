import json
import os
import shutil
import tempfile

from absl.testing import absltest

from agentrl.records import compare


def _tmpdir(test) -> str:
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def _run(root: str, name: str, records, *, config=None, summary=None) -> str:
  path = os.path.join(root, name)
  os.makedirs(path)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in records)
  for filename, value in (("config.json", config), ("summary.json", summary)):
    if value is not None:
      with open(os.path.join(path, filename), "w") as f:
        json.dump(value, f)
  return path


def _records(evals: dict[int, float], steps: int) -> list[dict]:
  return [{"step": 0, "eval/success": evals[0], "time/eval": 1.0}] + [
      {"step": s, "reward": 0.1 * s, "success": 0.1 * s, "time/step": 2.0,
       **({"eval/success": evals[s], "time/eval": 1.0} if s in evals else {})}
      for s in range(1, steps + 1)]


def _row(text: str, name: str) -> list[str]:
  return next(line for line in text.splitlines() if line.startswith(name + " ")).split()


class CompareTest(absltest.TestCase):

  def test_table_figures_time_and_config_differences(self):
    root = _tmpdir(self)
    config = {"seed": 0, "optim": {"lr": 0.001}, "total_steps": 4}
    finished = _run(root, "a", _records({0: 0.25, 2: 0.75, 4: 0.5}, 4), config=config,
                    summary={"method": "GRPO", "steps": 4,
                             "seconds": {"sft": 3.0, "train": 8.0, "eval": 3.0},
                             "process_seconds": 20.4})
    running = _run(root, "b", _records({0: 0.25, 2: 0.5}, 3),
                   config={**config, "seed": 1, "optim": {"lr": 0.002}})
    out = os.path.join(root, "compare.png")
    text, drawn = compare.compare([finished, running], out)
    self.assertTrue(os.path.exists(out))
    self.assertEqual(drawn[0], "eval/success")
    self.assertEqual(_row(text, "a"), ["a", "GRPO", "4", "25.0%", "50.0%", "75.0%", "@2", "3s",
                                       "8s", "3s", "20s", "-"])
    # No summary yet: the records give steps, figures and times; SFT and wall time are unknown.
    self.assertEqual(_row(text, "b"), ["b", "?", "3*", "25.0%", "50.0%", "50.0%", "@2", "-",
                                       "6s", "2s", "-", "-"])
    self.assertIn("* still running", text)
    diff = text.split("config differences:\n", 1)[1].splitlines()
    self.assertEqual([line.split() for line in diff[2:]],
                     [["optim.lr", "0.001", "0.002"], ["seed", "0", "1"]])

  def test_other_summary_layouts(self):
    root = _tmpdir(self)
    # A run from before the step-0 record: its baseline is in summary.json. Time split under
    # `time` with `_seconds` names, wall time at the top level.
    old = _run(root, "old", _records({0: 0.1, 2: 0.3}, 2)[1:], config={"seed": 0},
               summary={"method": "CTPO", "success_before": 0.1, "success_after": 0.3,
                        "time": {"sft_seconds": 5.0, "train_seconds": 4.0, "eval_seconds": 1.0},
                        "wall_seconds": 12.0})
    same = _run(root, "same", _records({0: 0.1, 2: 0.3}, 2), config={"seed": 0},
                summary={"method": "CTPO"})
    text, _ = compare.compare([old, same], os.path.join(root, "c.png"), ["eval/success"])
    self.assertEqual(_row(text, "old"), ["old", "CTPO", "2", "10.0%", "30.0%", "30.0%", "@2",
                                         "5s", "4s", "1s", "12s", "-"])
    self.assertEqual(_row(text, "same")[-5:], ["0s", "4s", "2s", "-", "-"])
    self.assertIn("config: identical", text)

  def test_runs_with_one_name_are_labelled_by_path(self):
    root = _tmpdir(self)
    a = _run(root, "x/run", _records({0: 0.0}, 1), summary={"method": "GRPO"})
    b = _run(root, "y/run", _records({0: 0.0}, 1), summary={"method": "GRPO"})
    text, _ = compare.compare([a, b], os.path.join(root, "c.png"))
    self.assertIn("no config.json in: ", text)
    self.assertLen(_row(text, os.path.normpath(a)), 12)
    with self.assertRaisesRegex(compare.RunDirError, "given twice"):
      compare.compare([a, a + "/"], os.path.join(root, "c.png"))

  def test_alarms_column_and_links_to_the_trajectory_viewer(self):
    root = _tmpdir(self)
    records = _records({0: 0.3, 4: 0.1}, 6)
    for record in records[1:]:   # divergence from step 3, invalid actions at step 5 only
      record.update({"alarm/reward_divergence": float(record["step"] >= 3),
                     "alarm/invalid_actions": float(record["step"] == 5),
                     "alarm/repetition": 0.0})
    viewed = _run(root, "viewed", records, summary={"method": "SIOP"})
    unviewed = _run(root, "unviewed", records, summary={"method": "SIOP"})
    quiet = _run(root, "quiet", _records({0: 0.3}, 6), summary={"method": "GRPO"})
    for run, steps in ((viewed, (2, 4)), (unviewed, (6,))):
      os.makedirs(os.path.join(run, "trajectories"))
      for step in steps:
        open(os.path.join(run, "trajectories", f"step_{step:06d}.jsonl.gz"), "wb").close()
    open(os.path.join(viewed, "trajectories", "viewer.html"), "w").close()
    text, _ = compare.compare([viewed, unviewed, quiet], os.path.join(root, "c.png"))
    self.assertEqual(_row(text, "viewed")[-2:], ["divergence@3,", "invalid@5"])
    self.assertEqual(_row(text, "quiet")[-1], "-")
    links = text.split("alarms in the trajectory records:\n", 1)[1].split("\n\n")[0]
    links = links.splitlines()
    page = os.path.join(os.path.abspath(viewed), "trajectories", "viewer.html")
    # The first recorded step at or after the alarm; none after step 5: the last before it.
    self.assertEqual(links[:2], [f"viewed: divergence@3 -> file://{page}#step-4",
                                 f"viewed: invalid@5 -> file://{page}#step-4"])
    self.assertEqual(links[2], f"unviewed: divergence@3 -> step 6 (write the viewer: python "
                               f"scripts/view_trajectories.py {os.path.abspath(unviewed)})")
    self.assertLen(links, 4)   # the run without trajectory records has no line

  def test_errors_name_the_run_dir_and_what_is_missing(self):
    root = _tmpdir(self)
    out = os.path.join(root, "c.png")
    good = _run(root, "good", _records({0: 0.0}, 1))
    with self.assertRaisesRegex(compare.RunDirError, "nowhere: no such directory"):
      compare.compare([good, os.path.join(root, "nowhere")], out)
    os.makedirs(os.path.join(root, "empty"))
    with self.assertRaisesRegex(compare.RunDirError, "empty: no metrics.jsonl"):
      compare.compare([good, os.path.join(root, "empty")], out)
    with self.assertRaisesRegex(compare.RunDirError, "new/metrics.jsonl holds no records"):
      compare.compare([good, _run(root, "new", [])], out)
    bad = _run(root, "bad", _records({0: 0.0}, 1))
    with open(os.path.join(bad, "summary.json"), "w") as f:
      f.write("{")
    with self.assertRaisesRegex(compare.RunDirError, "bad/summary.json: not valid JSON"):
      compare.compare([good, bad], out)
    with self.assertRaisesRegex(ValueError, "no numeric values for kll"):
      compare.compare([good], out, ["kll"])


if __name__ == "__main__":
  absltest.main()
