# pylint: disable=invalid-name
"""Tests for kernels.logprob: every implementation against the naive reference (docs/style.md C10).

Value and gradient w.r.t. hidden and W with per-token cotangents on logp and entropy, float32
and bf16, ragged N, V not a multiple of the tile, soft-capping and temperature. The Pallas
kernels run compiled on their accelerator (`TokenLogprobsPallasTest`, skipped on CPU) and in
interpret mode everywhere (`TokenLogprobsPallasInterpretTest`); the TPU (Mosaic) and GPU
(Triton) lowerings are checked on CPU with `jax.export`.
"""
import dataclasses
import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from kernels.logprob import common
from kernels.logprob import ops
from kernels.logprob import pallas_gpu
from kernels.logprob import pallas_tpu
from kernels.logprob import xla

jax.config.update("jax_numpy_rank_promotion", "raise")

# (n, d, v, dtype, softcap, temperature, entropy): ragged n, v not a multiple of any tile.
CASES = (
    dict(n=8, d=32, v=256, dtype="float32", softcap=None, temperature=1.0, entropy=False),
    dict(n=37, d=40, v=300, dtype="float32", softcap=5.0, temperature=1.3, entropy=True),
    dict(n=64, d=64, v=1000, dtype="bfloat16", softcap=None, temperature=1.0, entropy=True),
    dict(n=130, d=48, v=5000, dtype="bfloat16", softcap=30.0, temperature=0.7, entropy=False),
)
# Small tiles so the test shapes span several row and vocab tiles.
BLOCKS = {
    "xla": xla.BlockSizes(rows=16),
    "pallas_tpu": pallas_tpu.BlockSizes(rows=16, vocab=128),
    "pallas_gpu": pallas_gpu.BlockSizes(rows=16, vocab=128, depth=16, vocab_splits=3,
                                        backward="triton"),
}


def _inputs(n, d, v, dtype, seed=0):
  k = jax.random.split(jax.random.key(seed), 5)
  h_ND = jax.random.normal(k[0], (n, d)).astype(dtype)
  w_DV = (3.0 / np.sqrt(d) * jax.random.normal(k[1], (d, v))).astype(dtype)
  y_N = jax.random.randint(k[2], (n,), 0, v)
  # Per-token cotangents of both signs: RL losses weight each token by its advantage.
  g_N, g_ent_N = jax.random.normal(k[3], (n,)), jax.random.normal(k[4], (n,))
  return h_ND, w_DV, y_N, g_N, g_ent_N


def _value_and_grads(impl, case, **kw):
  h_ND, w_DV, y_N, g_N, g_ent_N = _inputs(case["n"], case["d"], case["v"], case["dtype"])

  def objective(h_ND, w_DV):
    out = ops.token_logprobs(h_ND, w_DV, y_N, temperature=case["temperature"],
                             softcap=case["softcap"], return_entropy=case["entropy"],
                             impl=impl, **kw)
    logp_N, ent_N = out if case["entropy"] else (out, jnp.zeros_like(out))
    return jnp.sum(g_N * logp_N) + jnp.sum(g_ent_N * ent_N), (logp_N, ent_N)

  # One jit per call: eager op-by-op dispatch compiles every primitive separately (slower).
  (_, values), grads = jax.jit(jax.value_and_grad(objective, (0, 1), has_aux=True))(h_ND, w_DV)
  return values, grads


@functools.lru_cache(maxsize=None)
def _reference(case_items):
  return _value_and_grads("reference", dict(case_items))


def _assert_close(test, got, want, dtype):
  """Compares pytrees; bf16 tolerances are relative to the largest reference entry."""
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    test.assertEqual(x.shape, y.shape)
    scale = max(1.0, float(np.abs(y).max()))
    tol = 2e-2 if dtype == "bfloat16" else 2e-5
    np.testing.assert_allclose(x, y, atol=tol * scale, rtol=0)


class TokenLogprobsTest(parameterized.TestCase):

  def test_reference_hand_computed(self):
    # Logits [0, ln 2, ln 3] (D = 1, h = 1): p = [1/6, 2/6, 3/6].
    w_DV = jnp.log(jnp.array([[1.0, 2.0, 3.0]]))
    logp_N, ent_N = ops.token_logprobs_reference(jnp.ones((2, 1)), w_DV, jnp.array([2, 0]),
                                                 return_entropy=True)
    np.testing.assert_allclose(logp_N, np.log([0.5, 1 / 6]), rtol=1e-6)
    p = np.array([1, 2, 3]) / 6
    np.testing.assert_allclose(ent_N, [-(p * np.log(p)).sum()] * 2, rtol=1e-6)

  def test_softcap_and_temperature_order(self):
    # Soft-capping applies to raw logits, then temperature (Gemma-2, verl).
    h_ND, w_DV = jnp.ones((1, 1)), jnp.array([[0.0, 4.0]])
    logp = ops.token_logprobs_reference(h_ND, w_DV, jnp.array([1]), temperature=2.0,
                                        softcap=3.0)
    z1 = 3.0 * np.tanh(4.0 / 3.0) / 2.0
    np.testing.assert_allclose(logp, [z1 - np.logaddexp(0.0, z1)], rtol=1e-6)

  @parameterized.parameters(*CASES)
  def test_xla_matches_reference(self, **case):
    got = _value_and_grads("xla", case, block_sizes=BLOCKS["xla"])
    _assert_close(self, got, _reference(tuple(case.items())), case["dtype"])

  @parameterized.parameters(*CASES)
  def test_xla_vocab_chunked_backward_matches_reference(self, **case):
    # 128-column chunks: exact (v=256), ragged last chunk shifted left (v=300, 1000, 5000).
    blocks = xla.BlockSizes(rows=16, backward="vocab", cols=128)
    got = _value_and_grads("xla", case, block_sizes=blocks)
    _assert_close(self, got, _reference(tuple(case.items())), case["dtype"])

  def test_xla_backward_orders_agree(self):
    with self.assertRaisesRegex(ValueError, "backward must be 'auto', 'tokens' or 'vocab'"):
      xla.backward(*[jnp.zeros(s) for s in ((4, 8), (8, 16))], jnp.zeros(4, jnp.int32),
                   *[jnp.zeros(4)] * 3, None, block_sizes=xla.BlockSizes(backward="rows"))
    # Both loop orders give the same gradients (N=40 > V=50 is false: auto would take vocab).
    h_ND, w_DV, y_N, g_N, _ = _inputs(40, 16, 50, "float32")
    z = lambda b: jax.jit(jax.grad(lambda h, w: jnp.sum(g_N * ops.token_logprobs(
        h, w, y_N, impl="xla", block_sizes=b)), (0, 1)))(h_ND, w_DV)
    tokens, vocab = z(xla.BlockSizes(rows=16, backward="tokens")), z(
        xla.BlockSizes(backward="vocab", cols=16))
    for a, b in zip(tokens, vocab):
      np.testing.assert_allclose(a, b, atol=1e-5)

  def test_xla_token_chunks_are_balanced(self):
    # 64 MiB of float32 logits hold 336 SmolLM2 rows (V = 49152); N = 4 x 255 = 1020 tokens
    # run as 4 chunks of 256 (4 padded rows), not 4 of 336 (324 padded rows of logits).
    smollm2 = lambda n, **kw: xla.chunk_rows(n, 49152, xla.BlockSizes(**kw))
    self.assertEqual([smollm2(n) for n in (1020, 4096, 336, 337, 100)],
                     [256, 320, 336, 176, 100])
    self.assertEqual(smollm2(1020, rows=336), 336)           # an explicit size is kept
    h_ND, w_DV, y_N, _, _ = _inputs(41, 16, 50, "float32")   # 2 chunks of 24, not 2 of 40
    np.testing.assert_allclose(
        ops.token_logprobs(h_ND, w_DV, y_N, impl="xla",
                           block_sizes=xla.BlockSizes(chunk_bytes=4 * 50 * 40)),
        ops.token_logprobs_reference(h_ND, w_DV, y_N), rtol=1e-5, atol=1e-6)

  @parameterized.parameters("tokens", "vocab")
  def test_gradient_is_zero_for_zero_cotangent_tokens(self, order):
    # A masked token (g = g_ent = 0) must not contribute to dh (its row) or to dW.
    h_ND, w_DV, y_N, g_N, _ = _inputs(16, 32, 300, "float32")
    g_N = g_N.at[5:].set(0.0)
    blocks = xla.BlockSizes(rows=16, backward=order, cols=128)
    loss = lambda h, w: jnp.sum(g_N * ops.token_logprobs(h, w, y_N, impl="xla",
                                                         block_sizes=blocks))
    dh, dw = jax.jit(jax.grad(loss, (0, 1)))(h_ND, w_DV)
    np.testing.assert_array_equal(dh[5:], 0.0)
    self.assertTrue(np.all(np.abs(dh[:5]).sum(-1) > 0))
    dw_first5 = jax.jit(jax.grad(loss, 1))(h_ND.at[5:].set(100.0), w_DV)  # junk in masked rows
    np.testing.assert_allclose(dw_first5, dw, atol=1e-6)

  def test_no_NV_residual(self):
    n, v = 64, 1000
    h_ND, w_DV, y_N, _, _ = _inputs(n, 32, v, "float32")

    def residual_sizes(impl):
      f = lambda h, w: ops.token_logprobs(h, w, y_N, impl=impl, return_entropy=True)
      _, vjp_fn = jax.vjp(f, h_ND, w_DV)
      return [x.size for x in jax.tree.leaves(vjp_fn)]

    self.assertLess(max(residual_sizes("xla")), n * v)
    self.assertGreaterEqual(max(residual_sizes("reference")), n * v)  # the check can fail

  def test_vocab_shards_compose(self):
    # What a vocab-parallel wrapper does: per-shard stats and grads, merged.
    h_ND, w_DV, y_N, g_N, g_ent_N = _inputs(24, 32, 900, "float32")
    kw = dict(temperature=0.9, softcap=20.0)
    starts = (0, 300, 600)

    @jax.jit
    def sharded():
      shards = [ops.logprob_stats(h_ND, w_DV[:, a:a + 300], y_N - a, with_entropy=True,
                                  impl="xla", **kw) for a in starts]
      stats = functools.reduce(ops.merge_stats, shards)
      # The same merge as a collective over a named axis (vmap stands in for shard_map).
      stacked = jax.tree.map(lambda *x: jnp.stack(x), *shards)
      gathered = jax.vmap(lambda s: ops.allreduce_stats(s, "v"), axis_name="v")(stacked)
      logp_N, lse_N, mean_z_N = ops.finalize(stats)
      grads = [ops.logprob_backward(h_ND, w_DV[:, a:a + 300], y_N - a, lse_N, mean_z_N, g_N,
                                    g_ent_N, impl="xla", **kw) for a in starts]
      return (logp_N, lse_N - mean_z_N, ops.finalize(jax.tree.map(lambda x: x[1], gathered))[0],
              sum(g[0] for g in grads), jnp.concatenate([g[1] for g in grads], 1))

    case = dict(n=24, d=32, v=900, dtype="float32", softcap=20.0, temperature=0.9, entropy=True)
    # Full float32 matmuls: GPUs default to TF32, whose rounding differs between the sharded
    # and the whole-vocabulary products by more than this exactness check allows.
    with jax.default_matmul_precision("highest"):
      (ref_logp, ref_ent), ref_grads = _value_and_grads("reference", case)
      logp_N, ent_N, logp_collective_N, dh_ND, dw_DV = sharded()
    for got, want in ((logp_N, ref_logp), (ent_N, ref_ent), (logp_collective_N, ref_logp),
                      (dh_ND, ref_grads[0]), (dw_DV, ref_grads[1])):
      np.testing.assert_allclose(got, want, atol=2e-5)

  def test_auto_dispatch(self):
    self.assertEqual(ops.default_impl("tpu"), "pallas_tpu")
    self.assertEqual(ops.default_impl("gpu"), "pallas_gpu")
    self.assertEqual(ops.default_impl("cpu"), "xla")

  def test_bad_arguments_raise(self):
    h_ND, w_DV, y_N, _, _ = _inputs(8, 32, 256, "float32")
    with self.assertRaisesRegex(ValueError, "impl"):
      ops.token_logprobs(h_ND, w_DV, y_N, impl="cuda")
    with self.assertRaisesRegex(ValueError, "w_DV"):
      ops.token_logprobs(h_ND, w_DV.T, y_N)
    with self.assertRaisesRegex(ValueError, "temperature"):
      ops.token_logprobs(h_ND, w_DV, y_N, temperature=0.0)
    with self.assertRaisesRegex(ValueError, "block_sizes"):
      ops.token_logprobs(h_ND, w_DV, y_N, impl="xla", block_sizes=BLOCKS["pallas_tpu"])
    with self.assertRaisesRegex(ValueError, "power of two"):
      ops.token_logprobs(h_ND, w_DV, y_N, impl="pallas_gpu", interpret=True,
                         block_sizes=pallas_gpu.BlockSizes(rows=24))
    if jax.default_backend() == "cpu":
      with self.assertRaisesRegex(ValueError, "interpret"):
        ops.token_logprobs(h_ND, w_DV, y_N, impl="pallas")


class TokenLogprobsPallasTest(parameterized.TestCase):
  """Compiled Pallas kernels; they need their accelerator (see the Interpret subclass)."""
  INTERPRET = False

  def _skip_unless_runnable(self, impl):
    backend = {"pallas_tpu": "tpu", "pallas_gpu": "gpu"}[impl]
    if not self.INTERPRET and jax.default_backend() != backend:
      self.skipTest(f"Compiled {impl} needs a {backend}; the Interpret subclass covers CPU.")

  @parameterized.product(impl=("pallas_tpu", "pallas_gpu"), case=CASES[1:])
  def test_matches_reference(self, impl, case):
    self._skip_unless_runnable(impl)
    got = _value_and_grads(impl, case, block_sizes=BLOCKS[impl], interpret=self.INTERPRET)
    _assert_close(self, got, _reference(tuple(case.items())), case["dtype"])

  def test_gpu_xla_backward(self):
    """pallas_gpu's default: the Triton forward, the XLA path's backward on its residuals."""
    self._skip_unless_runnable("pallas_gpu")
    case = CASES[1]
    blocks = dataclasses.replace(BLOCKS["pallas_gpu"], backward="xla")
    got = _value_and_grads("pallas_gpu", case, block_sizes=blocks, interpret=self.INTERPRET)
    _assert_close(self, got, _reference(tuple(case.items())), case["dtype"])

  @parameterized.parameters("pallas_tpu", "pallas_gpu")
  def test_stats_match_xla(self, impl):
    self._skip_unless_runnable(impl)
    h_ND, w_DV, y_N, _, _ = _inputs(37, 40, 300, "float32")
    y_N = y_N.at[0].set(-1).at[1].set(300)  # out-of-shard targets contribute t = 0
    kw = dict(with_entropy=True, softcap=5.0)
    got = ops.logprob_stats(h_ND, w_DV, y_N, impl=impl, block_sizes=BLOCKS[impl],
                            interpret=self.INTERPRET, **kw)
    want = ops.logprob_stats(h_ND, w_DV, y_N, impl="xla", **kw)
    for name, x, y in zip(common.Stats._fields, got, want):
      if name in ("l", "a"):  # relative to the running max, which may differ: compare lse
        continue
      np.testing.assert_allclose(x, y, atol=1e-5, err_msg=name)
    np.testing.assert_allclose(ops.finalize(got), ops.finalize(want), atol=2e-5)
    np.testing.assert_array_equal(got.t[:2], 0.0)


class TokenLogprobsPallasInterpretTest(TokenLogprobsPallasTest):
  INTERPRET = True


class LoweringTest(absltest.TestCase):
  """Pallas → Mosaic (TPU) and Pallas → Triton (GPU) lowering, forward and grad, on CPU."""

  def _export(self, impl, platform, block_sizes=None, **export_kw):
    n, d, v = 256, 576, 1000  # D and V not multiples of the tiles, as in SmolLM2 (D = 576)

    def fwd(h, w, y):
      return ops.token_logprobs(h, w, y, return_entropy=True, impl=impl, softcap=30.0,
                                block_sizes=block_sizes)

    def grad(h, w, y):
      return jax.grad(lambda h, w: sum(jnp.sum(x) for x in fwd(h, w, y)), (0, 1))(h, w)

    args = (jax.ShapeDtypeStruct((n, d), jnp.bfloat16),
            jax.ShapeDtypeStruct((d, v), jnp.bfloat16), jax.ShapeDtypeStruct((n,), jnp.int32))
    return [jax.export.export(jax.jit(f), platforms=[platform], **export_kw)(*args).mlir_module()
            for f in (fwd, grad)]

  def test_tpu_lowering(self):
    fwd, grad = self._export("pallas_tpu", "tpu")
    self.assertEqual(fwd.count("tpu_custom_call"), 1)
    self.assertEqual(grad.count("tpu_custom_call"), 3)  # forward + dh + dW kernels

  def test_gpu_triton_lowering(self):
    target = "__gpu$xla.gpu.triton"
    # Lowering the Triton kernel needs a GPU description; an abstract H100 stands in for it.
    device = jax.sharding.AbstractDevice(device_kind="NVIDIA H100", num_cores=132,
                                         platform="gpu")
    checks = dict(disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(target)])
    with jax.sharding.use_abstract_mesh(
        jax.sharding.AbstractMesh((1,), ("x",), abstract_device=device)):
      fwd, grad = self._export("pallas_gpu", "cuda",
                               block_sizes=pallas_gpu.BlockSizes(backward="triton"), **checks)
      _, grad_default = self._export("pallas_gpu", "cuda", **checks)
    self.assertEqual(fwd.count(target), 1)
    self.assertEqual(grad.count(target), 3)  # forward + dh + dW kernels
    self.assertEqual(grad_default.count(target), 1)  # the default backward is the XLA path's


if __name__ == "__main__":
  absltest.main()
