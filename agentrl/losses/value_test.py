# pylint: disable=invalid-name
"""Tests for agentrl.losses.value."""
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import value

jax.config.update("jax_numpy_rank_promotion", "raise")


def np_value_loss(v, v_old, ret, clip):
  """float64 reference (verl compute_value_loss, before aggregation)."""
  clipped = np.clip(v, v_old - clip, v_old + clip)
  return 0.5 * np.maximum((v - ret) ** 2, (clipped - ret) ** 2)


class ClippedValueLossTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    fn = self.variant(functools.partial(value.clipped_value_loss, clip_range=0.5))
    v = jnp.array([[1.0, 2.0, 7.0]])
    loss, metrics = fn(v, jnp.array([[0.0, 2.0, 0.0]]), jnp.array([[2.0, 0.0, 0.0]]),
                       jnp.array([[1.0, 1.0, 0.0]]))
    # Token 0: max((1-2)^2, (0.5-2)^2) = 2.25. Token 1: V = V_old, 4. Token 2 is masked.
    np.testing.assert_allclose(loss, [[1.125, 2.0, 0.0]])
    np.testing.assert_allclose(metrics["vf_clipfrac"], 0.5)

  def test_gradient_is_zero_where_the_clipped_branch_binds(self):
    grad = jax.grad(lambda v: value.clipped_value_loss(
        v, jnp.array([[0.0, 2.0]]), jnp.array([[2.0, 0.0]]), jnp.ones((1, 2)))[0].sum())(
            jnp.array([[1.0, 2.0]]))
    np.testing.assert_allclose(grad, [[0.0, 2.0]])  # V - R on the unclipped token

  def test_unclipped_form(self):
    loss, metrics = value.clipped_value_loss(jnp.array([[1.0]]), jnp.array([[0.0]]),
                                             jnp.array([[2.0]]), jnp.ones((1, 1)),
                                             clip_range=None)
    np.testing.assert_allclose(loss, [[0.5]])
    self.assertEqual(float(metrics["vf_clipfrac"]), 0.0)

  def test_against_float64_reference(self):
    rng = np.random.default_rng(0)
    shape = (4, 6)
    v, v_old, ret = (rng.normal(size=shape).astype(np.float32) for _ in range(3))
    mask = (rng.random(shape) > 0.3).astype(np.float32)
    mask[0] = 0.0
    fn = lambda x: value.clipped_value_loss(x, jnp.asarray(v_old), jnp.asarray(ret),
                                            jnp.asarray(mask), clip_range=0.2)[0]
    expected = np.where(mask > 0, np_value_loss(v, v_old, ret, 0.2), 0.0)
    np.testing.assert_allclose(fn(jnp.asarray(v)), expected, rtol=1e-5, atol=1e-6)
    v64, v_old64, ret64 = (x.astype(np.float64) for x in (v, v_old, ret))
    h = 1e-6
    fd = (np_value_loss(v64 + h, v_old64, ret64, 0.2)
          - np_value_loss(v64 - h, v_old64, ret64, 0.2)) / (2 * h)
    grad = jax.grad(lambda x: fn(x).sum())(jnp.asarray(v))
    np.testing.assert_allclose(grad, np.where(mask > 0, fd, 0.0), rtol=1e-5, atol=1e-5)
    self.assertTrue(np.any(np.asarray(grad) == 0) and np.any(np.asarray(grad)[mask > 0] != 0))

  @chex.variants(with_jit=True, without_jit=True)
  def test_explained_variance(self):
    fn = self.variant(value.explained_variance)
    ret = jnp.array([[1.0, 2.0, 3.0, 4.0, 100.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 1.0, 0.0]])
    np.testing.assert_allclose(fn(ret, ret, mask), 1.0)
    np.testing.assert_allclose(fn(jnp.full((1, 5), 2.5), ret, mask), 0.0, atol=1e-7)
    # Residual [0, 0, 0, 1] has var 3/16; Var[R] = 5/4.
    pred = jnp.array([[1.0, 2.0, 3.0, 3.0, 0.0]])
    np.testing.assert_allclose(fn(pred, ret, mask), 1.0 - (3 / 16) / (5 / 4), rtol=1e-6)
    self.assertEqual(float(fn(ret, jnp.ones((1, 5)), mask)), 0.0)  # Var[R] = 0: no NaN


if __name__ == "__main__":
  absltest.main()
