import os
import shutil
import tempfile

from absl.testing import absltest

from agentrl.records import plots


def _tmpdir(test) -> str:
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def _is_png(path: str) -> bool:
  with open(path, "rb") as f:
    return f.read(8) == b"\x89PNG\r\n\x1a\n"


# A HolderPO-like run: a binary reward (reward == success), a step-0 baseline evaluation,
# a method-specific scalar, timing and counters.
RECORDS = [{"step": 0, "eval/success": 0.2, "time/eval": 1.0}] + [
    {"step": s, "reward": s / 8, "success": s / 8, "kl": 0.01 * s, "holder_p": 1.0 + s,
     "ratio_mean": 1.0, "time/step": 0.5, "env/steps": 8.0, "rollout/pad_frac": 0.3,
     **({"eval/success": 0.5} if s == 4 else {})} for s in range(1, 5)]


class PanelTest(absltest.TestCase):

  def test_standard_then_method_specific_and_equal_series_share_a_panel(self):
    self.assertEqual(plots.choose_panels(RECORDS),
                     [["eval/success"], ["success", "reward"], ["kl"], ["holder_p"]])

  def test_reward_gets_its_own_panel_when_it_differs(self):
    records = [dict(r, reward=r["reward"] * 2) if "reward" in r else r for r in RECORDS]
    self.assertEqual(plots.choose_panels(records)[1:3], [["success"], ["reward"]])

  def test_constant_series_keep_their_own_panels(self):
    # An idle smoke run: success, reward and kl all 0 at every step are three quantities.
    records = [{"step": s, "success": 0.0, "reward": 0.0, "kl": 0.0} for s in (1, 2)]
    self.assertEqual(plots.choose_panels(records), [["success"], ["reward"], ["kl"]])

  def test_method_specific_keys_follow_the_standard_ones_up_to_the_cap(self):
    records = [{"step": s, "zeta": s, "alpha": -s, "loss": 2.0 * s, "ratio_max": 3.0 * s,
                "time/step": 1.0 * s, "env/steps": 4.0 * s} for s in (1, 2)]
    self.assertEqual(plots.choose_panels(records), [["loss"], ["alpha"], ["zeta"]])
    self.assertEqual(plots.choose_panels(records, max_panels=2), [["loss"], ["alpha"]])

  def test_requested_keys(self):
    self.assertEqual(plots.choose_panels(RECORDS, ["kl", "nope", "ratio_mean"]),
                     [["kl"], ["ratio_mean"]])


class PlotTest(absltest.TestCase):

  def test_curves_png(self):
    path = os.path.join(_tmpdir(self), "sub", "curves.png")
    drawn = plots.plot_curves(RECORDS, path, title="t")
    self.assertEqual(drawn, ["eval/success", "success = reward", "kl", "holder_p"])
    self.assertTrue(_is_png(path))
    with self.assertRaisesRegex(ValueError, r"nope in the records; available: \['env/steps', "):
      plots.plot_curves(RECORDS, path, keys=["kl", "nope"])  # a typo is reported, not skipped

  def test_runs_overlaid(self):
    other = [dict(r, kl=0.5 * r["step"]) if "kl" in r else r for r in RECORDS]
    path = os.path.join(_tmpdir(self), "compare.png")
    drawn = plots.plot_runs({"a": RECORDS, "b": other}, path)
    self.assertEqual(drawn, ["eval/success", "success = reward", "kl", "holder_p"])
    self.assertTrue(_is_png(path))
    # reward differs from success in one run: each gets its own panel.
    doubled = [dict(r, reward=r["reward"] * 2) if "reward" in r else r for r in RECORDS]
    drawn = plots.plot_runs({"a": RECORDS, "b": doubled}, path)
    self.assertEqual(drawn, ["eval/success", "success", "reward", "kl", "holder_p"])
    self.assertEqual(plots.plot_runs({"a": RECORDS, "b": other}, path, ["kl"]), ["kl"])
    with self.assertRaisesRegex(ValueError, "no numeric values for klx"):
      plots.plot_runs({"a": RECORDS, "b": other}, path, ["kl", "klx"])


if __name__ == "__main__":
  absltest.main()
