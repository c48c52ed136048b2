# pylint: disable=invalid-name
"""Device meshes, logical-axis sharding rules, sharded params, state and batches (docs/style.md C8).

The mesh has three axes: `data` (batch rows, params replicated), `fsdp` (batch rows too, and
params/optimizer state sharded ZeRO-3 style, Rajbhandari et al. 2020) and `tensor` (Megatron
tensor parallelism, Shoeybi et al. 2019: heads, MLP width and vocabulary). Models name their
parameter axes logically (`nnx.Param(..., out_sharding=("embed", "mlp"))`); one rules table
maps those names to mesh axes, as in flax lm1b and big_vision. `shard_map` is used only for
math whose communication is written by hand, such as the vocab-parallel log-prob
(`kernels.logprob.vocab_parallel_token_logprobs`, which takes this mesh).

Multi-host (TPU pod slices, GPU clusters) uses JAX's own runtime: call
`agentrl.distributed.initialize_distributed()` first thing in `main()`; every process then runs
the same program on the global mesh.
"""
from collections.abc import Mapping
import math
from typing import Any

from absl import logging
from flax import nnx
import jax
from jax.experimental import mesh_utils
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
import jax.numpy as jnp

from agentrl.models import lora
from agentrl import types

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
    ("lora_rank", None),  # LoRA adapters: sharded like their base matrix on its other axis
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
  slices = len({getattr(d, "slice_index", 0) for d in devices})
  if slices > 1:
    return _multi_slice_mesh(sizes, devices, slices, axis_types)
  return jax.make_mesh(tuple(sizes), MESH_AXES, axis_types=axis_types, devices=devices)


def _multi_slice_mesh(sizes, devices, slices: int, axis_types) -> jax.sharding.Mesh:
  """Several TPU slices joined by the data-center network: `data` spans the slices (only its
  gradient all-reduce crosses them), `fsdp` and `tensor` stay within each slice's ICI."""
  if sizes[0] % slices:
    raise ValueError(f"Mesh {dict(zip(MESH_AXES, sizes))} spans {slices} slices: the data "
                     f"axis must be a multiple of {slices} (set mesh.data={slices} or more).")
  ici = (sizes[0] // slices, *sizes[1:])
  grid = mesh_utils.create_hybrid_device_mesh(ici, (slices, 1, 1), devices=devices)
  return jax.sharding.Mesh(grid, MESH_AXES, axis_types=axis_types)


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

  With LoRA params the optimizer state covers the adapters only (`lora.trainable`), and the
  frozen base joins the state uncopied (the update step donates it along with the state).

  Pass the shardings to `jax.jit(update_step, in_shardings=(state_shardings, batch_sharding),
  out_shardings=(state_shardings, None), donate_argnums=0)`.
  """
  new_state = lambda p: types.TrainState(step=jnp.zeros((), jnp.int32), params=p,
                                         opt_state=tx.init(lora.trainable(p)))
  shardings = tree_shardings(jax.eval_shape(new_state, params), mesh, rules)
  with jax.set_mesh(mesh):
    state = jax.jit(new_state, out_shardings=lora.trainable(shardings))(lora.trainable(params))
  if lora.has_adapters(params):  # the frozen base is placed, not copied, into the state
    placed = jax.device_put(params, shardings.params)
    state = state.replace(params=lora.combine(placed, state.params))
  return state, shardings


def abstract_train_state(new_model, tx, mesh: jax.sharding.Mesh, rules):
  """(ShapeDtypeStructs of the TrainState of `new_model()`, their shardings), allocating nothing.

  For checking a real-scale preset's parameter count and layout on any machine.
  """
  with jax.set_mesh(mesh), nnx.logical_axis_rules(complete_rules(rules)):
    def init():
      params = nnx.split(new_model())[1]
      return types.TrainState(step=jnp.int32(0), params=params,
                              opt_state=tx.init(lora.trainable(params)))
    abstract = jax.eval_shape(init)
  return abstract, tree_shardings(abstract, mesh, rules)


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
