# pylint: disable=invalid-name
"""Tests for agentrl.losses.kl."""
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import kl

jax.config.update("jax_numpy_rank_promotion", "raise")

LN2 = np.log(2.0)
# d = ref - logp = [-ln 2, ln 2].
LOGP = jnp.log(jnp.array([[0.5, 0.25]]))
REF = jnp.log(jnp.array([[0.25, 0.5]]))
GOLDEN = {
    "k1": [LN2, -LN2],
    "k2": [0.5 * LN2**2, 0.5 * LN2**2],
    "k3": [0.5 + LN2 - 1.0, 2.0 - LN2 - 1.0],
    "abs": [LN2, LN2],
}


def np_kl(logp, ref, kind):
  """float64 reference (verl kl_penalty_forward)."""
  d = np.asarray(ref, np.float64) - np.asarray(logp, np.float64)
  if kind == "k1":
    return -d
  if kind == "k2":
    return 0.5 * d**2
  if kind == "abs":
    return np.abs(d)
  d = np.clip(d, -20, 20)
  return np.clip(np.exp(d) - d - 1, -10, 10)


def np_grad(fn, x, h=1e-6):
  """Central finite difference of an elementwise float64 function."""
  x = np.asarray(x, np.float64)
  return (fn(x + h) - fn(x - h)) / (2 * h)


class KlPenaltyTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*kl.KINDS)
  def test_hand_computed(self, kind):
    fn = self.variant(functools.partial(kl.kl_penalty, kind=kind))
    np.testing.assert_allclose(fn(LOGP, REF), [GOLDEN[kind.rstrip("+")]], rtol=1e-6)

  @parameterized.parameters(*kl.KINDS)
  def test_value_and_gradient_match_float64_reference(self, kind):
    rng = np.random.default_rng(0)
    logp = rng.normal(-2.0, 1.0, size=(3, 8)).astype(np.float32)
    ref = (logp + rng.normal(0.0, 0.7, size=logp.shape)).astype(np.float32)
    base = kind.rstrip("+")
    np.testing.assert_allclose(kl.kl_penalty(jnp.asarray(logp), jnp.asarray(ref), kind),
                               np_kl(logp, ref, base), rtol=1e-5, atol=1e-6)
    grad_kind = "k2" if kind.endswith("+") else base
    expected = np_grad(lambda x: np_kl(x, ref, grad_kind), logp)
    grad = jax.grad(lambda x: kl.kl_penalty(x, jnp.asarray(ref), kind).sum())(jnp.asarray(logp))
    np.testing.assert_allclose(grad, expected, rtol=1e-5, atol=1e-5)

  @parameterized.parameters(*kl.KINDS)
  def test_exactly_zero_when_policies_agree(self, kind):
    logp = jnp.log(jnp.array([[0.1, 0.7, 0.9, 1e-6]]))
    np.testing.assert_array_equal(kl.kl_penalty(logp, logp, kind), 0.0)
    self.assertTrue(np.all(kl.kl_penalty(logp, logp - 0.1, kind) != 0.0))  # non-trivial side

  def test_k3_is_nonnegative(self):
    rng = np.random.default_rng(1)
    logp = rng.normal(-3.0, 2.0, size=(4, 64)).astype(np.float32)
    # Mix tiny gaps (where exp(d) - d - 1 would cancel) with large ones.
    gap = rng.normal(size=logp.shape) * np.logspace(-8, 1, logp.size).reshape(logp.shape)
    k3 = kl.kl_penalty(jnp.asarray(logp), jnp.asarray(logp + gap.astype(np.float32)), "k3")
    self.assertTrue(np.all(np.asarray(k3) >= 0.0))
    self.assertTrue(np.mean(np.asarray(k3) > 0.0) > 0.5)

  def test_k3_uses_expm1_for_small_gaps(self):
    d = 1e-4
    k3 = kl.kl_penalty(jnp.zeros((1, 1)), jnp.full((1, 1), d), "k3")
    # In float32, exp(d) - d - 1 evaluates to exactly 0 here.
    np.testing.assert_allclose(k3, [[np.expm1(d) - d]], rtol=1e-2)

  def test_k3_clamps_and_their_zero_gradient(self):
    logp = jnp.array([[0.0, 0.0, 0.0]])
    ref = jnp.array([[30.0, -30.0, 1.0]])  # d clamped to +20 (then result to 10), -20 -> 19 -> 10
    value, grad = jax.value_and_grad(lambda x: kl.kl_penalty(x, ref, "k3").sum())(logp)
    np.testing.assert_allclose(value, 10.0 + 10.0 + np.exp(1.0) - 2.0, rtol=1e-6)
    np.testing.assert_array_equal(grad[0, :2], 0.0)
    np.testing.assert_allclose(grad[0, 2], 1.0 - np.e, rtol=1e-6)

  def test_k3_plus_has_k3_value_and_k2_gradient(self):
    rng = np.random.default_rng(2)
    logp = jnp.asarray(rng.normal(-2.0, 1.0, size=(2, 5)).astype(np.float32))
    ref = logp + jnp.asarray(rng.normal(0.0, 0.5, size=(2, 5)).astype(np.float32))
    grad = lambda kind: jax.grad(lambda x: kl.kl_penalty(x, ref, kind).sum())(logp)
    np.testing.assert_array_equal(kl.kl_penalty(logp, ref, "k3+"),
                                  kl.kl_penalty(logp, ref, "k3"))
    np.testing.assert_allclose(grad("k3+"), grad("k2"), rtol=1e-6)
    self.assertFalse(np.allclose(grad("k3"), grad("k2"), rtol=1e-2))

  def test_bad_kind_names_valid_ones(self):
    with self.assertRaisesRegex(ValueError, "k3\\+"):
      kl.kl_penalty(LOGP, REF, "k4")
    with self.assertRaisesRegex(ValueError, "verl's name for 'k3'"):
      kl.kl_penalty(LOGP, REF, "low_var_kl")


class ControllerAndRewardTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_adaptive_kl_coef_hand_computed(self):
    fn = self.variant(functools.partial(kl.adaptive_kl_coef, target=0.1, horizon=10000,
                                        n_steps=256))
    # KL/target - 1 = 1.0 -> clipped to 0.2; -0.5 -> -0.2; 0.1 stays.
    np.testing.assert_allclose(fn(0.1, 0.2), 0.1 * (1 + 0.2 * 256 / 10000), rtol=1e-6)
    np.testing.assert_allclose(fn(0.1, 0.05), 0.1 * (1 - 0.2 * 256 / 10000), rtol=1e-6)
    np.testing.assert_allclose(fn(0.1, 0.11), 0.1 * (1 + 0.1 * 256 / 10000), rtol=1e-5)

  def test_adaptive_kl_coef_rejects_bad_horizon(self):
    with self.assertRaisesRegex(ValueError, "horizon=0"):
      kl.adaptive_kl_coef(0.1, 0.1, target=0.1, horizon=0, n_steps=1)

  @chex.variants(with_jit=True, without_jit=True)
  def test_kl_in_reward_hand_computed(self):
    fn = self.variant(functools.partial(kl.kl_in_reward, beta=0.1))
    old_logp = jnp.array([[0.0, -1.0, -2.0, 0.0], [-1.0, -1.0, -1.0, -1.0]])
    ref_logp = jnp.array([[0.0, -1.5, -1.0, 0.0], [-1.0, -1.0, -3.0, -1.0]])
    mask = jnp.array([[0.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    reward, metrics = fn(jnp.array([1.0, 2.0]), old_logp, ref_logp, mask)
    # k1 = [[., .5, -1, .], [0, 0, 2, 0]]; the score sits on each row's last policy token.
    np.testing.assert_allclose(reward, [[0.0, -0.05, 1.1, 0.0], [0.0, 0.0, -0.2, 2.0]],
                               rtol=1e-6)
    np.testing.assert_allclose(metrics["kl_in_reward"], (-0.25 + 0.5) / 2, rtol=1e-6)
    np.testing.assert_allclose(metrics["kl_coef"], 0.1)


if __name__ == "__main__":
  absltest.main()
