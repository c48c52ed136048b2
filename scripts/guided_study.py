# pylint: disable=invalid-name
r"""Guided-sampling study: GRPO vs ICPO on SmolLM2-135M-Instruct, the pretrained model of the CPU.

  python scripts/guided_study.py --out=runs/guided_study          # 2 methods x 3 seeds
  python scripts/guided_study.py --out=/tmp/gs --preset=smoke --steps=1 --seeds=1

Every run is a subprocess of the experiment's own binary with its `smollm2` preset: LoRA on
reasoning-gym's 1-digit products (docs/usage.md §4), 8 prompts x G = 4 samples per step,
held-out greedy success on 128 problems at steps 0, 5 and 10:

  grpo   experiments.policy.grpo: 4 samples per prompt under the plain prompt;
  icpo   experiments.policy.icpo: 3 plain samples and 1 sampled with 3 solved products before
         the task (`guide.*`), every row trained under the plain prompt (docs/algorithms.md §17).

Equal budgets: the same prompts x samples per step, steps and held-out evaluation. GRPO runs at
ICPO's rollout.max_len (160, room for the guided prompt): the transcript bound is also the
evaluation's, and GRPO's own 64 cuts its 41-token prompt's answers at 23 tokens. The SmolLM2
policy needs no SFT, so every run starts from the same weights. Resumable: a run whose
summary.json reports --steps steps is skipped, a killed one resumes from its checkpoint.
Writes <out>/<method>_seed<s>/, <out>/results.txt (held-out success per evaluation and its
normalized AUC, mean ± std over seeds; the sampled reward of the plain and the guided rows;
the command) and <out>/guided_study.png. --preset=smoke runs the tiny CI presets instead, a
check of the plumbing in seconds.
"""
import os
import time

from absl import app, flags
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from agentrl.records import study

# preset -> method -> (experiment, its overrides). GRPO's transcript bound is ICPO's, so both
# evaluate alike (module docstring).
PRESETS = {
    "smollm2": {"grpo": ("grpo", ["--config.rollout.max_len=160"]), "icpo": ("icpo", [])},
    "smoke": {"grpo": ("grpo", ["--config.rollout.max_len=64"]), "icpo": ("icpo", [])},
}
PRESET_STEPS = 10  # the smollm2 presets' total_steps

_OUT = flags.DEFINE_string("out", "runs/guided_study", "Directory of the runs and results.")
_PRESET = flags.DEFINE_enum("preset", "smollm2", list(PRESETS), "Both experiments' preset.")
_SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds 0 .. seeds-1 per method.")
_STEPS = flags.DEFINE_integer("steps", PRESET_STEPS, "RL steps per run (default: the smollm2 "
                              "presets').")


def run_dir(method: str, seed: int) -> str:
  return os.path.join(_OUT.value, f"{method}_seed{seed}")


def train(method: str, seed: int) -> None:
  """Runs (or resumes) one run as a subprocess; its output goes to <run>/log.txt."""
  experiment, extra = PRESETS[_PRESET.value][method]
  config = f"--config={study.experiment_module(experiment).replace('.', '/')}.py:{_PRESET.value}"
  timing = study.run_experiment(experiment, run_dir(method, seed), [
      config, f"--config.seed={seed}", f"--config.total_steps={_STEPS.value}",
      "--config.log.tensorboard=False", *extra])
  print(f"{method} seed {seed}: {timing['wall_s']:.0f}s wall, {timing['cpu_s']:.0f}s CPU",
        flush=True)


def load(workdir: str) -> dict:
  """A run's held-out curve, its AUC and its mean sampled reward: over all rows, the plain
  rows and the guided rows (ICPO's rollout/plain_reward and rollout/guided_reward; a run
  without guided rows has only plain ones)."""
  curves = study.read_curves(workdir)
  steps = [r["step"] for r in curves["evals"]]
  success = [r["eval/success"] for r in curves["evals"]]
  mean = lambda key: float(np.mean([r[key] for r in curves["train"]]))
  guided = "rollout/guided_reward" in curves["train"][0]
  reward = mean("rollout/reward_mean")
  return {"steps": steps, "success": success, "auc": study.normalized_auc(steps, success),
          "reward": reward, "plain_reward": mean("rollout/plain_reward") if guided else reward,
          "guided_reward": mean("rollout/guided_reward") if guided else None,
          "train_seconds": curves["summary"]["seconds"]["train"]}


def table(runs: dict) -> str:
  """Markdown: held-out success at every evaluation and its AUC, then the sampled reward of
  all, plain and guided rows (mean over the run's steps), mean ± std over seeds."""
  pct = lambda values: study.mean_std(values, ".1f", 100.0)
  steps = next(iter(runs.values()))[0]["steps"]
  lines = ["| method | " + " | ".join(f"step {s}" for s in steps) + " | AUC | sampled reward: "
           "all rows | plain rows | guided rows | RL time (s) |",
           "|---|" + "---:|" * (len(steps) + 5)]
  for method, seeds in runs.items():
    guided = (pct([r["guided_reward"] for r in seeds])
              if seeds[0]["guided_reward"] is not None else "—")
    cells = [pct([r["success"][i] for r in seeds]) for i in range(len(steps))]
    lines.append(f"| {method} | " + " | ".join(cells) + f" | {pct([r['auc'] for r in seeds])} | "
                 f"{pct([r['reward'] for r in seeds])} | "
                 f"{pct([r['plain_reward'] for r in seeds])} | {guided} | "
                 f"{study.mean_std([r['train_seconds'] for r in seeds], '.0f')} |")
  return ("Held-out greedy success (%) at each evaluation, its normalized AUC, and the mean "
          "sampled reward (%) of the training rows, mean ± std over seeds:\n\n"
          + "\n".join(lines))


def plot(runs: dict, path: str) -> None:
  fig, ax = plt.subplots(figsize=(7, 4))
  for method, seeds in runs.items():
    x = np.asarray(seeds[0]["steps"], np.float64)
    y = np.asarray([r["success"] for r in seeds], np.float64) * 100
    ax.plot(x, y.mean(0), marker="o", label=method)
    ax.fill_between(x, y.mean(0) - y.std(0), y.mean(0) + y.std(0), alpha=0.2)
  ax.set_xlabel("RL step")
  ax.set_ylabel("held-out greedy success (%)")
  ax.set_title(f"guided (ICPO) vs plain (GRPO) sampling, {_PRESET.value}, "
               f"{len(next(iter(runs.values())))} seeds")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  os.makedirs(_OUT.value, exist_ok=True)
  methods = PRESETS[_PRESET.value]
  start = time.perf_counter()
  for seed in range(_SEEDS.value):
    for method in methods:
      if study.finished(run_dir(method, seed), _STEPS.value):
        print(f"{method} seed {seed}: done, skipped", flush=True)
      else:
        train(method, seed)
  runs = {m: [load(run_dir(m, s)) for s in range(_SEEDS.value)] for m in methods}
  png = os.path.join(_OUT.value, "guided_study.png")
  plot(runs, png)
  study.write_results(_OUT.value, "guided_study.py", table(runs), png, start)


if __name__ == "__main__":
  app.run(main)
