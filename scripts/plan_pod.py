# pylint: disable=invalid-name
r"""Plans a pod run without the pod: compiles agentrl's real steps for a TPU topology or GPUs.

  pip install -e '.[tpu-plan]'          # libtpu: compiles for TPUs, needs none attached
  pip install -e '.[gpu-plan]'          # the CUDA PJRT plugin, without NVIDIA's libraries
  python scripts/plan_pod.py --topology=v5e:2x2 \
      --config=experiments/policy/grpo.py:pod --config.model.variant=smollm2-135m
  python scripts/plan_pod.py --topology=v5p:4x4x4 --config.model.variant=qwen2.5-7b \
      --config.model.remat=True --bisect
  python scripts/plan_pod.py --topology=v5e:2x2 --num_slices=2 --config.mesh.data=2 ...
  python scripts/plan_pod.py --topology=8xh100 --config.model.variant=qwen2.5-7b ...

JAX compiles a sharded program for a TPU topology with no TPU attached, from the `libtpu`
wheel (`jax.experimental.topologies`, as MaxText's train_compile.py does). The experiment
config (--config, default GRPO's `pod` preset, with its --config.<key> overrides) is the
recipe: the model (`model.variant`, a preset of agentrl/models/presets.py, built abstractly,
no weights; `model.dtype`, `model.remat`, `model.attention`, `model.decode_attention`), LoRA
or full training (`lora.rank`; a scratch config's width/depth overrides are not read: the preset's sizes
are planned), the mesh (`mesh.data/fsdp/tensor`) and the sharding rules, and the shapes:
`rollout.prompts_per_step` x `rollout.group_size` rows of `rollout.max_len` tokens, split into
`updates.minibatches`. The programs (--programs) are the ones the experiment runs:

  update   the experiment file's own `make_update_step(config, graphdef, tx)` (its loss, the
           fused log-prob, the optimizer with gradient clipping) under
           `loop.skip_nonfinite`, jitted as the experiment jits it (state donated, state
           shardings out), on one minibatch;
  score    `loop.make_score_step` (pi_old, and pi_ref when the loss has a KL term) on one
           of the `updates.score_minibatches` row parts of the step's batch;
  prefill  the rollout engine's prefill of `rollout.slots` rows of the prompt budget
           (max_len - max_new_tokens) into the KV cache;
  decode   the engine's chunk of decode steps over `rollout.slots` slots and a cache of
           max_len columns (the LoRA adapters merged, as the engine samples).

Each prints, per chip, what XLA's buffer assignment reserves (`compiled.memory_analysis()`):
arguments, outputs, temporaries and code, their total (less the donated inputs' aliases), and
the collectives in the compiled HLO; with the train state held during rollouts (the learner
and the sampler share the chips), the rollout programs' totals include the optimizer state
they do not touch. The last line is `fits: yes, <x> GiB of <y> GiB per chip` (the largest
total) or `fits: no, ...`. A program whose buffers exceed the chip's memory fails to compile
on TPU ("Ran out of memory"); that is a plan that does not fit, reported with XLA's numbers.
--bisect then finds the largest prompts_per_step (in steps of the row-sharded device count)
whose programs all fit. --json=<file> also writes every figure in bytes.

GPU targets (`<GPUs per host>x<card>`: 8xh100, 1xh200, 8xa100-80, 8xa100-40; --num_slices
hosts) compile the same way through the CUDA PJRT plugin, for the card's GpuTargetConfigProto
(gpu_targets/, from XLA's device specs). An over-budget GPU compile does not fail: the verdict
compares the totals with the share of the card JAX's allocator takes (its
XLA_PYTHON_CLIENT_MEM_FRACTION, default 0.75), and the code column is 0 (XLA does not count
the kernels' binaries). A GPU plan traces as a GPU run does (`gpu_tracing`): cuDNN's flash
attention for `model.attention=fused`, the Pallas GPU log-prob kernel for `auto`; the kernels
column lists the custom calls in the HLO. A TPU plan keeps the host's pick, the XLA log-prob.
"""
import os

if __name__ == "__main__":
  # The plan compiles for a target, never on the host's accelerator; with the platforms set to
  # the CPU the CUDA plugin registers (for its topologies) without loading NVIDIA's libraries.
  os.environ.setdefault("JAX_PLATFORMS", "cpu")

# pylint: disable=g-import-not-at-top,wrong-import-position
import contextlib
import dataclasses
import functools
import importlib
import json
import math
import re
import time
from unittest import mock

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
from ml_collections import config_flags

from agentrl import sharding
from agentrl import types
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.models import lora
from agentrl.models import presets
from agentrl.models import transformer
from agentrl.rollout import engine as engine_lib
from agentrl.rollout import sampler as sampler_lib
from agentrl.train import loop
# pylint: enable=g-import-not-at-top,wrong-import-position

_CONFIG = config_flags.DEFINE_config_file("config", "experiments/policy/grpo.py:pod",
                                          "The experiment config: the recipe to plan.")
_TOPOLOGY = flags.DEFINE_string(
    "topology", "v5e:2x2", "TPU generation:chips, e.g. v4:2x2x1, v5e:4x4, v5p:4x4x4, v6e:2x2; "
    "or GPUs per host x card, e.g. 8xh100, 1xh200, 8xa100-80, 8xa100-40.")
_NUM_SLICES = flags.DEFINE_integer("num_slices", 1, "Slices joined over the data-center network "
                                   "(GPU targets: hosts).")
_PROGRAMS = flags.DEFINE_list("programs", ["update", "score", "prefill", "decode"],
                              "Programs to compile.")
_BISECT = flags.DEFINE_bool("bisect", False, "Find the largest prompts_per_step that fits.")
_HBM_GIB = flags.DEFINE_float("hbm_gib", 0.0, "Memory per chip (0: a TPU generation's HBM_GIB, "
                              "a GPU card's JAX allocator share).")
_JSON = flags.DEFINE_string("json", "", "Also write the plans (bytes per chip) to this file.")

PROGRAMS = ("update", "score", "prefill", "decode")
# HBM per chip in GiB by generation (Google Cloud's TPU system architecture pages).
HBM_GIB = {"v4": 32.0, "v5e": 16.0, "v5p": 95.0, "v6e": 32.0}
# GPU cards by the name --topology takes (<per host>x<card>): their GpuTargetConfigProto files.
GPU_SPECS = {"h100": "h100_sxm.txtpb", "h200": "h200.txtpb", "a100-80": "a100_sxm_80.txtpb",
             "a100-40": "a100_sxm_40.txtpb"}
GPU_SPECS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_targets")
# The share of a card JAX's GPU allocator takes unless XLA_PYTHON_CLIENT_MEM_FRACTION says.
JAX_GPU_MEM_FRACTION = 0.75
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
GIB = 2.0**30


@dataclasses.dataclass
class Plan:
  """One compiled program: per-chip bytes (None when it did not compile), its collectives."""
  name: str
  arguments: float = 0.0
  outputs: float = 0.0
  temporaries: float = 0.0
  code: float = 0.0
  aliased: float = 0.0
  held: float = 0.0          # resident state the program does not take (rollouts: optimizer)
  collectives: dict[str, int] = dataclasses.field(default_factory=dict)
  kernels: dict[str, int] = dataclasses.field(default_factory=dict)   # custom-call targets
  compile_s: float = 0.0
  error: str = ""

  @property
  def total(self) -> float:
    return (self.arguments + self.outputs + self.temporaries + self.code - self.aliased
            + self.held)


def gpu_target(topology: str) -> tuple[int, str] | None:
  """(GPUs per host, card) of a GPU target such as 8xh100; None for a TPU topology."""
  match = re.fullmatch(r"(\d+)x([a-z][\w-]*)", topology.lower())
  if not match:
    return None
  if match[2] not in GPU_SPECS:
    raise app.UsageError(f"--topology={topology}: no GPU card {match[2]!r}; use one of "
                         f"{sorted(GPU_SPECS)}, e.g. 8xh100")
  return int(match[1]), match[2]


def gpu_spec(card: str) -> str:
  with open(os.path.join(GPU_SPECS_DIR, GPU_SPECS[card])) as f:
    return f.read()


def topology_devices(name: str, num_slices: int):
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  gpu = gpu_target(name)
  if gpu:
    per_host, card = gpu
    try:
      topo = topologies.get_topology_desc(platform="cuda", target_config=gpu_spec(card),
                                          topology=f"1x{num_slices}x{per_host}")
    except Exception as e:  # pylint: disable=broad-except
      raise app.UsageError(f"--topology={name}: {str(e).splitlines()[0]} (is the CUDA PJRT "
                           "plugin installed? pip install -e '.[gpu-plan]')") from None
    return topo.devices
  try:
    topo = topologies.get_topology_desc(platform="tpu", topology_name=name,
                                        num_slices=num_slices)
  except Exception as e:  # pylint: disable=broad-except
    raise app.UsageError(f"--topology={name}: {str(e).splitlines()[0]} (is libtpu installed? "
                         "pip install -e '.[tpu-plan]'; names look like v5e:2x2)") from None
  return topo.devices


def gpu_tracing(card: str) -> contextlib.ExitStack:
  """Traces the programs as a run on `card` does. agentrl picks kernels by
  `jax.default_backend()`, the host's CPU here: on a GPU `model.attention=fused` takes cuDNN's
  flash attention and the log-prob op's `auto` its Pallas GPU kernel. Tracing cuDNN attention,
  JAX asks the installed cuDNN for its version and the attached GPU for its compute capability;
  with neither here, the card's spec answers."""
  # pylint: disable-next=g-import-not-at-top
  from jax._src.cudnn import fused_attention_stablehlo as cudnn
  spec = gpu_spec(card)
  major, minor, patch = map(int, re.search(
      r"dnn_version_info \{\s*major: (\d+)\s*minor: (\d+)\s*patch: (\d+)", spec).groups())
  cc = re.search(r"cuda_compute_capability \{\s*major: (\d+)(?:\s*minor: (\d+))?", spec)
  card_cc = (int(cc[1]), int(cc[2] or 0))
  wanted = lambda capability: tuple(int(x) for x in capability.split("."))
  stack = contextlib.ExitStack()
  for module, name, value in (
      (jax, "default_backend", lambda: "gpu"),
      (cudnn, "check_cudnn_version", lambda: major * 10000 + minor * 100 + patch),
      (cudnn, "check_compute_capability", lambda c: card_cc >= wanted(c)),
      (cudnn, "is_cuda_compute_capability_equal", lambda c: card_cc == wanted(c))):
    stack.enter_context(mock.patch.object(module, name, value))
  return stack


def hbm_gib(topology: str) -> float:
  """Memory per chip: a TPU generation's HBM, or the share of a GPU card JAX's allocator takes."""
  if _HBM_GIB.value:
    return _HBM_GIB.value
  gpu = gpu_target(topology)
  if gpu:
    card_bytes = int(re.search(r"device_memory_size: (\d+)", gpu_spec(gpu[1]))[1])
    fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", JAX_GPU_MEM_FRACTION))
    return card_bytes * fraction / GIB
  generation = topology.split(":")[0]
  if generation not in HBM_GIB:
    raise app.UsageError(f"no HBM size known for {generation!r} ({sorted(HBM_GIB)}); pass "
                         "--hbm_gib")
  return HBM_GIB[generation]


def model_config(config) -> transformer.Config:
  mc = config.model
  if mc.variant not in presets.PRESETS:
    raise app.UsageError(f"config.model.variant={mc.variant!r} is not a model preset; use one "
                         f"of {sorted(presets.PRESETS)}")
  return transformer.Config.named(mc.variant, dtype=mc.dtype, remat=mc.get("remat", False),
                                  attention=mc.get("attention", "xla"),
                                  decode_attention=mc.get("decode_attention", "xla"))


def abstract_policy(config, cfg, mesh, tx):
  """(graphdef, abstract TrainState, its shardings) of the policy the experiment trains."""
  spec = rl_config.lora_config(config.get("lora"))

  def new_model():
    model = transformer.Transformer(cfg, rngs=nnx.Rngs(0))
    return model if spec is None else lora.LoraTransformer(
        model, lora.Adapters(cfg, spec, rngs=nnx.Rngs(1)))

  state, shardings = sharding.abstract_train_state(new_model, tx, mesh, config.sharding_rules)
  return nnx.split(nnx.eval_shape(new_model))[0], state, shardings


def sharded(tree, shardings):
  """ShapeDtypeStructs of `tree` carrying `shardings` (a matching tree or one sharding)."""
  if isinstance(shardings, jax.sharding.Sharding):
    shardings = jax.tree.map(lambda _: shardings, tree)
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                      tree, shardings)


def abstract_batch(rows: int, length: int, mesh, *, with_ref: bool) -> types.Batch:
  sds = lambda dtype: jax.ShapeDtypeStruct((rows, length), dtype,
                                           sharding=sharding.batch_sharding(mesh))
  f32 = sds(jnp.float32)
  return types.Batch(tokens_BT=sds(jnp.int32), positions_BT=sds(jnp.int32),
                     input_mask_BT=sds(jnp.bool_), loss_mask_BT=f32, adv_BT=f32,
                     old_logp_BT=f32, sampler_logp_BT=f32, ref_logp_BT=f32 if with_ref else None)


def nbytes(tree) -> float:
  """Bytes per chip of an abstract sharded tree."""
  total = 0.0
  for x in jax.tree.leaves(tree):
    total += jnp.dtype(x.dtype).itemsize * math.prod(x.sharding.shard_shape(x.shape))
  return total


def compile_plan(name: str, lower, held: float = 0.0) -> Plan:
  """Compiles `lower()` and reads its buffer assignment; a compile that runs out of the chip's
  memory is a plan that does not fit, not a crash."""
  plan = Plan(name, held=held)
  start = time.perf_counter()
  try:
    compiled = lower().compile()
  except Exception as e:  # pylint: disable=broad-except
    message = str(e)
    if "RESOURCE_EXHAUSTED" not in message and "out of memory" not in message.lower():
      raise
    plan.error = next((line.strip() for line in message.splitlines()
                       if "memory" in line.lower()), message.splitlines()[0])[:300]
    plan.compile_s = time.perf_counter() - start
    return plan
  plan.compile_s = time.perf_counter() - start
  m = compiled.memory_analysis()
  plan.arguments, plan.outputs = m.argument_size_in_bytes, m.output_size_in_bytes
  plan.temporaries, plan.code = m.temp_size_in_bytes, m.generated_code_size_in_bytes
  plan.aliased = m.alias_size_in_bytes
  hlo = compiled.as_text()
  for op in COLLECTIVES:
    count = len(re.findall(rf"\s{op}(?:-start)?\(", hlo))
    if count:
      plan.collectives[op] = count
  for target in re.findall(r'custom_call_target="([^"]+)"', hlo):
    plan.kernels[target] = plan.kernels.get(target, 0) + 1
  return plan


def plan_programs(config, mesh, programs) -> list[Plan]:
  """Compiles the chosen programs of `config`'s recipe on `mesh`."""
  rc, mc = config.rollout, config.model
  path = os.path.relpath(
      config_flags.get_config_filename(flags.FLAGS["config"]).partition(":")[0])
  experiment = importlib.import_module(path.removesuffix(".py").replace(os.sep, "."))
  cfg = model_config(config)
  tx = recipe.make_optimizer(config.optim)
  graphdef, state, state_sh = abstract_policy(config, cfg, mesh, tx)
  with_ref = config.loss.get("kl_coef", 0.0) > 0
  rows = rc.prompts_per_step * rc.group_size
  minibatch = rows // config.updates.minibatches
  state_in = sharded(state, state_sh)
  opt_bytes = nbytes(sharded(state.opt_state, state_sh.opt_state))
  plans = []
  with jax.set_mesh(mesh):
    if "update" in programs:
      step = loop.skip_nonfinite(experiment.make_update_step(config, graphdef, tx))
      jitted = jax.jit(step, donate_argnames="state", out_shardings=(state_sh, None))
      batch = abstract_batch(minibatch, rc.max_len, mesh, with_ref=with_ref)
      plans.append(compile_plan("update", lambda: jitted.lower(state_in, batch)))
    if "score" in programs:
      score = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                           logprob_impl=mc.logprob_impl, with_ref=with_ref))
      ref = (None if not with_ref or lora.has_adapters(state.params) else state_in.params)
      batch = abstract_batch(rows // config.updates.get("score_minibatches", 1), rc.max_len,
                             mesh, with_ref=False)
      plans.append(compile_plan("score", lambda: score.lower(state_in.params, ref, batch),
                                held=opt_bytes))
    rollout = [p for p in ("prefill", "decode") if p in programs]
    if rollout:
      plans += plan_rollout(config, cfg, mesh, rollout, opt_bytes)
  return plans


def plan_rollout(config, cfg, mesh, programs, held) -> list[Plan]:
  """The engine's prefill and decode programs over a sharded KV cache; a LoRA policy samples
  with its adapters merged into the base weights, as the engine does, so these take the base
  Transformer's params."""
  rc = config.rollout
  with jax.set_mesh(mesh), nnx.logical_axis_rules(
      sharding.complete_rules(config.sharding_rules)):
    base_graphdef, params = nnx.split(nnx.eval_shape(
        lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0))))
  params_sh = sharding.tree_shardings(params, mesh, config.sharding_rules)
  engine = engine_lib.Engine(base_graphdef, pad_id=0, slots=rc.slots, unroll_layers=False)
  prefill, decode = engine.step_programs
  rows_axes = sharding.ROWS
  kv_axis = "tensor" if cfg.kv_heads % mesh.shape["tensor"] == 0 else None
  columns = sampler_lib.bucket(rc.max_len + engine.chunk, 32)
  cache = jax.eval_shape(functools.partial(transformer.init_cache, cfg, rc.slots, columns))
  cache = sharded(cache, transformer.KVCache(
      NamedSharding(mesh, P(None, rows_axes, kv_axis)),
      NamedSharding(mesh, P(None, rows_axes, kv_axis)),
      NamedSharding(mesh, P(rows_axes)), NamedSharding(mesh, P(rows_axes))))
  p_in = sharded(params, params_sh)
  rows = NamedSharding(mesh, P(rows_axes))
  one = NamedSharding(mesh, P())
  vec = lambda dtype, *shape: jax.ShapeDtypeStruct((rc.slots, *shape), dtype, sharding=rows)
  scalar = lambda dtype, *shape: jax.ShapeDtypeStruct(shape, dtype, sharding=one)
  plans = []
  if "prefill" in programs:
    prompt = sampler_lib.bucket(rc.max_len - rc.max_new_tokens, 16)
    args = (vec(jnp.int32), vec(jnp.bool_), vec(jnp.int32, prompt), vec(jnp.int32, prompt),
            vec(jnp.bool_, prompt), vec(jnp.int32), vec(jnp.int32), scalar(jnp.int32))
    plans.append(compile_plan("prefill", lambda: prefill.lower(p_in, None, cache, *args),
                              held=held))
  if "decode" in programs:
    key_data = jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0)))
    args = (scalar(jnp.int32), *(vec(jnp.int32) for _ in range(2)), vec(jnp.bool_),
            vec(jnp.int32), vec(key_data.dtype, *key_data.shape),
            *(vec(jnp.int32) for _ in range(2)), vec(jnp.bool_), vec(jnp.int32),
            vec(jnp.int32, 2),
            jax.eval_shape(lambda: jax.random.key(0)), scalar(jnp.float32),
            scalar(jnp.float32), None)
    plans.append(compile_plan(
        "decode", lambda: decode.lower(p_in, None, cache, *args, num_steps=engine.chunk,
                                       top_k=0, use_top_p=False, logp_mode="tempered"),
        held=held))
  return plans


def table(plans: list[Plan], hbm: float) -> str:
  lines = ["| program | arguments | outputs | temporaries | code | held | total (GiB/chip) | "
           "of HBM | collectives | kernels | compile s |", "|---|" + "---:|" * 7 + "---|---|---:|"]
  counts = lambda d: ", ".join(f"{n} {name}" for name, n in d.items()) or "none"
  for p in plans:
    if p.error:
      lines.append(f"| {p.name} | does not fit: {p.error} |" + " |" * 8 + f" {p.compile_s:.0f} |")
      continue
    g = lambda b: f"{b / GIB:.2f}"
    lines.append(f"| {p.name} | {g(p.arguments)} | {g(p.outputs)} | {g(p.temporaries)} | "
                 f"{g(p.code)} | {g(p.held)} | {g(p.total)} | {p.total / GIB / hbm:.0%} | "
                 f"{counts(p.collectives)} | {counts(p.kernels)} | {p.compile_s:.0f} |")
  return "\n".join(lines)


def verdict(plans: list[Plan], hbm: float) -> tuple[bool, str]:
  failed = [p.name for p in plans if p.error]
  worst = max(plans, key=lambda p: p.total)
  if failed:
    return False, f"fits: no, {', '.join(failed)} ran out of the chip's {hbm:g} GiB"
  if worst.total / GIB > hbm:
    return False, f"fits: no, {worst.total / GIB:.2f} GiB of {hbm:g} GiB per chip ({worst.name})"
  return True, f"fits: yes, {worst.total / GIB:.2f} GiB of {hbm:g} GiB per chip ({worst.name})"


def main(argv):
  del argv
  config = _CONFIG.value
  unknown = sorted(set(_PROGRAMS.value) - set(PROGRAMS))
  if unknown:
    raise app.UsageError(f"--programs: unknown {unknown}; choose from {PROGRAMS}")
  hbm = hbm_gib(_TOPOLOGY.value)
  devices = topology_devices(_TOPOLOGY.value, _NUM_SLICES.value)
  mesh = sharding.make_mesh(config.mesh, devices=devices)
  rc = config.rollout
  gpu = gpu_target(_TOPOLOGY.value)
  print(f"{_TOPOLOGY.value} x {_NUM_SLICES.value} {'host' if gpu else 'slice'}(s): "
        f"{len(devices)} chips "
        f"({devices[0].device_kind}, {hbm:g} GiB each), mesh {dict(mesh.shape)}; "
        f"{config.model.variant} ({config.model.dtype}, remat={config.model.get('remat')}, "
        f"attention={config.model.get('attention')}), lora rank {config.lora.rank}; "
        f"{rc.prompts_per_step} x {rc.group_size} rows of {rc.max_len} tokens, "
        f"{config.updates.minibatches} minibatches (scored in "
        f"{config.updates.get('score_minibatches', 1)}); {rc.slots} decode slots", flush=True)
  with gpu_tracing(gpu[1]) if gpu else contextlib.nullcontext():
    plans = plan_programs(config, mesh, _PROGRAMS.value)
    print(table(plans, hbm))
    fits, line = verdict(plans, hbm)
    if _JSON.value:
      with open(_JSON.value, "w") as f:
        json.dump({"fits": fits, "hbm_gib": hbm, "plans": [
            {**dataclasses.asdict(p), "total": p.total} for p in plans]}, f, indent=1)
    if _BISECT.value:
      print(bisect(config, mesh, hbm, fits))
  print(line)


def bisect(config, mesh, hbm: float, fits: bool) -> str:
  """The largest prompts_per_step (a multiple of the row-sharded chips) whose programs fit."""
  step = max(1, mesh.shape["data"] * mesh.shape["fsdp"] // config.rollout.group_size)
  step *= config.updates.minibatches
  ok = lambda n: verdict(plan_programs(_with_prompts(config, n), mesh, _PROGRAMS.value),
                         hbm)[0]
  lo, hi = 0, config.rollout.prompts_per_step // step
  if fits:
    lo, hi = hi, hi * 2
    while ok(hi * step):
      lo, hi = hi, hi * 2
  while hi - lo > 1:
    mid = (lo + hi) // 2
    lo, hi = (mid, hi) if ok(mid * step) else (lo, mid)
    print(f"  bisect: {mid * step} prompts per step {'fit' if lo == mid else 'do not fit'}",
          flush=True)
  if not lo:
    return f"largest batch that fits: none (not even {step} prompts per step)"
  return (f"largest batch that fits: {lo * step} prompts per step x {config.rollout.group_size}"
          f" = {lo * step * config.rollout.group_size} rows of {config.rollout.max_len} tokens")


def _with_prompts(config, n: int):
  config = config.copy_and_resolve_references()
  with config.unlocked():
    config.rollout.prompts_per_step = n
  return config


if __name__ == "__main__":
  app.run(main)
