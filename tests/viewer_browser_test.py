"""The trajectory viewer in a real headless browser (the system's Chromium through playwright).

The page is rendered from records the library writes (agentrl/records/viewer_testing.py: two
record steps of two groups of three rows, one alarm firing) and checked through the DOM:
groups, rows and token spans, the colours of positive and negative advantages, the colour
modes, the filters, the diff of two rows, the alarm, the step anchors; then a screenshot.
Skips only where playwright cannot be imported or no Chromium executable exists (`.ci/run`
installs Debian's chromium).
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

from absl.testing import absltest

from agentrl.records import viewer
from agentrl.records import viewer_testing

try:
  from playwright import sync_api
except ImportError:
  sync_api = None

ROOT = pathlib.Path(__file__).resolve().parents[1]
_SKIP = ("playwright is not installed (pip install playwright)" if sync_api is None else
         "no Chromium executable on PATH or at /usr/bin/chromium (apt-get install chromium)"
         if viewer.chromium_executable() is None else "")


def _rgb(css: str) -> tuple[int, ...]:
  return tuple(int(v) for v in re.findall(r"\d+", css)[:3])


@unittest.skipIf(_SKIP, _SKIP)
class ViewerBrowserTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.run_dir = tempfile.mkdtemp()
    cls.rows = viewer_testing.write_run(cls.run_dir)
    cls.url = pathlib.Path(viewer.write(cls.run_dir)).as_uri()
    cls.playwright = sync_api.sync_playwright().start()
    cls.browser = viewer.launch_chromium(cls.playwright)

  @classmethod
  def tearDownClass(cls):
    cls.browser.close()
    cls.playwright.stop()
    shutil.rmtree(cls.run_dir, ignore_errors=True)
    super().tearDownClass()

  def setUp(self):
    super().setUp()
    self.page = self.browser.new_page(viewport={"width": 1400, "height": 900})
    self.addCleanup(self.page.close)
    self.errors = []
    self.page.on("pageerror", lambda e: self.errors.append(str(e)))
    self.page.goto(self.url)
    self.addCleanup(lambda: self.assertEqual(self.errors, []))

  def _count(self, selector: str) -> int:
    return self.page.locator(selector).count()

  def _background(self, row: int, token: int) -> tuple[int, ...]:
    return _rgb(self.page.evaluate(
        "([row, token]) => getComputedStyle(document.querySelectorAll("
        "`#step-3 .row-card[data-row='${row}'] .tok`)[token]).backgroundColor", [row, token]))

  def test_newest_step_shows_its_groups_rows_and_tokens(self):
    rows = self.rows[3]
    self.assertTrue(self.page.is_visible("#step-3"))
    self.assertFalse(self.page.is_visible("#step-1"))
    self.assertEqual(self._count("#step-3 .group"), 2)
    self.assertEqual(self._count("#step-3 .row-card"), len(rows))
    self.assertEqual(self._count("#step-3 .row-card .tok"), sum(len(r["tokens"]) for r in rows))
    row0 = "#step-3 .row-card[data-row='0']"
    self.assertEqual(self._count(row0 + " .turn"), 4)
    labels = self.page.locator(row0 + " .turn-label .role").all_text_contents()
    self.assertEqual([s.lower() for s in labels], ["prompt", "model", "env", "model"])
    credits = self.page.locator(row0 + " .credit").all_text_contents()
    self.assertEqual(credits, ["reward 0 \u00b7 credit +1", "reward 1 \u00b7 credit +1"])
    self.assertEqual(self.page.text_content("#count"), "showing 6 of 6 rows")

  def test_advantage_colours_and_modes(self):
    # Token 5 is the first model token; row 0's advantage is +1, row 1's -1.5, token 0 is
    # prompt (outside the loss mask: no colour).
    pos, neg, prompt = self._background(0, 5), self._background(1, 5), self._background(0, 0)
    self.assertGreater(pos[1], pos[0] + 40, pos)  # green
    self.assertGreater(neg[0], neg[1] + 40, neg)  # red
    self.assertEqual(prompt, (0, 0, 0))  # transparent: the turn's own background shows
    title = self.page.get_attribute("#step-3 .row-card[data-row='0'] .tok >> nth=5", "title")
    self.assertIn("advantage 1", title)
    self.assertIn("id 6", title)
    self.page.select_option("#mode", "entropy")
    self.assertNotEqual(self._background(0, 5), pos)
    self.page.select_option("#mode", "ratio")  # the trainer above the sampler: ratio > 1
    ratio = self._background(0, 5)
    self.assertGreater(ratio[2], ratio[1], ratio)  # purple

  def test_filters_hide_rows_and_search_highlights(self):
    self.page.select_option("#success", "failure")
    self.assertEqual(self._count("#step-3 .row-card:visible"), 4)
    self.page.select_option("#success", "all")
    self.page.fill("#rmin", "0.9")
    self.assertEqual(self._count("#step-3 .row-card:visible"), 2)
    self.page.fill("#rmin", "")
    self.page.select_option("#group", "1")
    self.assertEqual(self._count("#step-3 .group:visible"), 1)
    self.page.select_option("#group", "all")
    self.page.fill("#search", "onerror=")
    self.assertEqual(self._count("#step-3 .row-card:visible"), 2)
    self.assertEqual(self._count("#step-3 .row-card[data-row='1'] .tok.hit"), 1)
    hit = self.page.text_content("#step-3 .row-card[data-row='1'] .tok.hit")
    self.assertEqual(hit, viewer_testing.HOSTILE)  # text, not markup
    self.assertEqual(self._count("img"), 0)

  def test_diff_of_the_best_and_worst_rows(self):
    self.page.click("#step-3 .group[data-group='0'] details.diff summary")
    out = "#step-3 .group[data-group='0'] .diff-out"
    self.assertEqual(self.page.locator(out + " .tok.del").all_text_contents(),
                     [" 75", " correct", "!"])
    self.assertEqual(self.page.locator(out + " .tok.ins").all_text_contents(),
                     [" 62", viewer_testing.HOSTILE, " wrong"])

  def test_alarm_and_step_anchor(self):
    badge = self.page.text_content("#step-3 .metrics .badge.alarm")
    self.assertIn(viewer_testing.ALARM, badge)
    links = self.page.locator("#alarm-summary a")
    self.assertEqual(links.all_text_contents(), ["2", "3"])
    self.assertEqual(links.first.get_attribute("href"), "#step-1")
    links.first.click()
    self.assertTrue(self.page.is_visible("#step-1 .row-card"))
    self.assertFalse(self.page.is_visible("#step-3"))
    self.page.goto(self.url + "#step-3")
    self.page.reload()
    self.assertTrue(self.page.is_visible("#step-3"))
    self.assertEqual(self.page.input_value("#step"), "3")
    self.assertFalse(self.page.is_visible("#note"))
    self.page.goto(self.url + "#step-2")  # not recorded: the recorded step before it
    self.assertTrue(self.page.is_visible("#step-1"))
    self.assertIn("step 2 has no trajectory records; showing step 1",
                  self.page.text_content("#note"))

  def test_screenshot(self):
    png = viewer.screenshot(viewer.default_path(self.run_dir),
                            os.path.join(self.run_dir, "shot", "viewer.png"), width=1000,
                            height=700, mode="entropy", browser=self.browser)
    with open(png, "rb") as f:
      self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
    self.assertGreater(os.path.getsize(png), 10_000)


class ScriptTest(absltest.TestCase):

  def test_no_records_is_one_clear_error(self):
    empty = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, empty, ignore_errors=True)
    proc = subprocess.run([sys.executable, "scripts/view_trajectories.py", empty], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    self.assertNotEqual(proc.returncode, 0)
    self.assertIn("config.log.trajectories_every", proc.stderr)

  def test_writes_the_page(self):
    run_dir = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, run_dir, ignore_errors=True)
    viewer_testing.write_run(run_dir)
    out = os.path.join(run_dir, "v.html")
    proc = subprocess.run([sys.executable, "scripts/view_trajectories.py", run_dir, "--steps=1",
                           f"--out={out}"], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
    self.assertIn(f"wrote {out}\n  open {pathlib.Path(out).as_uri()}", proc.stdout)
    with open(out, encoding="utf-8") as f:
      self.assertIn('id="step-1"', f.read())

if __name__ == "__main__":
  absltest.main()
