# pylint: disable=invalid-name
r"""Length and efficiency study: GRPO vs HAPO vs BRPO vs HBPO on the verbose arithmetic task.

  python scripts/efficiency_study.py --out=runs/efficiency_study      # 4 methods x 3 seeds
  python scripts/efficiency_study.py --out=/tmp/es --methods=grpo --seeds=1 --steps=4

Every run is a subprocess of the experiment's own binary (`python -m experiments.<name>`) with
its default `cpu` preset (the verbose-answer arithmetic task, envs/verbose_arithmetic.py:
answers padded with filler the reward ignores) and the same budget: --steps RL steps of
--prompts prompts x --group samples, one update per step (HAPO reads and writes its history
in the update, so every method gets updates.minibatches = 1), a held-out greedy evaluation on
--eval_problems problems every --eval_every steps. GRPO is experiments/efficiency/hapo_length.py
with loss.w = 0, which is GRPO exactly (reward = correctness) with the same prompts and evaluation.
All runs share one SFT warm start (the study's first run trains it; the others get a copy),
so every method and seed starts from the same policy and the seeds vary the RL runs.

Resumable: a run whose summary.json reports --steps steps is skipped, and a killed run resumes
from its last checkpoint (the experiments' own resume). Writes <out>/<method>_seed<s>/ (each
run's artifacts), <out>/results.txt (the table and the command) and <out>/efficiency_study.png
(held-out greedy success and response length, and the sampled response length, per step:
mean over seeds, +- one standard deviation shaded).
"""
import os
import time

from absl import app, flags
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from agentrl.records import study

# method -> (experiment, its extra overrides).
METHODS = {"grpo": ("hapo_length", ["--config.loss.w=0.0"]),
           "hapo": ("hapo_length", []),
           "brpo": ("brpo", []),
           "hbpo": ("hbpo", [])}

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


def train(method: str, seed: int) -> None:
  """Runs (or resumes) one run as a subprocess; its output goes to <run>/log.txt."""
  experiment, extra = METHODS[method]
  workdir = run_dir(method, seed)
  study.share_warm_start(workdir, [run_dir(m, s) for m in METHODS for s in range(_SEEDS.value)])
  timing = study.run_experiment(experiment, workdir, [
      f"--config.seed={seed}", f"--config.total_steps={_STEPS.value}",
      f"--config.rollout.prompts_per_step={_PROMPTS.value}",
      f"--config.rollout.group_size={_GROUP.value}", "--config.updates.minibatches=1",
      f"--config.eval.every={_EVAL_EVERY.value}",
      f"--config.eval.num_problems={_EVAL_PROBLEMS.value}",
      f"--config.log.save_every={_EVAL_EVERY.value}", "--config.log.tensorboard=False", *extra])
  print(f"{method} seed {seed}: {timing['wall_s']:.0f}s wall, {timing['cpu_s']:.0f}s CPU",
        flush=True)


def load(method: str, seed: int) -> dict:
  """The run's eval curve, sampled-length curve and wall time (summary.json)."""
  curves = study.read_curves(run_dir(method, seed))
  evals, train_records = curves["evals"], curves["train"]
  return {"eval_steps": [r["step"] for r in evals],
          "success": [r["eval/success"] for r in evals],
          "greedy_tokens": [r["eval/response_tokens"] for r in evals],
          "steps": [r["step"] for r in train_records],
          "sampled_tokens": [r["rollout/response_tokens_mean"] for r in train_records],
          "train_seconds": curves["summary"]["seconds"]["train"],
          "wall_s": curves["wall_s"], "cpu_s": curves["cpu_s"]}


def table(runs: dict) -> str:
  """Markdown: the SFT start, then each method after the steps (mean ± std over seeds)."""
  pct = lambda values: study.mean_std(values, ".1f", 100.0)
  secs = lambda values: study.mean_std(values, ".0f")
  header = ("| method | held-out greedy success (%) | held-out greedy response tokens | sampled "
            f"response tokens (last {_TAIL} steps) | RL steps' time (s) | process wall (s) | "
            "process CPU (s) |\n|---|---|---|---|---|---|---|")
  first = next(iter(runs.values()))
  lines = [header, f"| SFT start (step 0) | {pct([r['success'][0] for r in first])} | "
                   f"{study.mean_std([r['greedy_tokens'][0] for r in first])} | | | | |"]
  for method, seeds in runs.items():
    lines.append(f"| {method} | {pct([r['success'][-1] for r in seeds])} | "
                 f"{study.mean_std([r['greedy_tokens'][-1] for r in seeds])} | "
                 f"{study.mean_std([np.mean(r['sampled_tokens'][-_TAIL:]) for r in seeds])} | "
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
      if study.finished(run_dir(method, seed), _STEPS.value):
        print(f"{method} seed {seed}: done, skipped", flush=True)
      else:
        train(method, seed)
  runs = {m: [load(m, s) for s in range(_SEEDS.value)] for m in _METHODS.value}
  text = table(runs)
  png = os.path.join(_OUT.value, "efficiency_study.png")
  plot(runs, png)
  study.write_results(_OUT.value, "efficiency_study.py", text, png, start)


if __name__ == "__main__":
  app.run(main)
