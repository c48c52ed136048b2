"""Tests for agentrl.checkpoint: round trip of a full training tree, interval, keep-N, atomicity."""
import json
import os
import shutil
import tempfile

from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl import checkpoint
from agentrl import types

def _tmpdir(test) -> str:
  # tempfile rather than absltest's create_tempdir, which needs parsed absl flags (pytest).
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path



class _Tiny(nnx.Module):

  def __init__(self, rngs):
    self.dense = nnx.Linear(3, 4, rngs=rngs)


def _tree(seed: int):
  _, params = nnx.split(_Tiny(nnx.Rngs(seed)))
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
  state = types.TrainState(step=jnp.array(seed, jnp.int32), params=params,
                           opt_state=tx.init(params))
  return {"train": state, "rng": jax.random.key(seed), "dual": {"lam": jnp.float32(seed / 10)}}


def _assert_trees_equal(test, a, b):
  test.assertEqual(jax.tree.structure(a), jax.tree.structure(b))
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class CheckpointerTest(absltest.TestCase):

  def test_round_trip_of_state_rng_dual_and_meta(self):
    d = _tmpdir(self)
    ckpt = checkpoint.Checkpointer(d, save_every=1)
    saved = _tree(3)
    meta = {"data": {"index": 17, "epoch": 1}, "step": 3}
    self.assertTrue(ckpt.save(3, saved, meta))
    ckpt.close()

    reopened = checkpoint.Checkpointer(d, save_every=1)
    self.assertEqual(reopened.latest_step(), 3)
    template = _tree(0)  # different values, same structure: proves values come from disk
    restored, restored_meta = reopened.restore(template)
    self.assertEqual(restored_meta, meta)
    self.assertIsInstance(restored["train"], types.TrainState)
    self.assertIsInstance(restored["train"].params, nnx.State)
    self.assertTrue(jnp.issubdtype(restored["rng"].dtype, jax.dtypes.prng_key))
    np.testing.assert_array_equal(jax.random.key_data(restored["rng"]),
                                  jax.random.key_data(saved["rng"]))
    unwrap = lambda t: {**t, "rng": jax.random.key_data(t["rng"])}
    _assert_trees_equal(self, unwrap(restored), unwrap(saved))
    self.assertFalse(np.array_equal(restored["dual"]["lam"], template["dual"]["lam"]))
    reopened.close()

  def test_restore_from_abstract_template(self):
    d = _tmpdir(self)
    ckpt = checkpoint.Checkpointer(d, save_every=1, async_save=False)
    ckpt.save(1, _tree(1))
    abstract = jax.eval_shape(lambda: _tree(0))
    restored, meta = ckpt.restore(abstract)
    self.assertEqual(meta, {})
    np.testing.assert_array_equal(restored["train"].step, 1)
    ckpt.close()

  def test_interval_keep_and_force(self):
    d = _tmpdir(self)
    ckpt = checkpoint.Checkpointer(d, save_every=2, keep=2, async_save=False)
    tree = _tree(0)
    saved = [ckpt.save(s, tree) for s in range(1, 8)]
    self.assertEqual(saved, [False, True, False, True, False, True, False])
    self.assertFalse(ckpt.save(6, tree, force=True))  # already saved
    self.assertTrue(ckpt.save(7, tree, force=True))
    self.assertEqual(ckpt.all_steps(), [6, 7])
    ckpt.close()

  def test_incomplete_save_is_ignored_and_cleaned(self):
    d = _tmpdir(self)
    ckpt = checkpoint.Checkpointer(d, save_every=1, async_save=False)
    ckpt.save(2, _tree(2))
    ckpt.close()
    # What a SIGKILL during the write of step 3 leaves behind: a temporary directory.
    partial = os.path.join(d, "3.orbax-checkpoint-tmp-1234")
    os.makedirs(os.path.join(partial, "state"))
    reopened = checkpoint.Checkpointer(d, save_every=1)
    self.assertEqual(reopened.latest_step(), 2)
    restored, _ = reopened.restore(_tree(0))
    np.testing.assert_array_equal(restored["train"].step, 2)
    self.assertTrue(reopened.save(3, _tree(3)))  # the step the killed run never finished
    reopened.close()
    self.assertFalse(os.path.exists(partial))
    self.assertEqual(checkpoint.Checkpointer(d, save_every=1).all_steps(), [2, 3])

  def test_restore_without_checkpoint_names_directory(self):
    d = _tmpdir(self)
    ckpt = checkpoint.Checkpointer(d, save_every=1)
    self.assertIsNone(ckpt.latest_step())
    with self.assertRaisesRegex(FileNotFoundError, "no complete checkpoint in"):
      ckpt.restore(_tree(0))
    ckpt.close()

  def test_bad_arguments(self):
    d = _tmpdir(self)
    with self.assertRaisesRegex(ValueError, "save_every must be >= 1"):
      checkpoint.Checkpointer(d, save_every=0)
    with self.assertRaisesRegex(ValueError, "keep must be >= 1"):
      checkpoint.Checkpointer(d, save_every=1, keep=0)


def _saved(test, steps=(1, 2), **kwargs):
  d = _tmpdir(test)
  ckpt = checkpoint.Checkpointer(d, save_every=1, async_save=False, **kwargs)
  for step in steps:
    ckpt.save(step, _tree(step), {"step": step})
  ckpt.close()
  return d


def _files(directory):
  for root, _, names in os.walk(directory):
    for name in names:
      yield os.path.join(root, name)


class IntegrityTest(absltest.TestCase):

  def test_meta_is_copied_at_save_time(self):
    d = _tmpdir(self)
    ckpt = checkpoint.Checkpointer(d, save_every=1)  # async: meta is serialized later
    evals = {"0": {"success": 0.1}}
    ckpt.save(1, _tree(1), {"evals": evals})
    evals["2"] = {"success": 0.9}  # what the loop does after the save call returns
    ckpt.close()
    _, meta = checkpoint.Checkpointer(d, save_every=1).restore(_tree(0))
    self.assertEqual(meta["evals"], {"0": {"success": 0.1}})

  def test_checksum_mismatch_falls_back_to_the_previous_step(self):
    d = _saved(self)
    changed = 0
    for path in _files(os.path.join(d, "2", "meta")):  # the JSON file orbax names "metadata"
      with open(path) as f:
        text = f.read()
      if checkpoint.CHECKSUM_KEY in text:
        meta = json.loads(text)
        meta[checkpoint.CHECKSUM_KEY][0] += 1
        with open(path, "w") as f:
          json.dump(meta, f)
        changed += 1
    self.assertEqual(changed, 1)
    restored, meta = checkpoint.Checkpointer(d, save_every=1).restore(_tree(0))
    self.assertEqual(meta["step"], 1)
    np.testing.assert_array_equal(restored["train"].step, 1)
    with self.assertRaisesRegex(checkpoint.CheckpointError, r"step 2: checksum mismatch"):
      checkpoint.Checkpointer(d, save_every=1).restore(_tree(0), step=2)

  def test_flipped_bytes_are_detected(self):
    d = _saved(self)
    data = [f for f in _files(os.path.join(d, "2", "state")) if f"{os.sep}d{os.sep}" in f]
    self.assertNotEmpty(data)
    for path in data:
      with open(path, "r+b") as f:
        raw = bytearray(f.read())
        for i in range(len(raw) // 2, len(raw), 7):  # flip bits across the second half
          raw[i] ^= 0x10
        f.seek(0)
        f.write(raw)
    restored, meta = checkpoint.Checkpointer(d, save_every=1).restore(_tree(0))
    self.assertEqual(meta["step"], 1)  # step 2 failed to read or failed its checksum
    np.testing.assert_array_equal(restored["train"].step, 1)

  def test_damaged_files_fall_back_and_none_left_names_the_directory(self):
    d = _saved(self)
    for path in _files(os.path.join(d, "2", "state")):
      with open(path, "r+b") as f:
        f.truncate(max(0, os.path.getsize(path) // 3))
    _, meta = checkpoint.Checkpointer(d, save_every=1).restore(_tree(0))
    self.assertEqual(meta["step"], 1)
    for path in _files(os.path.join(d, "1", "state")):
      os.remove(path)
    with self.assertRaisesRegex(checkpoint.CheckpointError,
                                f"no checkpoint in {d} can be restored .*step 2.*step 1"):
      checkpoint.Checkpointer(d, save_every=1).restore(_tree(0))

  def test_nonfinite_state_is_never_saved_and_good_ones_are_kept(self):
    d = _tmpdir(self)
    ckpt = checkpoint.Checkpointer(d, save_every=1, keep=1, async_save=False)
    self.assertTrue(ckpt.save(1, _tree(1)))
    bad = _tree(2)
    bad["dual"]["lam"] = jnp.float32(np.nan)
    self.assertFalse(ckpt.save(2, bad))
    self.assertEqual(ckpt.all_steps(), [1])  # keep=1 did not rotate the good one away
    ckpt.close()

  def test_changed_state_structure_is_named(self):
    d = _saved(self, steps=(1,))
    other = _tree(0)
    other["dual"]["lam"] = jnp.zeros(3)
    with self.assertRaisesRegex(checkpoint.CheckpointError,
                                r"dual/lam has shape \(\) in the checkpoint, \(3,\) now"):
      checkpoint.Checkpointer(d, save_every=1).restore(other)

  def test_checksum_is_exact_and_sharding_independent(self):
    x = jnp.arange(12, dtype=jnp.float32).reshape(3, 4)
    sums, finite = checkpoint.checksum({"x": x})
    self.assertTrue(finite)
    flipped = x.at[2, 3].set(np.nextafter(np.float32(11.0), np.float32(12.0)))  # one ulp
    self.assertNotEqual(checkpoint.checksum({"x": flipped})[0], sums)
    mesh = jax.make_mesh((jax.device_count(),), ("d",),
                         axis_types=(jax.sharding.AxisType.Auto,))
    if 16 % jax.device_count() == 0:
      sharded = jax.device_put(jnp.arange(16.0), jax.sharding.NamedSharding(
          mesh, jax.sharding.PartitionSpec("d")))
      self.assertEqual(checkpoint.checksum({"x": sharded})[0],
                       checkpoint.checksum({"x": jnp.arange(16.0)})[0])
    self.assertFalse(checkpoint.checksum({"x": x.at[0, 0].set(np.inf)})[1])


class ReadSubtreeTest(absltest.TestCase):

  def test_reads_only_params_read_only(self):
    d = _tmpdir(self)
    ckpt = checkpoint.Checkpointer(d, save_every=1, async_save=False)
    saved = _tree(3)
    ckpt.save(3, saved)
    ckpt.close()
    # A temporary directory of an in-progress save by a live trainer must survive the read.
    partial = os.path.join(d, "4.orbax-checkpoint-tmp-99")
    os.makedirs(os.path.join(partial, "state"))
    self.assertEqual(checkpoint.saved_steps(d), [3])
    template = _tree(0)["train"].params  # other values: proves they come from disk
    params = checkpoint.read_subtree(d, ("train", "params"), template, step=3)
    _assert_trees_equal(self, params, saved["train"].params)
    self.assertIsInstance(params, nnx.State)
    self.assertTrue(os.path.exists(partial))

  def test_reads_the_policy_of_params_that_hold_a_critic(self):
    d = _tmpdir(self)
    ckpt = checkpoint.Checkpointer(d, save_every=1, async_save=False)
    policy, critic = _tree(5)["train"].params, _tree(6)["train"].params
    ckpt.save(1, {"state": {"params": {"policy": policy, "value": critic}}})
    ckpt.close()
    params = checkpoint.read_subtree(d, ("state", "params"), _tree(0)["train"].params, step=1)
    _assert_trees_equal(self, params, policy)

  def test_missing_path_is_named(self):
    d = _tmpdir(self)
    ckpt = checkpoint.Checkpointer(d, save_every=1, async_save=False)
    ckpt.save(1, _tree(1))
    ckpt.close()
    with self.assertRaisesRegex(KeyError, "has no state"):
      checkpoint.read_subtree(d, ("state", "params"), _tree(0)["train"].params, step=1)
    self.assertEqual(checkpoint.saved_steps(os.path.join(d, "absent")), [])


if __name__ == "__main__":
  absltest.main()
