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

The config every RL experiment starts from (all keys but `loss`, which each experiment writes
out in full), its schema and its checks are `agentrl.harness.rl_config`'s.
"""
from collections.abc import Callable, Sequence
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
from agentrl.data import generators
from agentrl.data import stream
from agentrl.envs import registry
from agentrl.envs import verbose_arithmetic
from agentrl.harness import rl_config
from agentrl.harness import sft
from agentrl.models import hf
from agentrl.models import lora
from agentrl.models import presets
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.models import transformer
from agentrl.records import alarms
from agentrl.records import trajectories
from agentrl import sharding
from agentrl.rollout import collect
from agentrl.rollout import engine as engine_lib

# Held-out evaluation seeds: disjoint from every training, SFT and validation seed.
EVAL_SEED_BASE = generators.HELDOUT_START


def loop_options(config: mlc.ConfigDict) -> dict:
  """`loop.run`'s update, stop, evaluation and logging keywords from config.updates/eval/log."""
  lc = config.log
  wandb = {"project": lc.wandb_project, "config": config.to_dict()} if lc.wandb_project else None
  uc = config.updates
  return dict(epochs=uc.epochs, num_minibatches=uc.minibatches,
              score_minibatches=uc.get("score_minibatches", 1), eval_every=config.eval.every,
              # The newest `keep` checkpoints, and those of the evaluation steps (for
              # experiments.eval --config.step=N) when they were saved.
              save_every=lc.save_every, keep=lc.keep, keep_period=config.eval.every,
              tensorboard=lc.tensorboard, wandb=wandb,
              stop_after_skipped=uc.stop_after_skipped,
              stop_after_collapsed=uc.stop_after_collapsed, sort_by_length=uc.sort_by_length,
              max_staleness=uc.max_staleness, off_policy=uc.off_policy,
              off_policy_threshold=uc.off_policy_threshold,
              trajectories=trajectory_settings(config), replay_batch=config.get("replay_batch", ""),
              alarms=alarm_settings(config))


def alarm_settings(config: mlc.ConfigDict) -> alarms.Settings | None:
  """The alarms' thresholds (config.alarms; None with alarms.enabled False)."""
  ac = config.get("alarms")
  if ac is None:
    return alarms.Settings()
  if not ac.enabled:
    return None
  try:
    return alarms.Settings(**{k: v for k, v in ac.items() if k != "enabled"})
  except ValueError as e:
    raise configs.ConfigError(f"config.alarms: {e}") from None


def trajectory_settings(config: mlc.ConfigDict) -> trajectories.Settings:
  """What the run records (config.log.trajectories_*): every -1 follows eval.every."""
  lc, rc = config.log, config.rollout
  every = lc.get("trajectories_every", -1)
  return trajectories.Settings(
      every=config.eval.every if every < 0 else every,
      rows_per_group=lc.get("trajectories_rows_per_group", 4),
      max_groups=lc.get("trajectories_groups", 16), keep=lc.get("trajectories_keep", 10),
      prompts_per_step=rc.prompts_per_step, full_batch=lc.get("trajectories_batch", True))


# ---------------------------------------------------------------------------------------------
# Task, policy, warm start, optimizer.
# ---------------------------------------------------------------------------------------------
def make_task(tc: mlc.ConfigDict) -> Callable[[], object]:
  """make_env() for config.task (`registry.factory`), built once now so that a bad name, key or
  argument fails up front, as a ConfigError that names it."""
  make_env = registry.factory(tc)
  try:
    make_env()
  except configs.ConfigError:
    raise
  except ValueError as e:  # the constructor's own check of its arguments
    raise configs.ConfigError(f"config.task (task.name={tc['name']!r}): {e}") from None
  return make_env


def model_config(mc: mlc.ConfigDict, vocab: int) -> transformer.Config:
  """The typed transformer Config of a scratch config.model for a tokenizer of `vocab` ids."""
  if mc.variant not in presets.PRESETS:
    raise configs.ConfigError(f"config.model.variant={mc.variant!r} is not a model preset; "
                              f"model.init='scratch' needs one of {sorted(presets.PRESETS)}")
  return transformer.Config.named(
      mc.variant, vocab=vocab, width=mc.width, depth=mc.depth, heads=mc.heads,
      kv_heads=mc.kv_heads, head_dim=mc.head_dim, mlp=mc.mlp,
      unroll_layers=mc.get("unroll_layers", False), remat=mc.get("remat", False),
      attention=mc.get("attention", "xla"), decode_attention=mc.get("decode_attention", "xla"))


def task_tokenizer(tc: mlc.ConfigDict) -> tokenizer_lib.Tokenizer:
  """The tokenizer a scratch model gets for its task (the registry row's `vocab`): built
  in-process from the env's own texts, deterministic."""
  row, kwargs = registry.check(tc), registry.constructor_kwargs(tc)
  if row.vocab is None:
    raise configs.ConfigError(f"config.model.init='scratch' has no tokenizer for task.name="
                              f"{tc.name!r} (open-ended texts); use model.init='gguf' or 'hf'")
  vocab = row.vocab(kwargs) if callable(row.vocab) else row.vocab
  if not isinstance(vocab, registry.Vocab):
    return vocab
  env = registry.factory(tc)()  # the row and its arguments were checked above
  lines = [env.system_prompt] if vocab.system and getattr(env, "system_prompt", "") else []
  lines += _episode_texts(env, range(vocab.seeds), bad=vocab.bad,
                          demonstrations=row.sft == "demonstrations")
  if hasattr(env, "close"):
    env.close()
  return tokenizer_lib.train_sentencepiece(lines, vocab.size, byte_fallback=vocab.byte_fallback)


def _episode_texts(env, seeds, *, bad: tuple, demonstrations: bool) -> list[str]:
  """The prompt of each of `env`'s episodes on `seeds`, its demonstrated actions and replies
  (noise 0.5) when it has `demonstrations`, and its first reply to each action in `bad`: the
  corpus of a task's scratch tokenizer."""
  lines = []
  for seed in seeds:
    lines.append(env.reset(seed))
    for action in (env.demonstration(seed, random.Random(seed), noise=0.5)
                   if demonstrations else ()):
      obs, _, done, _ = env.step(action)
      lines += [action, obs]
      if done:
        break
    for action in bad:
      env.reset(seed)
      lines.append(env.step(action)[0])
  return lines


def build_policy(config: mlc.ConfigDict, mesh) -> tuple[tokenizer_lib.Tokenizer,
                                                         nnx.GraphDef, nnx.State]:
  """(tokenizer, graphdef, params) for config.model, params sharded on `mesh`.

  Every init refuses a tokenizer with more ids than the model has embedding rows
  (`hf.check_vocab`); gguf/hf also refuse a model.variant that is not the file's architecture
  (`check_variant`).
  """
  mc, rules = config.model, config.sharding_rules
  if mc.init == "scratch":
    tok = task_tokenizer(config.task)
    cfg = model_config(mc, tok.vocab_size)
    hf.check_vocab(cfg, tok, model=f"config.model (init='scratch', variant={mc.variant!r})",
                   tokenizer=f"(built for task.name={config.task.name!r})")
    graphdef, params = sharding.create_sharded(
        lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(config.seed)), mesh, rules)
    return tok, *_with_lora(config, mesh, cfg, graphdef, params)
  path = mc.path or hf.smollm2_path()
  check_variant(mc.variant, hf.config_of(path), path)
  print(f"Loading {path} ({mc.dtype}) ...", flush=True)
  start = time.perf_counter()
  tok, cfg, graphdef, params = hf.load_with_tokenizer(
      path, dtype=mc.dtype, unroll_layers=mc.get("unroll_layers", False),
      remat=mc.get("remat", False), attention=mc.get("attention", "xla"),
      decode_attention=mc.get("decode_attention", "xla"))
  print(f"Loaded {_preset_of(cfg) or 'a model'} ({_architecture(cfg)}; vocab={cfg.vocab}, "
        f"tokenizer {tok.vocab_size} ids) in {time.perf_counter() - start:.0f}s.", flush=True)
  params = sharding.reshard(params, sharding.tree_shardings(params, mesh, rules))
  return tok, *_with_lora(config, mesh, cfg, graphdef, params)


def _architecture(cfg: transformer.Config) -> str:
  return ", ".join([cfg.family] + [f"{k}={getattr(cfg, k)}" for k in presets.ARCHITECTURE])


def _preset_of(cfg: transformer.Config) -> str | None:
  """The first preset with `cfg`'s architecture, or None."""
  return next((name for name in presets.PRESETS
               if _architecture(transformer.Config.named(name)) == _architecture(cfg)), None)


def check_variant(variant: str, cfg: transformer.Config, path: str) -> None:
  """ConfigError unless config.model.variant is "auto" or the preset of the file's architecture.

  A pretrained model's size comes from its file; the variant only names it (in config.json and
  the logs), so a variant the file contradicts would mislabel the run.
  """
  if variant == "auto":
    return
  if variant not in presets.PRESETS:
    raise configs.ConfigError(f"config.model.variant={variant!r} is neither 'auto' nor a model "
                              f"preset ({sorted(presets.PRESETS)})")
  want = _architecture(transformer.Config.named(variant))
  if want != _architecture(cfg):
    match = _preset_of(cfg)
    fix = (f"--config.model.variant={match}, the preset it matches, or auto" if match
           else "--config.model.variant=auto (no preset matches it)")
    raise configs.ConfigError(f"config.model.variant={variant!r} ({want}) does not match {path}, "
                              f"which holds ({_architecture(cfg)}); set {fix}")


def _with_lora(config: mlc.ConfigDict, mesh, cfg, graphdef, params):
  """(graphdef, params), with fresh adapters (born sharded) over them if config.lora asks."""
  spec = rl_config.lora_config(config.get("lora"))
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
               engine: engine_lib.Engine | None = None,
               data: sft.Data | None = None) -> tuple[nnx.State, dict]:
  """SFT (config.sft) for a scratch model; cached in <workdir>/warm_start for resumed runs.

  The task's registry row says what to train on (`registry.Row.sft`): arithmetic its gold
  answers; an env with demonstrations (hidden_rule, thinker, tool_use, calculator, textworld,
  verbose_arithmetic) its scripted episodes (`sft.demonstration_data`; the noise is
  sft.demo_noise; verbose answers carry random filler), with validation success measured by
  greedy rollouts of `engine` (built here if None); `data` replaces the task's own SFT data
  (an experiment's demonstrations, e.g. experiments/agents/ttexplore.py's thinker turns).
  Pretrained models (model.init gguf/hf) and the envs with neither are returned as they are,
  with info {}.
  """
  how = registry.check(config.task).sft
  if config.model.init != "scratch":
    return params, {}
  replaying = bool(config.get("replay_batch", ""))
  if replaying and not lora.has_adapters(params):
    print("SFT warm start: skipped: a replay restores every parameter from the run's "
          "checkpoint.", flush=True)
    return params, {}
  if data is None and not how:
    print(f"SFT warm start: skipped, task.name={config.task.name!r} has no demonstrations; RL "
          "starts from the initial model.", flush=True)
    return params, {}
  if lora.has_adapters(params):  # SFT trains the base; the fresh adapters go on top of it
    base, info = warm_start(config, workdir, mesh, *lora.detach(graphdef, params), tok,
                            data=data)
    return lora.with_base(params, base), info
  if replaying:  # the frozen base under the adapters is the replayed run's own SFT result
    workdir = config.replay_batch.rpartition(":")[0]
    if not checkpoint.saved_steps(os.path.join(workdir, "warm_start")):
      raise configs.ConfigError(f"config.replay_batch={config.replay_batch!r}: {workdir} has "
                                "no warm_start/ checkpoint, the SFT base its LoRA adapters sit on")
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
  if data is not None:
    data = {"data": data}
  elif how == "demonstrations":
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

  demo_env = functools.partial(make_env, **registry.check(tc).demo_kwargs)
  return sft.demonstration_data(tok, demo_env, batch_size=sc.batch_size, max_len=rc.max_len,
                                chat_template=tc.chat_template, noise=sc.get("demo_noise", 0.0),
                                success=success)


def make_optimizer(oc: mlc.ConfigDict, *, lr: float | None = None) -> optax.GradientTransformation:
  """Global-norm clipping, then Adam (with a linear warmup when oc.warmup_steps > 0, and a
  linear decay to 0 at optimizer update oc.decay_steps when it is > 0).

  `lr` overrides oc.lr, e.g. for a second parameter group (PPO's critic).
  """
  peak = oc.lr if lr is None else lr
  warmup, decay = oc.warmup_steps, oc.get("decay_steps", 0)
  parts = ([optax.linear_schedule(0.0, peak, warmup)] if warmup else []) + (
      [optax.linear_schedule(peak, 0.0, decay - warmup)] if decay else [])
  if not parts:
    lr = peak
  else:
    lr = parts[0] if len(parts) == 1 else optax.join_schedules(parts, [warmup])
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
  state, experiments/policy/r2vpo.py). With `greedy_baseline` the extras also hold one greedy
  rollout's reward per prompt (ReMax).
  """
  rc, tc = config.rollout, config.task
  min_len = min(rc.min_len if min_len is None else min_len, rc.max_len)

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    return collect.env_rollout(engine, params, tok, make_env, seeds,
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
  return float(np.mean([collect.trajectory_success(t) for t in trajs]))


def evaluator(config: mlc.ConfigDict, engine, tok, make_env) -> Callable:
  """evaluate(params) -> {"success"}: held-out greedy success for `loop.run`'s evaluations;
  on a multi-turn env also "turns" and "valid_turns" (`collect.episode_metrics`)."""
  rc, tc = config.rollout, config.task
  multi_turn = registry.check(tc).multi_turn

  def evaluate(params):
    trajs = held_out_rollouts(
        engine, tok, make_env, params, num=config.eval.num_problems, max_turns=tc.max_turns,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, chat_template=tc.chat_template)
    metrics = collect.episode_metrics(trajs)
    return metrics if multi_turn else {"success": metrics["success"]}

  return evaluate


# ---------------------------------------------------------------------------------------------
# The efficiency and length experiments (docs/algorithms.md §12).
# ---------------------------------------------------------------------------------------------
# experiments/efficiency/ train on the verbose-answer arithmetic task by default
# (`use_verbose_task`), log the held-out greedy response length next to the success
# (`length_evaluator`), and read per-row rewards through the helpers below.

# Prompt (BOS + "123+456=") + a budget prompt "[12]" + the longest response, rounded up.
VERBOSE_MAX_LEN = 32


def use_verbose_task(c: mlc.ConfigDict) -> None:
  """Points an `rl_config` (cpu or smoke) at the verbose task, in place.

  The response budget is the longest demonstrated response plus one token, so the warm-started
  policy is never cut; max_len also holds a budget prompt (HBPO). Adam's lr is 3e-4: at the
  compact task's 1e-3, GRPO with one update per step lost held-out greedy success on this task
  (22.6% -> 7.2% in 40 steps of 32 prompts x 8), at 3e-4 it gained (22.6% -> 26.0% in 30).
  """
  c.task.name = "verbose_arithmetic"
  longest = verbose_arithmetic.response_tokens(c.task.digits)
  c.rollout.update(max_new_tokens=longest + 1, max_len=VERBOSE_MAX_LEN)
  c.optim.lr = 3e-4


def reject_preset(name: str, preset: str, presets: Sequence[str], why: str) -> None:
  """ConfigError for a preset the experiment does not support (one line, names the reason)."""
  if preset not in presets:
    raise configs.ConfigError(f"unknown {name} preset {preset!r}; use one of {tuple(presets)} "
                              f"(and smoke): {why}")


def parse_ints(key: str, text: str) -> list[int]:
  """The comma-separated positive increasing ints of config key `key` ("6,8,10,12")."""
  try:
    values = [int(v) for v in text.split(",")]
  except ValueError:
    values = []
  if not values or min(values) < 1 or sorted(set(values)) != values:
    raise configs.ConfigError(f"config.{key}={text!r} must be comma-separated increasing "
                              "positive integers, e.g. '6,8,10,12'")
  return values


def is_correct(reward_B: jax.Array) -> jax.Array:
  """Bool [B]: the outcome reward is a full success (binary verifiers give 1.0)."""
  return reward_B >= 1.0


def response_length(loss_mask_BT: jax.Array) -> jax.Array:
  """Float [B]: sampled tokens of each row (the stop token included)."""
  return (loss_mask_BT > 0).sum(axis=1).astype(jnp.float32)


def length_evaluator(config: mlc.ConfigDict, engine, tok, make_env) -> Callable:
  """evaluate(params) -> {"success", "response_tokens"} on the held-out seeds, greedy.

  `response_tokens` is the greedy responses' mean sampled tokens, what a length-aware method
  is meant to shorten without costing success.
  """
  rc, tc = config.rollout, config.task

  def evaluate(params):
    trajs = held_out_rollouts(
        engine, tok, make_env, params, num=config.eval.num_problems, max_turns=tc.max_turns,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, chat_template=tc.chat_template)
    return {"success": float(np.mean([collect.trajectory_success(t) for t in trajs])),
            "response_tokens": float(np.mean([t.loss_mask.sum() for t in trajs]))}

  return evaluate
