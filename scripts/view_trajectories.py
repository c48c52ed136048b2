r"""Writes the trajectory viewer of a run: one self-contained HTML page, opened in any browser.

  python scripts/view_trajectories.py runs/agent      # -> runs/agent/trajectories/viewer.html
  python scripts/view_trajectories.py runs/agent --steps=1,26 --out=/tmp/v.html
  python scripts/view_trajectories.py runs/agent --screenshot=docs/trajectory_viewer.png

The run must have trajectory records (`--config.log.trajectories_every=N` when training; by
default a run records at its evaluation steps). `--screenshot` also saves a PNG of the page
in headless Chromium (needs `pip install playwright` and the system's chromium).
"""
import pathlib

from absl import app
from absl import flags

from agentrl.records import trajectories
from agentrl.records import viewer


def _steps(text: str) -> list[int] | None:
  try:
    return [int(s) for s in text.split(",") if s.strip()] or None
  except ValueError:
    raise app.UsageError(f"--steps={text!r}: expected comma-separated step numbers, "
                         "e.g. --steps=1,26") from None


def main(argv):
  if len(argv) != 2:
    raise app.UsageError("pass one run directory (the --workdir of an RL run)")
  run_dir = argv[1]
  try:
    path = viewer.write(run_dir, _OUT.value or None, _steps(_STEPS.value))
  except trajectories.RecordsError as e:
    raise app.UsageError(str(e)) from None
  print(f"wrote {path}\n  open {pathlib.Path(path).resolve().as_uri()}")
  if _SCREENSHOT.value:
    try:
      png = viewer.screenshot(path, _SCREENSHOT.value, width=_WIDTH.value,
                              height=_HEIGHT.value, mode=_MODE.value)
    except viewer.BrowserUnavailable as e:
      raise app.UsageError(f"--screenshot: {e}") from None
    print(f"wrote {png}")


if __name__ == "__main__":
  _OUT = flags.DEFINE_string("out", "", "Output HTML (default: RUN_DIR/trajectories/"
                             "viewer.html).")
  _STEPS = flags.DEFINE_string("steps", "", "Comma-separated recorded steps to include "
                               "(default: every recorded step).")
  _SCREENSHOT = flags.DEFINE_string("screenshot", "", "Also save a PNG of the page here "
                                    "(headless Chromium through playwright).")
  _WIDTH = flags.DEFINE_integer("width", 1400, "Screenshot viewport width.")
  _HEIGHT = flags.DEFINE_integer("height", 900, "Screenshot viewport height.")
  _MODE = flags.DEFINE_enum("mode", "adv", ["adv", "sampler_logp", "logp", "ratio", "entropy"],
                            "Colour mode of the screenshot.")
  app.run(main)
