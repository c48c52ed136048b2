# pylint: disable=invalid-name
"""Tests for agentrl.losses.self_imitation: SIL (Oh et al. 2018) and SPEAR (Qin et al. 2025).

Hand-computed numbers, a NumPy reference, and the invariants: masked tokens get exactly zero
gradient, rows permute with the batch, and replayed data with ratio 1 is the plain objective.
"""
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import policy as pg
from agentrl.losses import self_imitation as si

jax.config.update("jax_numpy_rank_promotion", "raise")

NO_COV = {"clip_cov_lb": 1e6, "clip_cov_ub": 2e6}  # no token is a Clip-Cov candidate


def np_spear(logp, old, adv_B, mask, eps_low=0.2, eps_high=0.28):
  """NumPy reference of `spear_sil` with no Clip-Cov exclusion."""
  a = np.maximum(adv_B, 0.0)[:, None]
  r = np.exp(np.clip(logp - old, -20, 20))
  loss = np.maximum(-a * r, -a * np.clip(r, 1 - eps_low, 1 + eps_high))
  return np.where(mask > 0, loss, 0.0)


class GoldenTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_sil(self):
    logp = jnp.array([[-1.0, -2.0, -0.5], [-1.0, -1.0, -1.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    ret, val = jnp.array([2.0, 0.0]), jnp.array([0.5, 1.0])
    loss, m = self.variant(si.sil_policy)(logp, ret, val, mask)
    # (R − V)+ = (1.5, 0): L = 1.5 · (1, 2), the masked token and the worse row give 0.
    np.testing.assert_allclose(loss, [[1.5, 3.0, 0.0], [0.0, 0.0, 0.0]])
    self.assertEqual(float(m["sil_active_frac"]), 0.5)
    np.testing.assert_allclose(self.variant(si.sil_value)(val, ret), [1.125, 0.0])

  def test_spear_advantage(self):
    np.testing.assert_allclose(
        si.spear_advantage(jnp.array([1.0, 0.2, 0.9]), baseline=0.5), [0.5, 0.0, 0.4],
        rtol=1e-6)
    np.testing.assert_allclose(
        si.spear_advantage(None, old_adv_B=jnp.array([2.0, -1.0]), decay=0.5), [1.0, 0.0])
    with self.assertRaisesRegex(ValueError, "exactly one"):
      si.spear_advantage(jnp.zeros(2))
    with self.assertRaisesRegex(ValueError, "decay must be"):
      si.spear_advantage(None, old_adv_B=jnp.zeros(2), decay=1.5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_spear_sil_ratio_and_clip(self):
    # Row 0: ℓ = 0.1 → r = e^0.1 inside (0.8, 1.28): L = −2 e^0.1; ℓ = 0.5 → r = 1.6487
    # > 1.28 with A > 0: L = −2 · 1.28. Row 1 has A = (−1)+ = 0.
    logp = jnp.array([[-0.5, -0.5], [-3.0, -3.0]])
    old = logp - jnp.array([[0.1, 0.5], [0.0, 0.0]])
    loss, m = self.variant(functools.partial(si.spear_sil, **NO_COV))(
        logp, old, jnp.array([2.0, -1.0]), jnp.ones((2, 2)), rng=jax.random.key(0))
    np.testing.assert_allclose(loss, [[-2 * np.exp(0.1), -2.56], [0.0, 0.0]], rtol=1e-6)
    self.assertEqual(float(m["clipfrac_high"]), 0.25)

  def test_spear_sil_clip_cov_excludes_one_token(self):
    # A = (2, 0), mean 1; logp = (−0.5, −0.5, −3, −3), mean −1.75: cov = 1.25 everywhere,
    # in (1, 40), so ⌊0.02 · 4⌋ → 1 token is excluded (its loss is 0).
    logp = jnp.array([[-0.5, -0.5], [-3.0, -3.0]])
    loss, m = si.spear_sil(logp, logp, jnp.array([2.0, 0.0]), jnp.ones((2, 2)),
                           rng=jax.random.key(1))
    self.assertEqual(float(m["cov_clipfrac"]), 0.25)
    self.assertIn(float(loss.sum()), (-2.0, -4.0))

  def test_spear_coef(self):
    np.testing.assert_allclose(
        [si.spear_coef(s, coef=2.0, warmup_steps=200) for s in (0, 100, 200, 500)],
        [0.0, 1.0, 2.0, 2.0], atol=1e-6)
    with self.assertRaisesRegex(ValueError, "warmup_steps"):
      si.spear_coef(0, warmup_steps=0)


class InvariantTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    rng = np.random.default_rng(0)
    self.logp = jnp.asarray(-rng.uniform(0.1, 3.0, (4, 5)), jnp.float32)
    self.old = self.logp + jnp.asarray(rng.normal(0, 0.3, (4, 5)), jnp.float32)
    self.adv = jnp.asarray(rng.normal(0, 1, (4,)), jnp.float32)
    self.mask = jnp.asarray(rng.uniform(size=(4, 5)) > 0.3, jnp.float32)

  def test_numpy_reference(self):
    loss, _ = si.spear_sil(self.logp, self.old, self.adv, self.mask, rng=jax.random.key(0),
                           **NO_COV)
    np.testing.assert_allclose(loss, np_spear(*map(np.asarray, (
        self.logp, self.old, self.adv, self.mask))), rtol=1e-5, atol=1e-6)

  def test_masked_tokens_get_zero_gradient(self):
    ret, val = self.adv + 1.0, jnp.zeros((4,))
    for fn in (lambda lp: si.sil_policy(lp, ret, val, self.mask)[0],
               lambda lp: si.spear_sil(lp, self.old, self.adv, self.mask,
                                       rng=jax.random.key(0))[0]):
      g = jax.grad(lambda lp, fn=fn: fn(lp).sum())(self.logp)
      np.testing.assert_array_equal(np.asarray(g)[np.asarray(self.mask) == 0], 0.0)

  def test_row_permutation_equivariance(self):
    perm = np.array([2, 0, 3, 1])
    run = lambda lp, old, a, m: si.spear_sil(lp, old, a, m, rng=jax.random.key(0), **NO_COV)[0]
    np.testing.assert_allclose(
        run(self.logp[perm], self.old[perm], self.adv[perm], self.mask[perm]),
        run(self.logp, self.old, self.adv, self.mask)[perm], rtol=1e-6)

  def test_on_policy_limit_is_ppo_on_positive_advantages(self):
    # Replayed rows sampled by the current policy (ratio 1): SPEAR's loss is PPO's −A+ per
    # token, and its gradient is SIL's −A+ ∇logp.
    pos = jnp.maximum(self.adv, 0.0)
    spear, _ = si.spear_sil(self.logp, self.logp, self.adv, self.mask, rng=jax.random.key(0),
                            **NO_COV)
    ppo, _ = pg.ppo_clip(self.logp, self.logp, pos[:, None], self.mask, eps_high=0.28)
    np.testing.assert_allclose(spear, ppo, rtol=1e-6)
    g_spear = jax.grad(lambda lp: si.spear_sil(lp, jax.lax.stop_gradient(lp), self.adv,
                                               self.mask, rng=jax.random.key(0),
                                               **NO_COV)[0].sum())(self.logp)
    g_sil = jax.grad(lambda lp: si.sil_policy(lp, pos, jnp.zeros(4), self.mask)[0].sum())(
        self.logp)
    np.testing.assert_allclose(g_spear, g_sil, rtol=1e-6)


if __name__ == "__main__":
  absltest.main()
