"""Orbax checkpointing: atomic saves every N steps, keep-N, and exact resume.

A checkpoint has two items:

  state  any pytree of arrays: the TrainState (params + optimizer state), dual variables,
         schedule state, host-side method state (a replay buffer), and the base RNG key. Typed PRNG keys are stored as their raw
         key data and re-wrapped on restore.
  meta   a JSON-able dict: the data stream's position (`state()` of the prompt source), the
         step, and anything else that is plain Python.

Orbax writes each step into a temporary directory and renames it when complete, so a run
killed with SIGKILL (even mid-save) resumes from the last complete step; stale temporary
directories are removed when the manager opens. Together with RNG keys derived from
`fold_in(base_rng, step)`, restoring state + meta reproduces the uninterrupted run exactly.

Integrity. Every save records a checksum of the state's values in `meta` (an exact uint32
sum of each leaf's bits times its position, computed on device, so it does not depend on how
the state is sharded) and refuses to write a state with a non-finite float, so a diverged run
never rotates good checkpoints away. `restore` recomputes the checksum and checks finiteness;
a checkpoint that fails to read, does not match the run's state structure, or fails those
checks is skipped with a message saying why, and the newest one that passes is used.

Tested with orbax-checkpoint 0.12.8 on jax 0.10.2 and jax 0.12.
"""
from collections.abc import Callable, Mapping
import dataclasses
import json
import logging
import os
from typing import Any

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from orbax.checkpoint.checkpoint_managers import preservation_policy as preservation


class _DropOrbaxInfo(logging.Filter):
  """Drops orbax's INFO records (a dozen lines per save) from absl's log; keeps warnings."""

  def filter(self, record: logging.LogRecord) -> bool:
    if "orbax" not in record.pathname:
      return True
    # A read-only reader (`read_subtree`) is deliberate; orbax warns about it on every open.
    return record.levelno >= logging.WARNING and "read only" not in record.getMessage() and (
        "read_only=True" not in record.getMessage())


_FILTER = _DropOrbaxInfo()


def _is_key(x: Any) -> bool:
  return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def _unwrap_keys(tree: Any) -> Any:
  return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def _abstract(tree: Any) -> Any:
  """ShapeDtypeStructs (keeping shardings) for `tree`, with keys replaced by their raw data."""

  def leaf(x):
    if _is_key(x):
      x = jax.eval_shape(jax.random.key_data, x)
    return ocp.utils.to_shape_dtype_struct(x)

  return jax.tree.map(leaf, tree)


def _key_impl(key: Any) -> Any:
  """jax.random.key_impl, also for an abstract (ShapeDtypeStruct) key."""
  impls = []
  jax.eval_shape(lambda k: impls.append(jax.random.key_impl(k)), key)
  return impls[0]


def _rewrap_keys(template: Any, restored: Any) -> Any:
  def leaf(t, r):
    return jax.random.wrap_key_data(r, impl=_key_impl(t)) if _is_key(t) else r

  return jax.tree.map(leaf, template, restored)


CHECKSUM_KEY = "checksum"  # reserved in meta


class CheckpointError(RuntimeError):
  """No checkpoint in a directory can be restored; the message says why for each."""


def _leaf_checksum(x: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(uint32 checksum of the bits of x, whether every float entry is finite)."""
  if jnp.issubdtype(x.dtype, jnp.floating):
    finite = jnp.all(jnp.isfinite(x))
    width = {2: jnp.uint16, 4: jnp.uint32}.get(x.dtype.itemsize)
    bits = jax.lax.bitcast_convert_type(x, width) if width else x.astype(jnp.float32).view(
        jnp.uint32)
  else:
    finite = jnp.bool_(True)
    bits = x
  bits = bits.astype(jnp.uint32).reshape(-1)
  # Position weights (odd, so any single flipped bit changes the sum mod 2**32); integer
  # addition is associative, so the result is exact under any sharding or reduction order.
  weights = jnp.arange(bits.size, dtype=jnp.uint32) * jnp.uint32(2) + jnp.uint32(1)
  return jnp.sum(bits * weights, dtype=jnp.uint32), finite


@jax.jit
def _checksums(tree: Any) -> tuple[list[jax.Array], jax.Array]:
  leaves = [_leaf_checksum(x) for x in jax.tree.leaves(tree)]
  finite = jnp.all(jnp.stack([f for _, f in leaves])) if leaves else jnp.bool_(True)
  return [c for c, _ in leaves], finite


def checksum(tree: Any) -> tuple[list[int], bool]:
  """(per-leaf uint32 checksums, whether every float leaf is finite) of a pytree of arrays."""
  sums, finite = jax.device_get(_checksums(_unwrap_keys(tree)))
  return [int(c) for c in sums], bool(finite)


def _structure_mismatch(saved: Any, template: Any) -> str:
  """'' if the saved tree's shapes match the template's, else the first difference."""
  def flat(tree):
    # Dataclass fields and dict keys name a node the same way: "train/params/w".
    name = lambda k: str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k))))
    return {"/".join(name(k) for k in path): leaf
            for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}

  flat_saved, flat_template = flat(saved), flat(_abstract(template))
  for key in sorted(set(flat_saved) ^ set(flat_template)):
    where = "only in the checkpoint" if key in flat_saved else "missing from the checkpoint"
    return f"state entry {key} is {where}"
  for key, want in flat_template.items():
    have = tuple(getattr(flat_saved[key], "shape", ()))
    if have != tuple(want.shape):
      return f"state entry {key} has shape {have} in the checkpoint, {tuple(want.shape)} now"
  return ""


@dataclasses.dataclass
class _KeepIf(preservation.PreservationPolicy):
  """Keeps the checkpoints whose step `keep(step)` accepts."""
  keep: Callable[[int], bool]

  def should_preserve(self, checkpoints, *, context) -> list[bool]:
    del context
    return [bool(self.keep(int(c.step))) for c in checkpoints]


class Checkpointer:
  """A small wrapper over `ocp.CheckpointManager` with a state pytree and a JSON meta dict.

  Usage in a training loop:

    ckpt = checkpoint.Checkpointer(workdir + "/ckpt", save_every=50, keep=3)
    if ckpt.latest_step() is not None:
      tree, meta = ckpt.restore(tree)   # `tree` (concrete or abstract) gives structure/sharding
    ...
    ckpt.save(step, tree, meta)          # saves only every `save_every` steps unless force=True
    ckpt.close()                         # waits for async writes
  """

  def __init__(self, directory: str, *, save_every: int, keep: int | None = 3,
               keep_period: int | None = None, async_save: bool = True,
               keep_if: Callable[[int], bool] | None = None):
    """Opens (or creates) the checkpoint directory.

    Args:
      directory: where the step directories go.
      save_every: `save` writes only steps divisible by this (unless forced).
      keep: the newest `keep` checkpoints are kept (None: all).
      keep_period: steps divisible by it are kept besides the newest `keep` (e.g. the
        evaluation steps, so `experiments.eval --config.step=N` finds them); None or 0: none.
      async_save: write in a background thread; `close` waits for it.
      keep_if: step -> whether to keep it besides those (asked again at every save; e.g. the
        loop keeps the start of each replayable record step while its batch is on disk).
    """
    if save_every < 1:
      raise ValueError(f"save_every must be >= 1, got {save_every}")
    if keep is not None and keep < 1:
      raise ValueError(f"keep must be >= 1 or None (keep all), got {keep}")
    self.directory = os.path.abspath(directory)
    self.save_every = save_every
    logging.getLogger("absl").addFilter(_FILTER)  # idempotent: the same filter object
    policies = [preservation.LatestN(n=keep)]
    if keep_period:
      policies.append(preservation.EveryNSteps(interval_steps=keep_period))
    if keep_if is not None:
      policies.append(_KeepIf(keep_if))
    options = ocp.CheckpointManagerOptions(
        preservation_policy=preservation.AnyPreservationPolicy(policies),
        enable_async_checkpointing=async_save, cleanup_tmp_directories=True, create=True)
    # Handlers named up front, so a reopened manager can read metadata before any save.
    self._manager = ocp.CheckpointManager(
        self.directory, options=options,
        item_handlers={"state": ocp.StandardCheckpointHandler(),
                       "meta": ocp.JsonCheckpointHandler()})

  def latest_step(self) -> int | None:
    """The newest complete checkpoint's step, or None."""
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, tree: Any, meta: Mapping[str, Any] | None = None, *,
           force: bool = False) -> bool:
    """Saves if `step` is on the save interval (or `force`); returns whether it saved.

    A step that is already saved is not written again (e.g. a forced final save that falls on
    the interval).
    """
    if (not force and step % self.save_every) or step in self._manager.all_steps():
      return False
    sums, finite = checksum(tree)
    if not finite:
      logging.warning("Not saving step %d to %s: the state holds NaN or inf; the earlier "
                      "checkpoints are kept.", step, self.directory)
      return False
    # A deep copy now: an async save serializes meta later, and the caller goes on mutating
    # nested dicts (the loop's evals), which would leak step s+1's values into step s.
    meta = {**json.loads(json.dumps(dict(meta or {}))), CHECKSUM_KEY: sums}
    args = ocp.args.Composite(state=ocp.args.StandardSave(_unwrap_keys(tree)),
                              meta=ocp.args.JsonSave(meta))
    return self._manager.save(int(step), args=args, force=True)

  def restore(self, template: Any, step: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Restores (tree, meta) from `step`, or the newest checkpoint that passes its checks.

    `template` may hold concrete arrays or ShapeDtypeStructs; restored arrays get its
    shardings, so a run resumes already sharded. A checkpoint that cannot be read, does not
    match the template's structure, holds NaN/inf or fails its checksum is skipped (logged,
    with the reason) in favour of the next older one (`meta["step"]` says which was used, if
    the saver recorded it). Raises CheckpointError naming the directory if none passes (or `step` fails), and
    FileNotFoundError if there is no checkpoint at all.
    """
    self._manager.wait_until_finished()
    steps = sorted(self._manager.all_steps(), reverse=True) if step is None else [int(step)]
    if not steps:
      raise FileNotFoundError(f"no complete checkpoint in {self.directory}")
    reasons = []
    for candidate in steps:
      try:
        tree, meta = self._restore_checked(template, candidate)
      except Exception as e:  # pylint: disable=broad-except
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        reasons.append(f"step {candidate}: {reason}")
        logging.warning("Skipping checkpoint %s/%d: %s", self.directory, candidate, reason)
        continue
      if reasons:
        print(f"Restored {self.directory}/{candidate}; skipped newer checkpoints: "
              f"{'; '.join(reasons)}", flush=True)
      return tree, meta
    raise CheckpointError(f"no checkpoint in {self.directory} can be restored ("
                          f"{'; '.join(reasons)}); delete the directory to start over, or "
                          "restore the run's config if it changed")

  def _restore_checked(self, template: Any, step: int) -> tuple[Any, dict[str, Any]]:
    saved = self._manager.item_metadata(step)["state"]
    mismatch = _structure_mismatch(getattr(saved, "tree", saved), template)
    if mismatch:
      raise ValueError(f"it does not match this run's state ({mismatch}); the model, "
                       "optimizer or state layout in the config changed")
    args = ocp.args.Composite(state=ocp.args.StandardRestore(_abstract(template)),
                              meta=ocp.args.JsonRestore())
    restored = self._manager.restore(step, args=args)
    tree, meta = _rewrap_keys(template, restored.state), dict(restored.meta)
    sums, finite = checksum(tree)
    if not finite:
      raise ValueError("it holds NaN or inf")
    expected = meta.pop(CHECKSUM_KEY, None)
    if expected is not None and list(expected) != sums:
      bad = next(i for i, (a, b) in enumerate(zip(expected, sums)) if a != b)
      raise ValueError(f"checksum mismatch in state leaf {bad}: the files were changed or "
                       "damaged after the save")
    return tree, meta

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


def _reader(directory: str) -> ocp.CheckpointManager:
  """A read-only manager: never creates, deletes or cleans anything under `directory`."""
  logging.getLogger("absl").addFilter(_FILTER)
  options = ocp.CheckpointManagerOptions(read_only=True, create=False)
  return ocp.CheckpointManager(os.path.abspath(directory), options=options,
                               item_handlers={"state": ocp.PyTreeCheckpointHandler(),
                                              "meta": ocp.JsonCheckpointHandler()})


def saved_steps(directory: str) -> list[int]:
  """The complete checkpoints' steps in `directory` (read-only), oldest first."""
  if not os.path.isdir(directory):
    return []
  manager = _reader(directory)
  try:
    return sorted(manager.all_steps())
  finally:
    manager.close()


def read_subtree(directory: str, path: tuple[str, ...], template: Any, *,
                 step: int) -> Any:
  """Restores only the subtree at `path` of a saved tree (e.g. ("params",) or ("state",
  "params")), read-only, onto `template`'s structure, dtypes and shardings.

  Evaluation uses it to read a policy's params out of any run's checkpoint without rebuilding
  that run's optimizer or extra state (a critic's Adam moments, a replay batch). If the node at
  `path` holds a "policy" entry (a run whose params also hold a critic), that entry is read.
  """
  manager = _reader(directory)
  try:
    node = manager.item_metadata(step)["state"]
    node = getattr(node, "tree", node)  # orbax wraps the saved structure in a metadata object
    for i, key in enumerate(path):
      if not isinstance(node, Mapping) or key not in node:
        raise KeyError(f"checkpoint {directory}/{step} has no {'.'.join(path[:i + 1])}")
      node = node[key]
    if isinstance(node, Mapping) and "policy" in node:
      path = path + ("policy",)
    wanted = template
    for key in reversed(path):
      wanted = {key: wanted}
    abstract = _abstract(wanted)
    args = ocp.args.PyTreeRestore(abstract, partial_restore=True,
                                  restore_args=ocp.checkpoint_utils.construct_restore_args(abstract))
    tree = manager.restore(step, args=ocp.args.Composite(state=args)).state
  finally:
    manager.close()
  for key in path:
    tree = tree[key]
  return tree
