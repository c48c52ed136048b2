"""scripts/plot_metrics.py: the run's own panels, never over the run's curves.png."""
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

from absl.testing import absltest

from agentrl.records import plots

ROOT = pathlib.Path(__file__).resolve().parents[1]
RECORDS = [{"step": 0, "eval/success": 0.25}] + [
    {"step": s, "reward": s / 4, "success": s / 4, "holder_p": 2.0 - s, "time/step": 1.0}
    for s in (1, 2)]


def _script(*args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, "scripts/plot_metrics.py", *args], cwd=ROOT,
                        capture_output=True, text=True, timeout=300)


class PlotMetricsTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    self.run_dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, self.run_dir, ignore_errors=True)
    with open(os.path.join(self.run_dir, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in RECORDS)
    self.curves = os.path.join(self.run_dir, "curves.png")
    with open(self.curves, "wb") as f:
      f.write(b"the run's own figure")

  def test_default_output_has_the_curves_panels_and_leaves_curves_png(self):
    proc = _script(f"--workdir={self.run_dir}")
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    titles = [" = ".join(p) for p in plots.choose_panels(RECORDS)]
    self.assertEqual(titles, ["eval/success", "success = reward", "holder_p"])
    self.assertIn(f"plot.png (3 records: {', '.join(titles)})", proc.stdout)
    with open(os.path.join(self.run_dir, "plot.png"), "rb") as f:
      self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
    with open(self.curves, "rb") as f:
      self.assertEqual(f.read(), b"the run's own figure")

  def test_refuses_curves_png_and_unknown_keys(self):
    proc = _script(f"--workdir={self.run_dir}", f"--out={self.curves}")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("is the run's own figure; pass another --out", proc.stderr)
    proc = _script(f"--workdir={self.run_dir}", "--keys=holder_p,rewrd")
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("no numeric values for rewrd", proc.stderr)
    with open(self.curves, "rb") as f:
      self.assertEqual(f.read(), b"the run's own figure")


if __name__ == "__main__":
  absltest.main()
