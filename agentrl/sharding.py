# pylint: disable=invalid-name
"""Device meshes, logical-axis sharding rules, and hand-written collectives (style.md C8).

The mesh has three axes: `data` (batch rows, params replicated), `fsdp` (batch rows too, and
params/optimizer state sharded ZeRO-3 style, Rajbhandari et al. 2020) and `tensor` (Megatron
tensor parallelism, Shoeybi et al. 2019: heads, MLP width and vocabulary). Models name their
parameter axes logically (`nnx.Param(..., out_sharding=("embed", "mlp"))`); one rules table
maps those names to mesh axes, as in flax lm1b and big_vision. `shard_map` is used only for
math whose communication is written by hand: the vocab-parallel log-prob here, which never
gathers the `[N, V]` logits or the vocabulary axis of the unembedding (Megatron's
vocab-parallel cross-entropy, kernels.md §8.5).

Multi-host (TPU pod slices, GPU clusters) uses JAX's own runtime: call `initialize_distributed()`
first thing in `main()`; every process then runs the same program on the global mesh.
"""
from collections.abc import Mapping
import functools
import math
import os
import pathlib
from typing import Any

from absl import logging
from flax import nnx
import jax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import jax.numpy as jnp

from agentrl import types
from kernels.logprob import ops

MESH_AXES = ("data", "fsdp", "tensor")
ROWS = ("data", "fsdp")  # batch rows (and flattened tokens) are split over both

# Every logical axis name used by agentrl.models, with its default placement. Names missing
# from a user's table are replicated (see `complete_rules`).
DEFAULT_RULES = (
    ("batch", ROWS),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("mlp", "tensor"),
    ("head_dim", None),
    ("layers", None),
)
LOGICAL_AXES = tuple(name for name, _ in DEFAULT_RULES)


# ---------------------------------------------------------------------------------------------
# Meshes.
# ---------------------------------------------------------------------------------------------
def _mesh_sizes(shape) -> list[int]:
  if isinstance(shape, Mapping) or hasattr(shape, "items"):
    given = dict(shape.items())
    unknown = sorted(set(given) - set(MESH_AXES))
    if unknown:
      raise ValueError(f"Unknown mesh axis name(s) {unknown} in mesh {given}; the axes are "
                       f"{MESH_AXES} (missing ones default to 1).")
    sizes = [given.get(name, 1) for name in MESH_AXES]
  else:
    sizes = list(shape)
    if len(sizes) != len(MESH_AXES):
      raise ValueError(f"Mesh shape {tuple(sizes)} must have {len(MESH_AXES)} entries, one "
                       f"per axis {MESH_AXES}.")
  for name, size in zip(MESH_AXES, sizes):
    if isinstance(size, bool) or not isinstance(size, int) or (size < 1 and size != -1):
      raise ValueError(f"Mesh axis {name!r} has size {size!r}; use a positive int or -1.")
  if sizes.count(-1) > 1:
    raise ValueError(f"Mesh {dict(zip(MESH_AXES, sizes))} has more than one -1; at most one "
                     "axis may take the remaining devices.")
  return sizes


def make_mesh(shape, *, axis_types=None, devices=None) -> jax.sharding.Mesh:
  """A `(data, fsdp, tensor)` mesh whose axis types are always pinned.

  Args:
    shape: `{"data": -1, "fsdp": 8}` (missing axes are 1; a ConfigDict works) or a 3-tuple.
      One entry may be -1: it takes the devices the others leave. The product must divide
      the device count; a smaller single-process mesh uses the first devices.
    axis_types: one `jax.sharding.AxisType` per axis, default all `Auto` (GSPMD propagation;
      a bare `jax.make_mesh` gives Explicit axes, which model code does not expect).
    devices: the devices to lay out (default `jax.devices()`, all processes' devices).
  """
  sizes = _mesh_sizes(shape)
  devices = list(jax.devices() if devices is None else devices)
  n = len(devices)
  fixed = math.prod(s for s in sizes if s != -1)
  named = dict(zip(MESH_AXES, sizes))
  if n % fixed:
    raise ValueError(f"Mesh {named} needs a multiple of {fixed} devices, but there are {n}; "
                     "change config.mesh so the product of the fixed sizes divides it.")
  if -1 in sizes:
    sizes[sizes.index(-1)] = n // fixed
  elif fixed < n:
    if jax.process_count() > 1:
      raise ValueError(f"Mesh {named} covers {fixed} of the {n} devices of a multi-process "
                       "run; every process must take part: set one axis to -1.")
    logging.info("Mesh %s uses %d of %d devices.", named, fixed, n)
    devices = devices[:fixed]
  if axis_types is None:
    axis_types = (AxisType.Auto,) * len(MESH_AXES)
  axis_types = tuple(axis_types)
  if len(axis_types) != len(MESH_AXES):
    raise ValueError(f"axis_types needs one AxisType per axis {MESH_AXES}; got {axis_types}.")
  return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=axis_types, devices=devices)


# ---------------------------------------------------------------------------------------------
# Logical-axis rules and parameter/optimizer shardings.
# ---------------------------------------------------------------------------------------------
def complete_rules(rules) -> tuple[tuple[str, Any], ...]:
  """`rules` plus `(name, None)` for every name of `LOGICAL_AXES` it does not mention."""
  rules = tuple((name, tuple(axes) if isinstance(axes, list) else axes) for name, axes in rules)
  named = {name for name, _ in rules}
  return rules + tuple((name, None) for name in LOGICAL_AXES if name not in named)


def _check_rules(rules, mesh: jax.sharding.Mesh) -> None:
  for name, axes in rules:
    for axis in (axes,) if isinstance(axes, str) or axes is None else axes:
      if axis is not None and axis not in mesh.axis_names:
        raise ValueError(f"Sharding rule ({name!r}, {axes!r}) names mesh axis {axis!r}; the "
                         f"mesh has {mesh.axis_names}.")


def _check_names(path, leaf, rules) -> None:
  """A clear error for a logical axis name that no rule maps."""
  names = leaf.get_metadata().get("out_sharding") or () if isinstance(leaf, nnx.Variable) else ()
  missing = [n for n in names if isinstance(n, str) and n not in dict(rules)]
  if missing:
    raise ValueError(f"{jax.tree_util.keystr(path)} has logical axes {missing} with no "
                     f"sharding rule; add e.g. ({missing[0]!r}, None) to the rules.")


def _check_divisible(path, leaf, sharding: NamedSharding) -> None:
  """A clear error for a dimension the mesh axes it is split over do not divide."""
  shape = getattr(leaf, "shape", ())
  for dim, axes in zip(shape, sharding.spec):
    axes = (axes,) if isinstance(axes, str) else axes or ()
    size = math.prod(sharding.mesh.shape[a] for a in axes)
    if dim % size:
      raise ValueError(f"{jax.tree_util.keystr(path)} of shape {shape} cannot be split as "
                       f"{sharding.spec} on mesh {dict(sharding.mesh.shape)}: {dim} is not a "
                       f"multiple of {size}. Change the mesh or the sharding rules.")


def tree_shardings(abstract_tree, mesh: jax.sharding.Mesh, rules) -> Any:
  """NamedShardings for an nnx.State / optimizer state / TrainState, from logical names.

  `rules` is config.sharding_rules, e.g. `[("embed", "fsdp"), ("mlp", "tensor")]`; names of
  `LOGICAL_AXES` it omits are replicated. Leaves without logical names (the step counter,
  optax counts) are replicated. Works on abstract (`eval_shape`) and concrete trees.
  """
  rules = complete_rules(rules)
  _check_rules(rules, mesh)
  is_var = lambda x: isinstance(x, nnx.Variable)
  leaves = jax.tree_util.tree_leaves_with_path(abstract_tree, is_leaf=is_var)
  for path, leaf in leaves:
    _check_names(path, leaf, rules)
  with nnx.logical_axis_rules(rules):
    shardings = nnx.get_named_sharding(abstract_tree, mesh)
  for (path, leaf), sharding in zip(leaves, jax.tree.leaves(shardings)):
    _check_divisible(path, leaf.get_value() if is_var(leaf) else leaf, sharding)
  return shardings


def create_sharded(new_fn, mesh: jax.sharding.Mesh, rules):
  """`(graphdef, params)` of the module `new_fn()` builds, each param born on its shards.

  `eval_shape` gives the abstract params, `tree_shardings` their placement, and
  `jit(init, out_shardings=...)` writes every shard in place: no device ever holds the whole
  model (big_vision, nanodo).
  """
  rules = complete_rules(rules)
  _check_rules(rules, mesh)
  with jax.set_mesh(mesh), nnx.logical_axis_rules(rules):
    graphdef, abstract_params = nnx.split(nnx.eval_shape(new_fn))
    shardings = tree_shardings(abstract_params, mesh, rules)
    params = jax.jit(lambda: nnx.split(new_fn())[1], out_shardings=shardings)()
  return graphdef, params


def create_train_state(params, tx, mesh: jax.sharding.Mesh, rules):
  """`(TrainState, its shardings)`: the optimizer state is created sharded like `params`.

  Pass the shardings to `jax.jit(update_step, in_shardings=(state_shardings, batch_sharding),
  out_shardings=(state_shardings, None), donate_argnums=0)`.
  """
  new_state = lambda p: types.TrainState(step=jnp.zeros((), jnp.int32), params=p,
                                         opt_state=tx.init(p))
  shardings = tree_shardings(jax.eval_shape(new_state, params), mesh, rules)
  with jax.set_mesh(mesh):
    state = jax.jit(new_state, out_shardings=shardings)(params)
  return state, shardings


def reshard(tree, shardings, *, donate: bool = False):
  """Moves `tree` onto `shardings` (a matching tree, or one Sharding for every leaf).

  The explicit transfer between a sampler mesh and a learner mesh, or after a restore; with
  `donate=True` the source buffers are freed as they are copied.
  """
  return jax.device_put(tree, shardings, donate=donate)


# ---------------------------------------------------------------------------------------------
# Batches.
# ---------------------------------------------------------------------------------------------
def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Rows (the leading axis of every Batch field) split over `data` x `fsdp`."""
  return NamedSharding(mesh, P(ROWS))


def shard_batch(batch: types.Batch, mesh: jax.sharding.Mesh) -> types.Batch:
  """Places a host `types.Batch` with its rows over `(data, fsdp)`.

  Single process: `batch` holds all B rows. Multi-process: each process passes its own
  `B / process_count` rows and the result is the global batch.
  """
  sharding = batch_sharding(mesh)
  ways = math.prod(mesh.shape[a] for a in ROWS)
  local_ways = ways // jax.process_count()
  for path, x in jax.tree_util.tree_leaves_with_path(batch):
    if x.shape[0] % max(local_ways, 1):
      raise ValueError(f"Batch field {jax.tree_util.keystr(path)} has {x.shape[0]} rows, "
                       f"not a multiple of the {local_ways} local row shards of mesh "
                       f"{dict(mesh.shape)}; make prompts_per_step * group_size divisible.")
  if jax.process_count() == 1:
    return jax.device_put(batch, sharding)
  return jax.tree.map(lambda x: jax.make_array_from_process_local_data(sharding, x), batch)


# ---------------------------------------------------------------------------------------------
# Vocab-parallel per-token log-probs.
# ---------------------------------------------------------------------------------------------
def _check_vma(impl: str) -> bool:
  """shard_map's varying-axes check works for jnp bodies but not around a pallas_call."""
  resolved = ops.default_impl() if impl == "auto" else impl
  return resolved in ("xla", "reference")


def _local_targets(y_n, w_Dv):
  """The shard holding vocab columns [v0, v0 + v) scores target y as column y - v0."""
  return y_n - jax.lax.axis_index("tensor") * w_Dv.shape[1]


def vocab_parallel_token_logprobs(hidden_ND, w_DV, targets_N, *, mesh: jax.sharding.Mesh,
                                  temperature: float = 1.0, softcap: float | None = None,
                                  return_entropy: bool = False, impl: str = "auto",
                                  block_sizes=None, interpret=False):
  """`kernels.logprob.ops.token_logprobs` with W's vocabulary split over `tensor`.

  Tokens are split over `(data, fsdp)` and the vocabulary over `tensor`; W's `D` axis is
  gathered (FSDP). Each device computes partial statistics `(max, Σexp, target logit[, Σexp·z])`
  over its vocab shard with the kernel for `impl`, then pmax/psum merge them
  (`ops.allreduce_stats`): the `[N, V]` logits and `W`'s `V` axis are never gathered. The
  backward is the kernel's hand-written one with the global lse; `dh` is psum'd over `tensor`
  and `dW` over the row axes. A `custom_vjp` spans the whole op, so no autodiff runs through
  pmax (which has no differentiation rule). Requires N divisible by data·fsdp and V by tensor.
  Returns float32 logp_N (and entropy_N). `temperature`, `softcap`, `impl`, `block_sizes` and
  `interpret` are as in `ops.token_logprobs` (a Pallas body runs with check_vma=False).
  """
  n, v, ways = targets_N.shape[0], w_DV.shape[-1], math.prod(mesh.shape[a] for a in ROWS)
  if n % ways or v % mesh.shape["tensor"]:
    raise ValueError(f"vocab_parallel_token_logprobs needs N={n} divisible by data*fsdp="
                     f"{ways} and V={v} divisible by tensor={mesh.shape['tensor']}.")
  kw = dict(temperature=float(temperature), softcap=None if softcap is None else float(softcap),
            impl=impl, block_sizes=block_sizes, interpret=interpret)
  local = functools.partial(jax.shard_map, mesh=mesh)

  @local(in_specs=(P(ROWS, None), P(None, "tensor"), P(ROWS)), out_specs=(P(ROWS),) * 3,
         check_vma=_check_vma(impl))
  def forward(h_nD, w_Dv, y_n):
    stats = ops.logprob_stats(h_nD, w_Dv, _local_targets(y_n, w_Dv),
                              with_entropy=return_entropy, **kw)
    return ops.finalize(ops.allreduce_stats(stats, "tensor"))

  # Every kernel backward scans dW from a plain jnp.zeros carry, which check_vma rejects as
  # unvarying; the body's collectives are the explicit psums below either way.
  @local(in_specs=(P(ROWS, None), P(None, "tensor"), P(ROWS)) + (P(ROWS),) * 4,
         out_specs=(P(ROWS, None), P(None, "tensor")), check_vma=False)
  def backward(h_nD, w_Dv, y_n, lse_n, mean_z_n, g_n, g_ent_n):
    dh_nD, dw_Dv = ops.logprob_backward(h_nD, w_Dv, _local_targets(y_n, w_Dv), lse_n, mean_z_n,
                                        g_n, g_ent_n if return_entropy else None, **kw)
    return jax.lax.psum(dh_nD, "tensor"), jax.lax.psum(dw_Dv, ROWS)

  def fwd(h_ND, w_DV, y_N):
    logp_N, lse_N, mean_z_N = forward(h_ND, w_DV, y_N)
    out = (logp_N, lse_N - mean_z_N) if return_entropy else logp_N
    return out, (h_ND, w_DV, y_N, lse_N, mean_z_N)

  def bwd(residuals, g):
    h_ND, w_DV, y_N, lse_N, mean_z_N = residuals
    g_N, g_ent_N = g if return_entropy else (g, jnp.zeros_like(g))
    dh_ND, dw_DV = backward(h_ND, w_DV, y_N, lse_N, mean_z_N, g_N, g_ent_N)
    return dh_ND.astype(h_ND.dtype), dw_DV.astype(w_DV.dtype), None

  @jax.custom_vjp
  def logprobs(h_ND, w_DV, y_N):
    return fwd(h_ND, w_DV, y_N)[0]

  logprobs.defvjp(fwd, bwd)
  dtype = jnp.promote_types(hidden_ND.dtype, w_DV.dtype)
  return logprobs(hidden_ND.astype(dtype), w_DV.astype(dtype), targets_N.astype(jnp.int32))


# ---------------------------------------------------------------------------------------------
# Multi-process runs.
# ---------------------------------------------------------------------------------------------
def _env_int(name: str) -> int | None:
  value = os.environ.get(name)
  if value in (None, ""):
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"Environment variable {name}={value!r} must be an integer.") from None


# PCI (vendor, device) ids of Cloud TPU chips, v3 to TPU7x, as in JAX's hardware_utils.
# Google's vendor id alone is not enough: GCE virtual NICs and disks carry it too.
_TPU_PCI_IDS = {("0x1ae0", d) for d in ("0x0027", "0x0056", "0x005e", "0x0062", "0x0063",
                                         "0x006f", "0x0076")}


def _on_cloud_tpu_vm() -> bool:
  """Whether a TPU chip is attached: a Cloud TPU VM, perhaps one host of a pod slice."""
  for dev in pathlib.Path("/sys/bus/pci/devices").glob("*"):
    try:
      ids = tuple((dev / f).read_text().strip() for f in ("vendor", "device"))
    except OSError:
      continue
    if ids in _TPU_PCI_IDS:
      return True
  return False


def cluster_launcher() -> str | None:
  """The multi-process launcher this process runs under, from standard env vars, or None."""
  env = os.environ
  if (_env_int("SLURM_NTASKS") or 1) > 1 and "SLURM_STEP_NODELIST" in env:
    return "slurm"
  if (_env_int("OMPI_COMM_WORLD_SIZE") or 1) > 1:
    return "openmpi"
  hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
  if len([h for h in hosts.split(",") if h]) > 1:
    return "tpu"
  if _on_cloud_tpu_vm():
    return "tpu-vm"  # pod slice or single host: JAX asks the VM metadata server
  return None


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None, process_id: int | None = None,
                           **kwargs) -> bool:
  """Starts JAX's multi-process runtime if this is a multi-process run; returns whether it is.

  Call it first in `main()`, before anything touches a device. Arguments left None are read
  from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID; when none is set, a
  SLURM (`srun`), Open MPI or Cloud TPU launch is detected from the environment and JAX fills
  everything in (on a single-host TPU VM that is a one-process runtime). Otherwise (one
  process: a laptop, a GPU host, JAX_NUM_PROCESSES=1) it does nothing.
  Extra keyword arguments (e.g. `initialization_timeout`) go to `jax.distributed.initialize`.
  """
  if jax.distributed.is_initialized():
    return jax.process_count() > 1
  coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if num_processes is None:
    num_processes = _env_int("JAX_NUM_PROCESSES")
  if process_id is None:
    process_id = _env_int("JAX_PROCESS_ID")
  if num_processes == 1:
    return False
  explicit = (coordinator_address, num_processes, process_id) != (None, None, None)
  if not explicit and cluster_launcher() is None:
    return False
  jax.distributed.initialize(coordinator_address, num_processes, process_id, **kwargs)
  logging.info("Process %d of %d; %d local and %d global devices.", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())
  return jax.process_count() > 1
