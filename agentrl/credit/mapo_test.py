# pylint: disable=invalid-name
"""Tests for agentrl.credit.mapo (arXiv 2603.06194): hand-computed cases with masks and uneven
turn counts, a float64 NumPy reference, and the invariants (masked turns 0, group permutation
equivariance, w = 1 / w = 0 single-level normalisations, the outcome-only return)."""
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.credit import mapo

jax.config.update("jax_numpy_rank_promotion", "raise")


def np_zscore(x, eps):
  """(x - mean) / (std + eps), unbiased std; 0 for fewer than two entries."""
  if len(x) < 2:
    return np.zeros(len(x))
  return (x - x.mean()) / (x.std(ddof=1) + eps)


def np_mapo(env, progress, mask, G, c=1.0, gamma=1.0, w=0.5, eps=1e-6):
  """Loops over rows, turns and groups in float64."""
  env, progress, mask = (np.asarray(a, np.float64) for a in (env, progress, mask))
  B, U = mask.shape
  ret = np.zeros((B, U))
  for i in range(B):
    running = 0.0
    for k in reversed(range(U)):
      if mask[i, k]:
        running = c * progress[i, k] + env[i, k] + gamma * running
        ret[i, k] = running
  turn, batch = np.zeros((B, U)), np.zeros((B, U))
  for p in range(B // G):
    for k in range(U):
      rows = [i for i in range(p * G, (p + 1) * G) if mask[i, k]]
      turn[rows, k] = np_zscore(ret[rows, k], eps)
  valid = mask > 0
  batch[valid] = np_zscore(ret[valid], eps)
  return np.where(valid, w * turn + (1 - w) * batch, 0.0)


def random_inputs(rng, P, G, U):
  B = P * G
  n_turns = rng.integers(0, U + 1, size=B)
  mask = (np.arange(U)[None, :] < n_turns[:, None]).astype(np.float32)
  env = rng.normal(size=(B, U)).astype(np.float32)
  progress = rng.random((B, U)).astype(np.float32)
  return env, progress, mask


class MapoTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_one_group_uneven_turns(self):
    # G = 2, U = 3. Row 0: 3 turns, progress [1, 0, 1], env [0, 0, 1] -> r = [1, 0, 2],
    # R = [3, 2, 2]. Row 1: 2 turns, progress [0, 1], env [0, 0] -> r = [0, 1], R = [1, 1].
    # Turn level: k=0 {3, 1} -> +-1/sqrt(2); k=1 {2, 1} -> +-0.5/sqrt(0.5); k=2 alone -> 0.
    # Batch level: {3, 2, 2, 1, 1}, mean 1.8, unbiased var 2.8/4 = 0.7.
    fn = self.variant(functools.partial(mapo.mapo, group_size=2))
    adv = fn(jnp.array([[0.0, 0.0, 1.0], [0.0, 0.0, 5.0]]),
             jnp.array([[1.0, 0.0, 1.0], [0.0, 1.0, 7.0]]),
             jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]))
    eps, sd = 1e-6, np.sqrt(0.7)
    turn = np.array([[1 / (np.sqrt(2) + eps), 0.5 / (np.sqrt(0.5) + eps), 0.0],
                     [-1 / (np.sqrt(2) + eps), -0.5 / (np.sqrt(0.5) + eps), 0.0]])
    batch = np.array([[1.2, 0.2, 0.2], [-0.8, -0.8, 0.0]]) / (sd + eps)
    np.testing.assert_allclose(adv, 0.5 * turn + 0.5 * batch, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(adv, [[1.070690, 0.473076, 0.119523],
                                     [-0.831644, -0.831644, 0.0]], rtol=1e-5, atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_two_groups_discount_and_weights(self):
    # P = 2, G = 2, U = 2, progress_coef 2, gamma 0.5, w = 0.25.
    # Row 0: r = 2 * [0.5, 0] + [0, 1] = [1, 1] -> R = [1.5, 1]. Row 1: zeros -> R = [0, 0].
    # Row 2: one turn, r = [1] -> R = [1] (its masked progress 9 is ignored). Row 3: no turns.
    # Turn level: group 0 k=0 {1.5, 0} and k=1 {1, 0} -> +-1/sqrt(2); group 1: one turn -> 0.
    # Batch level: {1.5, 1, 0, 0, 1}, mean 0.7, unbiased var 1.8/4 = 0.45.
    fn = self.variant(functools.partial(mapo.mapo, group_size=2, progress_coef=2.0,
                                        gamma=0.5, turn_weight=0.25))
    adv = fn(jnp.array([[0.0, 1.0], [0.0, 0.0], [1.0, 0.0], [3.0, 3.0]]),
             jnp.array([[0.5, 0.0], [0.0, 0.0], [0.0, 9.0], [1.0, 1.0]]),
             jnp.array([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [0.0, 0.0]]))
    eps = 1e-6
    t0 = 0.75 / (np.sqrt(2 * 0.75**2) + eps)
    t1 = 0.5 / (np.sqrt(0.5) + eps)
    turn = np.array([[t0, t1], [-t0, -t1], [0.0, 0.0], [0.0, 0.0]])
    batch = np.array([[0.8, 0.3], [-0.7, -0.7], [0.3, 0.0], [0.0, 0.0]]) / (
        np.sqrt(0.45) + eps)
    np.testing.assert_allclose(adv, 0.25 * turn + 0.75 * batch, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(adv, [[1.071202, 0.512186], [-0.959399, -0.959399],
                                     [0.335410, 0.0], [0.0, 0.0]], rtol=1e-5, atol=1e-6)

  def test_against_numpy_reference(self):
    rng = np.random.default_rng(0)
    for P, G, U, c, gamma, w in ((3, 4, 5, 1.0, 1.0, 0.5), (2, 3, 6, 0.3, 0.9, 0.8),
                                 (4, 2, 1, 2.0, 0.5, 0.0)):
      env, progress, mask = random_inputs(rng, P, G, U)
      got = mapo.mapo(jnp.asarray(env), jnp.asarray(progress), jnp.asarray(mask), group_size=G,
                      progress_coef=c, gamma=gamma, turn_weight=w)
      np.testing.assert_allclose(got, np_mapo(env, progress, mask, G, c, gamma, w),
                                 rtol=1e-4, atol=1e-5)

  def test_masked_turns_are_exactly_zero_and_ignored(self):
    rng = np.random.default_rng(1)
    env, progress, mask = random_inputs(rng, 3, 4, 5)
    adv = np.asarray(mapo.mapo(jnp.asarray(env), jnp.asarray(progress), jnp.asarray(mask),
                               group_size=4))
    np.testing.assert_array_equal(adv[mask == 0], 0.0)
    junk = np.where(mask > 0, 0.0, 100.0).astype(np.float32)
    np.testing.assert_allclose(mapo.mapo(jnp.asarray(env + junk), jnp.asarray(progress - junk),
                                         jnp.asarray(mask), group_size=4), adv, rtol=1e-6)

  def test_group_permutation_equivariance(self):
    rng = np.random.default_rng(2)
    P, G = 3, 4
    env, progress, mask = random_inputs(rng, P, G, 5)
    within = np.concatenate([rng.permutation(G) + G * g for g in range(P)])
    perm = (rng.permutation(P)[:, None] * G + np.arange(G)[None, :]).reshape(-1)[within]
    args = lambda rows: [jnp.asarray(a[rows]) for a in (env, progress, mask)]
    adv = np.asarray(mapo.mapo(*args(np.arange(P * G)), group_size=G))
    np.testing.assert_allclose(mapo.mapo(*args(perm), group_size=G), adv[perm], rtol=1e-5,
                               atol=1e-6)

  def test_single_level_weights(self):
    rng = np.random.default_rng(3)
    env, progress, mask = (jnp.asarray(a) for a in random_inputs(rng, 2, 3, 4))
    ret = mapo.mc_returns(env, progress, mask, gamma=0.9)
    np.testing.assert_allclose(
        mapo.mapo(env, progress, mask, group_size=3, gamma=0.9, turn_weight=1.0),
        mapo.turn_level(ret, mask, group_size=3), rtol=1e-6)
    np.testing.assert_allclose(
        mapo.mapo(env, progress, mask, group_size=3, gamma=0.9, turn_weight=0.0),
        mapo.batch_level(ret, mask), rtol=1e-6)

  def test_outcome_only_return_is_the_outcome_sum_from_k(self):
    rng = np.random.default_rng(4)
    env, progress, mask = random_inputs(rng, 2, 3, 5)
    env = env * mask
    ret = mapo.mc_returns(jnp.asarray(env), jnp.asarray(progress), jnp.asarray(mask),
                          progress_coef=0.0, gamma=1.0)
    want = np.cumsum(env[:, ::-1], axis=1)[:, ::-1] * mask
    np.testing.assert_allclose(ret, want, rtol=1e-5, atol=1e-5)
    # A sparse env (the outcome on the last turn) gives every valid turn the outcome.
    last = np.zeros_like(mask)
    n = mask.sum(1).astype(int)
    last[np.arange(len(n))[n > 0], n[n > 0] - 1] = 1.0
    outcome = rng.random(len(n)).astype(np.float32)
    ret = mapo.mc_returns(jnp.asarray(last * outcome[:, None]), jnp.asarray(progress),
                          jnp.asarray(mask), progress_coef=0.0)
    np.testing.assert_allclose(ret, mask * outcome[:, None], rtol=1e-6)
    np.testing.assert_allclose(ret, estimators.discounted_turn_returns(
        jnp.asarray(last * outcome[:, None]), jnp.asarray(mask)), rtol=1e-6)

  def test_equal_returns_give_exactly_zero(self):
    mask = jnp.array([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0], [1.0, 0.0]])
    env = jnp.array([[0.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 0.0]])  # every R = 1
    np.testing.assert_array_equal(mapo.mapo(env, jnp.zeros_like(env), mask, group_size=2), 0.0)

  def test_bad_arguments(self):
    z = jnp.zeros((4, 3))
    with self.assertRaisesRegex(ValueError, "turn_weight"):
      mapo.mapo(z, z, z, group_size=2, turn_weight=1.5)
    with self.assertRaisesRegex(ValueError, "progress_BU has shape"):
      mapo.mapo(z, jnp.zeros((4, 2)), z, group_size=2)
    with self.assertRaisesRegex(ValueError, "group_size=3"):
      mapo.mapo(z, z, z, group_size=3)


if __name__ == "__main__":
  absltest.main()
