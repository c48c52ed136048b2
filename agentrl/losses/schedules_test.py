"""Tests for agentrl.losses.schedules (HölderPO p schedules, docs/algorithms.md §2.4)."""
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import schedules

jax.config.update("jax_numpy_rank_promotion", "raise")

INCREASING = ("linear", "sin", "quad", "cubic")
DECREASING = ("linear_dec", "cos", "quad_dec", "cubic_dec")
# p at progress 0.25 for p_min=-2, p_max=2, power=2 (mid 0, amp 2), computed by hand.
AT_QUARTER = {"linear": -1.0, "linear_dec": 1.0, "sin": -2 * np.cos(np.pi / 4),
              "cos": 2 * np.cos(np.pi / 4), "quad": -2 + 4 / 16, "quad_dec": 2 - 4 / 16,
              "cubic": -0.25, "cubic_dec": 0.25}


class HolderPTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_golden_values(self):
    for name, want in AT_QUARTER.items():
      fn = self.variant(functools.partial(schedules.holder_p, schedule=name, schedule_steps=100))
      np.testing.assert_allclose(fn(jnp.int32(25)), want, rtol=1e-6, atol=1e-7, err_msg=name)
    const = self.variant(functools.partial(schedules.holder_p, schedule="constant", p_const=3.0))
    self.assertEqual(float(const(jnp.int32(7))), 3.0)

  @parameterized.parameters(*INCREASING, *DECREASING)
  def test_endpoints(self, name):
    fn = jax.jit(functools.partial(schedules.holder_p, schedule=name, p_min=-1.0, p_max=2.0,
                                   schedule_steps=10))
    start, end = (-1.0, 2.0) if name in INCREASING else (2.0, -1.0)
    np.testing.assert_allclose(fn(0), start, atol=1e-6)
    np.testing.assert_allclose(fn(-5), start, atol=1e-6)  # negative steps count as 0
    np.testing.assert_allclose(fn(10), end, atol=1e-6)
    np.testing.assert_allclose(fn(1000), end, atol=1e-6)  # held after schedule_steps
    self.assertNotAlmostEqual(float(fn(5)), start)  # it moves in between

  def test_power_shapes_quad(self):
    p = lambda power: float(schedules.holder_p(5, schedule="quad", p_min=0.0, p_max=1.0,
                                               schedule_steps=10, power=power))
    self.assertAlmostEqual(p(2.0), 0.25, places=6)
    self.assertAlmostEqual(p(3.0), 0.125, places=6)

  def test_bad_name_lists_valid_ones(self):
    with self.assertRaisesRegex(ValueError, "'linear_dec'.*'cubic_dec'"):
      schedules.holder_p(0, schedule="exp")


if __name__ == "__main__":
  absltest.main()
