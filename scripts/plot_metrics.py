r"""Writes PNG learning curves from a run's metrics JSONL.

  python scripts/plot_metrics.py --workdir=runs/grpo                  # -> runs/grpo/curves.png
  python scripts/plot_metrics.py --jsonl=a/metrics.jsonl --out=a.png --keys=reward,kl

Experiments already write `<workdir>/curves.png` at the end of a run; this re-plots a run
(including one still in progress or killed) with other keys.
"""
import os

from absl import app
from absl import flags

from agentrl import metrics


def main(argv):
  del argv
  jsonl = _JSONL.value or (os.path.join(_WORKDIR.value, metrics.JSONL) if _WORKDIR.value else "")
  if not jsonl:
    raise app.UsageError("pass --workdir=<run dir> or --jsonl=<metrics.jsonl>")
  if not os.path.exists(jsonl):
    raise app.UsageError(f"metrics file {jsonl} does not exist")
  out = _OUT.value or os.path.join(os.path.dirname(jsonl), "curves.png")
  records = metrics.read_jsonl(jsonl)
  if not records:
    raise app.UsageError(f"{jsonl} holds no records yet")
  keys = [k.strip() for k in _KEYS.value.split(",") if k.strip()] or None
  drawn = metrics.plot_curves(records, out, keys, title=_TITLE.value)
  print(f"wrote {out} ({len(records)} steps: {', '.join(drawn)})")


if __name__ == "__main__":
  _WORKDIR = flags.DEFINE_string("workdir", "", "Run directory holding metrics.jsonl.")
  _JSONL = flags.DEFINE_string("jsonl", "", "Path of a metrics JSONL (overrides --workdir).")
  _OUT = flags.DEFINE_string("out", "", "Output PNG (default: curves.png next to the JSONL).")
  _KEYS = flags.DEFINE_string("keys", "", "Comma-separated metric keys (default: the usual).")
  _TITLE = flags.DEFINE_string("title", "", "Figure title.")
  app.run(main)
