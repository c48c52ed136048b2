# pylint: disable=invalid-name
"""Tests for agentrl.losses.ratios: golden numbers, CTPO and HölderPO properties."""
import decimal
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import ratios

jax.config.update("jax_numpy_rank_promotion", "raise")

LN = np.log
# Hand-made batch: row 0 has ratios (2, 0.5, 1.5); row 1 has (1.25, <masked>, 0.75), and its
# masked token carries a garbage log-prob that must not matter.
MASK = jnp.array([[1., 1., 1.], [1., 0., 1.]])
ELL = np.array([[LN(2.), -LN(2.), LN(1.5)], [LN(1.25), 0., LN(0.75)]])
OLD = jnp.full((2, 3), -1.0)
LOGP = jnp.asarray(np.where(np.asarray(MASK) > 0, -1.0 + ELL, 40.0), jnp.float32)


def _random_batch(seed=0, b=4, t=6, scale=0.3):
  """Masks with holes, a leading masked prompt, and a fully masked row."""
  rng = np.random.default_rng(seed)
  mask = np.array([[1, 1, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1],
                   [0, 1, 1, 0, 0, 1]], np.float32)[:b, :t]
  old = -rng.uniform(0.1, 3.0, (b, t))
  logp = old + rng.normal(0.0, scale, (b, t))
  logp = np.where(mask > 0, logp, 7.0)  # garbage on masked tokens
  return jnp.asarray(logp, jnp.float32), jnp.asarray(old, jnp.float32), jnp.asarray(mask)


class GoldenTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_token_log_ratio(self):
    out = self.variant(ratios.token_log_ratio)(LOGP, OLD, MASK)
    np.testing.assert_allclose(out, ELL, rtol=1e-6, atol=1e-7)
    clamped = self.variant(functools.partial(ratios.token_log_ratio, clamp=0.5))(LOGP, OLD, MASK)
    np.testing.assert_allclose(clamped, [[0.5, -0.5, 0.4054651], [0.2231436, 0., -0.2876821]],
                               rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_sequence_log_ratios(self):
    np.testing.assert_allclose(self.variant(ratios.sequence_log_ratio)(LOGP, OLD, MASK),
                               [0.13515504, -0.03226926], rtol=1e-5)
    tok = self.variant(functools.partial(ratios.sequence_token_log_ratio, max_log_ratio=0.1))
    np.testing.assert_allclose(tok(LOGP, OLD, MASK),
                               [[0.1, 0.1, 0.1], [-0.03226926, 0., -0.03226926]], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_cumulative_log_ratio(self):
    log_rho, n = self.variant(ratios.cumulative_log_ratio)(LOGP, OLD, MASK)
    np.testing.assert_allclose(log_rho, [[LN(2.), 0., LN(1.5)], [LN(1.25), 0., LN(0.9375)]],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(n, [[1., 2., 3.], [1., 1., 2.]])
    geo, _ = self.variant(functools.partial(ratios.cumulative_log_ratio, geomean=True))(
        LOGP, OLD, MASK)
    np.testing.assert_allclose(geo, [[LN(2.), 0., 0.13515504], [LN(1.25), 0., -0.03226926]],
                               rtol=1e-5, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_holder_log_ratio(self):
    ell = jnp.asarray(np.where(np.asarray(MASK) > 0, ELL, 9.0), jnp.float32)
    fn = self.variant(ratios.holder_log_ratio)
    golden = {1.0: [0.28768207, 0.0], -1.0: [-0.05406722, -0.06453852],
              2.0: [0.38659494, 0.03031231], 0.0: [0.13515504, -0.03226926]}
    for p, want in golden.items():
      np.testing.assert_allclose(fn(ell, MASK, p=jnp.float32(p)), want, rtol=1e-5, atol=1e-6,
                                 err_msg=f"p={p}")

  @chex.variants(with_jit=True, without_jit=True)
  def test_rollout_correction_weight(self):
    # old = logp of the fixture, sampler = -1: per-token weights are the ratios above.
    fn = lambda **kw: self.variant(functools.partial(ratios.rollout_correction_weight, **kw))(
        LOGP, OLD, MASK)
    np.testing.assert_allclose(fn(level="token", threshold=1.6),
                               [[1.6, 0.5, 1.5], [1.25, 0., 0.75]], rtol=1e-6)
    np.testing.assert_allclose(fn(level="sequence", threshold=1.2),
                               [[1.2, 1.2, 1.2], [0.9375, 0., 0.9375]], rtol=1e-6)
    np.testing.assert_allclose(fn(level="token", threshold=1.6, batch_normalize=True),
                               np.array([[1.6, 0.5, 1.5], [1.25, 0., 0.75]]) / 1.12, rtol=1e-6)
    np.testing.assert_allclose(fn(level="sequence", threshold=2.0, batch_normalize=True),
                               np.array([[1.5, 1.5, 1.5], [0.9375, 0., 0.9375]]) / 1.21875,
                               rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_rollout_rejection_mask(self):
    # Ratios (2, 0.5, 1.5) and (1.25, masked, 0.75); row products 1.5 and 0.9375.
    fn = lambda **kw: self.variant(functools.partial(ratios.rollout_rejection_mask, **kw))(
        LOGP, OLD, MASK)
    np.testing.assert_array_equal(fn(level="token", threshold=1.6), [[0, 0, 1], [1, 0, 1]])
    np.testing.assert_array_equal(fn(level="sequence", threshold=1.4), [[0, 0, 0], [1, 0, 1]])
    np.testing.assert_array_equal(fn(level="sequence", threshold=1.6), [[1, 1, 1], [1, 0, 1]])
    with self.assertRaisesRegex(ValueError, "threshold must be > 1"):
      ratios.rollout_rejection_mask(LOGP, OLD, MASK, threshold=0.5)


class RatioPropertiesTest(parameterized.TestCase):

  def test_masked_tokens_get_zero_gradient(self):
    logp, old, mask = _random_batch()
    fns = {
        "token": lambda lp: ratios.token_log_ratio(lp, old, mask).sum(),
        "seq": lambda lp: ratios.sequence_log_ratio(lp, old, mask).sum(),
        "seq_token": lambda lp: ratios.sequence_token_log_ratio(lp, old, mask).sum(),
        "cum": lambda lp: ratios.cumulative_log_ratio(lp, old, mask)[0].sum(),
        "holder": lambda lp: ratios.holder_log_ratio(lp - old, mask, p=-2.0).sum(),
    }
    for name, fn in fns.items():
      g = np.asarray(jax.grad(fn)(logp))
      np.testing.assert_array_equal(g[np.asarray(mask) == 0], 0.0, err_msg=name)
      self.assertTrue(np.all(g[np.asarray(mask) == 1] != 0.0), msg=name)

  def test_token_clamp_has_zero_gradient(self):
    logp = jnp.array([[30.0, 0.5, -25.0, 0.0]])
    g = jax.grad(lambda lp: ratios.token_log_ratio(lp, jnp.zeros((1, 4)), jnp.ones((1, 4))).sum())(
        logp)
    np.testing.assert_array_equal(g, [[0.0, 1.0, 0.0, 1.0]])

  def test_rollout_weight_is_detached_and_validates(self):
    logp, old, mask = _random_batch()
    g = jax.grad(lambda o: ratios.rollout_correction_weight(o, logp, mask).sum())(old)
    np.testing.assert_array_equal(g, 0.0)
    self.assertGreater(float(ratios.rollout_correction_weight(old, logp, mask).sum()), 0.0)
    with self.assertRaisesRegex(ValueError, "'token' or 'sequence'"):
      ratios.rollout_correction_weight(old, logp, mask, level="geometric")


class CumulativeRatioTest(absltest.TestCase):
  """CTPO ratio properties (docs/algorithms.md §1.6)."""

  def test_first_and_last_policy_tokens(self):
    logp, old, mask = _random_batch()
    log_rho, n = ratios.cumulative_log_ratio(logp, old, mask)
    ell, m = np.asarray(logp - old, np.float64), np.asarray(mask) > 0
    for b in (0, 2, 3):
      idx = np.flatnonzero(m[b])
      np.testing.assert_allclose(np.exp(log_rho[b, idx[0]]), np.exp(ell[b, idx[0]]), rtol=1e-5)
      np.testing.assert_allclose(np.exp(log_rho[b, idx[-1]]), np.prod(np.exp(ell[b, idx])),
                                 rtol=1e-5)
      np.testing.assert_array_equal(n[b, idx], np.arange(1, len(idx) + 1))
    self.assertGreater(np.abs(np.asarray(log_rho)).max(), 0.1)  # ratios are not all 1

  def test_jacobian_is_diagonal(self):
    logp, old, mask = _random_batch()
    row = lambda lp: jnp.exp(ratios.cumulative_log_ratio(lp[None], old[2:3], mask[2:3])[0][0])
    jac = np.asarray(jax.jacfwd(row)(logp[2]))
    rho = np.asarray(row(logp[2]))
    np.testing.assert_allclose(np.diag(jac), rho, rtol=1e-6)
    np.testing.assert_array_equal(jac - np.diag(np.diag(jac)), 0.0)
    self.assertGreater(np.ptp(rho), 0.05)  # prefix products differ along the row

  def test_inserting_masked_tool_tokens_changes_nothing(self):
    logp, old, _ = _random_batch()
    policy_logp, policy_old = logp[2, :4], old[2, :4]
    # Same four policy tokens with a two-token tool observation after the second.
    ins_logp = jnp.concatenate([policy_logp[:2], jnp.array([5.0, -9.0]), policy_logp[2:]])
    ins_old = jnp.concatenate([policy_old[:2], jnp.array([-3.0, 1.0]), policy_old[2:]])
    ins_mask = jnp.array([1., 1., 0., 0., 1., 1.])
    for geomean in (False, True):
      ref, ref_n = ratios.cumulative_log_ratio(policy_logp[None], policy_old[None],
                                               jnp.ones((1, 4)), geomean=geomean)
      got, got_n = ratios.cumulative_log_ratio(ins_logp[None], ins_old[None], ins_mask[None],
                                               geomean=geomean)
      keep = np.array([0, 1, 4, 5])
      np.testing.assert_allclose(got[0, keep], ref[0], rtol=1e-6)
      np.testing.assert_array_equal(got_n[0, keep], ref_n[0])
      np.testing.assert_array_equal(got_n[0, keep], [1., 2., 3., 4.])

  def test_max_log_ratio_clamp_zeroes_gradient(self):
    logp, old, mask = jnp.array([[12.0, 0.0, -3.0, 0.5]]), jnp.zeros((1, 4)), jnp.ones((1, 4))
    grad = jax.grad(lambda lp: ratios.cumulative_log_ratio(lp, old, mask)[0].sum())
    # Prefix sums 12, 12, 9, 9.5: only the first two exceed the clamp at 10.
    np.testing.assert_array_equal(grad(logp), [[0.0, 0.0, 1.0, 1.0]])


class HolderRatioTest(parameterized.TestCase):
  """Power-mean properties (docs/algorithms.md §2.6, §2.8, §9)."""

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(3)
    self.ell = rng.normal(0.0, 0.3, (1, 6))
    self.r = np.exp(self.ell[0])
    self.mask = jnp.ones((1, 6))

  def _mean(self, p):
    return float(jnp.exp(ratios.holder_log_ratio(jnp.asarray(self.ell, jnp.float32), self.mask,
                                                 p=p))[0])

  def test_classical_means_and_limits(self):
    r = self.r
    np.testing.assert_allclose(self._mean(1.0), r.mean(), rtol=1e-6)
    np.testing.assert_allclose(self._mean(0.0), np.exp(np.log(r).mean()), rtol=1e-6)
    np.testing.assert_allclose(self._mean(1e-7), np.exp(np.log(r).mean()), rtol=1e-6)
    np.testing.assert_allclose(self._mean(-1.0), 1.0 / (1.0 / r).mean(), rtol=1e-6)
    np.testing.assert_allclose(self._mean(50.0), r.max(), rtol=0.05)
    np.testing.assert_allclose(self._mean(-50.0), r.min(), rtol=0.05)
    self.assertGreater(r.max() / r.min(), 1.3)  # the limits are distinguishable

  def test_monotone_in_p(self):
    ps = [-50., -2., -1., -0.5, 0., 0.5, 1., 2., 3., 50.]
    means = [self._mean(p) for p in ps]
    self.assertTrue(np.all(np.diff(means) >= -1e-6), msg=str(means))
    self.assertGreater(means[-1] - means[0], 0.1)

  @parameterized.parameters(-2.0, -1.0, 0.5, 1.0, 2.0, 0.0)
  def test_gradient_is_rho_times_softmax(self, p):
    ell = jnp.asarray(self.ell, jnp.float32)
    g = jax.grad(lambda x: jnp.exp(ratios.holder_log_ratio(x, self.mask, p=p))[0])(ell)[0]
    rho = self._mean(p)
    w = np.exp(p * self.ell[0]) / np.exp(p * self.ell[0]).sum()
    np.testing.assert_allclose(g, rho * w, rtol=1e-5, atol=1e-7)

  def test_on_policy_gradient_is_one_over_length(self):
    for p in (-2.0, 0.5, 1.0, 3.0):
      g = jax.grad(lambda x: jnp.exp(ratios.holder_log_ratio(x, self.mask, p=p))[0])(
          jnp.zeros((1, 6)))
      np.testing.assert_allclose(g, np.full((1, 6), 1 / 6), rtol=1e-6)

  def test_traced_p_and_empty_rows_are_nan_free(self):
    logp, old, mask = _random_batch()
    fn = jax.jit(lambda x, p: ratios.holder_log_ratio(x, mask, p=p).sum())
    for p in (0.0, 1e-8, -3.0, 2.0):
      val, (g, gp) = jax.value_and_grad(fn, argnums=(0, 1))(logp - old, jnp.float32(p))
      self.assertTrue(np.isfinite(val) and np.all(np.isfinite(g)) and np.isfinite(gp), msg=p)
      np.testing.assert_array_equal(g[1], 0.0)  # the fully masked row
    out = ratios.holder_log_ratio(logp - old, mask, p=-3.0)
    self.assertEqual(float(out[1]), 0.0)

  def test_masked_entries_never_win(self):
    ell, mask = jnp.asarray(self.ell[:, :4], jnp.float32), jnp.ones((1, 4))
    padded = jnp.concatenate([ell, jnp.array([[-30.0, 30.0]])], axis=1)
    padded_mask = jnp.concatenate([mask, jnp.zeros((1, 2))], axis=1)
    for p in (-5.0, 0.0, 5.0):
      np.testing.assert_allclose(ratios.holder_log_ratio(padded, padded_mask, p=p),
                                 ratios.holder_log_ratio(ell, mask, p=p), rtol=1e-6)


def _exact_power_mean_log(x, p):
  """log((1/L) Σ_t exp(p x_t)) / p (the mean at p = 0) in 34-digit decimal arithmetic.

  The textbook formula, evaluated with enough digits that its cancellation does not matter:
  an exact reference for the f32 inputs, independent of the library's centred form.
  """
  with decimal.localcontext(decimal.Context(prec=34)):
    xs = [decimal.Decimal(float(v)) for v in np.asarray(x, np.float64)]
    if p == 0:
      return float(sum(xs) / len(xs))
    pd = decimal.Decimal(float(p))
    return float((sum(((pd * v).exp() for v in xs), decimal.Decimal(0)) / len(xs)).ln() / pd)


def _log_ratio_rows(case, t=4096):
  """Two rows of LLM-like token log-ratios: row 0 has all T tokens valid, row 1 ~60 % of them
  (its own L) with garbage on the masked ones."""
  rng = np.random.default_rng(7)
  if case == "realistic":
    x = rng.normal(-0.002, 0.05, (2, t))
  elif case == "wide":
    x = rng.normal(-0.05, 0.5, (2, t))
  else:  # "spike": tokens whose probability moved a lot (one dominates for large |p|)
    x = rng.normal(0.0, 0.05, (2, t))
    x[:, [5, 900, 3000]] = [3.0, -2.5, 1.5]
  mask = np.ones((2, t), np.float32)
  mask[1] = rng.random(t) < 0.6
  mask[1, :6] = 1.0  # keeps the spike valid
  x = np.where(mask > 0, x, 50.0).astype(np.float32)
  return x, mask


_holder_jit = jax.jit(lambda x, mask, p: ratios.holder_log_ratio(x, mask, p=p))


class HolderPrecisionTest(parameterized.TestCase):
  """M_p in f32 vs an exact reference (docs/algorithms.md §2.7): relative error <= 1e-5 per row.

  The textbook f32 form (logsumexp(p ℓ) − log L)/p is off by 2-240 % of M_p at L = 4096 for
  1e-6 <= |p| <= 1e-3 (e.g. 0 instead of −0.0028 at p = 1e-5), because the rounding of
  logsumexp ≈ log L is divided by p.
  """

  def _check(self, case, p):
    x, mask = _log_ratio_rows(case)
    got = np.asarray(_holder_jit(jnp.asarray(x), jnp.asarray(mask), jnp.float32(p)))
    for b in range(2):
      want = _exact_power_mean_log(x[b][mask[b] > 0], np.float32(p))
      np.testing.assert_allclose(got[b], want, rtol=1e-5, err_msg=f"{case} p={p} row {b}")

  @parameterized.product(case=["realistic", "wide"],
                         magnitude=[1e-7, 3e-7, 1e-6, 1e-5, 2e-5, 1e-4, 1e-3, 1e-2],
                         sign=[1.0, -1.0])
  def test_small_p(self, case, magnitude, sign):
    self._check(case, sign * magnitude)

  @parameterized.product(case=["wide", "spike"], p=[0.0, 0.5, -1.0, 2.0, -2.0, 10.0, -50.0, 300.0])
  def test_large_p_and_geometric_mean(self, case, p):
    self._check(case, p)

  @parameterized.parameters(0.0, 1e-7, -1e-7, 1e-4, -1e-2, 1.0, -2.0, 20.0)
  def test_gradient_matches_finite_differences(self, p):
    # ∂M_p/∂ℓ by autodiff (f32) vs central differences of the exact reference (f64 steps).
    x, mask = _log_ratio_rows("wide", t=48)
    g = np.asarray(jax.grad(lambda v: ratios.holder_log_ratio(v, jnp.asarray(mask), p=p).sum())(
        jnp.asarray(x)))
    np.testing.assert_array_equal(g[mask == 0], 0.0)
    for b in range(2):
      row = x[b][mask[b] > 0].astype(np.float64)
      fd = np.zeros_like(row)
      for i in range(row.size):
        e = np.zeros_like(row)
        e[i] = 1e-6
        fd[i] = (_exact_power_mean_log(row + e, p) - _exact_power_mean_log(row - e, p)) / 2e-6
      np.testing.assert_allclose(g[b][mask[b] > 0], fd, rtol=1e-5, atol=1e-9, err_msg=f"p={p}")
    if abs(p) >= 1:
      self.assertGreater(np.ptp(g[0]), 1e-3)  # a softmax far from uniform is also matched

  @parameterized.parameters(0.0, 1e-7, -1e-5, 1e-3, -1e-2, 1.0, 50.0)
  def test_gradient_is_softmax_at_llm_length(self, p):
    x, mask = _log_ratio_rows("realistic")
    g = np.asarray(jax.grad(lambda v: ratios.holder_log_ratio(v, jnp.asarray(mask), p=p).sum())(
        jnp.asarray(x)))
    for b in range(2):
      row = x[b][mask[b] > 0].astype(np.float64)
      w = np.exp(p * (row - row.max()))
      np.testing.assert_allclose(g[b][mask[b] > 0], w / w.sum(), rtol=1e-5)
    self.assertTrue(np.all(np.isfinite(g)))


if __name__ == "__main__":
  absltest.main()
