# pylint: disable=invalid-name
r"""A process reward model (PRM) on the hidden-rule game, labelled by Monte-Carlo continuations.

  python -m experiments.preference.prm
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
     continuations are its label source. The held-out prompts (seeds from recipe.EVAL_SEED_BASE,
     disjoint from training) are labelled the same way.
  3. The PRM is the warm-started policy's backbone with a fresh scalar `heads.StepHead` read at
     each step's end (Math-Shepherd trains its PRM from the base model), trained on the roots'
     labelled steps with per-step binary cross-entropy (`losses.process.step_bce`; soft labels
     are its targets as given), prm.steps Adam steps of prm.batch_size episodes.
  4. Held-out step accuracy ([p > 0.5] == [y > 0.5] over labelled steps), ROC AUC of p against
     [y > 0.5], and the base rate (accuracy of always predicting the majority label) for scale.

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
  # continuations: forks after each env reply (Math-Shepherd's N); labels: mc_labels' mode.
  c.prm = dict(train_prompts=256, eval_prompts=64, continuations=4, labels="hard", steps=300,
               batch_size=32, lr=1e-4)
  if arg.preset == "pod":
    c.prm.update(train_prompts=4096, eval_prompts=512, continuations=8, steps=1000,
                 batch_size=128, lr=1e-5)
  if arg.smoke:
    c.prm.update(train_prompts=2, eval_prompts=2, continuations=1, steps=2, batch_size=2)
  return c


SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    **registry.schema(registry.NAMES),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "prm.train_prompts": configs.Key(int, min=1),
    "prm.eval_prompts": configs.Key(int, min=1),
    "prm.continuations": configs.Key(int, min=1),
    "prm.labels": configs.Key(str, choices=process.LABEL_MODES),
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


def labelled_roots(config, engine, tok, make_env, params, seeds, rng):
  """The root rows of a branching rollout from `seeds`, packed, with their MC step labels.

  Returns (data, stats): data a dict of numpy arrays (tokens_BT, positions_BT, input_mask_BT,
  step_end_BU, label_BU, mask_BU) over the roots only (a fork's own steps have only itself as
  continuation); stats the labelling statistics.
  """
  rc, pc = config.rollout, config.prm
  max_steps = make_env().max_turns
  trajs, metrics = engine.run(
      params, tok, [make_env() for _ in seeds], list(seeds), rng=rng, max_turns=max_steps,
      max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, temperature=rc.temperature,
      chat_template=config.task.chat_template, brancher=make_brancher(pc.continuations))
  end_BU, _, labels_BU, mask_BU = step_labels(trajs, max_steps=max_steps, max_len=rc.max_len,
                                              mode=pc.labels)
  roots = list(range(len(seeds)))  # engine.run returns the roots first, in the seeds' order
  batch = pack.pack_numpy([trajs[i] for i in roots], max_len=rc.max_len, pad_id=tok.pad_id,
                          min_len=rc.max_len)
  data = {"tokens_BT": np.asarray(batch.tokens_BT), "positions_BT": np.asarray(batch.positions_BT),
          "input_mask_BT": np.asarray(batch.input_mask_BT), "step_end_BU": end_BU[roots],
          "label_BU": labels_BU[roots], "mask_BU": mask_BU[roots]}
  labelled = mask_BU[roots] > 0
  stats = {"rows": float(len(trajs)), "branches": metrics.get("rollout/branches", 0.0),
           "success": float(np.mean([collect.trajectory_success(trajs[i]) for i in roots])),
           "labelled_steps": float(labelled.sum()),
           "label_mean": float(labels_BU[roots][labelled].mean()) if labelled.any() else 0.0}
  return data, stats


# ---------------------------------------------------------------------------------------------
# The PRM: the policy's backbone and a step head.
# ---------------------------------------------------------------------------------------------
def make_scorer(graphdef, head_graphdef):
  """logits(params, data) -> [B, U] step logits of {"backbone", "head"} params."""
  logits = heads.policy_prm_logits(graphdef, head_graphdef)
  return lambda params, data: logits(params, data["tokens_BT"], data["positions_BT"],
                                     data["input_mask_BT"], data["step_end_BU"], data["mask_BU"])


def make_update_step(graphdef, head_graphdef, tx):
  """update_step(state, data): one Adam step on the labelled steps' mean cross-entropy."""
  logits = make_scorer(graphdef, head_graphdef)

  def loss_fn(params, data):
    loss_BU, metrics = process_loss.step_bce(logits(params, data), data["label_BU"],
                                             data["mask_BU"])
    loss = aggregation.masked_mean(loss_BU, data["mask_BU"])
    return loss, {"prm/loss": loss, "prm/step_accuracy": metrics["step_accuracy"]}

  return loop.gradient_step(loss_fn, tx)


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


def train_prm(config, mesh, graphdef, params, train_data, eval_data):
  """Trains the PRM on train_data; returns (params, history, held-out figures)."""
  pc = config.prm
  head_graphdef, head_params = heads.policy_step_head(graphdef, params, seed=config.seed + 1)
  prm_params = {"backbone": params, "head": head_params}
  tx = optax.adam(pc.lr)
  state, shardings = sharding.create_train_state(prm_params, tx, mesh, config.sharding_rules)
  update_step = jax.jit(make_update_step(graphdef, head_graphdef, tx), donate_argnames="state",
                        out_shardings=(shardings, None))
  rows, rng = sharding.batch_sharding(mesh), np.random.default_rng(config.seed)
  n, history = len(train_data["tokens_BT"]), []
  for step in range(1, pc.steps + 1):
    pick = rng.choice(n, size=pc.batch_size, replace=n < pc.batch_size)
    batch = jax.device_put({k: v[pick] for k, v in train_data.items()}, rows)
    state, metrics = update_step(state, batch)
    history.append({k: float(v) for k, v in jax.device_get(metrics).items()
                    if k.startswith("prm/")})
  logits = jax.jit(make_scorer(graphdef, head_graphdef))
  # Held-out rows in chunks of prm.batch_size (one compiled shape; the last chunk is padded
  # by repeating the last row, dropped after), so a pod-scale eval set fits like a training batch.
  m, probs = len(eval_data["tokens_BT"]), []
  for lo in range(0, m, pc.batch_size):
    index = np.minimum(np.arange(lo, lo + pc.batch_size), m - 1)
    chunk = jax.device_put({k: v[index] for k, v in eval_data.items()}, rows)
    probs.append(np.asarray(jax.device_get(jax.nn.sigmoid(logits(state.params, chunk)))))
  prob_BU = np.concatenate(probs)[:m]
  figures = held_out_figures(prob_BU, eval_data["label_BU"], eval_data["mask_BU"])
  return state.params, history, figures


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """Label, train and evaluate the PRM; writes metrics.jsonl, <workdir>/prm and summary.json."""
  rl_config.validate(config, SCHEMA)
  configs.require(config.lora.rank == 0, f"config.lora.rank ({config.lora.rank}) must be 0: "
                  "the PRM trains its whole backbone")
  start = rundir.write_config(config, workdir, experiment="prm")
  pc, mesh = config.prm, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Warm-started policy: the labeller's rollouts and the PRM's initial backbone.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  engine = recipe.rollout_engine(config, graphdef, tok)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok,
                                       engine=engine)

  # ---- MC labels on training and held-out seeds.
  rng = jax.random.key(config.seed)
  train_seeds = recipe.prompt_stream(make_env).take(pc.train_prompts)
  train_data, train_stats = labelled_roots(
      config, engine, tok, make_env, params, [e["seed"] for e in train_seeds],
      jax.random.fold_in(rng, 0))
  eval_seeds = [recipe.EVAL_SEED_BASE + i for i in range(pc.eval_prompts)]
  eval_data, eval_stats = labelled_roots(config, engine, tok, make_env, params, eval_seeds,
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
  print(f"PRM: {pc.steps} steps, held-out step accuracy {info['held_out_step_accuracy']:.1%} "
        f"(base rate {info['held_out_base_rate']:.1%}), AUC {info['held_out_auc']:.3f} over "
        f"{eval_stats['labelled_steps']:.0f} steps -> {workdir}", flush=True)
  return summary


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
