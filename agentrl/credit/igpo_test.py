# pylint: disable=invalid-name
"""Tests for agentrl.credit.igpo: hand-computed goldens, a NumPy transcription of the
official token-level code (GuoqingWang1/IGPO@49a8c4ec, verl/trainer/ppo/core_algos.py), and
the RL invariants."""
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.credit import igpo

jax.config.update("jax_numpy_rank_promotion", "raise")


def np_official_igpo(token_rewards, response_mask, index, gamma, norm_mode, eps=1e-6):
  """compute_grpo_outcome_advantage + _compute_turn_level_advantage, loop for loop, float64.

  token_rewards holds each turn's gain on its last token and the outcome on the last valid
  token (the layout info_gain.py builds); response_mask is contiguous, as in that code.
  """
  r = np.asarray(token_rewards, np.float64)
  mask = np.asarray(response_mask) > 0
  B, T = r.shape
  last = mask.sum(1) - 1
  f1 = (np.arange(T)[None] == last[:, None]) & mask
  ig = mask & ~f1 & (r != 0)

  def stats(sel):
    mean, std = {}, {}
    for g in set(index):
      vals = [r[b, t] for b in range(B) if index[b] == g for t in range(T) if sel[b, t]]
      n = len(vals)
      m = sum(vals) / max(n, 1)
      var = sum((v - m) ** 2 for v in vals) / max(n, 1)
      mean[g], std[g] = m, (1.0 if n <= 1 else np.sqrt(var + 1e-8))
    return mean, std

  normed = np.zeros_like(r)
  pools = [f1, ig] if norm_mode == "separate" else [f1 | ig]
  for sel in pools:
    mean, std = stats(sel)
    for b in range(B):
      for t in range(T):
        if sel[b, t]:
          normed[b, t] = (r[b, t] - mean[index[b]]) / (std[index[b]] + eps)
  out = np.zeros_like(r)
  for b in range(B):
    positions = list(np.nonzero((f1 | ig)[b])[0])
    nxt, data = 0.0, []
    for pos in reversed(positions):
      nxt = normed[b, pos] + gamma * nxt
      data.append((pos, nxt))
    prev = 0
    for pos, adv in reversed(data):
      for t in range(prev, pos + 1):
        if mask[b, t]:
          out[b, t] = adv
      prev = pos + 1
  return out


def token_layout(turn_lengths, T):
  """turn_BT (-1 on padding) and a contiguous mask for rows of consecutive turns."""
  B = len(turn_lengths)
  turn = np.full((B, T), -1, np.int32)
  for b, lengths in enumerate(turn_lengths):
    t = 0
    for k, n in enumerate(lengths):
      turn[b, t:t + n] = k
      t += n
  return turn, (turn >= 0).astype(np.float32)


def to_token_rewards(reward_BU, turn_BT):
  """Each turn's reward on its last token (info_gain.py's placement)."""
  out = np.zeros(turn_BT.shape, np.float64)
  for b in range(turn_BT.shape[0]):
    for k in range(reward_BU.shape[1]):
      pos = np.nonzero(turn_BT[b] == k)[0]
      if len(pos):
        out[b, pos[-1]] = reward_BU[b, k]
  return out


class TurnRewardsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    logp = jnp.array([[-2.0, -1.0, -0.5, 0.0], [-3.0, -3.0, 0.0, 0.0]])
    mask = jnp.array([[1, 1, 1, 0], [1, 1, 0, 0]])
    outcome = jnp.array([0.8, -2.0])
    fn = self.variant(functools.partial(igpo.turn_rewards, info_gain_type="log_prob_diff"))
    np.testing.assert_allclose(fn(logp, mask, outcome), [[1.0, 0.5, 0.8, 0.0],
                                                         [0.0, -2.0, 0.0, 0.0]])
    fn = self.variant(functools.partial(igpo.turn_rewards, info_gain_type="prob_diff"))
    e = np.exp
    np.testing.assert_allclose(fn(logp, mask, outcome),
                               [[e(-1) - e(-2), e(-0.5) - e(-1), 0.8, 0.0],
                                [0.0, -2.0, 0.0, 0.0]], rtol=1e-6)

  def test_existing_information_gain_is_prob_diff(self):
    rng = np.random.default_rng(0)
    summed = jnp.asarray(-rng.uniform(1, 20, size=(6, 5)), jnp.float32)
    length = jnp.asarray(rng.integers(1, 8, size=6), jnp.float32)
    mask = jnp.asarray(np.arange(5)[None] < rng.integers(0, 6, size=6)[:, None], jnp.float32)
    outcome = jnp.asarray(rng.normal(size=6), jnp.float32)
    np.testing.assert_allclose(
        estimators.information_gain(summed, length, mask, outcome),
        igpo.turn_rewards(summed / length[:, None], mask, outcome, info_gain_type="prob_diff"),
        rtol=1e-6, atol=1e-7)

  def test_bad_arguments(self):
    x, m = jnp.zeros((2, 3)), jnp.ones((2, 3))
    with self.assertRaisesRegex(ValueError, "info_gain_type"):
      igpo.turn_rewards(x, m, jnp.zeros(2), info_gain_type="kl")
    with self.assertRaisesRegex(ValueError, r"\[B, U\]"):
      igpo.turn_rewards(x, jnp.ones((2, 4)), jnp.zeros(2))
    with self.assertRaisesRegex(ValueError, "outcome_B"):
      igpo.turn_rewards(x, m, jnp.zeros(3))
    with self.assertRaisesRegex(ValueError, "group_size"):
      igpo.turn_advantages(x, m, group_size=4)
    with self.assertRaisesRegex(ValueError, "norm_mode"):
      igpo.turn_advantages(x, m, group_size=2, norm_mode="batch")


class TurnAdvantagesTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_separate_and_joint(self):
    # One group (G = 2). Row 0: gain 0.2, then outcome 1. Row 1: gains 0.6, 0.4, outcome 0.
    reward = jnp.array([[0.2, 1.0, 0.0], [0.6, 0.4, 0.0]])
    mask = jnp.array([[1, 1, 0], [1, 1, 1]])
    a = 0.5 / (np.sqrt(0.25 + 1e-8) + 1e-6)        # outcome pool {1, 0}: z = +-a
    g = 0.2 / (np.sqrt(0.08 / 3 + 1e-8) + 1e-6)    # gain pool {0.2, 0.6, 0.4}: z = -g, g, 0
    fn = self.variant(functools.partial(igpo.turn_advantages, group_size=2))
    np.testing.assert_allclose(fn(reward, mask), [[a - g, a, 0.0], [g - a, -a, -a]],
                               rtol=1e-5)
    fn = self.variant(functools.partial(igpo.turn_advantages, group_size=2, gamma=0.5))
    np.testing.assert_allclose(fn(reward, mask), [[0.5 * a - g, a, 0.0],
                                                  [g - 0.25 * a, -0.5 * a, -a]], rtol=1e-5)
    # Joint pool {0.2, 1, 0.6, 0.4, 0}: mean 0.44, population variance 0.592 / 5.
    z = (np.array([[0.2, 1.0, 0.0], [0.6, 0.4, 0.0]]) - 0.44) / (np.sqrt(0.1184 + 1e-8) + 1e-6)
    fn = self.variant(functools.partial(igpo.turn_advantages, group_size=2, norm_mode="joint"))
    np.testing.assert_allclose(fn(reward, mask),
                               [[z[0, :2].sum(), z[0, 1], 0.0],
                                [z[1].sum(), z[1, 1:].sum(), z[1, 2]]], rtol=1e-5)

  def test_matches_official_token_level_code(self):
    rng = np.random.default_rng(1)
    G, U, T = 4, 4, 40
    for case in range(6):
      n_turns = rng.integers(1, U + 1, size=2 * G)
      lengths = [list(rng.integers(1, 5, size=n)) for n in n_turns]
      turn, mask = token_layout(lengths, T)
      turn_mask = (np.arange(U)[None] < n_turns[:, None]).astype(np.float32)
      logp = -rng.uniform(0.1, 3.0, size=(2 * G, U)).astype(np.float32)
      logp[:, 1] = logp[:, 0]  # zero gains on turn 0: the official code skips them
      outcome = rng.integers(0, 2, size=2 * G).astype(np.float32)
      kind = igpo.INFO_GAIN_TYPES[case % 2]
      reward = np.asarray(igpo.turn_rewards(jnp.asarray(logp), jnp.asarray(turn_mask),
                                            jnp.asarray(outcome), info_gain_type=kind))
      index = [b // G for b in range(2 * G)]
      for mode in igpo.NORM_MODES:
        for gamma in (1.0, 0.8):
          want = np_official_igpo(to_token_rewards(reward, turn), mask, index, gamma, mode)
          got = igpo.token_advantages(jnp.asarray(reward), jnp.asarray(turn_mask),
                                      jnp.asarray(turn), jnp.asarray(mask), group_size=G,
                                      norm_mode=mode, gamma=gamma)
          np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5,
                                     err_msg=f"case {case} {kind} {mode} gamma={gamma}")

  def test_zero_gains_reduce_to_outcome_group_zscore(self):
    # IG = 0 everywhere: every turn gets the outcome's population z-score, whatever gamma.
    outcome = np.array([1.0, 0.0, 0.0, 0.5], np.float32)
    mask = np.array([[1, 1, 1], [1, 0, 0], [1, 1, 0], [1, 1, 1]], np.float32)
    reward = np.where(igpo.last_turn(jnp.asarray(mask)), outcome[:, None], 0.0)
    z = (outcome - outcome.mean()) / (np.sqrt(outcome.var() + 1e-8) + 1e-6)
    for mode in igpo.NORM_MODES:
      for gamma in (1.0, 0.3):
        got = igpo.turn_advantages(jnp.asarray(reward), jnp.asarray(mask), group_size=4,
                                   norm_mode=mode, gamma=gamma)
        np.testing.assert_allclose(got, mask * z[:, None], rtol=1e-5, atol=1e-7)

  def test_skip_zero_gain_false_pools_and_discounts_zero_gain_turns(self):
    reward = jnp.array([[0.0, 1.0], [0.4, 0.0]])
    mask = jnp.ones((2, 2))
    got = igpo.turn_advantages(reward, mask, group_size=2, skip_zero_gain=False, gamma=0.5)
    a = 0.5 / (np.sqrt(0.25 + 1e-8) + 1e-6)
    g = 0.2 / (np.sqrt(0.04 + 1e-8) + 1e-6)  # gain pool {0, 0.4}
    np.testing.assert_allclose(got, [[-g + 0.5 * a, a], [g - 0.5 * a, -a]], rtol=1e-5)
    # Official default: the zero gain is no boundary, so row 0's turn 0 shares turn 1's
    # advantage; row 1's lone gain is a one-entry pool (mean = itself): z = 0.
    got = igpo.turn_advantages(reward, mask, group_size=2, gamma=0.5)
    np.testing.assert_allclose(got, [[a, a], [-0.5 * a, -a]], rtol=1e-5)

  def test_invariants(self):
    rng = np.random.default_rng(2)
    G, U = 3, 4
    n_turns = np.array([4, 2, 3, 1, 4, 3])
    mask = (np.arange(U)[None] < n_turns[:, None]).astype(np.float32)
    reward = np.where(mask > 0, rng.normal(size=(6, U)), 99.0).astype(np.float32)
    adv = np.asarray(igpo.turn_advantages(jnp.asarray(reward), jnp.asarray(mask),
                                          group_size=G))
    self.assertTrue(np.all(adv[mask == 0] == 0.0))  # invalid turns, garbage rewards ignored
    self.assertTrue(np.all(adv[mask > 0] != 0.0))   # non-trivial side
    perm = np.array([2, 0, 1, 4, 5, 3])
    np.testing.assert_allclose(
        igpo.turn_advantages(jnp.asarray(reward[perm]), jnp.asarray(mask[perm]),
                             group_size=G), adv[perm], rtol=1e-6, atol=1e-6)
    # Identical trajectories with one gain value: exactly zero everywhere.
    same = np.tile(np.array([[0.1, 0.1, 0.7, 0.0]], np.float32), (G, 1))
    same_mask = np.tile(np.array([[1, 1, 1, 0]], np.float32), (G, 1))
    np.testing.assert_array_equal(
        igpo.turn_advantages(jnp.asarray(same), jnp.asarray(same_mask), group_size=G), 0.0)
    # Identical trajectories with different gains per turn: the gains are pooled over turns,
    # so later turns keep +-z, but the first turn's return (the row's z-sum) is 0 at gamma 1.
    same[:, 1] = 0.3
    adv = igpo.turn_advantages(jnp.asarray(same), jnp.asarray(same_mask), group_size=G)
    np.testing.assert_allclose(adv[:, 0], 0.0, atol=1e-6)
    self.assertTrue(np.all(np.abs(adv[:, 1]) > 0.5))

  def test_observation_and_prompt_tokens_get_zero(self):
    turn = jnp.array([[-1, -1, 0, 0, 0, 1, 1, 1, -1], [-1, 0, 0, 1, 1, 1, 1, 1, 1]])
    loss_mask = jnp.array([[0, 0, 1, 1, 0, 0, 1, 1, 0], [0, 1, 1, 0, 0, 1, 1, 1, 1]])
    reward = jnp.array([[0.3, 1.0], [-0.1, 0.0]])
    adv_BU = igpo.turn_advantages(reward, jnp.ones((2, 2)), group_size=2)
    adv_BT = np.asarray(igpo.token_advantages(reward, jnp.ones((2, 2)), turn, loss_mask,
                                              group_size=2))
    self.assertTrue(np.all(adv_BT[np.asarray(loss_mask) == 0] == 0.0))
    np.testing.assert_array_equal(adv_BT[0, [2, 3, 6, 7]], np.repeat(adv_BU[0], 2))


if __name__ == "__main__":
  absltest.main()
