# pylint: disable=invalid-name
"""Tests for agentrl.advantages.estimators: golden numbers, float64 references, RL invariants."""
import collections
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl import types

jax.config.update("jax_numpy_rank_promotion", "raise")

RTOL, ATOL = 1e-5, 1e-6


# ---------------------------------------------------------------------------------------------
# Independent float64 references, written like verl's loops (core_algos.py).

def _groups(n, group_size):
  return [list(range(i, i + group_size)) for i in range(0, n, group_size)]


def np_grpo(reward, group_size, norm_by_std=True, eps=1e-6):
  reward = np.asarray(reward, np.float64)
  out = np.zeros_like(reward)
  for rows in _groups(len(reward), group_size):
    r = reward[rows]
    mean, std = (0.0, 1.0) if len(r) == 1 else (r.mean(), r.std(ddof=1))
    out[rows] = (r - mean) / (std + eps) if norm_by_std else r - mean
  return out


def np_rloo(reward, group_size):
  reward = np.asarray(reward, np.float64)
  out = reward.copy()
  for rows in _groups(len(reward), group_size):
    for i in rows if len(rows) > 1 else []:
      out[i] = reward[i] - np.mean([reward[j] for j in rows if j != i])
  return out


def np_opo(reward, length, group_size):
  reward, length = np.asarray(reward, np.float64), np.asarray(length, np.float64)
  out = reward.copy()
  for rows in _groups(len(reward), group_size):
    if len(rows) > 1:
      out[rows] = reward[rows] - (length[rows] * reward[rows]).sum() / length[rows].sum()
  return out


def np_whiten(x, mask):
  vals = x[mask > 0]
  return np.where(mask > 0, (x - vals.mean()) / np.sqrt(vals.var(ddof=1) + 1e-8), 0.0)


def np_returns(reward, mask, gamma):
  """Per row: keep policy tokens only, discount right to left, scatter back."""
  out = np.zeros_like(reward, dtype=np.float64)
  for b in range(reward.shape[0]):
    idx = np.nonzero(mask[b])[0]
    running = 0.0
    for t in idx[::-1]:
      running = reward[b, t] + gamma * running
      out[b, t] = running
  return out


def np_gae_row(reward, value, gamma, lam):
  adv, last, next_value = np.zeros(len(reward)), 0.0, 0.0
  for t in reversed(range(len(reward))):
    delta = reward[t] + gamma * next_value - value[t]
    last = delta + gamma * lam * last
    adv[t], next_value = last, value[t]
  return adv


def np_gae(reward, value, mask, gamma, lam):
  """GAE on each row's compressed sequence of policy tokens."""
  adv = np.zeros_like(reward, dtype=np.float64)
  for b in range(reward.shape[0]):
    idx = np.nonzero(mask[b])[0]
    adv[b, idx] = np_gae_row(reward[b, idx], value[b, idx], gamma, lam)
  return adv, np.where(mask > 0, adv + value, 0.0)


def np_turn_group(reward, mask, group_size, eps=1e-6):
  out = np.zeros_like(reward, dtype=np.float64)
  by_key = collections.defaultdict(list)
  for b in range(reward.shape[0]):
    for k in range(reward.shape[1]):
      if mask[b, k]:
        by_key[(b // group_size, k)].append(b)
  for (_, k), rows in by_key.items():
    r = reward[rows, k].astype(np.float64)
    mean, std = (0.0, 1.0) if len(r) == 1 else (r.mean(), r.std(ddof=1))
    out[rows, k] = (r - mean) / (std + eps)
  return out


def _random_rewards(rng, n_groups, group_size):
  """Binary, continuous and all-equal groups mixed, as in real batches."""
  reward = rng.normal(size=(n_groups, group_size))
  reward[0] = 1.0                      # all solved
  reward[1] = 0.0                      # all failed
  reward[2] = rng.integers(0, 2, size=group_size)
  reward[3] = 0.1                      # equal, not exactly representable
  return reward.reshape(-1).astype(np.float32)


def _holey_mask(rng, B, T):
  mask = (rng.random((B, T)) > 0.3).astype(np.float32)
  mask[0] = 0.0                         # a fully masked row
  mask[1, :] = 1.0
  return mask


# ---------------------------------------------------------------------------------------------

class GroupEstimatorTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_grpo_hand_computed(self):
    fn = self.variant(functools.partial(estimators.grpo, group_size=2))
    a = 0.5 / (np.sqrt(0.5) + 1e-6)
    np.testing.assert_allclose(fn(jnp.array([1.0, 0.0, 3.0, 3.0])), [a, -a, 0.0, 0.0],
                               rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_dr_grpo_hand_computed(self):
    fn = self.variant(functools.partial(estimators.grpo, group_size=2, norm_by_std=False))
    np.testing.assert_allclose(fn(jnp.array([1.0, 0.0, 3.0, 3.0])), [0.5, -0.5, 0.0, 0.0])

  def test_grpo_size_one_groups_use_mean_zero_std_one(self):
    reward = jnp.array([2.0, -1.0])
    np.testing.assert_allclose(estimators.grpo(reward, group_size=1), reward / (1 + 1e-6))
    np.testing.assert_array_equal(
        estimators.grpo(reward, group_size=1, norm_by_std=False), reward)

  @chex.variants(with_jit=True, without_jit=True)
  def test_rloo_hand_computed(self):
    fn = self.variant(functools.partial(estimators.rloo, group_size=3))
    np.testing.assert_allclose(fn(jnp.array([1.0, 0.0, 0.0, 3.0, 3.0, 3.0])),
                               [1.0, -0.5, -0.5, 0.0, 0.0, 0.0], rtol=1e-6, atol=1e-7)

  @chex.variants(with_jit=True, without_jit=True)
  def test_opo_hand_computed(self):
    fn = self.variant(functools.partial(estimators.opo, group_size=2))
    # b = (3 * 1 + 1 * 0) / 4 = 0.75.
    np.testing.assert_allclose(fn(jnp.array([1.0, 0.0]), jnp.array([3, 1])), [0.25, -0.75])

  @chex.variants(with_jit=True, without_jit=True)
  def test_group_has_variance(self):
    fn = self.variant(functools.partial(estimators.group_has_variance, group_size=2))
    np.testing.assert_array_equal(fn(jnp.array([1.0, 1.0, 0.0, 1.0, 2.0, 2.0])),
                                  [False, False, True, True, False, False])

  def test_constant_groups_give_exactly_zero(self):
    for value in (7.0, 0.1, 1e6 + 0.1, -3.3):
      reward = jnp.full((6,), value)
      for name, adv in [
          ("grpo", estimators.grpo(reward, group_size=3)),
          ("dr_grpo", estimators.grpo(reward, group_size=3, norm_by_std=False)),
          ("rloo", estimators.rloo(reward, group_size=3)),
          ("opo", estimators.opo(reward, jnp.array([1, 5, 9, 2, 2, 7]), group_size=3)),
          ("turn_group", estimators.turn_group(reward.reshape(3, 2), jnp.ones((3, 2)),
                                               group_size=3)),
      ]:
        np.testing.assert_array_equal(adv, 0.0, err_msg=f"{name} at {value}")
    # Non-trivial side: one differing reward gives non-zero advantages.
    self.assertTrue(np.all(estimators.grpo(jnp.array([0.1, 0.1, 0.2]), group_size=3) != 0))

  def test_against_float64_reference(self):
    rng = np.random.default_rng(0)
    G = 4
    reward = _random_rewards(rng, 6, G)
    length = rng.integers(1, 50, size=reward.shape).astype(np.float32)
    for norm in (True, False):
      np.testing.assert_allclose(estimators.grpo(jnp.asarray(reward), group_size=G,
                                                 norm_by_std=norm),
                                 np_grpo(reward, G, norm), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(estimators.rloo(jnp.asarray(reward), group_size=G),
                               np_rloo(reward, G), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(estimators.rloo(jnp.asarray(reward[:3]), group_size=1),
                               reward[:3])
    np.testing.assert_allclose(
        estimators.opo(jnp.asarray(reward), jnp.asarray(length), group_size=G),
        np_opo(reward, length, G), rtol=RTOL, atol=ATOL)

  def test_permuting_rows_within_a_group_permutes_advantages(self):
    rng = np.random.default_rng(1)
    G = 4
    reward = _random_rewards(rng, 5, G)
    length = rng.integers(1, 50, size=reward.shape).astype(np.float32)
    turn_reward = rng.normal(size=(reward.shape[0], 3)).astype(np.float32)
    turn_mask = (rng.random(turn_reward.shape) > 0.3).astype(np.float32)
    perm = np.concatenate([rng.permutation(G) + g * G for g in range(5)])
    self.assertFalse(np.array_equal(perm, np.arange(len(perm))))
    fns = {
        "grpo": lambda r, l, tr, tm: estimators.grpo(r, group_size=G),
        "rloo": lambda r, l, tr, tm: estimators.rloo(r, group_size=G),
        "opo": lambda r, l, tr, tm: estimators.opo(r, l, group_size=G),
        "turn_group": lambda r, l, tr, tm: estimators.turn_group(tr, tm, group_size=G),
    }
    for name, fn in fns.items():
      base = np.asarray(fn(reward, length, turn_reward, turn_mask))
      permuted = fn(reward[perm], length[perm], turn_reward[perm], turn_mask[perm])
      np.testing.assert_allclose(permuted, base[perm], rtol=RTOL, atol=ATOL, err_msg=name)
      self.assertGreater(np.abs(base).max(), 0.1, name)  # cannot pass on all-zero output
      # Moving a row to another group does change the result.
      swapped = np.arange(len(perm))
      swapped[[0, 2 * G + 2]] = swapped[[2 * G + 2, 0]]
      other = fn(reward[swapped], length[swapped], turn_reward[swapped], turn_mask[swapped])
      self.assertFalse(np.allclose(other, base[swapped]), name)

  def test_bad_group_size_raises(self):
    with self.assertRaisesRegex(ValueError, "group_size=4"):
      estimators.grpo(jnp.zeros((6,)), group_size=4)


class TokenReturnTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_discounted_returns_carry_across_masked_positions(self):
    fn = self.variant(functools.partial(estimators.discounted_returns, gamma=0.5))
    # Position 2 is a tool observation: its reward is ignored and does not cost a discount step.
    out = fn(jnp.array([[0.0, 1.0, 9.0, 2.0]]), jnp.array([[1.0, 1.0, 0.0, 1.0]]))
    np.testing.assert_allclose(out, [[1.0, 2.0, 0.0, 2.0]])

  @chex.variants(with_jit=True, without_jit=True)
  def test_reinforce_pp_hand_computed(self):
    fn = self.variant(functools.partial(estimators.reinforce_pp, gamma=0.5))
    out = fn(jnp.array([[0.0, 1.0, 9.0, 2.0]]), jnp.array([[1.0, 1.0, 0.0, 1.0]]))
    # Returns [1, 2, 2] over policy tokens: mean 5/3, unbiased std sqrt(1/3).
    s = np.sqrt(1.0 / 3.0 + 1e-8)
    np.testing.assert_allclose(out, [[-2 / 3 / s, 1 / 3 / s, 0.0, 1 / 3 / s]], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_reinforce_pp_baseline_hand_computed(self):
    fn = self.variant(functools.partial(estimators.reinforce_pp_baseline, group_size=2))
    mask = jnp.array([[1.0, 1.0], [1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    out = fn(jnp.array([1.0, 0.0, 2.0, 2.0]), mask)
    # Centred [0.5, -0.5, 0, 0] on tokens -> values .5,.5,-.5,0,0: mean .1, unbiased var .175.
    s = np.sqrt(0.175 + 1e-8)
    a, b, c = 0.4 / s, -0.6 / s, -0.1 / s
    np.testing.assert_allclose(out, [[a, a], [b, 0.0], [c, c], [0.0, 0.0]], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_remax_hand_computed(self):
    np.testing.assert_allclose(
        self.variant(estimators.remax)(jnp.array([1.0, 0.0]), jnp.array([0.5, 0.5])),
        [0.5, -0.5])
    out = self.variant(estimators.remax_token)(
        jnp.array([[0.0, 0.0, 1.0], [0.0, 0.5, 0.0]]), jnp.array([0.5, 0.0]),
        jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]))
    np.testing.assert_allclose(out, [[0.5, 0.5, 0.5], [0.5, 0.5, 0.0]])

  def test_against_float64_reference(self):
    rng = np.random.default_rng(2)
    B, T, G = 8, 7, 2
    mask = _holey_mask(rng, B, T)
    token_reward = rng.normal(size=(B, T)).astype(np.float32)
    token_reward[mask == 0] = np.nan  # never read
    ret = np_returns(token_reward, mask, 0.9)
    np.testing.assert_allclose(
        estimators.discounted_returns(jnp.asarray(token_reward), jnp.asarray(mask), gamma=0.9),
        ret, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(
        estimators.reinforce_pp(jnp.asarray(token_reward), jnp.asarray(mask), gamma=0.9),
        np_whiten(ret, mask), rtol=RTOL, atol=ATOL)
    reward = _random_rewards(rng, 4, G)
    tokens = np.where(mask > 0, np_grpo(reward, G, norm_by_std=False)[:, None], 0.0)
    np.testing.assert_allclose(
        estimators.reinforce_pp_baseline(jnp.asarray(reward), jnp.asarray(mask), group_size=G),
        np_whiten(tokens, mask), rtol=RTOL, atol=ATOL)
    greedy = rng.normal(size=(B,)).astype(np.float32)
    np.testing.assert_allclose(
        estimators.remax_token(jnp.asarray(token_reward), jnp.asarray(greedy),
                               jnp.asarray(mask)),
        np.where(mask > 0, np_returns(token_reward, mask, 1.0) - greedy[:, None], 0.0),
        rtol=RTOL, atol=ATOL)


class GaeTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    fn = self.variant(functools.partial(estimators.gae, gamma=0.9, lam=0.8))
    adv, ret = fn(jnp.array([[0.0, 0.0, 1.0]]), jnp.array([[0.5, 0.6, 0.7]]),
                  jnp.ones((1, 3)))
    # delta = [0.04, 0.03, 0.3]; A_1 = 0.03 + 0.72 * 0.3; A_0 = 0.04 + 0.72 * A_1.
    np.testing.assert_allclose(adv, [[0.21712, 0.246, 0.3]], rtol=1e-5)
    np.testing.assert_allclose(ret, [[0.71712, 0.846, 1.0]], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_observation_token_is_skipped(self):
    fn = self.variant(functools.partial(estimators.gae, gamma=0.9, lam=0.8))
    adv, ret = fn(jnp.array([[0.0, 5.0, 1.0]]), jnp.array([[0.5, jnp.nan, 0.7]]),
                  jnp.array([[1.0, 0.0, 1.0]]))
    # Same as the compressed sequence r = [0, 1], V = [0.5, 0.7].
    np.testing.assert_allclose(adv, [[0.346, 0.0, 0.3]], rtol=1e-5)
    np.testing.assert_allclose(ret, [[0.846, 0.0, 1.0]], rtol=1e-5)

  def test_gamma_lam_one_is_return_minus_value(self):
    adv, ret = estimators.gae(jnp.array([[0.0, 0.0, 1.0]]), jnp.array([[0.5, 0.6, 0.7]]),
                              jnp.ones((1, 3)))
    np.testing.assert_allclose(adv, [[0.5, 0.4, 0.3]], rtol=1e-6)
    np.testing.assert_allclose(ret, [[1.0, 1.0, 1.0]], rtol=1e-6)

  def test_skipping_masked_positions_equals_compressed_sequence(self):
    rng = np.random.default_rng(3)
    B, T = 6, 9
    mask = _holey_mask(rng, B, T)
    reward = rng.normal(size=(B, T)).astype(np.float32)
    value = rng.normal(size=(B, T)).astype(np.float32)
    value[mask == 0] = np.nan  # values at masked positions are never read
    adv, ret = estimators.gae(jnp.asarray(reward), jnp.asarray(value), jnp.asarray(mask),
                              gamma=0.95, lam=0.9)
    ref_adv, ref_ret = np_gae(reward, np.nan_to_num(value), mask, 0.95, 0.9)
    np.testing.assert_allclose(adv, ref_adv, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(ret, ref_ret, rtol=RTOL, atol=ATOL)
    # Non-trivial side: not skipping (mask all ones) gives a different answer on these rows.
    dense_adv, _ = estimators.gae(jnp.asarray(reward), jnp.asarray(np.nan_to_num(value)),
                                  jnp.ones((B, T)), gamma=0.95, lam=0.9)
    self.assertFalse(np.allclose(np.where(mask > 0, dense_adv, 0.0), ref_adv, atol=1e-3))


class TurnLevelTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_turn_group_hand_computed(self):
    fn = self.variant(functools.partial(estimators.turn_group, group_size=2))
    out = fn(jnp.array([[1.0, 5.0], [3.0, 7.0]]), jnp.array([[1.0, 1.0], [1.0, 0.0]]))
    # Turn 0: {1, 3}, mean 2, std sqrt(2). Turn 1: one valid turn -> mean 0, std 1.
    a = 1.0 / (np.sqrt(2.0) + 1e-6)
    np.testing.assert_allclose(out, [[-a, 5.0 / (1 + 1e-6)], [a, 0.0]], rtol=1e-5)

  def test_turn_group_against_float64_reference(self):
    rng = np.random.default_rng(4)
    G = 3
    reward = rng.normal(size=(9, 4)).astype(np.float32)
    mask = (rng.random(reward.shape) > 0.35).astype(np.float32)
    reward[3:6, 1] = 0.25  # an all-equal (prompt, turn) group
    mask[3:6, 1] = 1.0
    out = estimators.turn_group(jnp.asarray(reward), jnp.asarray(mask), group_size=G)
    np.testing.assert_allclose(out, np_turn_group(reward, mask, G), rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(out[3:6, 1], 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_information_gain_hand_computed(self):
    prob = jnp.array([[0.2, 0.5, 0.6], [0.4, 0.3, 0.9]])
    out = self.variant(estimators.information_gain)(
        2.0 * jnp.log(prob), jnp.array([2, 2]), jnp.array([[1, 1, 1], [1, 1, 0]]),
        jnp.array([1.0, 0.0]))
    # Gains P_{k+1} - P_k; the last valid turn gets the outcome; turn 2 of row 1 is invalid.
    np.testing.assert_allclose(out, [[0.3, 0.1, 1.0], [-0.1, 0.0, 0.0]], atol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_discounted_turn_returns_hand_computed(self):
    reward, full = jnp.array([[1.0, 2.0, 3.0]]), jnp.ones((1, 3))
    fn = self.variant(functools.partial(estimators.discounted_turn_returns, gamma=0.5))
    np.testing.assert_allclose(fn(reward, full), [[2.75, 3.5, 3.0]])
    np.testing.assert_allclose(fn(reward, jnp.array([[1.0, 1.0, 0.0]])), [[2.0, 2.0, 0.0]])
    rescaled = self.variant(functools.partial(estimators.discounted_turn_returns, gamma=0.5,
                                              variance_rescale=True))(reward, full)
    np.testing.assert_allclose(rescaled, [[2.75 / np.sqrt(3), 3.5 / np.sqrt(2), 3.0]],
                               rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_broadcast_turn_to_tokens(self):
    out = self.variant(estimators.broadcast_turn_to_tokens)(
        jnp.array([[10.0, 20.0]]), jnp.array([[-1, 0, 0, 1, 1, 2]]),
        jnp.array([[0.0, 1.0, 0.0, 1.0, 1.0, 1.0]]))
    # Prompt (-1), a masked tool token and an out-of-range turn index all get 0.
    np.testing.assert_array_equal(out, [[0.0, 10.0, 0.0, 20.0, 20.0, 0.0]])

  @chex.variants(with_jit=True, without_jit=True)
  def test_broadcast_to_tokens(self):
    out = self.variant(estimators.broadcast_to_tokens)(
        jnp.array([2.0, -1.0]), jnp.array([[1.0, 0.0], [1.0, 1.0]]))
    np.testing.assert_array_equal(out, [[2.0, 0.0], [-1.0, -1.0]])


class DapoTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_overlong_penalty_hand_computed(self):
    length = jnp.array([10, 16, 18, 20, 25])
    fn = self.variant(functools.partial(estimators.dapo_overlong_penalty, max_len=20,
                                        buffer_len=4))
    np.testing.assert_allclose(fn(length), [0.0, 0.0, -0.5, -1.0, -1.0])
    half = self.variant(functools.partial(estimators.dapo_overlong_penalty, max_len=20,
                                          buffer_len=4, penalty_factor=0.5))
    np.testing.assert_allclose(half(length), [0.0, 0.0, -0.25, -0.5, -0.5])

  def test_overlong_penalty_rejects_bad_buffer(self):
    with self.assertRaisesRegex(ValueError, "buffer_len=30"):
      estimators.dapo_overlong_penalty(jnp.array([1]), max_len=20, buffer_len=30)


class GrpoStepTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # Group 1 (rewards 1, 0): +-1/sqrt(2) after the ddof=1 std; group 2 (3, 3): no signal.
    # Row 0 has 3 response tokens, the others 2.
    mask_BT = jnp.array([[1.0, 1.0, 1.0]] + [[0.0, 1.0, 1.0]] * 3)
    batch = types.Batch(tokens_BT=jnp.zeros((4, 3), jnp.int32),
                        positions_BT=jnp.zeros((4, 3), jnp.int32),
                        input_mask_BT=jnp.ones((4, 3), bool), loss_mask_BT=mask_BT,
                        reward_B=jnp.array([1.0, 0.0, 3.0, 3.0]))
    out, metrics = self.variant(estimators.grpo_step(2))(batch, {})
    a = 0.5 / (np.sqrt(0.5) + 1e-6)
    np.testing.assert_allclose(out.adv_BT, [[a, a, a], [0, -a, -a], [0, 0, 0], [0, 0, 0]],
                               rtol=1e-6)
    np.testing.assert_allclose(metrics["groups_with_signal"], 0.5)
    # Over response tokens (5 of 9 carry |A| = a), not over rows (which would give a / 2).
    np.testing.assert_allclose(metrics["adv_abs_mean"], 5 * a / 9, rtol=1e-6)
    out, _ = self.variant(estimators.grpo_step(2, norm_by_std=False))(batch, {})
    np.testing.assert_allclose(out.adv_BT[:, 1], [0.5, -0.5, 0.0, 0.0])


if __name__ == "__main__":
  absltest.main()
