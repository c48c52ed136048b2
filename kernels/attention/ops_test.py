# pylint: disable=invalid-name
"""Tests for kernels.attention: both Pallas kernels (interpret mode) against the XLA path.

The cases are decode-shaped: grouped-query heads (R > 1), one or a chunk of new tokens, rows
left-padded or with holes (a row that skipped steps), a row with no real slot, a read bound far
below the cache size with NaN written past it (and before a row's first real slot), soft-capped
scores, a sliding window, float32 and bfloat16. That the skipped KV blocks are never fetched is
checked on the kernels' block-index and loop-bound functions; the TPU (Mosaic) and GPU (Triton)
lowerings with `jax.export`, and a full TPU compile where libtpu is installed.
"""
import importlib.util

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from kernels.attention import ops
from kernels.attention import pallas_gpu
from kernels.attention import pallas_tpu

jax.config.update("jax_numpy_rank_promotion", "raise")

# Small tiles, so that every case spans several KV blocks (a ragged last one) and row tiles.
BLOCKS = {"pallas_tpu": pallas_tpu.BlockSizes(rows=8, slots=128),
          "pallas_gpu": pallas_gpu.BlockSizes(rows=16, slots=32, splits=3)}
CASES = {
    # One new token per row, read bound 151 of 300 slots: a full row, a left-padded row with a
    # hole, and a row whose first real slot (140) lies past the first KV block.
    "decode": dict(t=1, g=2, r=3, s=300, k=16, dtype="float32", softcap=None, window=None,
                   starts=(0, 20, 140), holes=((60, 80),), empty_row=False),
    # A chunk of 9 new tokens (18 query rows per KV head), soft-capped scores, a sliding window
    # and a row with no real slot at all.
    "chunk": dict(t=9, g=2, r=2, s=200, k=32, dtype="float32", softcap=5.0, window=7,
                  starts=(0, 33, 0), holes=((40, 41), (90, 95)), empty_row=True),
    "bfloat16": dict(t=1, g=1, r=4, s=256, k=128, dtype="bfloat16", softcap=30.0, window=None,
                     starts=(5, 0, 64), holes=(), empty_row=False),
}
COL = 150   # the engine's shared write column: new tokens go to slots [COL, COL + T)


def _case(t, g, r, s, k, dtype, softcap, window, starts, holes, empty_row, seed=0):
  """(q, k, v with NaN outside each row's read range, the same without, mask, softcap)."""
  b = len(starts)
  keys = jax.random.split(jax.random.key(seed), 3)
  q_BTHK = jax.random.normal(keys[0], (b, t, g * r, k)).astype(dtype)
  k_BGSK, v_BGSK = (jax.random.normal(x, (b, g, s, k)).astype(dtype) for x in keys[1:])
  valid_BS = np.zeros((b, s), bool)
  for row, start in enumerate(starts):
    valid_BS[row, start:COL + t] = True
  for lo, hi in holes:
    valid_BS[1, lo:hi] = False
  if empty_row:
    valid_BS[2] = False
  pos_BS = np.maximum(np.cumsum(valid_BS, axis=1) - 1, 0).astype(np.int32)
  mask = ops.cache_mask(jnp.asarray(pos_BS[:, COL:COL + t]), COL + jnp.arange(t),
                        jnp.asarray(pos_BS), jnp.asarray(valid_BS), window=window)
  first_B = np.where(valid_BS.any(1), np.argmax(valid_BS, 1), 0)
  slot_S = np.arange(s)
  unread_B11S = ((slot_S < first_B[:, None]) | (slot_S >= COL + t))[:, None, None]
  poison = lambda x: jnp.where(jnp.asarray(unread_B11S).swapaxes(2, 3), jnp.nan, x)
  return (q_BTHK, poison(k_BGSK), poison(v_BGSK)), (q_BTHK, k_BGSK, v_BGSK), mask, softcap


def _attend(impl, args, mask, softcap, **kw):
  f = lambda q, k, v, m: ops.decode_attention(q, k, v, m, scale=0.3, softcap=softcap,
                                              impl=impl, **kw)
  return np.asarray(jax.jit(f)(*args, mask), np.float32)


def _assert_close(got, want, dtype):
  # bfloat16: the kernels round the softmax weights to bf16 before the value matmul.
  np.testing.assert_allclose(got, want, atol=2e-2 if dtype == "bfloat16" else 2e-6, rtol=0)


class ReferenceTest(parameterized.TestCase):

  def test_dense_mask_is_the_rule(self):
    # Slot s is visible to query t of row b iff it is real, in [first real slot, COL + t] and
    # within the window of the query's position.
    _, _, mask, _ = _case(**CASES["chunk"])
    got = np.asarray(ops.dense_mask(mask, 200))
    k_pos, q_pos = np.asarray(mask.k_pos_BS), np.asarray(mask.q_pos_BT)
    for b in range(3):
      for t in range(9):
        want = ((k_pos[b] != ops.INVALID_POS) & (np.arange(200) <= COL + t)
                & (q_pos[b, t] - k_pos[b] < 7))
        np.testing.assert_array_equal(got[b, t], want)
    self.assertFalse(got[2].any())   # the empty row

  def test_reference_is_a_masked_softmax(self):
    _, (q, k, v), mask, softcap = _case(**CASES["chunk"])
    got = _attend("xla", (q, k, v), mask, softcap)
    ok_BTS = np.asarray(ops.dense_mask(mask, 200))
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    for b, t, h in ((0, 0, 0), (1, 8, 3), (0, 4, 1)):
      g = h // 2
      scores = softcap * np.tanh(k[b, g] @ q[b, t, h] * 0.3 / softcap)
      p = np.where(ok_BTS[b, t], np.exp(scores - scores[ok_BTS[b, t]].max()), 0.0)
      np.testing.assert_allclose(got[b, t, h], p @ v[b, g] / p.sum(), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got[2], 0.0)   # no real slot: zeros, not NaN

  def test_xla_never_reads_past_the_bound(self):
    poisoned, clean, mask, softcap = _case(**CASES["decode"])
    np.testing.assert_array_equal(_attend("xla", poisoned, mask, softcap),
                                  _attend("xla", clean, mask, softcap))


class KernelTest(parameterized.TestCase):
  """Both Pallas kernels in interpret mode, on NaN-poisoned caches, against the XLA path."""

  @parameterized.product(impl=("pallas_tpu", "pallas_gpu"), case=tuple(CASES))
  def test_matches_xla(self, impl, case):
    poisoned, clean, mask, softcap = _case(**CASES[case])
    got = _attend(impl, poisoned, mask, softcap, block_sizes=BLOCKS[impl], interpret=True)
    self.assertFalse(np.isnan(got).any())
    _assert_close(got, _attend("xla", clean, mask, softcap), CASES[case]["dtype"])
    if CASES[case]["empty_row"]:
      np.testing.assert_array_equal(got[2], 0.0)

  def test_tpu_fetches_only_blocks_in_the_read_range(self):
    # Grid step j fetches block kv_block_index(j): over all steps, exactly the blocks that
    # overlap [lo, hi) (one block when the range is empty); a repeated index is not re-fetched.
    bk, steps = 128, np.arange(8)
    for lo, hi in ((0, 151), (140, 151), (20, 1024), (300, 301), (0, 1), (151, 151)):
      fetched = set(np.asarray(pallas_tpu.kv_block_index(steps, lo, hi, bk)).tolist())
      want = set(range(lo // bk, -(-hi // bk))) or {(hi - 1) // bk}
      self.assertEqual(fetched, want, (lo, hi))

  def test_gpu_splits_loop_over_the_read_range_once(self):
    bk = 32
    for lo, hi, splits in ((0, 151, 3), (140, 151, 3), (20, 1000, 8), (151, 151, 2)):
      blocks = []
      for c in range(splits):
        start, end = (int(x) for x in pallas_gpu.split_range(c, splits, lo, hi, bk))
        blocks += range(start, end)
      self.assertEqual(blocks, list(range(lo // bk, -(-hi // bk))), (lo, hi, splits))

  def test_pallas_impl_interprets_on_cpu(self):
    # impl="pallas" picks its kernel when lowered: here (CPU) the TPU kernel, interpreted.
    poisoned, clean, mask, softcap = _case(**CASES["decode"])
    _assert_close(_attend("pallas", poisoned, mask, softcap),
                  _attend("xla", clean, mask, softcap), "float32")

  def test_input_errors(self):
    _, (q, k, v), mask, _ = _case(**CASES["decode"])
    attend = lambda **kw: ops.decode_attention(q, k, v, mask, scale=1.0, **kw)
    with self.assertRaisesRegex(ValueError, "Unknown decode attention impl 'flash'"):
      attend(impl="flash")
    with self.assertRaisesRegex(ValueError, "block_sizes needs impl='pallas_tpu' or"):
      attend(impl="pallas", block_sizes=pallas_tpu.BlockSizes())
    with self.assertRaisesRegex(ValueError, "slots % 128 == 0"):
      attend(impl="pallas_tpu", block_sizes=pallas_tpu.BlockSizes(slots=100), interpret=True)
    with self.assertRaisesRegex(ValueError, "slots must be a power of two >= 16"):
      attend(impl="pallas_gpu", block_sizes=pallas_gpu.BlockSizes(slots=48), interpret=True)
    with self.assertRaisesRegex(ValueError, "H a multiple of G"):
      ops.decode_attention(q[:, :, :5], k, v, mask, scale=1.0)
    with self.assertRaisesRegex(ValueError, "build it with cache_mask"):
      ops.decode_attention(q, k[:, :, :299], v[:, :, :299], mask, scale=1.0)


def _abstract_args(b, t, g, r, s, k, sharding=None):
  sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
  i32 = jnp.int32
  return (sds((b, t, g * r, k), jnp.bfloat16), sds((b, g, s, k), jnp.bfloat16),
          sds((b, g, s, k), jnp.bfloat16),
          ops.CacheMask(sds((b, t), i32), sds((t,), i32), sds((b, s), i32), sds((b,), i32),
                        sds((), i32)))


def _decode_fn(impl):
  return jax.jit(lambda q, k, v, m: ops.decode_attention(q, k, v, m, scale=0.125, softcap=50.0,
                                                         impl=impl))


class LoweringTest(absltest.TestCase):
  """impl="pallas" lowered for a TPU (Mosaic) and a GPU (Triton) on CPU, SmolLM2's heads."""

  def test_tpu_lowering(self):
    module = jax.export.export(_decode_fn("pallas"), platforms=["tpu"])(
        *_abstract_args(8, 1, 3, 3, 4096, 64)).mlir_module()
    self.assertEqual(module.count("tpu_custom_call"), 1)
    self.assertNotIn("triton", module)

  def test_gpu_triton_lowering(self):
    target = "__gpu$xla.gpu.triton"
    # Lowering the Triton kernel needs a GPU description; an abstract H100 stands in for it.
    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=132,
                                         platform="gpu")
    checks = [jax.export.DisabledSafetyCheck.custom_call(target)]
    with jax.sharding.use_abstract_mesh(
        jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)):
      module = jax.export.export(_decode_fn("pallas"), platforms=["cuda"],
                                 disabled_checks=checks)(
                                     *_abstract_args(8, 1, 3, 3, 4096, 64)).mlir_module()
    self.assertEqual(module.count(target), 1)
    self.assertNotIn("tpu_custom_call", module)


@absltest.skipIf(importlib.util.find_spec("libtpu") is None,
                 "needs libtpu (pip install -e '.[tpu-plan]'; run with JAX_PLATFORMS=cpu)")
class TpuCompileTest(absltest.TestCase):
  """The Mosaic kernel through libtpu's compiler for a v5e chip, without a TPU."""

  def test_compiles_for_v5e(self):
    from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
    topo = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2")
    mesh = jax.sharding.Mesh(np.array(topo.devices[:1]), ("x",))
    one_chip = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    # A SmolLM2 decode step (K = 64: the cache is read slots-minor, as XLA lays it out), and
    # Gemma 2's K = 256 with a 16-token chunk. Neither copies the cache into another layout.
    for shape in ((8, 1, 3, 3, 4096, 64), (2, 16, 4, 2, 4096, 256)):
      compiled = _decode_fn("pallas_tpu").lower(*_abstract_args(*shape, one_chip)).compile()
      hlo = compiled.as_text()
      self.assertIn("tpu_custom_call", hlo)
      b, _, g, _, s, k = shape
      self.assertNotRegex(hlo, rf"bf16\[{b},{g},{s},{k}\]\S* copy\(")


if __name__ == "__main__":
  absltest.main()
