# pylint: disable=invalid-name
"""Tests for agentrl.losses.process: hand-computed golden values, a NumPy reference, masked
steps and pairs get exactly zero gradient, permutation equivariance (docs/algorithms.md §15.2).
"""
import math

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import process

jax.config.update("jax_numpy_rank_promotion", "raise")


def np_bce(z, y):
  """Reference: -[y log sigmoid(z) + (1 - y) log(1 - sigmoid(z))] in float64."""
  z, y = np.asarray(z, np.float64), np.asarray(y, np.float64)
  p = 1.0 / (1.0 + np.exp(-z))
  return -(y * np.log(p) + (1.0 - y) * np.log(1.0 - p))


class StepBceTest(absltest.TestCase):

  def test_golden(self):
    loss, metrics = process.step_bce(jnp.array([[0.0, 2.0]]), jnp.array([[1.0, 0.25]]),
                                     jnp.array([[1.0, 1.0]]))
    s = 1.0 / (1.0 + math.exp(-2.0))
    want = [math.log(2.0), -(0.25 * math.log(s) + 0.75 * math.log(1.0 - s))]
    np.testing.assert_allclose(loss, [want], rtol=1e-6)
    # Step 0: p = 0.5 is not > 0.5 while y = 1 (wrong); step 1: p > 0.5, y = 0.25 (wrong).
    self.assertEqual(float(metrics["step_accuracy"]), 0.0)
    np.testing.assert_allclose(metrics["step_prob"], (0.5 + s) / 2, rtol=1e-6)

  def test_matches_numpy_reference(self):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(3, 4)) * 3
    y = rng.uniform(size=(3, 4))
    mask = (rng.uniform(size=(3, 4)) > 0.3).astype(np.float32)
    loss, _ = process.step_bce(jnp.asarray(z, jnp.float32), jnp.asarray(y, jnp.float32),
                               jnp.asarray(mask))
    np.testing.assert_allclose(loss, np_bce(z, y) * mask, rtol=1e-5, atol=1e-6)

  def test_masked_steps_get_exactly_zero_gradient_even_if_nan(self):
    z = jnp.array([[0.3, jnp.nan, -1.0], [jnp.inf, 2.0, 0.0]])
    y = jnp.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.5]])
    mask = jnp.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    loss_fn = lambda z: process.step_bce(z, y, mask)[0].sum()
    grad = np.asarray(jax.grad(loss_fn)(z))
    self.assertTrue(np.isfinite(float(loss_fn(z))))
    self.assertEqual(grad[0, 1], 0.0)
    self.assertEqual(grad[1, 0], 0.0)
    # d/dz BCE = p - y on labelled steps.
    np.testing.assert_allclose(grad[0, 0], 1 / (1 + math.exp(-0.3)) - 1.0, rtol=1e-6)

  def test_permuting_rows_permutes_the_loss(self):
    rng = np.random.default_rng(1)
    z, y = jnp.asarray(rng.normal(size=(4, 3))), jnp.asarray(rng.uniform(size=(4, 3)))
    mask = jnp.asarray(rng.uniform(size=(4, 3)) > 0.5)
    perm = np.array([2, 0, 3, 1])
    loss, metrics = process.step_bce(z, y, mask)
    loss_p, metrics_p = process.step_bce(z[perm], y[perm], mask[perm])
    np.testing.assert_allclose(loss_p, np.asarray(loss)[perm], rtol=1e-6)
    np.testing.assert_allclose(metrics_p["step_prob"], metrics["step_prob"], rtol=1e-6)


class StepBradleyTerryTest(absltest.TestCase):

  def test_golden_and_padding(self):
    z = jnp.array([[1.0, -1.0], [0.5, 3.0]])     # flat: [1, -1, 0.5, 3]
    chosen, rejected = jnp.array([0, 2, 0]), jnp.array([1, 3, 0])
    loss, metrics = process.step_bradley_terry(z, chosen, rejected, jnp.array([1.0, 1.0, 0.0]))
    want = [math.log1p(math.exp(-2.0)), math.log1p(math.exp(2.5)), 0.0]
    np.testing.assert_allclose(loss, want, rtol=1e-6)
    self.assertEqual(float(metrics["pair_accuracy"]), 0.5)
    np.testing.assert_allclose(metrics["pair_margin"], (2.0 - 2.5) / 2, rtol=1e-6)
    loss_m, _ = process.step_bradley_terry(z, chosen, rejected, jnp.array([1.0, 1.0, 0.0]),
                                           margin=1.0)
    np.testing.assert_allclose(loss_m[0], math.log1p(math.exp(-1.0)), rtol=1e-6)

  def test_unpaired_steps_get_exactly_zero_gradient(self):
    z = jnp.array([[1.0, jnp.nan], [0.5, 3.0]])
    loss_fn = lambda z: process.step_bradley_terry(
        z, jnp.array([0, 1]), jnp.array([2, 3]), jnp.array([1.0, 0.0]))[0].sum()
    grad = np.asarray(jax.grad(loss_fn)(z)).reshape(-1)
    self.assertTrue(np.isfinite(float(loss_fn(z))))
    np.testing.assert_array_equal(grad[[1, 3]], [0.0, 0.0])
    g = 1.0 / (1.0 + math.exp(0.5))   # sigmoid(-(z_c - z_r))
    np.testing.assert_allclose(grad[[0, 2]], [-g, g], rtol=1e-6)


if __name__ == "__main__":
  absltest.main()
