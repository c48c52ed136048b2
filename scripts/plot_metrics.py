r"""Writes PNG learning curves from a run's metrics JSONL (a run in progress or killed, too).

  python scripts/plot_metrics.py --workdir=runs/grpo                 # -> runs/grpo/plot.png
  python scripts/plot_metrics.py --workdir=runs/grpo --keys=kl,entropy,ratio_max
  python scripts/plot_metrics.py --jsonl=a/metrics.jsonl --out=a.png

The panels are the ones the run's own curves.png has (agentrl.records.plots.choose_panels) unless
--keys picks others. It never overwrites the run's curves.png (the default output is plot.png
next to the JSONL); compare several runs with scripts/compare_runs.py.
"""
import json
import os

from absl import app
from absl import flags

from agentrl.records import metrics
from agentrl.records import plots


def _title(jsonl: str) -> str:
  """'<method>: <run dir>' as on the run's curves.png (the method once summary.json exists)."""
  run_dir = os.path.dirname(jsonl) or "."
  try:
    with open(os.path.join(run_dir, "summary.json")) as f:
      return f"{json.load(f)['method']}: {run_dir}"
  except (OSError, ValueError, KeyError, TypeError):
    return run_dir  # a run in progress has no summary yet


def main(argv):
  del argv
  jsonl = _JSONL.value or (os.path.join(_WORKDIR.value, metrics.JSONL) if _WORKDIR.value else "")
  if not jsonl:
    raise app.UsageError("pass --workdir=<run dir> or --jsonl=<metrics.jsonl>")
  if not os.path.exists(jsonl):
    raise app.UsageError(f"metrics file {jsonl} does not exist")
  out = _OUT.value or os.path.join(os.path.dirname(jsonl), "plot.png")
  if os.path.basename(out) == "curves.png" and os.path.exists(out):
    raise app.UsageError(f"{out} is the run's own figure; pass another --out")
  records = metrics.read_jsonl(jsonl)
  if not records:
    raise app.UsageError(f"{jsonl} holds no records yet")
  keys = [k.strip() for k in _KEYS.value.split(",") if k.strip()] or None
  try:
    drawn = plots.plot_curves(records, out, keys, title=_TITLE.value or _title(jsonl))
  except ValueError as e:
    raise app.UsageError(str(e)) from None
  print(f"wrote {out} ({len(records)} records: {', '.join(drawn)})")


if __name__ == "__main__":
  _WORKDIR = flags.DEFINE_string("workdir", "", "Run directory holding metrics.jsonl.")
  _JSONL = flags.DEFINE_string("jsonl", "", "Path of a metrics JSONL (overrides --workdir).")
  _OUT = flags.DEFINE_string("out", "", "Output PNG (default: plot.png next to the JSONL).")
  _KEYS = flags.DEFINE_string("keys", "", "Comma-separated metric keys (default: the run's "
                              "curves.png panels).")
  _TITLE = flags.DEFINE_string("title", "", "Figure title (default: method and run dir).")
  app.run(main)
