"""The viewer page's content, without a browser (tests/viewer_browser_test.py loads it in one)."""
import json
import os
import re
import shutil
import tempfile

from absl.testing import absltest

from agentrl.records import trajectories
from agentrl.records import viewer
from agentrl.records import viewer_testing

_DATA_RE = re.compile(r'<script type="application/json" id="viewer-data">(.*?)</script>', re.S)


class ViewerTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.run_dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.run_dir, ignore_errors=True)
    self.rows = viewer_testing.write_run(self.run_dir)
    self.html = viewer.render(self.run_dir)

  def test_page_holds_every_recorded_step_and_row(self):
    data = json.loads(_DATA_RE.search(self.html).group(1))
    self.assertEqual([s["step"] for s in data["steps"]], list(viewer_testing.STEPS))
    for step, rows in zip(data["steps"], self.rows.values()):
      self.assertIn(f'id="step-{step["step"]}"', self.html)
      self.assertEqual([r["row"] for r in step["rows"]], [r["row"] for r in rows])
      for got, want in zip(step["rows"], rows):
        for key in ("tokens", "pieces", "loss_mask", "adv", "logp", "sampler_logp", "entropy",
                    "reward", "success", "turn_rewards", "infos"):
          self.assertEqual(got[key], want[key], key)
        self.assertEqual(got["turns"], [{k: t[k] for k in ("index", "role", "start", "end")}
                                        for t in want["turns"]])

  def test_embedded_json_round_trips(self):
    embedded = _DATA_RE.search(self.html).group(1)
    self.assertEqual(json.loads(embedded), viewer.page_data(self.run_dir))

  def test_alarms_come_from_the_metrics(self):
    data = viewer.page_data(self.run_dir)
    self.assertEqual(data["alarm_steps"], {viewer_testing.ALARM: list(viewer_testing.ALARM_STEPS)})
    self.assertEqual([s["alarms"] for s in data["steps"]], [[], [viewer_testing.ALARM]])
    self.assertEqual(data["steps"][1]["metrics"]["loss"], 0.1)
    self.assertEqual(viewer.fired_alarms({"alarm/a": 1.0, "alarm/b": 0.0, "loss": 1.0}), ["a"])

  def test_self_contained(self):
    self.assertNotIn("<script src", self.html.lower())
    self.assertNotIn("<link", self.html.lower())
    self.assertNotIn("@import", self.html)
    self.assertNotIn("url(", self.html)
    self.assertIsNone(re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", self.html, re.I))
    self.assertNotIn("http://", self.html)
    self.assertNotIn("https://", self.html)

  def test_model_text_is_escaped(self):
    self.assertIn(viewer_testing.HOSTILE, json.dumps(self.rows[1]))  # the rows do hold it
    self.assertNotIn("<img", self.html)
    self.assertEqual(self.html.count("</script>"), 2)  # the data block's and the code's
    self.assertNotIn(".innerHTML", self.html)
    self.assertIsNone(re.search(r"\beval\(|new Function", self.html))

  def test_steps_subset_and_errors(self):
    html = viewer.render(self.run_dir, steps=[3])
    self.assertIn('id="step-3"', html)
    self.assertNotIn('id="step-1"', html)
    with self.assertRaisesRegex(trajectories.RecordsError, r"recorded steps: \[1, 3\]"):
      viewer.render(self.run_dir, steps=[2])
    with self.assertRaisesRegex(trajectories.RecordsError, "trajectories_every"):
      viewer.render(tempfile.mkdtemp(dir=self.run_dir))

  def test_write_is_atomic_at_the_default_path(self):
    path = viewer.write(self.run_dir)
    self.assertEqual(path, os.path.join(self.run_dir, "trajectories", "viewer.html"))
    with open(path, encoding="utf-8") as f:
      self.assertEqual(f.read(), self.html)
    self.assertEqual([n for n in os.listdir(os.path.dirname(path)) if n.endswith(".tmp")], [])
    out = os.path.join(self.run_dir, "elsewhere", "v.html")
    self.assertEqual(viewer.write(self.run_dir, out, steps=[1]), out)
    self.assertTrue(os.path.exists(out))


if __name__ == "__main__":
  absltest.main()
