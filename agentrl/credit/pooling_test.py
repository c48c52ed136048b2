# pylint: disable=invalid-name
"""Tests for agentrl.credit.pooling: hand values, a NumPy reference and exact zeros."""
from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.credit import pooling

jax.config.update("jax_numpy_rank_promotion", "raise")


class CentreTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    x = jnp.array([[1.0, 2.0, 6.0, 99.0], [5.0, 5.0, 5.0, 5.0], [3.0, 0.0, 0.0, 0.0]])
    sel = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]], bool)
    centred, count, sumsq = self.variant(pooling.centre)(x, sel)
    np.testing.assert_allclose(centred, [[-2, -1, 3, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(count, [[3], [2], [0]])
    np.testing.assert_allclose(sumsq, [[14], [0], [0]])

  def test_equal_values_centre_to_exact_zero_and_match_numpy(self):
    for value in (0.1, 1e6 + 0.1, -3.3):
      centred, _, sumsq = pooling.centre(jnp.full((2, 5), value), jnp.ones((2, 5), bool))
      np.testing.assert_array_equal(centred, 0.0)
      np.testing.assert_array_equal(sumsq, 0.0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4, 7)).astype(np.float32)
    sel = rng.random((4, 7)) > 0.4
    centred, count, sumsq = pooling.centre(jnp.asarray(x), jnp.asarray(sel))
    for p in range(4):
      vals = x[p, sel[p]].astype(np.float64)
      want = np.zeros(7)
      want[sel[p]] = vals - vals.mean() if vals.size else 0.0
      np.testing.assert_allclose(centred[p], want, rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(sumsq[p, 0], np.square(want).sum(), rtol=1e-5, atol=1e-6)
      self.assertEqual(int(count[p, 0]), sel[p].sum())

  def test_bad_shapes(self):
    with self.assertRaisesRegex(ValueError, r"\[P, N\]"):
      pooling.centre(jnp.zeros((2, 3)), jnp.ones((2, 4), bool))


if __name__ == "__main__":
  absltest.main()
