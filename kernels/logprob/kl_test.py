# pylint: disable=invalid-name
"""Tests for kernels.logprob.kl: every implementation against the naive reference.

Value and gradient w.r.t. the student's hidden states and W with per-token cotangents, forward
and reverse KL, full vocabulary and top-k, student and teacher of different widths, ragged N
and V against small chunks and tiles. The Pallas kernel runs compiled on a TPU
(`DistillKLPallasTest`, skipped elsewhere) and in interpret mode everywhere; its Mosaic
lowering is checked on CPU with `jax.export`.
"""
import functools

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from kernels.logprob import kl
from kernels.logprob import kl_pallas
from kernels.logprob import kl_xla

jax.config.update("jax_numpy_rank_promotion", "raise")

# Ragged n; V not a multiple of the 16-row / 128-column chunks and tiles; D_s != D_t.
CASES = (
    dict(n=8, ds=32, dt=32, v=256, dtype="float32", temperature=1.0, kind="forward", top_k=None),
    dict(n=37, ds=24, dt=40, v=300, dtype="float32", temperature=1.3, kind="reverse", top_k=None),
    dict(n=37, ds=24, dt=40, v=300, dtype="float32", temperature=0.7, kind="forward", top_k=7),
    dict(n=20, ds=16, dt=48, v=1000, dtype="float32", temperature=1.0, kind="reverse", top_k=50),
    dict(n=64, ds=64, dt=32, v=1000, dtype="bfloat16", temperature=1.0, kind="forward",
         top_k=None),
)
FULL_VOCAB = tuple(c for c in CASES if c["top_k"] is None)
XLA_BLOCKS = {"tokens": kl_xla.BlockSizes(rows=16, backward="tokens"),
              "vocab": kl_xla.BlockSizes(rows=16, backward="vocab", cols=128)}
PALLAS_BLOCKS = kl_pallas.BlockSizes(rows=16, vocab=128)


def _inputs(n, ds, dt, v, dtype, seed=0):
  k = jax.random.split(jax.random.key(seed), 5)
  h_s = jax.random.normal(k[0], (n, ds)).astype(dtype)
  w_s = (2.0 / np.sqrt(ds) * jax.random.normal(k[1], (ds, v))).astype(dtype)
  h_t = jax.random.normal(k[2], (n, dt)).astype(dtype)
  w_t = (2.0 / np.sqrt(dt) * jax.random.normal(k[3], (dt, v))).astype(dtype)
  g = jax.random.normal(k[4], (n,))  # per-token cotangents of both signs
  return h_s, w_s, h_t, w_t, g


def _value_and_grads(impl, case, **kw):
  h_s, w_s, h_t, w_t, g = _inputs(*(case[x] for x in ("n", "ds", "dt", "v", "dtype")))
  op = functools.partial(kl.distill_kl, kind=case["kind"], top_k=case["top_k"],
                         temperature=case["temperature"], impl=impl, **kw)

  def objective(h_s, w_s, h_t, w_t, g):
    kl_N = op(h_s, w_s, h_t, w_t)
    return jnp.sum(g * kl_N), kl_N

  # Inputs are jit arguments (closed-over constants would be constant-folded, slowly).
  (_, kl_N), grads = jax.jit(jax.value_and_grad(objective, (0, 1), has_aux=True))(
      h_s, w_s, h_t, w_t, g)
  return kl_N, grads


@functools.lru_cache(maxsize=None)
def _reference(case_items):
  return _value_and_grads("reference", dict(case_items))


def _assert_close(test, got, want, dtype):
  """Float32: 1e-5 relative to the largest reference entry of each array; bf16: 2e-2."""
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
    x, y = np.asarray(x, np.float32), np.asarray(y, np.float32)
    test.assertEqual(x.shape, y.shape)
    tol = 2e-2 if dtype == "bfloat16" else 1e-5
    np.testing.assert_allclose(x, y, atol=tol * float(np.abs(y).max()), rtol=0)


class DistillKLTest(parameterized.TestCase):

  def test_reference_hand_computed(self):
    # D = 1, h = 1: student p_S = [1, 2, 3]/6, teacher uniform (first row) or [1, 2, 4]/7.
    one = jnp.ones((1, 1))
    w_s = jnp.log(jnp.array([[1.0, 2.0, 3.0]]))
    uniform, skewed = jnp.zeros((1, 3)), jnp.log(jnp.array([[1.0, 2.0, 4.0]]))
    ref = functools.partial(kl.distill_kl, impl="reference")
    p_s, u = np.array([1, 2, 3]) / 6, np.full(3, 1 / 3)
    np.testing.assert_allclose(ref(one, w_s, one, uniform, kind="forward"),
                               [np.sum(u * np.log(u / p_s))], rtol=1e-6)  # = log(4/3) / 3
    np.testing.assert_allclose(ref(one, w_s, one, uniform, kind="reverse"),
                               [np.sum(p_s * np.log(p_s / u))], rtol=1e-6)
    # top-2 of [1, 2, 4]/7 is ids {1, 2}: teacher [2, 4]/6, student [2, 3]/5 after renormalising.
    # (A KL of 0.0095 from float32 log-probs: 1e-5 relative.)
    np.testing.assert_allclose(ref(one, w_s, one, skewed, kind="forward", top_k=2),
                               [np.log(5 / 6) / 3 + 2 * np.log(10 / 9) / 3], rtol=1e-5)
    # A uniform teacher's top-2 are its two lowest ids, {0, 1}: student [1, 2]/3.
    np.testing.assert_allclose(ref(one, w_s, one, uniform, kind="reverse", top_k=2),
                               [np.log(2 / 3) / 3 + 2 * np.log(4 / 3) / 3], rtol=1e-6)

  def test_temperature_divides_both_models(self):
    h_s, w_s, h_t, w_t, _ = _inputs(4, 8, 8, 16, "float32")
    got = kl.distill_kl(h_s, w_s, h_t, w_t, temperature=2.0, impl="reference")
    want = kl.distill_kl(h_s / 2, w_s, h_t / 2, w_t, impl="reference")
    np.testing.assert_allclose(got, want, rtol=1e-6)

  @parameterized.product(case=CASES, order=("tokens", "vocab"))
  def test_xla_matches_reference(self, case, order):
    got = _value_and_grads("xla", case, block_sizes=XLA_BLOCKS[order])
    _assert_close(self, got, _reference(tuple(case.items())), case["dtype"])

  @parameterized.parameters("forward", "reverse")
  def test_top_k_of_whole_vocabulary_is_the_full_kl(self, kind):
    h_s, w_s, h_t, w_t, _ = _inputs(19, 16, 24, 300, "float32")
    fn = jax.jit(lambda *a: (kl.distill_kl(*a, kind=kind, impl="xla"),
                             kl.distill_kl(*a, kind=kind, top_k=300, impl="xla")))
    full, top = fn(h_s, w_s, h_t, w_t)
    np.testing.assert_allclose(top, full, rtol=1e-5, atol=1e-6)

  @parameterized.parameters(*CASES[:4])
  def test_identical_models_give_zero(self, **case):
    h_s, w_s, _, _, g = _inputs(case["n"], case["ds"], case["ds"], case["v"], case["dtype"])
    loss = lambda h, w: jnp.sum(g * kl.distill_kl(h, w, h, w, kind=case["kind"],
                                                  top_k=case["top_k"], impl="xla"))
    value, (dh, dw) = jax.jit(jax.value_and_grad(loss, (0, 1)))(h_s, w_s)
    if case["top_k"] is None:  # the same logits on both sides: exact zeros
      self.assertEqual(float(value), 0.0)
      np.testing.assert_array_equal(dh, 0.0)
      np.testing.assert_array_equal(dw, 0.0)
    else:  # the student's k logits are a gather-matmul, the teacher's a full one: rounding
      np.testing.assert_allclose(value, 0.0, atol=1e-5)
      np.testing.assert_allclose(dh, 0.0, atol=1e-5)

  @parameterized.product(top_k=(None, 7), order=("tokens", "vocab"))
  def test_masked_rows_get_exactly_zero_gradient(self, top_k, order):
    # Rows with g = 0 (masked tokens) add nothing to dh (their rows) or to dW, whatever their h.
    h_s, w_s, h_t, w_t, g = _inputs(21, 24, 40, 300, "float32")
    g = g.at[6:].set(0.0)
    loss = lambda h, w: jnp.sum(g * kl.distill_kl(h, w, h_t, w_t, top_k=top_k, impl="xla",
                                                  block_sizes=XLA_BLOCKS[order]))
    grad = jax.jit(jax.grad(loss, (0, 1)))
    dh, dw = grad(h_s, w_s)
    np.testing.assert_array_equal(dh[6:], 0.0)
    self.assertTrue(np.all(np.abs(dh[:6]).sum(-1) > 0))
    _, dw_junk = grad(h_s.at[6:].set(100.0), w_s)
    np.testing.assert_allclose(dw_junk, dw, atol=1e-6)

  def test_teacher_gets_no_gradient(self):
    h_s, w_s, h_t, w_t, g = _inputs(9, 8, 12, 40, "float32")
    for impl in ("reference", "xla"):
      loss = lambda ht, wt, impl=impl: jnp.sum(g * kl.distill_kl(h_s, w_s, ht, wt, impl=impl))
      for x in jax.grad(loss, (0, 1))(h_t, w_t):
        np.testing.assert_array_equal(x, 0.0)

  @parameterized.parameters(None, 7)
  def test_no_NV_residual(self, top_k):
    n, v = 64, 1000
    h_s, w_s, h_t, w_t, _ = _inputs(n, 32, 16, v, "float32")

    def residual_sizes(impl, top_k=top_k, **kw):
      f = lambda hs, ws: kl.distill_kl(hs, ws, h_t, w_t, top_k=top_k, impl=impl, **kw)
      _, vjp_fn = jax.vjp(f, h_s, w_s)
      return [x.size for x in jax.tree.leaves(vjp_fn)]

    self.assertLess(max(residual_sizes("xla")), n * v)
    if top_k is None:
      self.assertLess(max(residual_sizes("pallas", interpret=True)), n * v)
    # The check can fail: the naive full-vocabulary op keeps [N, V] arrays.
    self.assertGreaterEqual(max(residual_sizes("reference", top_k=None)), n * v)

  def test_auto_dispatch(self):
    self.assertEqual(kl.default_impl("tpu"), "pallas_tpu")
    self.assertEqual(kl.default_impl("gpu"), "xla")
    self.assertEqual(kl.default_impl("cpu"), "xla")

  def test_bad_arguments_raise(self):
    h_s, w_s, h_t, w_t, _ = _inputs(8, 16, 24, 64, "float32")
    with self.assertRaisesRegex(ValueError, "cross-tokenizer distillation is out of scope"):
      kl.distill_kl(h_s, w_s, h_t, w_t[:, :60])
    with self.assertRaisesRegex(ValueError, "same N token positions"):
      kl.distill_kl(h_s, w_s, h_t[:5], w_t)
    with self.assertRaisesRegex(ValueError, "w_teacher_DV"):
      kl.distill_kl(h_s, w_s, h_t, w_t.T)
    with self.assertRaisesRegex(ValueError, "kind"):
      kl.distill_kl(h_s, w_s, h_t, w_t, kind="jsd")
    for top_k in (0, 65, 2.0):
      with self.assertRaisesRegex(ValueError, "top_k"):
        kl.distill_kl(h_s, w_s, h_t, w_t, top_k=top_k)
    with self.assertRaisesRegex(ValueError, "temperature"):
      kl.distill_kl(h_s, w_s, h_t, w_t, temperature=0.0)
    with self.assertRaisesRegex(ValueError, "impl"):
      kl.distill_kl(h_s, w_s, h_t, w_t, impl="cuda")
    with self.assertRaisesRegex(ValueError, "top_k runs the xla path"):
      kl.distill_kl(h_s, w_s, h_t, w_t, top_k=4, impl="pallas", interpret=True,
                    block_sizes=PALLAS_BLOCKS)
    if jax.default_backend() == "cpu":
      with self.assertRaisesRegex(ValueError, "interpret"):
        kl.distill_kl(h_s, w_s, h_t, w_t, impl="pallas")


class DistillKLPallasTest(parameterized.TestCase):
  """The compiled Mosaic kernel; it needs a TPU (the Interpret subclass runs everywhere)."""
  INTERPRET = False

  @parameterized.parameters(*FULL_VOCAB)
  def test_matches_reference(self, **case):
    if not self.INTERPRET and jax.default_backend() != "tpu":
      self.skipTest("Compiled pallas_tpu needs a TPU; the Interpret subclass covers CPU.")
    got = _value_and_grads("pallas", case, block_sizes=PALLAS_BLOCKS, interpret=self.INTERPRET)
    _assert_close(self, got, _reference(tuple(case.items())), case["dtype"])


class DistillKLPallasInterpretTest(DistillKLPallasTest):
  INTERPRET = True


class LoweringTest(absltest.TestCase):

  def test_tpu_lowering(self):
    n, d, v = 256, 576, 1000  # D and V not multiples of the tiles, as SmolLM2's head

    def fwd(h_s, w_s, h_t, w_t):
      return kl.distill_kl(h_s, w_s, h_t, w_t, kind="reverse", impl="pallas_tpu")

    def grad(*args):
      return jax.grad(lambda h_s, w_s: jnp.sum(fwd(h_s, w_s, *args[2:])), (0, 1))(*args[:2])

    args = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in ((n, d), (d, v), (n, 2 * d),
                                                            (2 * d, v))]
    fwd_mlir, grad_mlir = (jax.export.export(jax.jit(f), platforms=["tpu"])(*args).mlir_module()
                           for f in (fwd, grad))
    self.assertEqual(fwd_mlir.count("tpu_custom_call"), 1)
    self.assertEqual(grad_mlir.count("tpu_custom_call"), 3)  # forward + dh + dW kernels


if __name__ == "__main__":
  absltest.main()
