# pylint: disable=invalid-name
r"""Length and efficiency study: GRPO vs HAPO vs BRPO vs HBPO on the verbose arithmetic task.

  python scripts/efficiency_study.py --out=runs/efficiency_study      # 4 methods x 3 seeds
  python scripts/efficiency_study.py --out=/tmp/es --methods=grpo --seeds=1 --steps=4

Every run is a subprocess of the experiment's own binary (`python -m experiments.<name>`) with
its default `cpu` preset (the verbose-answer arithmetic task, envs/verbose_arithmetic.py:
answers padded with filler the reward ignores) and the same budget: --steps RL steps of
--prompts prompts x --group samples, one update per step (HAPO reads and writes its history
in the update, so every method gets updates.minibatches = 1), a held-out greedy evaluation on
--eval_problems problems every --eval_every steps. GRPO is experiments/hapo_length.py with
loss.w = 0, which is GRPO exactly (reward = correctness) with the same prompts and evaluation.
All runs share one SFT warm start (the study's first run trains it; the others get a copy),
so every method and seed starts from the same policy and the seeds vary the RL runs.

Resumable: a run whose summary.json reports --steps steps is skipped, and a killed run resumes
from its last checkpoint (the experiments' own resume). Writes <out>/<method>_seed<s>/ (each
run's artifacts), <out>/results.txt (the table and the command) and <out>/efficiency_study.png
(held-out greedy success and response length, and the sampled response length, per step:
mean over seeds, +- one standard deviation shaded).
"""
import json
import os
import resource
import shutil
import subprocess
import sys
import time

from absl import app, flags
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from agentrl import metrics  # pylint: disable=wrong-import-position

# method -> (experiment, its extra overrides).
METHODS = {"grpo": ("hapo_length", ["--config.loss.w=0.0"]),
           "hapo": ("hapo_length", []),
           "brpo": ("brpo", []),
           "hbpo": ("hbpo", [])}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_OUT = flags.DEFINE_string("out", "runs/efficiency_study", "Directory of the runs and results.")
_METHODS = flags.DEFINE_list("methods", list(METHODS), f"Methods, of {list(METHODS)}.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds 0 .. seeds-1 per method.")
_STEPS = flags.DEFINE_integer("steps", 40, "RL steps per run.")
_PROMPTS = flags.DEFINE_integer("prompts", 16, "Prompts per step.")
_GROUP = flags.DEFINE_integer("group", 8, "Samples per prompt (HBPO: 2 per budget).")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 10, "Held-out evaluation every N steps.")
_EVAL_PROBLEMS = flags.DEFINE_integer("eval_problems", 400, "Held-out problems.")
_TAIL = 5  # steps averaged for the final sampled length


def run_dir(method: str, seed: int) -> str:
  return os.path.join(_OUT.value, f"{method}_seed{seed}")


def summary(workdir: str) -> dict:
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def finished(workdir: str) -> bool:
  path = os.path.join(workdir, "summary.json")
  return os.path.exists(path) and summary(workdir).get("steps") == _STEPS.value


def share_warm_start(method: str, seed: int) -> None:
  """Copies the study's SFT warm start into a new run (the first run of the study trains it).

  One SFT policy for every run: the seeds vary the RL run (sampling, prompt order), and every
  method starts from the same policy.
  """
  target = os.path.join(run_dir(method, seed), "warm_start")
  if os.path.exists(target):
    return
  for other in METHODS:
    for other_seed in range(_SEEDS.value):
      source = os.path.join(run_dir(other, other_seed), "warm_start")
      if os.path.isdir(source) and os.listdir(source):
        os.makedirs(run_dir(method, seed), exist_ok=True)
        shutil.copytree(source, target)
        return


def train(method: str, seed: int) -> None:
  """Runs (or resumes) one run as a subprocess; its output goes to <run>/log.txt."""
  experiment, extra = METHODS[method]
  workdir = run_dir(method, seed)
  share_warm_start(method, seed)
  os.makedirs(workdir, exist_ok=True)
  command = [sys.executable, "-m", f"experiments.{experiment}", f"--workdir={workdir}",
             f"--config.seed={seed}", f"--config.total_steps={_STEPS.value}",
             f"--config.rollout.prompts_per_step={_PROMPTS.value}",
             f"--config.rollout.group_size={_GROUP.value}", "--config.updates.minibatches=1",
             f"--config.eval.every={_EVAL_EVERY.value}",
             f"--config.eval.num_problems={_EVAL_PROBLEMS.value}",
             f"--config.log.save_every={_EVAL_EVERY.value}", "--config.log.tensorboard=False",
             *extra]
  start, cpu = time.perf_counter(), _children_cpu()
  with open(os.path.join(workdir, "log.txt"), "a") as log:
    subprocess.run(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
  timing = {"wall_s": time.perf_counter() - start, "cpu_s": _children_cpu() - cpu}
  with open(os.path.join(workdir, "study_time.json"), "w") as f:
    json.dump(timing, f)
  print(f"{method} seed {seed}: {timing['wall_s']:.0f}s wall, {timing['cpu_s']:.0f}s CPU",
        flush=True)


def _children_cpu() -> float:
  """User + system CPU seconds of the finished child processes: a measure of a run's work
  that does not grow when other jobs share the machine, as its wall time does."""
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def load(method: str, seed: int) -> dict:
  """The run's eval curve, sampled-length curve and wall time (summary.json)."""
  workdir = run_dir(method, seed)
  records = metrics.read_jsonl(os.path.join(workdir, metrics.JSONL))
  evals = [r for r in records if "eval/success" in r]
  train_records = [r for r in records if r["step"] > 0]
  return {"eval_steps": [r["step"] for r in evals],
          "success": [r["eval/success"] for r in evals],
          "greedy_tokens": [r["eval/response_tokens"] for r in evals],
          "steps": [r["step"] for r in train_records],
          "sampled_tokens": [r["rollout/response_tokens_mean"] for r in train_records],
          "train_seconds": summary(workdir)["seconds"]["train"],
          **_process_time(workdir)}


def _process_time(workdir: str) -> dict:
  """The wall and CPU seconds of the process that ran the run (NaN for a resumed run)."""
  path = os.path.join(workdir, "study_time.json")
  if not os.path.exists(path):
    return {"wall_s": float("nan"), "cpu_s": float("nan")}
  with open(path) as f:
    return json.load(f)


def mean_std(values, fmt: str = ".2f", scale: float = 1.0) -> str:
  """"mean ± std" over seeds (sample std, ddof 1)."""
  values = np.asarray(values, np.float64) * scale
  std = values.std(ddof=1) if len(values) > 1 else 0.0
  return f"{values.mean():{fmt}} ± {std:{fmt}}"


def table(runs: dict) -> str:
  """Markdown: the SFT start, then each method after the steps (mean ± std over seeds)."""
  pct = lambda values: mean_std(values, ".1f", 100.0)
  secs = lambda values: mean_std(values, ".0f")
  header = ("| method | held-out greedy success (%) | held-out greedy response tokens | sampled "
            f"response tokens (last {_TAIL} steps) | RL steps' time (s) | process wall (s) | "
            "process CPU (s) |\n|---|---|---|---|---|---|---|")
  first = next(iter(runs.values()))
  lines = [header, f"| SFT start (step 0) | {pct([r['success'][0] for r in first])} | "
                   f"{mean_std([r['greedy_tokens'][0] for r in first])} | | | | |"]
  for method, seeds in runs.items():
    lines.append(f"| {method} | {pct([r['success'][-1] for r in seeds])} | "
                 f"{mean_std([r['greedy_tokens'][-1] for r in seeds])} | "
                 f"{mean_std([np.mean(r['sampled_tokens'][-_TAIL:]) for r in seeds])} | "
                 f"{secs([r['train_seconds'] for r in seeds])} | "
                 f"{secs([r['wall_s'] for r in seeds])} | {secs([r['cpu_s'] for r in seeds])} |")
  return "\n".join(lines)


def plot(runs: dict, path: str) -> None:
  fig, axes = plt.subplots(1, 3, figsize=(15, 4))
  panels = (("eval_steps", "success", "held-out greedy success"),
            ("eval_steps", "greedy_tokens", "held-out greedy response tokens"),
            ("steps", "sampled_tokens", "sampled response tokens (training)"))
  for ax, (x_key, y_key, title) in zip(axes, panels):
    for method, seeds in runs.items():
      x = np.asarray(seeds[0][x_key])
      y = np.asarray([r[y_key] for r in seeds], np.float64)
      mean, std = y.mean(0), y.std(0)
      ax.plot(x, mean, label=method)
      ax.fill_between(x, mean - std, mean + std, alpha=0.2)
    ax.set_title(title)
    ax.set_xlabel("RL step")
    ax.grid(alpha=0.3)
  axes[0].legend()
  fig.suptitle(f"verbose arithmetic, {_PROMPTS.value} prompts x {_GROUP.value} samples, "
               f"{len(next(iter(runs.values())))} seeds")
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  unknown = sorted(set(_METHODS.value) - set(METHODS))
  if unknown:
    raise app.UsageError(f"unknown methods {unknown}; use {list(METHODS)}")
  os.makedirs(_OUT.value, exist_ok=True)
  start = time.perf_counter()
  for seed in range(_SEEDS.value):
    for method in _METHODS.value:
      if finished(run_dir(method, seed)):
        print(f"{method} seed {seed}: done, skipped", flush=True)
      else:
        train(method, seed)
  runs = {m: [load(m, s) for s in range(_SEEDS.value)] for m in _METHODS.value}
  text = table(runs)
  png = os.path.join(_OUT.value, "efficiency_study.png")
  plot(runs, png)
  command = "python scripts/efficiency_study.py " + " ".join(sys.argv[1:])
  with open(os.path.join(_OUT.value, "results.txt"), "w") as f:
    f.write(f"`{command}`\n\n{text}\n\n![curves]({os.path.basename(png)})\n")
  print(f"\n{text}\n\n{png}\nstudy wall time {time.perf_counter() - start:.0f}s "
        "(runs already finished are not re-run)")


if __name__ == "__main__":
  app.run(main)
