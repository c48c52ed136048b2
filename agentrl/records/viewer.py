"""The trajectory viewer: one self-contained HTML page of a run's trajectory records.

  path = viewer.write(run_dir)              # <run_dir>/trajectories/viewer.html
  html = viewer.render(run_dir, steps=[1, 26])

The page (scripts/view_trajectories.py writes it) needs no server and no network: its CSS and
JavaScript are inline (agentrl/records/viewer_page.py) and the records are embedded as JSON in
a `<script type="application/json">` block, every "<" written as \\u003c so no text of a
trajectory can close the block. The script builds the page with DOM calls and `textContent`
only, so model text never becomes markup.

What it shows, per recorded step (section `step-<N>`; `viewer.html#step-<N>` opens step N):
the step's key metrics and the alarms (`alarm/*` = 1) that fired at it, from metrics.jsonl;
the recorded groups side by side, each row's outcome and turns (prompt / model / env) with
the tokens coloured by advantage, sampler or trainer log-prob, trainer/sampler ratio or
entropy; filters by reward, success, group, step and text; and a token-level diff of two rows
of a group. docs/usage.md describes the controls and the colour scales.
"""
from collections.abc import Mapping, Sequence
import html
import json
import os
import pathlib
import shutil
from typing import Any

from agentrl.records import metrics as metrics_lib
from agentrl.records import trajectories
from agentrl.records import viewer_page

FILENAME = "viewer.html"
# Row fields the page reads; the per-token role and turn lists are left out (each row's
# `turns` runs hold the same information).
_ROW_FIELDS = ("row", "group", "sample", "parent", "fork_at", "version", "reward", "success",
               "done", "truncated", "turn_rewards", "infos", "tokens", "pieces", "loss_mask")
_TURN_FIELDS = ("index", "role", "start", "end")
# Headless Chromium for the screenshot and the browser test: no GPU, no sandbox (CI runs as
# root), and none of the background traffic a fresh profile starts.
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run")
_CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome")


def default_path(run_dir: str) -> str:
  return os.path.join(trajectories.directory(run_dir), FILENAME)


def _compact_row(row: Mapping[str, Any]) -> dict[str, Any]:
  out = {k: row.get(k) for k in _ROW_FIELDS}
  out["turns"] = [{k: t.get(k) for k in _TURN_FIELDS} for t in row.get("turns") or []]
  for name in trajectories.TOKEN_FIELDS.values():
    if row.get(name) is not None:
      out[name] = row[name]
  return out


def _metrics_by_step(run_dir: str) -> dict[int, dict[str, Any]]:
  """metrics.jsonl's records merged per step (an evaluation may be its own record)."""
  path = os.path.join(run_dir, metrics_lib.JSONL)
  by_step: dict[int, dict[str, Any]] = {}
  if os.path.exists(path):
    for record in metrics_lib.read_jsonl(path):
      if isinstance(record.get("step"), int):
        by_step.setdefault(record["step"], {}).update(record)
  return by_step


def fired_alarms(record: Mapping[str, Any]) -> list[str]:
  """The alarms (`alarm/<name>` > 0) of one metrics record, by name."""
  return sorted(k.split("/", 1)[1] for k, v in record.items()
                if k.startswith("alarm/") and isinstance(v, (int, float)) and v > 0)


def page_data(run_dir: str, steps: Sequence[int] | None = None) -> dict[str, Any]:
  """What the page embeds: the chosen recorded steps (default all) with their rows and
  metrics, and the steps at which each alarm fired over the whole run."""
  recorded = trajectories.steps(run_dir)
  if not recorded:
    raise trajectories.RecordsError(
        f"no trajectory records in {trajectories.directory(run_dir)}: train with "
        "--config.log.trajectories_every=N (N > 0) to record every N steps")
  chosen = sorted(set(steps)) if steps else recorded
  by_step = _metrics_by_step(run_dir)
  out_steps = []
  for step in chosen:
    header, rows = trajectories.read_step(run_dir, step)
    record = {**(header.get("metrics") or {}), **by_step.get(step, {})}
    record.pop("step", None)
    out_steps.append({
        "step": step, "rows_in_batch": header.get("rows_in_batch"),
        "group_size": header.get("group_size"), "metrics": trajectories.json_safe(record),
        "alarms": fired_alarms(record), "rows": [_compact_row(r) for r in rows]})
  alarm_steps: dict[str, list[int]] = {}
  for step in sorted(by_step):
    for name in fired_alarms(by_step[step]):
      alarm_steps.setdefault(name, []).append(step)
  return {"run": os.path.abspath(run_dir), "recorded": recorded, "steps": out_steps,
          "alarm_steps": alarm_steps}


def embed_json(data: Any) -> str:
  """`data` as JSON that is safe inside a <script> element: no "<" at all, so neither
  "</script>" nor "<!--" can appear in it; JSON.parse reads the \\u003c escapes back."""
  text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
  return text.replace("<", "\\u003c")


def render(run_dir: str, steps: Sequence[int] | None = None) -> str:
  """The viewer page of `run_dir`'s trajectory records (the recorded `steps`, default all)."""
  data = page_data(run_dir, steps)
  name = os.path.basename(os.path.normpath(os.path.abspath(run_dir)))
  sections = "".join(
      f'<section class="step" id="step-{s["step"]}" data-step="{s["step"]}" hidden>'
      f'<h2>Step {s["step"]}</h2><div class="step-body"></div></section>'
      for s in data["steps"])
  return viewer_page.page(title=html.escape(f"{name}: trajectories"), sections=sections,
                          data_json=embed_json(data))


def write(run_dir: str, out: str | None = None, steps: Sequence[int] | None = None) -> str:
  """Writes the viewer page (default <run_dir>/trajectories/viewer.html) atomically; returns
  its path."""
  path = out or default_path(run_dir)
  text = render(run_dir, steps)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = path + ".tmp"
  with open(tmp, "w", encoding="utf-8") as f:
    f.write(text)
  os.replace(tmp, path)
  return path


# ---- A picture of the page, in headless Chromium.


def chromium_executable() -> str | None:
  """The system Chromium (or Chrome) on PATH or at /usr/bin/chromium, or None."""
  for name in _CHROMIUM_NAMES:
    found = shutil.which(name)
    if found:
      return found
  return "/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None


class BrowserUnavailable(RuntimeError):
  """playwright or a Chromium executable is missing (the message says how to install it)."""


def launch_chromium(playwright: Any) -> Any:
  """A headless system Chromium browser through a started playwright (sync API)."""
  executable = chromium_executable()
  if executable is None:
    raise BrowserUnavailable("no Chromium executable on PATH or at /usr/bin/chromium: "
                             "apt-get install chromium")
  return playwright.chromium.launch(executable_path=executable, args=list(CHROMIUM_ARGS))


def screenshot(html_path: str, png: str, *, width: int = 1400, height: int = 900,
               mode: str = "adv", browser: Any = None) -> str:
  """Loads the page at `html_path` in headless Chromium (a new one, or `browser` from
  `launch_chromium`), colours it by `mode` and saves the viewport as a PNG; returns `png`."""
  if browser is not None:
    return _shoot(browser, html_path, png, width=width, height=height, mode=mode)
  try:
    from playwright import sync_api  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise BrowserUnavailable("the screenshot needs playwright and Chromium: pip install "
                             "playwright; apt-get install chromium") from None
  with sync_api.sync_playwright() as p:
    browser = launch_chromium(p)
    try:
      return _shoot(browser, html_path, png, width=width, height=height, mode=mode)
    finally:
      browser.close()


def _shoot(browser: Any, html_path: str, png: str, *, width: int, height: int,
           mode: str) -> str:
  page = browser.new_page(viewport={"width": width, "height": height})
  try:
    page.goto(pathlib.Path(html_path).resolve().as_uri())
    page.wait_for_selector(".row-card")
    page.select_option("#mode", mode)
    os.makedirs(os.path.dirname(os.path.abspath(png)), exist_ok=True)
    page.screenshot(path=png)
  finally:
    page.close()
  return png
