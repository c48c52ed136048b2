# pylint: disable=invalid-name
r"""Credit-assignment study: outcome-only GRPO vs turn-level credit on multi-turn tasks.

  python scripts/credit_study.py --out=runs/credit_study          # 8 methods x 3 seeds
  python scripts/credit_study.py --out=/tmp/cs --methods=grpo --seeds=1 --steps=4
  python scripts/credit_study.py --task=tool_use --out=runs/tool_study --steps=75
  python scripts/make_game_pool.py && python scripts/credit_study.py --task=textworld
  python scripts/credit_study.py --task=replay --steps=40 --eval_every=10 --eval_problems=200
  python scripts/credit_study.py --task=prm --out=runs/prm_study

--task=hidden_rule (default): every run is `python -m experiments.agents.agent` with its `cpu`
preset (the number-guessing hidden-rule game, 7 turns, a tiny model warm-started by SFT on
demonstrations) and one `loss.credit`, on the outcome reward alone
(`task.closeness_reward=0`: the main job's graded reward for failures would give every credit
the dense signal that turn-level credit is meant to supply), SFT checked every 10 steps (the
warm start, at 36.7% held-out, that experiments/agents/README.md's study started from):

  grpo         the outcome's group z-score on every turn (no turn-level credit);
  a2tgpo_igpo  A2TGPO over IGPO information-gain turn rewards (the smollm2/pod presets' default);
  igpo         IGPO's own advantage (log-prob-difference gains, separate normalisation);
  gigpo        GiGPO: episode group advantage + anchor-state step groups (gamma 0.95, as its
               launchers).
  siop         SIOP: the group's own final answers as references (no gold), their likelihood
               gain per turn, one group-pooled z-score (lambda 0.5, 3 references);
  infopo       InfoPO: outcome GRPO + the gated counterfactual-observation information.
  mapo         MAPO (arXiv 2603.06194): Monte-Carlo returns of the env's per-step progress
               signal plus its turn rewards, turn-level and batch-level z-scores mixed 1:1
               (this game sets no progress signal: the returns are the outcome).
  certainty_mix  MAPO of arXiv 2509.18849: the outcome's z-score and percent deviation mixed
               by the group's certainty.

--task=tool_use: every run is `python -m experiments.agents.matchtir` (the multi-turn tool-use env
with gold call traces, the tiny model warm-started by SFT on its demonstrations) at Adam 1e-4,
a third of the preset's rate, at which neither credit loses the call format in its first steps:

  grpo         the outcome's group z-score on every turn;
  matchtir     MatchTIR: turn rewards by Kuhn-Munkres matching of the calls to the gold calls,
               the dual-level (trajectory + turn) advantage;
  matchtir_ot  the same with optimal-transport (Sinkhorn) matching.

--task=textworld: the long-horizon task. Every run is `experiments.agents.agent` (or
`experiments.agents.spa_rl`) with its `textworld` preset (`registry.TEXTWORLD_STUDY`): TextWorld
coin collector at level 15, a chain of 15 rooms with the coin in the last (the walkthrough is 14
moves and "take coin"); the opening objective, which recites that walkthrough, is dropped, so
each room's two exits (the way back and the way on) are all the agent sees: 20 turns (at most
two steps back and forth spare), compact observations (the room's name and its commands),
reward 1 for taking the coin and nothing else (sparse by construction); one step back in a
failed episode is the turn that lost it. 200 training games and 64 each for held-out
evaluation and SFT validation, generated once by scripts/make_game_pool.py (else each run
generates the games it meets). The tiny scratch model is warm-started by SFT on the
walkthroughs to 30% validation success; 8 games x 8 samples per step; held-out greedy success
on the 64 games:

  grpo, gigpo, infopo, mapo, certainty_mix   as above (mapo: TextWorld's intermediate reward,
               1 for a command that shortened the winning command sequence, is its progress
               signal);
  gigpo_std    GiGPO with both levels divided by their std ("mean_std_norm", what its ALFWorld
               and search launchers run; its default "mean_norm" only centres, so its
               advantages are about half GRPO's z-scores at the same learning rate).
  spa_rl       SPA-RL (`experiments.agents.spa_rl`, the same warm start): an online progress
               estimator's turn contributions + 0.5 for an admissible command.

Not run on it: igpo and a2tgpo_igpo (their probes score a gold final answer after each turn; a
navigation episode has none: "take coin" is every game's winning command and is likely only in
the coin's room, and the walkthrough's next command changes with the state, so neither is the
fixed answer whose likelihood IGPO's information gain tracks); siop (it runs on textworld,
the last command read as the episode's answer, but its probe pass scores 3 references after
the prompt and after each of 20 turns, 63 rows of 272 tokens per episode, 4032 per step, in one
forward: it ran out of this machine's memory, asking for 30 GB); SPO-chain
(`experiments.agents.spo_chain` samples Monte-Carlo continuations of one single-turn response;
multi-turn values would need the env replayed under every cut); OPRL and MatchTIR (the one is
wired to the hidden-rule game, the other needs gold tool-call traces).

--task=branching: branching rollouts against independent samples on the hidden-rule game
(the `cpu` presets, outcome reward only, as --task=hidden_rule): grpo (agent.py, 8 independent
samples per prompt) and the tree methods, each its own experiment file sized to sample about
as many tokens per step: tree_rl (TreeRL's EPTree forest and node credit), spo_tree (SPO-tree
segment advantages), latr (LATR's forced alternatives at uncertain tokens, GRPO on the kept
sequences), r3l (R3L-style retries from the first failing turn). A branch samples only after
its fork, so the methods are compared at an equal budget of sampled tokens: curves over
cumulative `rollout/sampled_tokens`, and success and AUC at the smallest total any run reached.

--task=replay (the hidden-rule game, the `cpu` presets, outcome reward only, as
--task=hidden_rule) and --task=replay_textworld (the `textworld` presets): experience replay at
an equal rollout budget (every method samples the same prompts x samples per step; replayed
rows are stored ones, not new samples):

  grpo         agent.py, the outcome's group z-score (no replay);
  arpo         ARPO (`experiments.agents.arpo`): a stored success replaces a row of a group that
               sampled none, with its stored log-probs as pi_old; training tasks drawn from a
               pool of 256 so that a task's successes can come back;
  spear        SPEAR (`experiments.agents.spear`): self-imitation of replayed successes with
               the recalibrated advantage and Clip-Cov, the coefficient ramped over 10 updates
               (its preset's 50 would leave it below full strength for a whole 40-step run);
  spear_no_sil (--task=replay only) SPEAR with its self-imitation coefficient 0: the same
               sampled rows, loss and buffer, the replayed rows sending no gradient, which
               tells the self-imitation term from the rest of SPEAR's settings.

--task=prm: process rewards on the hidden-rule game (the `cpu` presets, outcome reward only, as
--task=hidden_rule), where the guess family's steps are checkable (envs/hidden_rule.py: a guess
outside the range the feedback leaves open, or an invalid turn, is a mistake):

  grpo             agent.py, the outcome's group z-score on every turn (no process reward);
  prm_min          prm_rl.py, reward.form=min: returns min_{j >= k} s_j + o (PURE);
  prm_sum          prm_rl.py, reward.form=sum: r_k = s_k, + o on the last turn;
  first_error      prm_rl.py, VPPO's first-error credit from the env's own step checks
                   (reward.verifier=env: a verifiable prefix, no PRM);
  first_error_prm  prm_rl.py, VPPO's first-error credit from the PRM (s_k <= 0.5).

The PRM-using methods (prm_min, prm_sum, first_error_prm) share one PRM: before the runs, and
only when a chosen method uses it, the study trains `python -m experiments.preference.prm`
once into <out>/prm on the env-checked step labels (prm.labels=checked: exact labels, no
Monte-Carlo forks), and passes reward.prm=<out>/prm to those runs. It is the first run of a
new study, so its SFT policy is the study's one warm start, which every RL run then copies:
the PRM's backbone and all arms' policies start from the same SFT. A finished PRM
(<out>/prm/summary.json) is reused; its held-out figures open results.txt.

Equal budgets: the same RL steps, prompts and samples per step (so the same env steps), the
same held-out evaluation, and one shared SFT warm start (the first run trains it, the others get
a copy), so methods differ only in credit and seeds only in the RL runs' randomness. Resumable:
finished runs are skipped, killed ones resume. Writes <out>/study_task (a study of another
task refuses the directory), <out>/<method>_seed<s>/, <out>/results.txt (the table and the
command) and <out>/credit_study.png (held-out success per step, mean over seeds, +- one
standard deviation shaded).
"""
import dataclasses
import os
import time

from absl import app, flags
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from agentrl.records import study



@dataclasses.dataclass(frozen=True)
class Task:
  """A study's task.

  Attributes:
    methods: method -> (its experiment's file name, its config overrides).
    flags: the overrides of every run.
    title: the plot's title.
    out: the default --out.
    preset: every run's experiment preset ("": the experiment's default).
    by_tokens: compare at an equal budget of sampled tokens (the methods sample different
      amounts per step): curves over cumulative `rollout/sampled_tokens`, and success and AUC
      at the smallest budget every run reached.
    prm_flags: the overrides (after `flags`) of the study's one PRM run
      (experiments.preference.prm, into <out>/prm).
    prm_methods: the methods that use that PRM (given --config.reward.prm=<out>/prm).
  """
  methods: dict[str, tuple[str, list[str]]]
  flags: list[str]
  title: str
  out: str
  preset: str = ""
  by_tokens: bool = False
  prm_flags: tuple[str, ...] = ()
  prm_methods: tuple[str, ...] = ()


def _agent(*overrides: str) -> tuple[str, list[str]]:
  return "agent", list(overrides)


# SPEAR's self-imitation coefficient ramps over spear.warmup_steps (50 by default, longer than a
# 40-step study run): 10 here, so that its replayed rows weigh in for most of the run.
_REPLAY = {
    "grpo": _agent("--config.loss.credit=grpo"),
    "arpo": ("arpo", []),
    "spear": ("spear", ["--config.spear.warmup_steps=10"]),
}

TASKS = {
    "hidden_rule": Task({
        "grpo": _agent("--config.loss.credit=grpo"),
        "a2tgpo_igpo": _agent("--config.loss.credit=a2tgpo_igpo"),
        "igpo": _agent("--config.loss.credit=igpo"),
        "gigpo": _agent("--config.loss.credit=gigpo", "--config.loss.gamma=0.95"),
        "siop": _agent("--config.loss.credit=siop"),
        "infopo": _agent("--config.loss.credit=infopo"),
        "mapo": _agent("--config.loss.credit=mapo"),
        "certainty_mix": _agent("--config.loss.credit=certainty_mix"),
    }, ["--config.task.closeness_reward=0", "--config.sft.eval_every=10"],
        "hidden-rule guessing game", "runs/credit_study"),
    "tool_use": Task({
        "grpo": ("matchtir", ["--config.loss.credit=grpo"]),
        "matchtir": ("matchtir", ["--config.loss.credit=matchtir",
                                  "--config.loss.matching=kuhn_munkres"]),
        "matchtir_ot": ("matchtir", ["--config.loss.credit=matchtir",
                                     "--config.loss.matching=ot"]),
    }, ["--config.optim.lr=1e-4"], "multi-turn tool use", "runs/tool_study"),
    "textworld": Task({
        **{credit: _agent(f"--config.loss.credit={credit}")
           for credit in ("grpo", "infopo", "mapo", "certainty_mix")},
        "gigpo": _agent("--config.loss.credit=gigpo", "--config.loss.gamma=0.95"),
        "gigpo_std": _agent("--config.loss.credit=gigpo", "--config.loss.gamma=0.95",
                            "--config.loss.gigpo_mode=mean_std_norm"),
        "spa_rl": ("spa_rl", []),
    }, [], "TextWorld coin collector, 20 turns", "runs/textworld_study", preset="textworld"),
    "branching": Task({
        "grpo": _agent("--config.loss.credit=grpo"),
        "tree_rl": ("tree_rl", []),
        "spo_tree": ("spo_tree", []),
        "latr": ("latr", []),
        "r3l": ("r3l", []),
    }, ["--config.task.closeness_reward=0", "--config.sft.eval_every=10"],
        "hidden-rule game: branching vs independent samples", "runs/branching_study",
        by_tokens=True),
    "replay": Task({**_REPLAY, "spear_no_sil": ("spear", ["--config.spear.coef=0"])},
                   ["--config.task.closeness_reward=0", "--config.sft.eval_every=10"],
                   "hidden-rule game: experience replay", "runs/replay_study"),
    "replay_textworld": Task(_REPLAY, [], "TextWorld coin collector: experience replay",
                             "runs/replay_textworld_study", preset="textworld"),
    "prm": Task({
        "grpo": _agent("--config.loss.credit=grpo"),
        "prm_min": ("prm_rl", ["--config.reward.form=min"]),
        "prm_sum": ("prm_rl", ["--config.reward.form=sum"]),
        "first_error": ("prm_rl", ["--config.reward.form=vppo", "--config.reward.verifier=env"]),
        "first_error_prm": ("prm_rl", ["--config.reward.form=vppo"]),
    }, ["--config.task.closeness_reward=0", "--config.sft.eval_every=10"],
        "hidden-rule game: process rewards", "runs/prm_study",
        prm_flags=("--config.prm.labels=checked",),
        prm_methods=("prm_min", "prm_sum", "first_error_prm")),
}
PRM_DIR = "prm"   # <out>/prm: the study's PRM run (Task.prm_flags)

_TASK = flags.DEFINE_enum("task", "hidden_rule", list(TASKS), "The multi-turn task.")
_OUT = flags.DEFINE_string("out", None, "Directory of the runs and results (default: "
                           + ", ".join(f"{t.out} for --task={n}" for n, t in TASKS.items())
                           + ").")
_METHODS = flags.DEFINE_list(
    "methods", None, "Methods (default: all of the task's): "
    + "; ".join(f"{name}: {','.join(task.methods)}" for name, task in TASKS.items()))
_SEEDS = flags.DEFINE_integer("seeds", 3, "Seeds 0 .. seeds-1 per method.")
_STEPS = flags.DEFINE_integer("steps", 150, "RL steps per run.")
_EVAL_EVERY = flags.DEFINE_integer("eval_every", 25, "Held-out evaluation every N steps.")
_EVAL_PROBLEMS = flags.DEFINE_integer("eval_problems", 0,
                                      "Held-out problems; 0: the experiment preset's number.")


def out_dir() -> str:
  return _OUT.value or TASKS[_TASK.value].out


def run_dir(method: str, seed: int) -> str:
  return os.path.join(out_dir(), f"{method}_seed{seed}")


def claim_out_dir(out: str, task: str) -> None:
  """Marks `out` as a `task` study, or raises UsageError if it holds the other task's runs:
  both tasks have a grpo_seed0, which must not be mixed up."""
  os.makedirs(out, exist_ok=True)
  marker = os.path.join(out, "study_task")
  if os.path.exists(marker):
    with open(marker) as f:
      claimed = f.read().strip()
    if claimed != task:
      raise app.UsageError(f"{out} holds a --task={claimed} study; pass --task={claimed} or a "
                           f"new --out for --task={task}")
  else:
    with open(marker, "w") as f:
      f.write(task)


def warm_start_sources(task: Task, out: str, seeds: int) -> list[str]:
  """Every run of the study that may hold its warm start: the PRM run first, then the arms."""
  runs = [os.path.join(out, f"{m}_seed{s}") for m in task.methods for s in range(seeds)]
  return ([os.path.join(out, PRM_DIR)] if task.prm_methods else []) + runs


def prm_override(task: Task, out: str, method: str) -> list[str]:
  """--config.reward.prm=<out>/prm for a method that uses the study's PRM, else nothing."""
  return ([f"--config.reward.prm={os.path.join(out, PRM_DIR)}"]
          if method in task.prm_methods else [])


def train_prm(task: Task, out: str, sources: list[str]) -> None:
  """Trains the study's PRM into <out>/prm unless it is finished (its summary.json); it takes
  the study's warm start if a run already has one, else trains it (the others copy it)."""
  workdir = os.path.join(out, PRM_DIR)
  if os.path.exists(os.path.join(workdir, "summary.json")):
    print(f"PRM {workdir}: done, reused", flush=True)
    return
  study.share_warm_start(workdir, [s for s in sources if s != workdir])
  timing = study.run_experiment("prm", workdir, [*task.flags, *task.prm_flags])
  print(f"PRM {workdir}: {timing['wall_s']:.0f}s wall, {timing['cpu_s']:.0f}s CPU", flush=True)


def prm_line(out: str) -> str:
  """The study PRM's held-out figures, a line of results.txt."""
  summary = study.summary(os.path.join(out, PRM_DIR))
  return (f"PRM ({PRM_DIR}/, checked step labels): held-out step accuracy "
          f"{summary['held_out_step_accuracy']:.1%} (base rate "
          f"{summary['held_out_base_rate']:.1%}), AUC {summary['held_out_auc']:.3f}")


def train(method: str, seed: int) -> None:
  task = TASKS[_TASK.value]
  experiment, method_flags = task.methods[method]
  workdir = run_dir(method, seed)
  study.share_warm_start(workdir, warm_start_sources(task, out_dir(), _SEEDS.value))
  eval_problems = ([f"--config.eval.num_problems={_EVAL_PROBLEMS.value}"]
                   if _EVAL_PROBLEMS.value else [])
  # The config file first: the --config.<key> overrides apply to its preset.
  preset = ([f"--config={study.experiment_module(experiment).replace('.', '/')}.py:"
             f"{task.preset}"] if task.preset else [])
  timing = study.run_experiment(experiment, workdir, [
      *preset, f"--config.seed={seed}", f"--config.total_steps={_STEPS.value}",
      f"--config.eval.every={_EVAL_EVERY.value}", *eval_problems,
      f"--config.log.save_every={_EVAL_EVERY.value}", "--config.log.tensorboard=False",
      *task.flags, *method_flags, *prm_override(task, out_dir(), method)])
  print(f"{method} seed {seed}: {timing['wall_s']:.0f}s wall, {timing['cpu_s']:.0f}s CPU",
        flush=True)


def load(method: str, seed: int) -> dict:
  curves = study.read_curves(run_dir(method, seed))
  steps = [r["step"] for r in curves["evals"]]
  success = [r["eval/success"] for r in curves["evals"]]
  sampled = np.cumsum([0.0] + [r.get("rollout/sampled_tokens", 0.0) for r in curves["train"]])
  return {"steps": steps, "success": success, "auc": study.normalized_auc(steps, success),
          "train_seconds": curves["summary"]["seconds"]["train"],
          "tokens": [float(sampled[min(s, len(sampled) - 1)]) for s in steps]}


def at_budget(run: dict, budget: float) -> tuple[float, float]:
  """(held-out success at `budget` sampled tokens, linearly interpolated between evaluations;
  the curve's mean level over [0, budget]) of one run."""
  x, y = np.asarray(run["tokens"]), np.asarray(run["success"])
  inside = x < budget
  xs = np.append(x[inside], budget)
  ys = np.append(y[inside], np.interp(budget, x, y))
  return float(ys[-1]), study.normalized_auc(xs, ys)


def token_table(runs: dict) -> str:
  """Markdown: the runs compared at the smallest sampled-token budget every run reached."""
  budget = min(r["tokens"][-1] for seeds in runs.values() for r in seeds)
  pct = lambda values: study.mean_std(values, ".1f", 100.0)
  lines = [f"At {budget / 1e6:.2f}M sampled tokens (the smallest total of any run):", "",
           "| method | sampled tokens per step (K) | success at budget | AUC to budget | "
           "final success (its tokens, M) | s / step |", "|---|" + "---:|" * 5]
  for method, seeds in runs.items():
    per_step = [r["tokens"][-1] / max(r["steps"][-1], 1) / 1e3 for r in seeds]
    both = [at_budget(r, budget) for r in seeds]
    final = pct([r["success"][-1] for r in seeds])
    step_s = [r["train_seconds"] / max(r["steps"][-1], 1) for r in seeds]
    lines.append(f"| {method} | {study.mean_std(per_step, '.1f')} | "
                 f"{pct([b[0] for b in both])} | {pct([b[1] for b in both])} | {final} "
                 f"({np.mean([r['tokens'][-1] for r in seeds]) / 1e6:.2f}) | "
                 f"{study.mean_std(step_s, '.1f')} |")
  return "\n".join(lines)


def table(runs: dict) -> str:
  """Markdown: held-out success at every evaluation, its normalized AUC, the RL time."""
  pct = lambda values: study.mean_std(values, ".1f", 100.0)
  steps = next(iter(runs.values()))[0]["steps"]
  header = ("| method | " + " | ".join(f"step {s}" for s in steps) +
            " | AUC | RL time (s) |\n|---|" + "---:|" * (len(steps) + 2))
  lines = [header]
  for method, seeds in runs.items():
    cells = [pct([r["success"][i] for r in seeds]) for i in range(len(steps))]
    lines.append(f"| {method} | " + " | ".join(cells) +
                 f" | {pct([r['auc'] for r in seeds])} | "
                 f"{study.mean_std([r['train_seconds'] for r in seeds], '.0f')} |")
  return "\n".join(lines)


def plot(runs: dict, path: str) -> None:
  by_tokens = TASKS[_TASK.value].by_tokens
  fig, ax = plt.subplots(figsize=(7, 4))
  for method, seeds in runs.items():
    x = np.asarray(seeds[0]["steps"], np.float64)
    if by_tokens:   # the seeds' mean token count at each evaluation
      x = np.mean([r["tokens"] for r in seeds], axis=0) / 1e6
    y = np.asarray([r["success"] for r in seeds], np.float64) * 100
    ax.plot(x, y.mean(0), label=method)
    ax.fill_between(x, y.mean(0) - y.std(0), y.mean(0) + y.std(0), alpha=0.2)
  ax.set_xlabel("sampled tokens (M)" if by_tokens else "RL step")
  ax.set_ylabel("held-out greedy success (%)")
  ax.set_title(f"{TASKS[_TASK.value].title}, {len(next(iter(runs.values())))} seeds")
  ax.grid(alpha=0.3)
  ax.legend()
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  methods = TASKS[_TASK.value].methods
  chosen = _METHODS.value or list(methods)
  unknown = sorted(set(chosen) - set(methods))
  if unknown:
    raise app.UsageError(f"unknown methods {unknown} for --task={_TASK.value}; use "
                         f"{list(methods)}")
  claim_out_dir(out_dir(), _TASK.value)
  start = time.perf_counter()
  task = TASKS[_TASK.value]
  uses_prm = bool(set(chosen) & set(task.prm_methods))
  if uses_prm:
    train_prm(task, out_dir(), warm_start_sources(task, out_dir(), _SEEDS.value))
  for seed in range(_SEEDS.value):
    for method in chosen:
      if study.finished(run_dir(method, seed), _STEPS.value):
        print(f"{method} seed {seed}: done, skipped", flush=True)
      else:
        train(method, seed)
  runs = {m: [load(m, s) for s in range(_SEEDS.value)] for m in chosen}
  text = table(runs)
  if uses_prm:
    text = prm_line(out_dir()) + "\n\n" + text
  if TASKS[_TASK.value].by_tokens:
    text += "\n\n" + token_table(runs)
  png = os.path.join(out_dir(), "credit_study.png")
  plot(runs, png)
  study.write_results(out_dir(), "credit_study.py", text, png, start)


if __name__ == "__main__":
  app.run(main)
