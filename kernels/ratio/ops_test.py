# pylint: disable=invalid-name
"""Tests for kernels.ratio: golden numbers and CTPO invariants on the jnp path, the Pallas kernel
against it (compiled on TPU, interpret mode everywhere), and the TPU lowering via jax.export."""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from kernels.ratio import ops
from kernels.ratio import pallas

jax.config.update("jax_numpy_rank_promotion", "raise")

BLOCKS = pallas.BlockSizes(rows=8, tokens=128)


def _inputs(b, t, seed=0):
  k = jax.random.split(jax.random.key(seed), 4)
  logp_BT = -2.0 * jax.random.uniform(k[0], (b, t))
  old_logp_BT = logp_BT + 0.05 * jax.random.normal(k[1], (b, t))
  old_logp_BT = old_logp_BT.at[0, 3].add(30.0)  # one |ℓ| > 20: the clamp binds
  mask_BT = (jax.random.uniform(k[2], (b, t)) > 0.3).astype(jnp.float32)
  return logp_BT, old_logp_BT, mask_BT, jax.random.normal(k[3], (b,))


class RatioStatsTest(parameterized.TestCase):

  def test_hand_computed(self):
    # ℓ = [0.1, −0.2, (masked), 0.3, 30 → clamp 20]; S = [0.1, −0.1, ·, 0.2, 20.2].
    ell = jnp.array([[0.1, -0.2, 5.0, 0.3, 30.0]])
    mask = jnp.array([[1.0, 1.0, 0.0, 1.0, 1.0]])
    out = ops.ratio_stats(ell, jnp.zeros_like(ell), mask, jnp.ones((1,)), kappa=0.0)
    np.testing.assert_allclose(out.log_ratio_BT, [[0.1, -0.2, 0.0, 0.3, 20.0]], rtol=1e-6)
    np.testing.assert_allclose(out.cum_log_ratio_BT, [[0.1, -0.1, 0.0, 0.2, 20.2]], rtol=1e-5)
    np.testing.assert_array_equal(out.position_BT, [[1, 2, 2, 3, 4]])
    # log ρ = min(S, 10) against [−0.025, 0.05].
    np.testing.assert_array_equal(out.clip_high_BT, [[True, False, False, True, True]])
    np.testing.assert_array_equal(out.clip_low_BT, [[False, True, False, False, False]])
    np.testing.assert_allclose([out.clipfrac_high, out.clipfrac_low, out.num_tokens],
                               [0.75, 0.0, 4.0])  # A > 0: low clips remove no gradient

  def test_window_grows_with_position(self):
    # κ = 0.5: S = 0.3 is clipped at n = 1 (hi = 0.05) but not at n = 100 (hi = 0.5).
    log_ratio = jnp.zeros((1, 100)).at[0, 0].set(0.3)
    out = ops.ratio_stats(log_ratio, jnp.zeros_like(log_ratio), jnp.ones((1, 100)),
                          jnp.ones((1,)), kappa=0.5)
    self.assertTrue(out.clip_high_BT[0, 0])
    self.assertFalse(out.clip_high_BT[0, 99])

  def test_masked_tokens_do_not_change_policy_tokens(self):
    logp_BT, old_logp_BT, _, adv_B = _inputs(2, 12)
    full = ops.ratio_stats(logp_BT, old_logp_BT, jnp.ones((2, 12)), adv_B)
    # Insert tool tokens with arbitrary log-probs after position 4.
    junk = jnp.full((2, 5), 7.0)
    ins = lambda x, fill: jnp.concatenate([x[:, :5], fill, x[:, 5:]], 1)
    with_tools = ops.ratio_stats(ins(logp_BT, junk), ins(old_logp_BT, -junk),
                                 ins(jnp.ones((2, 12)), jnp.zeros((2, 5))), adv_B)
    keep = np.r_[0:5, 10:17]
    for name in ("log_ratio_BT", "cum_log_ratio_BT", "position_BT", "clip_high_BT"):
      np.testing.assert_allclose(np.asarray(getattr(with_tools, name), np.float32)[:, keep],
                                 np.asarray(getattr(full, name), np.float32), atol=1e-6,
                                 err_msg=name)
    np.testing.assert_array_equal(with_tools.log_ratio_BT[:, 5:10], 0.0)
    self.assertTrue(np.any(np.asarray(full.cum_log_ratio_BT) != 0.0))

  def test_gradient_only_through_token_log_ratio(self):
    logp_BT, old_logp_BT, mask_BT, adv_B = _inputs(2, 8)
    f = lambda lp, field: getattr(ops.ratio_stats(lp, old_logp_BT, mask_BT, adv_B), field).sum()
    np.testing.assert_array_equal(jax.grad(f)(logp_BT, "cum_log_ratio_BT"), 0.0)
    g_BT = jax.grad(f)(logp_BT, "log_ratio_BT")
    np.testing.assert_array_equal(g_BT, mask_BT.at[0, 3].set(0.0))  # clamp at (0, 3) binds

  def test_bad_arguments_raise(self):
    logp_BT, old_logp_BT, mask_BT, adv_B = _inputs(2, 8)
    with self.assertRaisesRegex(ValueError, "impl"):
      ops.ratio_stats(logp_BT, old_logp_BT, mask_BT, adv_B, impl="triton")
    with self.assertRaisesRegex(ValueError, "shape"):
      ops.ratio_stats(logp_BT, old_logp_BT[:, :4], mask_BT, adv_B)
    if jax.default_backend() != "tpu":
      with self.assertRaisesRegex(ValueError, "interpret"):
        ops.ratio_stats(logp_BT, old_logp_BT, mask_BT, adv_B, impl="pallas")


class RatioPallasTest(parameterized.TestCase):
  """Compiled Mosaic kernel; needs a TPU (see the Interpret subclass)."""
  INTERPRET = False

  def setUp(self):
    super().setUp()
    if not self.INTERPRET and jax.default_backend() != "tpu":
      self.skipTest("The compiled ratio kernel needs a TPU; the Interpret subclass covers CPU.")

  @parameterized.parameters(
      dict(b=5, t=300, kappa=0.5, geomean=False),   # ragged B and T, 3 token tiles
      dict(b=9, t=128, kappa=-0.5, geomean=True),   # 2 row tiles, geomean ablation
      dict(b=3, t=40, kappa=0.0, geomean=False))    # uniform window, T < one tile
  def test_matches_xla(self, b, t, kappa, geomean):
    logp_BT, old_logp_BT, mask_BT, adv_B = _inputs(b, t)
    kw = dict(kappa=kappa, geomean=geomean, a_lo=0.1, a_hi=0.2)

    def run(impl, **extra):
      f = lambda lp: ops.ratio_stats(lp, old_logp_BT, mask_BT, adv_B, impl=impl, **kw, **extra)
      weights_BT = jnp.cos(jnp.arange(b * t, dtype=jnp.float32)).reshape(b, t)
      grad = jax.grad(lambda lp: jnp.sum(f(lp).log_ratio_BT * weights_BT))(logp_BT)
      return f(logp_BT), grad

    (got, got_grad), (want, want_grad) = (
        jax.jit(lambda: run("pallas", interpret=self.INTERPRET, block_sizes=BLOCKS))(),
        jax.jit(lambda: run("xla"))())
    for name, x, y in zip(ops.RatioStats._fields, got, want):
      np.testing.assert_allclose(np.asarray(x, np.float32), np.asarray(y, np.float32),
                                 atol=2e-5, err_msg=name)
    np.testing.assert_allclose(got_grad, want_grad, atol=1e-6)
    self.assertGreater(float(want.clipfrac_high + want.clipfrac_low), 0.0)  # clips exercised


class RatioPallasInterpretTest(RatioPallasTest):
  INTERPRET = True


class LoweringTest(absltest.TestCase):

  def test_tpu_lowering(self):
    s = jax.ShapeDtypeStruct((16, 1000), jnp.float32)
    f = lambda lp, old, m, a: ops.ratio_stats(lp, old, m, a, impl="pallas_tpu", geomean=True)
    module = jax.export.export(jax.jit(f), platforms=["tpu"])(s, s, s, s).mlir_module()
    self.assertEqual(module.count("tpu_custom_call"), 1)


if __name__ == "__main__":
  absltest.main()
