"""Side-by-side comparison of finished or running RL runs (scripts/compare_runs.py).

`compare(run_dirs, out_png)` overlays the runs' curves in one PNG and returns a table with each
run's method, steps, held-out greedy success (before RL, final, peak and the step of the peak)
and where its time went, followed by the config keys whose values differ between the runs. It
reads only the files every run writes (metrics.jsonl, config.json, summary.json when the run
has finished), so it works on a run in progress too.
"""
from collections.abc import Sequence
import json
import os
from typing import Any

from agentrl import metrics
from agentrl import plots


class RunDirError(ValueError):
  """A directory that is not a run (names it and what is missing)."""


def _load_json(path: str) -> dict | None:
  if not os.path.exists(path):
    return None
  try:
    with open(path) as f:
      return json.load(f)
  except ValueError as e:
    raise RunDirError(f"{path}: not valid JSON ({e})") from None


def _flat(tree: Any, prefix: str = "") -> dict[str, Any]:
  if isinstance(tree, dict):
    out = {}
    for key, value in tree.items():
      out.update(_flat(value, f"{prefix}{key}."))
    return out
  return {prefix[:-1]: tree}


def load_run(run_dir: str) -> dict[str, Any]:
  """records, config, summary (or None) and the figures of one run directory."""
  path = os.path.join(run_dir, metrics.JSONL)
  if not os.path.exists(path):
    raise RunDirError(f"{run_dir}: no {metrics.JSONL}; pass the --workdir of an RL run")
  records = metrics.read_jsonl(path)
  if not records:
    raise RunDirError(f"{path} holds no records yet")
  summary = _load_json(os.path.join(run_dir, "summary.json"))
  evals = [(r["step"], r["eval/success"]) for r in records
           if isinstance(r.get("eval/success"), (int, float))]
  seconds = (summary or {}).get("seconds") or {}
  train = seconds.get("train", sum(r.get("time/step") or 0.0 for r in records))
  return {
      "name": os.path.basename(os.path.normpath(run_dir)),
      "records": records,
      "config": _flat(_load_json(os.path.join(run_dir, "config.json")) or {}),
      "method": (summary or {}).get("method", "?"),
      "steps": max(r["step"] for r in records),
      "finished": summary is not None,
      "before": evals[0][1] if evals and evals[0][0] == 0 else None,
      "final": evals[-1][1] if evals else None,
      "peak": max(evals, key=lambda e: e[1]) if evals else None,
      "seconds": {"sft": seconds.get("sft", 0.0), "train": train,
                  "eval": seconds.get("eval", sum(r.get("time/eval") or 0.0 for r in records))},
  }


def _pct(x: float | None) -> str:
  return "-" if x is None else f"{x:.1%}"


def table(runs: Sequence[dict[str, Any]]) -> str:
  """The comparison table, then the config keys that differ between the runs."""
  rows = []
  for run in runs:
    peak = "-" if run["peak"] is None else f"{run['peak'][1]:.1%} @{run['peak'][0]}"
    sec = run["seconds"]
    rows.append([run["name"], run["method"], f"{run['steps']}{'' if run['finished'] else '*'}",
                 _pct(run["before"]), _pct(run["final"]), peak, f"{sec['sft']:.0f}s",
                 f"{sec['train']:.0f}s", f"{sec['eval']:.0f}s"])
  text = metrics.format_table(
      ["run", "method", "steps", "greedy before", "final", "peak @step", "SFT", "RL train",
       "eval"], rows)
  if any(not r["finished"] for r in runs):
    text += "\n* still running or stopped before its summary was written"
  keys = sorted({k for r in runs for k in r["config"]})
  diff = [k for k in keys if len({json.dumps(r["config"].get(k)) for r in runs}) > 1]
  if diff:
    text += "\n\nconfig differences:\n" + metrics.format_table(
        ["key", *(r["name"] for r in runs)],
        [[k, *(json.dumps(r["config"].get(k)) for r in runs)] for k in diff])
  else:
    text += "\n\nconfig: identical"
  return text


def compare(run_dirs: Sequence[str], out_png: str,
            keys: Sequence[str] | None = None) -> tuple[str, list[str]]:
  """(table, metric keys drawn); writes the overlaid curves to `out_png`."""
  runs = [load_run(d) for d in run_dirs]
  names = [r["name"] for r in runs]
  labels = names if len(set(names)) == len(names) else [os.path.normpath(d) for d in run_dirs]
  drawn = plots.plot_runs({f"{label} ({r['method']})": r["records"]
                           for label, r in zip(labels, runs)}, out_png, keys)
  for label, run in zip(labels, runs):
    run["name"] = label
  return table(runs), drawn
