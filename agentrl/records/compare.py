"""Side-by-side comparison of finished or running RL runs (scripts/compare_runs.py).

`compare(run_dirs, out_png)` overlays the runs' curves in one PNG and returns a table with each
run's method, steps, held-out greedy success (before RL, final, peak and the step of the peak),
where its time went and the alarms that fired (`agentrl.records.alarms`: each with the first
step it fired, `divergence@26`), followed by the config keys whose values differ between the
runs. It reads only the files every run writes (metrics.jsonl, config.json, summary.json when
the run has finished), so it works on a run in progress too. A run with trajectory records
(`agentrl.records.trajectories`) gets a line per fired alarm below the table: the link to
its viewer page (`trajectories/viewer.html`) at the first recorded step at or after the alarm
(the last recorded one before it when none is), or the command that writes the page.
"""
from collections.abc import Mapping, Sequence
import json
import os
from typing import Any

from agentrl import configs
from agentrl.records import alarms
from agentrl.records import metrics
from agentrl.records import plots
from agentrl.records import trajectories
from agentrl.records import viewer

# summary.json's time split has been `seconds` and may be `time` or `times`; each phase under
# any of these names (plain or with a `_seconds` suffix) is read, so older and newer runs
# compare side by side.
_TIME_DICTS = ("seconds", "time", "times")
_PHASE_NAMES = {"sft": ("sft",), "train": ("train", "training", "rl"),
                "eval": ("eval", "evaluation", "evals"),
                "wall": ("wall", "total", "process")}


ALARM = "alarm/"


class RunDirError(ValueError):
  """A directory that is not a run (names it and what is missing)."""


def _load_json(path: str) -> dict | None:
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      value = json.load(f)
  except ValueError as e:
    raise RunDirError(f"{path}: not valid JSON ({e})") from None
  if not isinstance(value, dict):
    raise RunDirError(f"{path}: expected a JSON object, found {type(value).__name__}")
  return value


def _number(value: Any) -> float | None:
  ok = isinstance(value, (int, float)) and not isinstance(value, bool)
  return float(value) if ok else None


def _summary_seconds(summary: Mapping[str, Any], phase: str) -> float | None:
  """A phase's seconds from summary.json, wherever the current layout keeps them."""
  split = next((summary[k] for k in _TIME_DICTS if isinstance(summary.get(k), dict)), {})
  for name in _PHASE_NAMES[phase]:
    for value in (split.get(name), split.get(f"{name}_seconds"), summary.get(f"{name}_seconds")):
      if _number(value) is not None:
        return _number(value)
  return None


def _seconds(summary: Mapping[str, Any], records) -> dict[str, float | None]:
  """SFT / RL training / evaluation / wall seconds; the records fill in an unfinished run."""
  total = lambda key: float(sum(_number(r.get(key)) or 0.0 for r in records))
  sec = {phase: _summary_seconds(summary, phase) for phase in _PHASE_NAMES}
  if sec["train"] is None:
    sec["train"] = total("time/step")
  if sec["eval"] is None:
    sec["eval"] = total("time/eval")
  if sec["sft"] is None:
    sec["sft"] = 0.0 if summary else None  # a running run's SFT time is in no file yet
  return sec


def load_run(run_dir: str) -> dict[str, Any]:
  """records, config, summary (or None) and the figures of one run directory."""
  if not os.path.isdir(run_dir):
    raise RunDirError(f"{run_dir}: no such directory")
  path = os.path.join(run_dir, metrics.JSONL)
  if not os.path.exists(path):
    raise RunDirError(f"{run_dir}: no {metrics.JSONL}; pass the --workdir of an RL run")
  records = [r for r in metrics.read_jsonl(path) if isinstance(r.get("step"), int)]
  if not records:
    raise RunDirError(f"{path} holds no records yet")
  summary = _load_json(os.path.join(run_dir, "summary.json"))
  config = _load_json(os.path.join(run_dir, "config.json"))
  evals = [(r["step"], _number(r.get("eval/success"))) for r in records]
  evals = [(step, value) for step, value in evals if value is not None]
  # The step-0 record is the baseline; a run written before it existed has it in summary.json.
  before = evals[0][1] if evals and evals[0][0] == 0 else (summary or {}).get("success_before")
  final = evals[-1][1] if evals else (summary or {}).get("success_after")
  return {
      "name": os.path.basename(os.path.normpath(run_dir)),
      "records": records,
      "config": None if config is None else configs.flatten(config),
      "method": (summary or {}).get("method", "?"),
      "steps": max(r["step"] for r in records),
      "finished": summary is not None,
      "before": before,
      "final": final,
      "peak": max(evals, key=lambda e: e[1]) if evals else None,
      "seconds": _seconds(summary or {}, records),
      "alarms": fired_alarms(records),
      "trajectory_steps": trajectories.steps(run_dir),
      "run_dir": os.path.abspath(run_dir),
  }


def fired_alarms(records) -> list[tuple[str, int]]:
  """(label, first step) of each `alarm/*` metric that was 1 on some step, by first step."""
  first = {}
  for record in records:
    for key, value in record.items():
      if key.startswith(ALARM) and _number(value) and value > 0 and key not in first:
        first[key] = record["step"]
  name = lambda key: alarms.LABELS.get(key[len(ALARM):], key[len(ALARM):])
  return sorted(((name(k), step) for k, step in first.items()), key=lambda a: (a[1], a[0]))


def _alarm_links(run: Mapping[str, Any]) -> list[str]:
  """A line per fired alarm of a run with trajectory records: where to read that step."""
  steps = run["trajectory_steps"]
  if not steps:
    return []
  page = viewer.default_path(run["run_dir"])
  lines = []
  for label, step in run["alarms"]:
    later = [s for s in steps if s >= step]
    near = later[0] if later else steps[-1]
    where = (f"file://{page}#step-{near}" if os.path.exists(page) else
             f"step {near} (write the viewer: python scripts/view_trajectories.py "
             f"{run['run_dir']})")
    lines.append(f"{run['name']}: {label}@{step} -> {where}")
  return lines


def _pct(x: float | None) -> str:
  return "-" if x is None else f"{x:.1%}"


def _sec(x: float | None) -> str:
  return "-" if x is None else f"{x:.0f}s"


def _config_diff(runs: Sequence[dict[str, Any]]) -> str:
  missing = [r["name"] for r in runs if r["config"] is None]
  runs = [r for r in runs if r["config"] is not None]
  text = f"\n\nno config.json in: {', '.join(missing)}" if missing else ""
  if len(runs) < 2:
    return text
  # JSON for a value, "-" for a key the run's config lacks (another method's loss keys).
  value = lambda run, key: json.dumps(run["config"][key]) if key in run["config"] else "-"
  keys = sorted({k for r in runs for k in r["config"]})
  diff = [k for k in keys if len({value(r, k) for r in runs}) > 1]
  if not diff:
    return text + "\n\nconfig: identical"
  return text + "\n\nconfig differences:\n" + metrics.format_table(
      ["key", *(r["name"] for r in runs)], [[k, *(value(r, k) for r in runs)] for k in diff])


def table(runs: Sequence[dict[str, Any]]) -> str:
  """The comparison table, then the config keys that differ between the runs."""
  rows = []
  for run in runs:
    peak = "-" if run["peak"] is None else f"{run['peak'][1]:.1%} @{run['peak'][0]}"
    sec = run["seconds"]
    rows.append([run["name"], run["method"], f"{run['steps']}{'' if run['finished'] else '*'}",
                 _pct(run["before"]), _pct(run["final"]), peak, _sec(sec["sft"]),
                 _sec(sec["train"]), _sec(sec["eval"]), _sec(sec["wall"]),
                 ", ".join(f"{label}@{step}" for label, step in run["alarms"]) or "-"])
  text = metrics.format_table(
      ["run", "method", "steps", "greedy before", "final", "peak @step", "SFT", "RL train",
       "eval", "wall", "alarms"], rows)
  if any(not r["finished"] for r in runs):
    text += "\n* still running or stopped before its summary.json was written"
  links = [line for run in runs for line in _alarm_links(run)]
  if links:
    text += "\n\nalarms in the trajectory records:\n" + "\n".join(links)
  return text + _config_diff(runs)


def compare(run_dirs: Sequence[str], out_png: str,
            keys: Sequence[str] | None = None) -> tuple[str, list[str]]:
  """(table, metric keys drawn); writes the overlaid curves to `out_png`."""
  runs = [load_run(d) for d in run_dirs]
  names = [r["name"] for r in runs]
  labels = names if len(set(names)) == len(names) else [os.path.normpath(d) for d in run_dirs]
  if len(set(labels)) < len(labels):
    raise RunDirError(f"a run directory is given twice: {', '.join(run_dirs)}")
  for label, run in zip(labels, runs):
    run["name"] = label
  drawn = plots.plot_runs({f"{r['name']} ({r['method']})": r["records"] for r in runs},
                          out_png, keys)
  return table(runs), drawn
