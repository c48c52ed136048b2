# pylint: disable=invalid-name
"""Tests for agentrl.credit.certainty_mix (MAPO of arXiv 2509.18849): hand-computed values,
the official `grpomixpro` branch as a float64 reference, and the reductions (lambda = 0 is GRPO,
lambda = 1 the percent deviation)."""
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.credit import certainty_mix as cmix

jax.config.update("jax_numpy_rank_promotion", "raise")


def np_certainty_mix(reward, G, eps=1e-6, weighting="quadratic"):
  """WenkeHuang/MAPO ray_trainer.py `grpomixpro` (and `grpomixair` for "linear"), float64."""
  reward = np.asarray(reward, np.float64).reshape(-1, G)
  out = np.zeros_like(reward)
  for i, r in enumerate(reward):
    mean, std = r.mean(), r.std(ddof=1)
    p = np.sum(r == 1.0) / G
    w_std = 4 * p * (1 - p) if weighting == "quadratic" else 2 * min(p, 1 - p)
    out[i] = w_std * (r - mean) / (std + eps) + (1 - w_std) * (r - mean) / (mean + eps)
  return out.reshape(-1)


class CertaintyMixTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # Group [1, 1, 1, 0]: p = 0.75, lambda = 1 - 4 * 0.75 * 0.25 = 0.25, mu = 0.75, sigma = 0.5.
    # z = [0.5, 0.5, 0.5, -1.5], percent = [1/3, 1/3, 1/3, -1].
    # Group [0, 1, 0, 0.5]: p = 0.25, lambda = 0.25, mu = 0.375.
    fn = self.variant(functools.partial(cmix.certainty_mix, group_size=4))
    adv = fn(jnp.array([1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.5]))
    z1 = np.array([0.25, 0.25, 0.25, -0.75]) / (0.5 + 1e-6)
    want1 = 0.75 * z1 + 0.25 * np.array([1 / 3, 1 / 3, 1 / 3, -1.0])
    r2 = np.array([0.0, 1.0, 0.0, 0.5])
    sigma2 = r2.std(ddof=1)
    want2 = 0.75 * (r2 - 0.375) / (sigma2 + 1e-6) + 0.25 * (r2 - 0.375) / (0.375 + 1e-6)
    np.testing.assert_allclose(adv, np.concatenate([want1, want2]), rtol=1e-5)
    np.testing.assert_allclose(adv[:4], [0.458333, 0.458333, 0.458333, -1.375], rtol=1e-5)

  def test_against_official_branch(self):
    rng = np.random.default_rng(0)
    reward = rng.integers(0, 2, size=(6, 8)).astype(np.float32)
    reward[1] = rng.random(8)  # continuous rewards: p counts exact 1.0 only
    reward[2, :7] = 1.0
    reward = reward.reshape(-1)
    for weighting in cmix.WEIGHTINGS:
      np.testing.assert_allclose(cmix.certainty_mix(jnp.asarray(reward), group_size=8,
                                                    weighting=weighting),
                                 np_certainty_mix(reward, 8, weighting=weighting), rtol=1e-5,
                                 atol=1e-6)

  def test_fixed_lambda_reductions(self):
    reward = jnp.array([1.0, 0.0, 0.0, 0.0, 0.2, 0.6, 0.6, 1.0])
    np.testing.assert_allclose(cmix.certainty_mix(reward, group_size=4, lam=0.0),
                               estimators.grpo(reward, group_size=4), rtol=1e-6)
    mean = jnp.repeat(reward.reshape(2, 4).mean(1), 4)
    np.testing.assert_allclose(cmix.certainty_mix(reward, group_size=4, lam=1.0),
                               (reward - mean) / (mean + 1e-6), rtol=1e-5, atol=1e-6)

  def test_mix_weight(self):
    p = jnp.array([0.0, 0.25, 0.5, 1.0])
    np.testing.assert_allclose(cmix.mix_weight(p), [1.0, 0.25, 0.0, 1.0])
    np.testing.assert_allclose(cmix.mix_weight(p, weighting="linear"), [1.0, 0.5, 0.0, 1.0])
    np.testing.assert_allclose(
        cmix.trajectory_certainty(jnp.array([1.0, 0.0, 1.0, 1.0]), group_size=2),
        [0.5, 0.5, 1.0, 1.0])

  def test_equal_groups_give_exactly_zero_and_permutations(self):
    for value in (0.0, 1.0, 0.3):
      np.testing.assert_array_equal(cmix.certainty_mix(jnp.full((4,), value), group_size=4),
                                    0.0)
    rng = np.random.default_rng(1)
    reward = rng.integers(0, 2, size=12).astype(np.float32)
    perm = np.concatenate([rng.permutation(4) + 4 * g for g in range(3)])
    adv = np.asarray(cmix.certainty_mix(jnp.asarray(reward), group_size=4))
    np.testing.assert_allclose(cmix.certainty_mix(jnp.asarray(reward[perm]), group_size=4),
                               adv[perm], rtol=1e-6)

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "group_size >= 2"):
      cmix.certainty_mix(jnp.zeros(3), group_size=1)
    with self.assertRaisesRegex(ValueError, "weighting="):
      cmix.mix_weight(jnp.zeros(2), weighting="cubic")
    with self.assertRaisesRegex(ValueError, "divisible"):
      cmix.trajectory_certainty(jnp.zeros(3), group_size=2)


if __name__ == "__main__":
  absltest.main()
