r"""Compares RL runs: overlaid learning curves (PNG) and a table of their figures.

  python scripts/compare_runs.py runs/grpo runs/ctpo                 # -> compare.png
  python scripts/compare_runs.py runs/grpo* --out=/tmp/grpo_lrs.png --keys=eval/success,kl

The table gives each run's method, steps, held-out greedy success before RL, at the end and at
its peak (with the step), the SFT / RL training / evaluation time and the alarms that fired
(`divergence@26, repetition@40`: each alarm's first step; agentrl/records/alarms.py), then the
config keys whose values differ. For a run with trajectory records, each fired alarm gets a
line with the link to the run's viewer page at the first recorded step at or after it
(`file://<run>/trajectories/viewer.html#step-26`). Runs still in progress are read as far as
they got.
"""
from absl import app
from absl import flags

from agentrl.records import compare


def main(argv):
  run_dirs = argv[1:]
  if not run_dirs:
    raise app.UsageError("pass one or more run directories (the --workdir of RL runs)")
  keys = [k.strip() for k in _KEYS.value.split(",") if k.strip()] or None
  try:
    text, drawn = compare.compare(run_dirs, _OUT.value, keys)
  except (compare.RunDirError, ValueError) as e:
    raise app.UsageError(str(e)) from None
  print(text)
  print(f"\nwrote {_OUT.value} ({', '.join(drawn)})")


if __name__ == "__main__":
  _OUT = flags.DEFINE_string("out", "compare.png", "Output PNG.")
  _KEYS = flags.DEFINE_string("keys", "", "Comma-separated metric keys (default: the "
                              "panels of the runs' curves.png).")
  app.run(main)
