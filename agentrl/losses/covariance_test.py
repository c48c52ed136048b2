# pylint: disable=invalid-name
"""Tests for agentrl.losses.covariance: Clip-Cov and KL-Cov (Cui et al. 2025).

Hand-computed numbers and the RL invariants of docs/algorithms.md §7. The functions are called
through `agentrl.losses.policy`, where the API contract names them.
"""
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import policy as pg
from agentrl.losses import testing

jax.config.update("jax_numpy_rank_promotion", "raise")


class GoldenTest(chex.TestCase):
  """Hand-computed numbers (each under jit and without)."""

  @chex.variants(with_jit=True, without_jit=True)
  def test_kl_cov(self):
    # cov = (A − mean A)(logp − mean logp) = (3, −3, −2.4, 2.4); ℓ = (0.1, 0.2, −0.1, 0.3).
    logp = jnp.array([[-0.5, -2.5, -0.7, -2.3]])
    old = logp - jnp.array([[0.1, 0.2, -0.1, 0.3]])
    adv, mask = jnp.array([[3., 3., -3., -3.]]), jnp.ones((1, 4))
    base = np.array([-3.31551275, -3.66420827, 2.71451225, 4.04957642])
    run = lambda ratio: self.variant(functools.partial(pg.kl_cov, kl_cov_ratio=ratio))(
        logp, old, adv, mask)
    loss, m = run(0.25)
    np.testing.assert_allclose(loss[0], base + [0.1, 0, 0, 0], rtol=1e-5)
    loss, m = run(0.5)
    np.testing.assert_allclose(loss[0], base + [0.1, 0, 0, 0.3], rtol=1e-5)
    np.testing.assert_allclose([m["cov_kl_frac"], m["ppo_kl_abs"], m["ppo_kl"]],
                               [0.5, 0.175, -0.125], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_clip_cov(self):
    # On-policy, cov = (3, −3, −3, 3): tokens 0 and 3 lie in (1, 5).
    logp = jnp.array([[-0.5, -2.5, -0.5, -2.5]])
    adv, mask = jnp.array([[3., 3., -3., -3.]]), jnp.ones((1, 4))
    run = lambda ratio: self.variant(
        lambda rng: pg.clip_cov(logp, logp, adv, mask, clip_cov_ratio=ratio, rng=rng))
    loss, m = run(0.5)(jax.random.key(0))
    np.testing.assert_allclose(loss, [[0., -3., 3., 0.]], rtol=1e-6)
    np.testing.assert_allclose(m["cov_clipfrac"], 0.5)
    excluded, quarter = set(), run(0.25)
    for seed in range(8):  # one of the two candidates, chosen at random
      loss, m = quarter(jax.random.key(seed))
      zero = tuple(np.flatnonzero(np.asarray(loss[0]) == 0.0))
      self.assertIn(zero, ((0,), (3,)))
      excluded.add(zero)
    self.assertLen(excluded, 2)


class InvariantTest(parameterized.TestCase):
  """Masking and on-policy properties (the same checks run in policy_ and sequence_test)."""

  # (function, advantage kind, aggregation, kwargs)
  CASES = {
      "kl_cov": (pg.kl_cov, "token", "token-mean", dict(kl_cov_ratio=0.2)),
      # A high lower bound keeps every token out of the covariance clip in this test.
      "clip_cov": (pg.clip_cov, "token", "token-mean",
                   dict(rng=jax.random.key(0), clip_cov_lb=50.0, clip_cov_ub=60.0)),
  }

  @parameterized.named_parameters(*[(k, k) for k in CASES])
  def test_masked_tokens_get_exactly_zero_gradient(self, name):
    testing.check_masked_tokens_get_exactly_zero_gradient(*self.CASES[name])

  @parameterized.named_parameters(*[(k, k) for k in CASES])
  def test_on_policy_gradient_is_reinforce(self, name):
    testing.check_on_policy_gradient_is_reinforce(*self.CASES[name])


class ClipCovTest(absltest.TestCase):

  def test_ppo_clipped_tokens_are_not_candidates(self):
    logp = jnp.array([[-0.5, -2.5, -0.5, -2.5]])
    old = logp - jnp.array([[1.0, 0.0, 0.0, 0.0]])  # token 0: ratio e > 1.2 with A > 0
    adv, mask = jnp.array([[3., 3., -3., -3.]]), jnp.ones((1, 4))
    for seed in range(4):
      loss, _ = pg.clip_cov(logp, old, adv, mask, clip_cov_ratio=0.5, rng=jax.random.key(seed))
      np.testing.assert_allclose(loss, [[-3.6, -3., 3., 0.]], rtol=1e-6)  # only token 3 out


if __name__ == "__main__":
  absltest.main()
