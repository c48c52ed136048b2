# pylint: disable=invalid-name
"""Tests for agentrl.losses.regularizers."""
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import regularizers

jax.config.update("jax_numpy_rank_promotion", "raise")

# log-ratios ln 2, 0, ln 0.5 (ratios 2, 1, 0.5) on policy tokens; the last position is padding.
OLD = jnp.zeros((1, 4))
LOGP = jnp.array([[np.log(2.0), 0.0, np.log(0.5), 50.0]])
MASK = jnp.array([[1.0, 1.0, 1.0, 0.0]])


class EntropyBonusTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    loss, metrics = self.variant(regularizers.entropy_bonus)(
        jnp.array([[1.0, 2.0, jnp.nan], [3.0, 0.5, 0.5]]),
        jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]))
    np.testing.assert_array_equal(loss, [[-1.0, -2.0, 0.0], [-3.0, 0.0, 0.0]])
    np.testing.assert_allclose(metrics["entropy_loss"], 2.0)

  def test_gradient_is_minus_mask(self):
    mask = jnp.array([[1.0, 0.0, 1.0]])
    grad = jax.grad(lambda h: regularizers.entropy_bonus(h, mask)[0].sum())(jnp.ones((1, 3)))
    np.testing.assert_array_equal(grad, [[-1.0, 0.0, -1.0]])


class RatioVarianceTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    one, metrics = self.variant(functools.partial(regularizers.ratio_variance, center="one"))(
        LOGP, OLD, MASK)
    mean, _ = self.variant(functools.partial(regularizers.ratio_variance, center="mean"))(
        LOGP, OLD, MASK)
    # (r - 1)^2 = [1, 0, 0.25]; mean r = 7/6; (r - 7/6)^2 = [25, 1, 16] / 36.
    np.testing.assert_allclose(one, 1.25 / 3, rtol=1e-6)
    np.testing.assert_allclose(mean, 42 / 36 / 3, rtol=1e-6)
    np.testing.assert_allclose(metrics["ratio_mean"], 3.5 / 3, rtol=1e-6)
    np.testing.assert_allclose(metrics["ratio_var_mean"], 42 / 36 / 3, rtol=1e-6)

  def test_gradient_matches_float64_finite_difference(self):
    rng = np.random.default_rng(0)
    logp = rng.normal(0.0, 0.3, size=(3, 5))
    mask = (rng.random((3, 5)) > 0.3).astype(np.float64)

    def np_penalty(x, center):
      r = np.exp(x)[mask > 0]
      return np.mean((r - (1.0 if center == "one" else r.mean())) ** 2)

    for center in regularizers.CENTERS:
      fn = lambda x, c=center: regularizers.ratio_variance(x, jnp.zeros((3, 5)),
                                                            jnp.asarray(mask), center=c)[0]
      value, grad = jax.value_and_grad(fn)(jnp.asarray(logp, jnp.float32))
      np.testing.assert_allclose(value, np_penalty(logp, center), rtol=1e-5)
      h, fd = 1e-6, np.zeros_like(logp)
      for idx in np.ndindex(*logp.shape):
        e = np.zeros_like(logp)
        e[idx] = h
        fd[idx] = (np_penalty(logp + e, center) - np_penalty(logp - e, center)) / (2 * h)
      np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-6)
      np.testing.assert_array_equal(np.asarray(grad)[mask == 0], 0.0)

  def test_on_policy_penalty_and_gradient_vanish(self):
    logp = jnp.log(jnp.array([[0.3, 0.6, 0.9]]))
    fn = lambda x: regularizers.ratio_variance(x, logp, jnp.ones((1, 3)))[0]
    value, grad = jax.value_and_grad(fn)(logp)
    self.assertEqual(float(value), 0.0)
    np.testing.assert_array_equal(grad, 0.0)
    self.assertGreater(float(fn(logp + 0.1)), 0.0)  # non-trivial side

  def test_bad_center_raises(self):
    with self.assertRaisesRegex(ValueError, "center='median'"):
      regularizers.ratio_variance(LOGP, OLD, MASK, center="median")


if __name__ == "__main__":
  absltest.main()
