# pylint: disable=invalid-name
r"""Overlapped training on the main job: steps per minute and held-out success at equal wall
time for max_staleness k = 0 (synchronous), 1, 2.

  python scripts/overlap_study.py --out=runs/overlap_study
  python scripts/overlap_study.py --out=/tmp/os --ks=0,1 --steps=4

Every run is `python -m experiments.policy.grpo` (the `cpu` preset) with `updates.max_staleness=k`
and the default off-policy correction (token-level truncated importance sampling), one shared
SFT warm start (the first run trains it, the others get a copy) and the same steps. The wall
time compared is the RL training time (the sum of the steps' `time/step`; SFT and evaluations
excluded): "at equal wall time" reads each run's held-out success at its last evaluation
within the shortest run's RL time. Resumable like the other studies. Writes <out>/k<k>/,
<out>/results.txt (the table and the command) and <out>/overlap_study.png (held-out success
against RL wall time).
"""
import os
import time

from absl import app, flags
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from agentrl.records import study

_OUT = flags.DEFINE_string("out", "runs/overlap_study", "Directory of the runs and results.")
_KS = flags.DEFINE_list("ks", ["0", "1", "2"], "max_staleness values to run.")
_STEPS = flags.DEFINE_integer("steps", 150, "RL steps per run.")
_SEED = flags.DEFINE_integer("seed", 0, "config.seed of every run.")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 25, "Held-out evaluation every N steps.")


def run_dir(k: int) -> str:
  return os.path.join(_OUT.value, f"k{k}")


def train(k: int, ks) -> None:
  workdir = run_dir(k)
  study.share_warm_start(workdir, [run_dir(other) for other in ks])
  timing = study.run_experiment("grpo", workdir, [
      f"--config.seed={_SEED.value}", f"--config.total_steps={_STEPS.value}",
      f"--config.eval.every={_EVAL_EVERY.value}", f"--config.updates.max_staleness={k}",
      f"--config.log.save_every={_EVAL_EVERY.value}", "--config.log.tensorboard=False"])
  print(f"k={k}: {timing['wall_s']:.0f}s wall, {timing['cpu_s']:.0f}s CPU", flush=True)


def load(k: int) -> dict:
  """Per-step timings and the evaluations placed on the run's cumulative RL time."""
  curves = study.read_curves(run_dir(k))
  train_records = curves["train"]
  elapsed = dict(zip([r["step"] for r in train_records],
                     np.cumsum([r["time/step"] for r in train_records])))
  elapsed[0] = 0.0
  mean = lambda key: float(np.mean([r.get(key, np.nan) for r in train_records[1:]]))
  return {"evals": [(r["step"], elapsed[r["step"]], r["eval/success"]) for r in curves["evals"]],
          "seconds": elapsed[train_records[-1]["step"]], "steps": train_records[-1]["step"],
          # Per step, step 1 (compilation) left out.
          "step_s": mean("time/step"), "wait_s": mean("time/rollout"),
          "busy_s": mean("time/rollout_busy") if k else mean("time/rollout"),
          "update_s": mean("time/update"), "score_s": mean("time/score")}


def at_time(evals, seconds: float) -> tuple[int, float]:
  """(step, success) of the last evaluation within `seconds` of RL time."""
  return max(((s, v) for s, t, v in evals if t <= seconds + 1e-9), key=lambda e: e[0])


def table(runs: dict) -> str:
  budget = min(r["seconds"] for r in runs.values())
  lines = ["| max_staleness k | RL time (s) | steps / min | per step: rollout made / waited "
           "/ score / update (s) | held-out success at the end | at equal wall time "
           f"({budget:.0f} s) |", "|---|---:|---:|---|---:|---:|"]
  for k, r in runs.items():
    step, success = at_time(r["evals"], budget)
    lines.append(f"| {k} | {r['seconds']:.0f} | {60 * r['steps'] / r['seconds']:.0f} | "
                 f"{r['busy_s']:.2f} / {r['wait_s']:.2f} / {r['score_s']:.2f} / "
                 f"{r['update_s']:.2f} | {100 * r['evals'][-1][2]:.1f}% | "
                 f"{100 * success:.1f}% (step {step}) |")
  return "\n".join(lines)


def plot(runs: dict, path: str) -> None:
  fig, ax = plt.subplots(figsize=(7, 4))
  for k, r in runs.items():
    _, seconds, success = zip(*r["evals"])
    ax.plot(seconds, 100 * np.asarray(success), marker="o", label=f"k = {k}")
  ax.set_xlabel("RL training time (s)")
  ax.set_ylabel("held-out greedy success (%)")
  ax.set_title("GRPO main job, overlapped rollouts (max_staleness k)")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  ks = [int(k) for k in _KS.value]
  if any(k < 0 for k in ks):
    raise app.UsageError(f"--ks must be >= 0; got {ks}")
  os.makedirs(_OUT.value, exist_ok=True)
  start = time.perf_counter()
  for k in ks:
    if study.finished(run_dir(k), _STEPS.value):
      print(f"k={k}: done, skipped", flush=True)
    else:
      train(k, ks)
  runs = {k: load(k) for k in ks}
  text = table(runs)
  png = os.path.join(_OUT.value, "overlap_study.png")
  plot(runs, png)
  study.write_results(_OUT.value, "overlap_study.py", text, png, start)


if __name__ == "__main__":
  app.run(main)
