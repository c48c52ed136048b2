# pylint: disable=invalid-name
r"""A process reward model (PRM) on the hidden-rule game, labelled by Monte-Carlo continuations
or by the game's own check of each step.

  python -m experiments.preference.prm
  python -m experiments.preference.prm --config.prm.labels=checked --workdir=/tmp/prm_checked
  python -m experiments.preference.prm --config.prm.loss=bradley_terry --workdir=/tmp/prm_bt
  python -m experiments.preference.prm --config=experiments/preference/prm.py:smoke \
      --workdir=/tmp/prm

Steps are model turns (`rewards.process`: a step's score is read at its last sampled token).

  1. The policy is warm-started by SFT as the agent experiments' (experiments/agents/agent.py's
     cpu preset: the hidden-rule game's guess family, closeness reward).
  2. Labels (Math-Shepherd, Wang et al. 2024, arXiv 2312.08935): each of prm.train_prompts
     training seeds plays one root episode at the rollout temperature; after every env reply
     the engine forks prm.continuations episodes from that point (`Engine.run(brancher=)`, the
     env replayed or cloned), which play on to the end. A root's step k is a prefix; its
     continuations are the forks made after it plus the root itself, and the step's label is
     hard (1 if any continuation succeeded) or soft (the fraction that did), prm.labels
     (`continuation_counts`, `mc_labels`). The game emits no per-step progress signal, so MC
     continuations are its default label source. prm.labels=checked instead labels each step
     with the env's own verdict, info["step_ok"] (`base.STEP_OK`: in the `guess` family a guess
     outside the range the feedback leaves open, or an invalid turn, is a mistake;
     envs/hidden_rule.py), read by `process.progress_labels`: one episode per seed, no forks.
     The held-out prompts (seeds from recipe.EVAL_SEED_BASE, disjoint from training) are
     labelled the same way.
  3. The PRM is the warm-started policy's backbone with a fresh scalar `heads.StepHead` read at
     each step's end (Math-Shepherd trains its PRM from the base model), trained for prm.steps
     Adam steps, prm.loss:
       bce            per-step binary cross-entropy on the roots' labelled steps
                      (`losses.process.step_bce`; soft labels are its targets as given),
                      batches of prm.batch_size episodes;
       bradley_terry  -log sigmoid(z_c - z_r) over sibling steps, the same step index generated
                      after the same prefix (a root's step k and the step k of each fork made
                      after its step k - 1; `process.sibling_groups`), whose MC labels differ,
                      the higher-labelled one chosen (`process.sibling_pairs`,
                      `losses.process.step_bradley_terry`); batches of prm.batch_size // 2
                      pairs, each pair's two rows. Needs MC labels (a checked rollout has no
                      forks, so no siblings).
  4. Held-out figures. bce: step accuracy ([p > 0.5] == [y > 0.5] over the roots' labelled
     steps), ROC AUC of p against [y > 0.5], and the base rate (accuracy of always predicting
     the majority label) for scale. bradley_terry: its scores are only ranked, so p > 0.5 means
     nothing and the step accuracy is not its figure; it adds the pair accuracy on the held-out
     sibling pairs (p_c > p_r, ties half) and their number; its AUC (a ranking figure) applies.

Writes config.json, metrics.jsonl (one record per PRM step; the labelling statistics at step 0
and the held-out figures at the last step), summary.json, and <workdir>/prm: a checkpoint of
{"backbone": ..., "head": ...} whose info names the step count and the held-out figures (an RL
run rebuilds the backbone from this run's config.json and loads both). Presets: cpu (default),
pod (agent.py's pod game on Qwen3-8B), smoke (seconds, for tests).
"""
import json
import os
import time

from absl import app
import jax
import ml_collections as mlc
import numpy as np
import optax

from agentrl import checkpoint
from agentrl import configs
from agentrl import distributed
from agentrl.credit import probes
from agentrl.envs import base
from agentrl.envs import hidden_rule
from agentrl.envs import registry
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import process as process_loss
from agentrl.models import heads
from agentrl.records import metrics as metrics_lib
from agentrl.records import rundir
from agentrl.rewards import process
from agentrl.rollout import branching
from agentrl.rollout import collect
from agentrl.rollout import pack
from agentrl import sharding
from agentrl.train import loop


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  if arg.preset not in ("cpu", "pod"):
    raise configs.ConfigError(f"unknown prm preset {arg.preset!r}; use cpu (default), pod or "
                              "smoke")
  c = rl_config.agent_study(arg, experiment="prm", names=registry.NAMES)
  # train_prompts / eval_prompts: root episodes labelled for training / held out;
  # continuations: forks after each env reply (Math-Shepherd's N); labels: mc_labels' mode
  # (hard, soft) or checked (the env's own step check); loss: LOSSES (module docstring).
  c.prm = dict(train_prompts=256, eval_prompts=64, continuations=4, labels="hard", loss="bce",
               steps=300, batch_size=32, lr=1e-4)
  if arg.preset == "pod":
    c.prm.update(train_prompts=4096, eval_prompts=512, continuations=8, steps=1000,
                 batch_size=128, lr=1e-5)
  if arg.smoke:
    c.prm.update(train_prompts=2, eval_prompts=2, continuations=1, steps=2, batch_size=2)
  return c


LABELS = process.LABEL_MODES + ("checked",)
LOSSES = ("bce", "bradley_terry")
# The per-row arrays the PRM scores (`make_scorer`) and the BCE loss reads.
ROW_KEYS = ("tokens_BT", "positions_BT", "input_mask_BT", "step_end_BU", "label_BU", "mask_BU")

SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    **registry.schema(registry.NAMES),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "prm.train_prompts": configs.Key(int, min=1),
    "prm.eval_prompts": configs.Key(int, min=1),
    "prm.continuations": configs.Key(int, min=1),
    "prm.labels": configs.Key(str, choices=LABELS),
    "prm.loss": configs.Key(str, choices=LOSSES),
    "prm.steps": configs.Key(int, min=1),
    "prm.batch_size": configs.Key(int, min=1),
    "prm.lr": configs.Key(float, min=0.0),
}


# ---------------------------------------------------------------------------------------------
# Labelled steps from branching rollouts.
# ---------------------------------------------------------------------------------------------
def make_brancher(continuations: int):
  """Forks `continuations` episodes after every env reply of a root episode."""

  def brancher(point: branching.ForkPoint) -> list[branching.Fork]:
    if point.kind != "stepped" or point.depth > 0:
      return []
    return [branching.Fork(at=len(point.trajectory.tokens), n=continuations)]

  return brancher


def step_labels(trajs, *, max_steps: int, max_len: int, mode: str):
  """(step_end_BU, step_mask_BU, labels_BU, label_mask_BU) of every row (roots and forks).

  A fork made after its parent's k-th env reply shares the parent's first k steps; it is one
  more continuation of the prefix ending at step k - 1 (`process.continuation_counts`). A step
  that ends past max_len (the pack cut) is dropped.
  """
  steps = probes.prm_steps(trajs, max_steps=max_steps, max_len=max_len)
  success_B = np.asarray([collect.trajectory_success(t) for t in trajs], np.float32)
  succ_BU, total_BU = process.continuation_counts(
      success_B, steps["num_steps"], max_steps=max_steps, parent_B=steps["parent"],
      shared_B=steps["shared"])
  labels_BU, label_mask_BU = process.mc_labels(succ_BU, total_BU, mode=mode)
  step_mask_BU = steps["step_mask"]
  return steps["step_end"], step_mask_BU, labels_BU, label_mask_BU * step_mask_BU


def checked_labels(trajs, *, max_steps: int, max_len: int):
  """(step_end_BU, step_mask_BU, labels_BU, label_mask_BU): each step labelled by the env's own
  check, info["step_ok"] (`process.progress_labels`); a step without it, or ending past
  max_len (the pack cut), is unlabelled."""
  steps = probes.prm_steps(trajs, max_steps=max_steps, max_len=max_len)
  labels_BU, mask_BU = process.progress_labels([t.infos for t in trajs], max_steps=max_steps,
                                               key=base.STEP_OK)
  mask_BU = mask_BU * steps["step_mask"]
  return steps["step_end"], steps["step_mask"], labels_BU * mask_BU, mask_BU


def root_of(parent_B: np.ndarray) -> np.ndarray:
  """Int [B]: the root row each row descends from (itself for a root)."""
  parent_B, root_B = np.asarray(parent_B), np.arange(len(parent_B))
  for row in range(len(parent_B)):
    while parent_B[root_B[row]] >= 0:
      root_B[row] = parent_B[root_B[row]]
  return root_B


def labelled_rows(config, engine, tok, make_env, params, seeds, rng):
  """The rows of a rollout from `seeds`, packed, with their step labels.

  prm.labels hard / soft: a branching rollout (`make_brancher`) and its MC labels
  (`step_labels`); checked: one episode per seed, no forks, and the env's check
  (`checked_labels`). prm.loss bce keeps the roots only (a fork's own steps have only itself as
  continuation); bradley_terry keeps every row, and adds group_BU (`process.sibling_groups`,
  one prompt per root) and root_B (1 on roots), the input of its sibling pairs.

  Returns (data, stats): data a dict of numpy arrays (ROW_KEYS, and the two above for
  bradley_terry); stats the labelling statistics, over the roots (and "pairs", the sibling
  pairs, for bradley_terry).
  """
  rc, pc = config.rollout, config.prm
  max_steps, checked = make_env().max_turns, pc.labels == "checked"
  trajs, metrics = engine.run(
      params, tok, [make_env() for _ in seeds], list(seeds), rng=rng, max_turns=max_steps,
      max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, temperature=rc.temperature,
      chat_template=config.task.chat_template,
      brancher=None if checked else make_brancher(pc.continuations))
  if checked:
    end_BU, _, labels_BU, mask_BU = checked_labels(trajs, max_steps=max_steps,
                                                   max_len=rc.max_len)
  else:
    end_BU, _, labels_BU, mask_BU = step_labels(trajs, max_steps=max_steps,
                                                max_len=rc.max_len, mode=pc.labels)
  roots = np.arange(len(seeds))  # engine.run returns the roots first, in the seeds' order
  keep = roots if pc.loss == "bce" else np.arange(len(trajs))
  batch = pack.pack_numpy([trajs[i] for i in keep], max_len=rc.max_len, pad_id=tok.pad_id,
                          min_len=rc.max_len)
  data = {"tokens_BT": np.asarray(batch.tokens_BT), "positions_BT": np.asarray(batch.positions_BT),
          "input_mask_BT": np.asarray(batch.input_mask_BT), "step_end_BU": end_BU[keep],
          "label_BU": labels_BU[keep], "mask_BU": mask_BU[keep]}
  labelled = mask_BU[roots] > 0
  stats = {"rows": float(len(trajs)), "branches": metrics.get("rollout/branches", 0.0),
           "success": float(np.mean([collect.trajectory_success(trajs[i]) for i in roots])),
           "labelled_steps": float(labelled.sum()),
           "label_mean": float(labels_BU[roots][labelled].mean()) if labelled.any() else 0.0}
  if pc.loss == "bradley_terry":
    steps = probes.prm_steps(trajs, max_steps=max_steps, max_len=rc.max_len)
    data["group_BU"] = process.sibling_groups(
        steps["num_steps"], max_steps=max_steps, prompt_B=root_of(steps["parent"]),
        parent_B=steps["parent"], shared_B=steps["shared"])
    data["root_B"] = (steps["parent"] < 0).astype(np.float32)
    stats["pairs"] = float(len(process.sibling_pairs(labels_BU, mask_BU, data["group_BU"])[0]))
  return data, stats


def pair_batch(data, chosen_N: np.ndarray, rejected_N: np.ndarray) -> dict:
  """A Bradley-Terry batch of the pairs (chosen_N, rejected_N), flat indices into data's
  [B * U]: the chosen steps' rows, then the rejected steps' rows (ROW_KEYS), and the pairs as
  indices into this batch's [2N * U] with an all-ones pair mask (one compiled shape)."""
  u, n = data["step_end_BU"].shape[1], len(chosen_N)
  rows = np.concatenate([chosen_N // u, rejected_N // u])
  batch = {k: data[k][rows] for k in ROW_KEYS}
  batch["chosen_N"] = (np.arange(n) * u + chosen_N % u).astype(np.int32)
  batch["rejected_N"] = ((n + np.arange(n)) * u + rejected_N % u).astype(np.int32)
  batch["pair_mask_N"] = np.ones(n, np.float32)
  return batch


# ---------------------------------------------------------------------------------------------
# The PRM: the policy's backbone and a step head.
# ---------------------------------------------------------------------------------------------
def make_scorer(graphdef, head_graphdef):
  """logits(params, data) -> [B, U] step logits of {"backbone", "head"} params."""
  logits = heads.policy_prm_logits(graphdef, head_graphdef)
  return lambda params, data: logits(params, data["tokens_BT"], data["positions_BT"],
                                     data["input_mask_BT"], data["step_end_BU"], data["mask_BU"])


def make_update_step(graphdef, head_graphdef, tx, *, loss: str = "bce"):
  """update_step(state, data): one Adam step on the labelled steps' mean cross-entropy (bce)
  or the batch's pairs' mean Bradley-Terry loss (bradley_terry, a `pair_batch`)."""
  if loss not in LOSSES:
    raise ValueError(f"make_update_step loss={loss!r}; expected one of {LOSSES}.")
  logits = make_scorer(graphdef, head_graphdef)

  def bce_fn(params, data):
    loss_BU, metrics = process_loss.step_bce(logits(params, data), data["label_BU"],
                                             data["mask_BU"])
    mean = aggregation.masked_mean(loss_BU, data["mask_BU"])
    return mean, {"prm/loss": mean, "prm/step_accuracy": metrics["step_accuracy"]}

  def bradley_terry_fn(params, data):
    loss_N, metrics = process_loss.step_bradley_terry(
        logits(params, data), data["chosen_N"], data["rejected_N"], data["pair_mask_N"])
    mean = aggregation.masked_mean(loss_N, data["pair_mask_N"])
    return mean, {"prm/loss": mean, "prm/pair_accuracy": metrics["pair_accuracy"]}

  return loop.gradient_step(bce_fn if loss == "bce" else bradley_terry_fn, tx)


def roc_auc(score_N: np.ndarray, positive_N: np.ndarray) -> float:
  """Area under the ROC curve (Mann-Whitney U, ties counted half); 0.5 with one class only."""
  score_N, positive_N = np.asarray(score_N, np.float64), np.asarray(positive_N, bool)
  pos, neg = score_N[positive_N], score_N[~positive_N]
  if not pos.size or not neg.size:
    return 0.5
  greater = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
  return float(greater / (pos.size * neg.size))


def held_out_figures(prob_BU: np.ndarray, label_BU: np.ndarray, mask_BU: np.ndarray) -> dict:
  """Step accuracy, AUC and the majority-label base rate over the labelled steps."""
  labelled = np.asarray(mask_BU) > 0
  prob_N, good_N = np.asarray(prob_BU)[labelled], np.asarray(label_BU)[labelled] > 0.5
  if not good_N.size:
    return {"prm/held_out_step_accuracy": 0.0, "prm/held_out_auc": 0.5,
            "prm/held_out_base_rate": 0.0}
  return {"prm/held_out_step_accuracy": float(((prob_N > 0.5) == good_N).mean()),
          "prm/held_out_auc": roc_auc(prob_N, good_N),
          "prm/held_out_base_rate": float(max(good_N.mean(), 1.0 - good_N.mean()))}


def pair_figures(prob_BU: np.ndarray, chosen_N: np.ndarray, rejected_N: np.ndarray) -> dict:
  """Pair accuracy (p_c > p_r, a tie counted half; 0.5 without pairs) and the pair count."""
  prob_M = np.asarray(prob_BU, np.float64).reshape(-1)
  chosen_p, rejected_p = prob_M[np.asarray(chosen_N, int)], prob_M[np.asarray(rejected_N, int)]
  right = (chosen_p > rejected_p) + 0.5 * (chosen_p == rejected_p)
  return {"prm/held_out_pair_accuracy": float(right.mean()) if right.size else 0.5,
          "prm/held_out_pairs": float(right.size)}


def sibling_pairs_of(data) -> tuple[np.ndarray, np.ndarray]:
  """(chosen_N, rejected_N) of `labelled_rows`' bradley_terry data; ConfigError without any."""
  chosen_N, rejected_N = process.sibling_pairs(data["label_BU"], data["mask_BU"],
                                               data["group_BU"])
  if not chosen_N.size:
    raise configs.ConfigError(
        "prm.loss=bradley_terry found no sibling steps with different labels; raise "
        "prm.continuations or prm.train_prompts")
  return chosen_N, rejected_N


def train_prm(config, mesh, graphdef, params, train_data, eval_data):
  """Trains the PRM on train_data; returns (params, history, held-out figures)."""
  pc = config.prm
  head_graphdef, head_params = heads.policy_step_head(graphdef, params, seed=config.seed + 1)
  prm_params = {"backbone": params, "head": head_params}
  tx = optax.adam(pc.lr)
  state, shardings = sharding.create_train_state(prm_params, tx, mesh, config.sharding_rules)
  update_step = jax.jit(make_update_step(graphdef, head_graphdef, tx, loss=pc.loss),
                        donate_argnames="state", out_shardings=(shardings, None))
  rows, rng = sharding.batch_sharding(mesh), np.random.default_rng(config.seed)
  n, history = len(train_data["tokens_BT"]), []
  if pc.loss == "bradley_terry":
    chosen_N, rejected_N = sibling_pairs_of(train_data)
    n = len(chosen_N)
  for step in range(1, pc.steps + 1):
    if pc.loss == "bce":
      pick = rng.choice(n, size=pc.batch_size, replace=n < pc.batch_size)
      batch = {k: train_data[k][pick] for k in ROW_KEYS}
    else:
      pairs = max(pc.batch_size // 2, 1)
      pick = rng.choice(n, size=pairs, replace=n < pairs)
      batch = pair_batch(train_data, chosen_N[pick], rejected_N[pick])
    state, metrics = update_step(state, jax.device_put(batch, rows))
    history.append({k: float(v) for k, v in jax.device_get(metrics).items()
                    if k.startswith("prm/")})
  logits = jax.jit(make_scorer(graphdef, head_graphdef))
  # Held-out rows in chunks of prm.batch_size (one compiled shape; the last chunk is padded
  # by repeating the last row, dropped after), so a pod-scale eval set fits like a training batch.
  m, probs = len(eval_data["tokens_BT"]), []
  for lo in range(0, m, pc.batch_size):
    index = np.minimum(np.arange(lo, lo + pc.batch_size), m - 1)
    chunk = jax.device_put({k: eval_data[k][index] for k in ROW_KEYS}, rows)
    probs.append(np.asarray(jax.device_get(jax.nn.sigmoid(logits(state.params, chunk)))))
  prob_BU = np.concatenate(probs)[:m]
  root_B = eval_data.get("root_B", np.ones(m, np.float32))   # bce's rows are all roots
  figures = held_out_figures(prob_BU, eval_data["label_BU"],
                             eval_data["mask_BU"] * root_B[:, None])
  if pc.loss == "bradley_terry":
    figures |= pair_figures(prob_BU, *process.sibling_pairs(
        eval_data["label_BU"], eval_data["mask_BU"], eval_data["group_BU"]))
  return state.params, history, figures


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def check_labels(config) -> None:
  """ConfigError unless prm.labels and prm.loss fit the task: checked labels need an env whose
  infos carry step_ok, and have no forks, hence no sibling pairs for bradley_terry."""
  pc, tc = config.prm, config.task
  if pc.labels != "checked":
    return
  configs.require(tc.name == "hidden_rule" and tc.family in hidden_rule.CHECKED_FAMILIES,
                  f"config.prm.labels=checked needs an env that checks its steps "
                  f"(info['step_ok']): task.name='hidden_rule' with task.family in "
                  f"{hidden_rule.CHECKED_FAMILIES}, got {tc.name!r} / {tc.get('family')!r}")
  configs.require(pc.loss == "bce", "config.prm.labels=checked with prm.loss=bradley_terry: "
                  "a checked rollout has no forks, so no sibling steps to pair; use "
                  "prm.loss=bce or MC labels (prm.labels=hard/soft)")


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """Label, train and evaluate the PRM; writes metrics.jsonl, <workdir>/prm and summary.json."""
  rl_config.validate(config, SCHEMA)
  configs.require(config.lora.rank == 0, f"config.lora.rank ({config.lora.rank}) must be 0: "
                  "the PRM trains its whole backbone")
  check_labels(config)
  start = rundir.write_config(config, workdir, experiment="prm")
  pc, mesh = config.prm, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Warm-started policy: the labeller's rollouts and the PRM's initial backbone.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  engine = recipe.rollout_engine(config, graphdef, tok)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok,
                                       engine=engine)

  # ---- Step labels (MC or checked) on training and held-out seeds.
  rng = jax.random.key(config.seed)
  train_seeds = recipe.prompt_stream(make_env).take(pc.train_prompts)
  train_data, train_stats = labelled_rows(
      config, engine, tok, make_env, params, [e["seed"] for e in train_seeds],
      jax.random.fold_in(rng, 0))
  eval_seeds = [recipe.EVAL_SEED_BASE + i for i in range(pc.eval_prompts)]
  eval_data, eval_stats = labelled_rows(config, engine, tok, make_env, params, eval_seeds,
                                        jax.random.fold_in(rng, 1))

  # ---- The PRM.
  prm_params, history, figures = train_prm(config, mesh, graphdef, params, train_data,
                                           eval_data)
  writer = metrics_lib.Writer(workdir, total_steps=pc.steps, console=False)
  writer.write(0, {f"prm/train_{k}": v for k, v in train_stats.items()}
               | {f"prm/eval_{k}": v for k, v in eval_stats.items()})
  for step, record in enumerate(history, 1):
    writer.write(step, record | (figures if step == pc.steps else {}))
  writer.close()
  info = {"steps": pc.steps, "train_loss": history[-1]["prm/loss"],
          **{k.removeprefix("prm/"): v for k, v in figures.items()}}
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "prm"), save_every=1, keep=1,
                                 async_save=False)
  ckpt.save(pc.steps, {"params": prm_params}, info, force=True)
  ckpt.close()
  summary = {**info, "train_labelled_steps": train_stats["labelled_steps"],
             "eval_labelled_steps": eval_stats["labelled_steps"],
             "policy_success": train_stats["success"], "sft": sft_info.get("success"),
             "seconds": time.perf_counter() - start}
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  ranked = (f"pair accuracy {info['held_out_pair_accuracy']:.1%} over "
            f"{info['held_out_pairs']:.0f} sibling pairs" if pc.loss == "bradley_terry" else
            f"step accuracy {info['held_out_step_accuracy']:.1%} (base rate "
            f"{info['held_out_base_rate']:.1%})")
  print(f"PRM ({pc.labels} labels, {pc.loss}): {pc.steps} steps, held-out {ranked}, AUC "
        f"{info['held_out_auc']:.3f} over {eval_stats['labelled_steps']:.0f} steps -> "
        f"{workdir}", flush=True)
  return summary


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
