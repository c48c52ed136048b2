# pylint: disable=invalid-name
"""Tests for agentrl.advantages.shaping (HAPO token group average, COPO, RiskPO, ProGRPO, FAPO).

References are float64 NumPy transcriptions of the official loops, named per test class:
starriver030515/HAPO `compute_hapo_outcome_advantage` (7671dde), hijih/copo-code
`compute_score_global` / `compute_grpo_outcome_advantage_with_global` (c15c75f) and
RTkenny/RiskPO `compute_grpo_bundle_rvar_outcome_advantage_quantile_tracking` (65ec40c).
"""
import functools
import math

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.advantages import shaping

jax.config.update("jax_numpy_rank_promotion", "raise")


def np_grpo(scores, G, norm=True, eps=1e-6):
  s = scores.reshape(-1, G)
  if G == 1:
    mean, std = np.zeros_like(s), np.ones_like(s)
  else:
    mean, std = s.mean(1, keepdims=True), s.std(1, ddof=1, keepdims=True)
  return (((s - mean) / (std + eps)) if norm else s - mean).reshape(-1)


def np_hapo(scores, mask, G, norm=True, eps=1e-6, padding=True):
  """`compute_hapo_outcome_advantage`; padding=False checks the threshold on tokens only."""
  tok = scores[:, None] * mask
  grpo_tok = np_grpo(scores, G, norm, eps)[:, None] * mask
  out = np.zeros_like(tok)
  for start in range(0, len(scores), G):
    rows = slice(start, start + G)
    vals = tok[rows][mask[rows] > 0]
    mean, std = vals.mean(), vals.std()  # unbiased=False
    normed = (tok[rows] - mean) / (std + eps) if norm else tok[rows] - mean
    seen = normed if padding else normed[mask[rows] > 0]
    out[rows] = grpo_tok[rows] if np.any(np.abs(seen) >= 5) else normed
  return out


class GroupRewardVarianceTest(absltest.TestCase):

  def test_hand_computed(self):
    var = shaping.group_reward_variance(jnp.array([1.0, 0.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]),
                                        group_size=4)
    np.testing.assert_array_equal(var, [0.1875] * 4 + [0.0] * 4)  # p (1 - p), p = 3/4


class HapoGroupTokenAdvantageTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # Rewards (1, 0), lengths (1, 3): mean 1/4, std sqrt(3/16), A = (sqrt 3, -1/sqrt 3).
    mask = jnp.array([[1.0, 0, 0], [1, 1, 1]])
    fn = self.variant(functools.partial(shaping.hapo_group_token_advantage, group_size=2))
    np.testing.assert_allclose(fn(jnp.array([1.0, 0.0]), mask),
                               [math.sqrt(3), -1 / math.sqrt(3)], rtol=1e-5)
    # Lengths (1, 30): A_0 = sqrt(30) >= 5, so the group falls back to GRPO (+-1/sqrt 2).
    long = jnp.concatenate([jnp.eye(1, 30), jnp.ones((1, 30))])
    np.testing.assert_allclose(fn(jnp.array([1.0, 0.0]), long), [0.70710, -0.70710], rtol=1e-4)

  def test_against_transcription(self):
    rng = np.random.default_rng(0)
    for trial in range(8):
      G, T = 4, 9
      mask = (np.arange(T)[None, :] < rng.integers(1, T + 1, (3 * G, 1))).astype(np.float64)
      scores = rng.choice([0.0, 1.0, -1.0, 0.5], size=3 * G) if trial % 2 else rng.normal(
          size=3 * G)
      for padding in (True, False):
        for norm in (True, False):
          got = shaping.hapo_group_token_advantage(
              jnp.asarray(scores), jnp.asarray(mask), group_size=G, norm_by_std=norm,
              count_padding=padding)
          want = np_hapo(scores, mask, G, norm, padding=padding)
          np.testing.assert_allclose(np.asarray(got)[:, None] * mask, want * mask, rtol=1e-4,
                                     atol=1e-5, err_msg=f"trial {trial} {padding} {norm}")

  def test_invariants(self):
    mask = jnp.ones((6, 4)).at[2, 3:].set(0.0)
    fn = functools.partial(shaping.hapo_group_token_advantage, group_size=3)
    np.testing.assert_array_equal(fn(jnp.full((6,), 7.3), mask), 0.0)  # all-equal groups
    np.testing.assert_array_equal(
        shaping.hapo_group_token_advantage(jnp.array([3.0, -2.0]), jnp.ones((2, 3)),
                                           group_size=1), 0.0)  # a response is its own mean
    reward = jnp.array([1.0, 0.0, 0.3, 0.0, 1.0, 1.0])
    perm = jnp.array([2, 0, 1, 4, 5, 3])
    np.testing.assert_allclose(fn(reward[perm], mask[perm]), fn(reward, mask)[perm], rtol=1e-6)
    no_tokens = mask.at[1].set(0.0)
    self.assertEqual(float(fn(reward, no_tokens)[1]), 0.0)


def np_copo_global(scores, answers, G, coef=False, norm=True, eps=1e-6):
  """`compute_score_global` per group, then the batch standardisation."""
  g, h = [], []
  for start in range(0, len(scores), G):
    grp = answers[start:start + G]
    probs = np.array([grp.count(a) for a in dict.fromkeys(grp)]) / G
    ent = -np.sum(probs * np.log2(probs + 1e-8))
    lam = (1 - 1 / G) / np.log2(G)
    g.append(np.mean(scores[start:start + G]) * ((1 - lam * ent) if coef else 1.0))
    h += [ent] * G
  g = np.array(g)
  adv = (g - g.mean()) / (g.std(ddof=1) + eps) if norm else g - g.mean()
  return np.repeat(adv, G), np.array(h)


class CopoTest(chex.TestCase):

  def test_answer_entropy_hand_computed(self):
    ids = jnp.array([0, 0, 1, 2, 5, 5, 5, 5])
    np.testing.assert_allclose(shaping.answer_entropy(ids, group_size=4), [1.5] * 4 + [0.0] * 4,
                               atol=1e-6)

  def test_global_advantage_against_transcription(self):
    rng = np.random.default_rng(1)
    G = 6
    scores = rng.integers(0, 2, 4 * G).astype(np.float64)
    answers = [str(a) for a in rng.integers(0, 3, 4 * G)]
    ids = jnp.asarray([int(a) for a in answers])
    for coef in (False, True):
      for norm in (False, True):
        got = shaping.copo_global_advantage(jnp.asarray(scores), ids, group_size=G,
                                            entropy_coef=coef, norm_by_std=norm)
        want, ent = np_copo_global(scores, answers, G, coef, norm)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(shaping.answer_entropy(ids, group_size=G), ent, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_global_advantage_hand_computed(self):
    # Pass rates (1, 1/2, 0): g - mean = (1/2, 0, -1/2), unbiased std 1/2.
    reward = jnp.array([1.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    ids = jnp.zeros(6, jnp.int32)
    fn = self.variant(functools.partial(shaping.copo_global_advantage, group_size=2))
    np.testing.assert_allclose(fn(reward, ids), [1, 1, 0, 0, -1, -1], rtol=1e-5, atol=1e-6)
    # An all-correct group (local GRPO advantage 0) still gets a global signal.
    np.testing.assert_allclose(estimators.grpo(reward, group_size=2)[:2], 0.0)

  def test_global_advantage_degenerate_batches(self):
    ids = jnp.zeros(4, jnp.int32)
    np.testing.assert_array_equal(
        shaping.copo_global_advantage(jnp.array([1.0, 0, 1, 1]), ids, group_size=4), 0.0)
    np.testing.assert_array_equal(
        shaping.copo_global_advantage(jnp.array([0.5, 0.5, 0.5, 0.5]), ids, group_size=2), 0.0)

  def test_local_weight_modes(self):
    entropy = jnp.array([0.0, 1.0, 2.0, 2.0])
    reward = jnp.array([1.0, 1.0, 1.0, 0.0])
    sig = lambda x: 1 / (1 + np.exp(-x))
    want_soft = sig(5 * (np.array([0.0, 1.0, 2.0, 2.0]) - 1))
    np.testing.assert_allclose(shaping.copo_local_weight(entropy, reward),
                               want_soft * [1, 1, 1, 0], rtol=1e-6)
    np.testing.assert_allclose(shaping.copo_local_weight(entropy, reward, mode="only-soft"),
                               want_soft, rtol=1e-6)
    np.testing.assert_array_equal(shaping.copo_local_weight(entropy, reward, mode="only-zero"),
                                  [1, 1, 1, 0])
    np.testing.assert_array_equal(shaping.copo_local_weight(entropy, reward, mode="no-global"), 1)
    np.testing.assert_array_equal(shaping.copo_local_weight(entropy, reward, mode="only-global"),
                                  0)
    with self.assertRaisesRegex(ValueError, "COPO mode"):
      shaping.copo_local_weight(entropy, reward, mode="soft with zero")


def np_riskpo(scores, G, Q, alpha_d=0.2, alpha_u=0.8, w_mix=1.5, mix=True, natural=False,
              norm=True, credit="sum-mean", eps=1e-6):
  """The official loop: bundles of Q questions, paper g = the g-th response of each."""
  out = np.zeros_like(scores)
  per_bundle = Q * G
  for b in range(0, len(scores), per_bundle):
    rows = [[b + q * G + g for g in range(G)] for q in range(Q)]  # question q's responses
    q_std = [np.std(scores[r], ddof=1) if G > 1 else np.nan for r in rows]
    q_std = [s if s > 1e-3 else 1.0 for s in q_std]
    q_mean = [np.mean(scores[r]) for r in rows]
    papers = np.array([sum(scores[rows[q][g]] for q in range(Q)) for g in range(G)])
    if G == 1:
      q_d = q_u = papers[0]
      std = 1.0
    else:
      q_d, q_u = np.quantile(papers, alpha_d), np.quantile(papers, alpha_u)
      std = np.std(papers, ddof=1)
    for g in range(G):
      s = papers[g]
      adv = max(s - q_d, 0) - max(s - q_u, 0) + ((q_d - q_u) if natural else 0.0)
      adv /= alpha_u - alpha_d + eps
      if mix:
        adv = (w_mix * (-max(q_d - s, 0) / (alpha_d + eps)) + adv) / (w_mix + 1)
      if norm:
        adv /= std + eps
      members = [rows[q][g] for q in range(Q)]
      ratios = [scores[i] - q_mean[q] for q, i in enumerate(members)]
      for q, i in enumerate(members):
        if credit == "uniform":
          out[i] = adv
        elif credit == "score":
          out[i] = (0.5 if scores[i] > 0 else 1.5) * adv
        elif credit == "std":
          out[i] = adv / (q_std[q] + eps)
        elif abs(sum(ratios)) > 1e-6:
          out[i] = adv * ratios[q] / sum(ratios)
        else:
          out[i] = adv / Q
  return out


class RiskpoTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # One question per bundle, rewards (1, 0, 0, 1): q_0.2 = 0, q_0.8 = 1, std sqrt(1/3);
    # a_RVaR = S / 0.6, a_CVaR = 0, a = a_RVaR / 2.5 / std -> 2/3 * sqrt 3 for the correct ones.
    fn = self.variant(functools.partial(shaping.riskpo_advantage, group_size=4, bundle_size=1))
    want = 2 / 3 * math.sqrt(3)
    np.testing.assert_allclose(fn(jnp.array([1.0, 0.0, 0.0, 1.0])), [want, 0, 0, want],
                               rtol=1e-5)

  def test_against_transcription(self):
    rng = np.random.default_rng(2)
    configs = [dict(), dict(credit="std", alpha_u=0.9, natural=True),
               dict(credit="uniform", mix=False), dict(credit="score", norm=False, w_mix=0.5)]
    for G, Q in ((5, 2), (4, 3), (1, 2)):
      scores = rng.integers(0, 2, 2 * Q * G).astype(np.float64)
      scores[: Q * G] += rng.normal(0, 0.3, Q * G) * (G > 1)
      for cfg in configs:
        kw = dict(alpha_down=cfg.get("alpha_d", 0.2), alpha_up=cfg.get("alpha_u", 0.8),
                  w_mix=cfg.get("w_mix", 1.5), mix_cvar=cfg.get("mix", True),
                  natural_baseline=cfg.get("natural", False), norm_by_std=cfg.get("norm", True),
                  credit=cfg.get("credit", "sum-mean"))
        got = shaping.riskpo_advantage(jnp.asarray(scores), group_size=G, bundle_size=Q, **kw)
        np.testing.assert_allclose(got, np_riskpo(scores, G, Q, **cfg), rtol=1e-4, atol=1e-5,
                                   err_msg=f"G={G} Q={Q} {cfg}")

  def test_invariants(self):
    fn = functools.partial(shaping.riskpo_advantage, group_size=4)
    np.testing.assert_array_equal(fn(jnp.ones(40)), 0.0)  # all-equal bundles
    reward = jnp.array([1.0, 0.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    perm = jnp.array([3, 1, 0, 2, 6, 7, 5, 4])
    single = functools.partial(fn, bundle_size=1)
    np.testing.assert_allclose(single(reward[perm]), single(reward)[perm], rtol=1e-6)
    with self.assertRaisesRegex(ValueError, "multiple of bundle_size"):
      fn(jnp.ones(8), bundle_size=3)
    with self.assertRaisesRegex(ValueError, "credit"):
      fn(jnp.ones(8), bundle_size=1, credit="mean")


class ArmAndFapoTest(chex.TestCase):

  def test_lowest_fraction_mean(self):
    logp = jnp.array([[-1.0, -3.0, -0.5, -2.0, jnp.nan], [-0.1, -0.2, 0.0, 0.0, 0.0]])
    mask = jnp.array([[1.0, 1, 1, 1, 0], [1, 1, 0, 0, 0]])
    # Row 0: ceil(0.5 * 4) = 2 lowest, -3 and -2; row 1: ceil(0.5 * 2) = 1, -0.2.
    np.testing.assert_allclose(shaping.lowest_fraction_mean(logp, mask, fraction=0.5),
                               [-2.5, -0.2], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_arm_hand_computed(self):
    fn = self.variant(functools.partial(shaping.arm_advantage, group_size=2, alpha=2.0))
    got = fn(jnp.array([1.0, -1.0, 0.0, 0.0]), jnp.array([1.0, 0.0, 0.0, 0.0]),
             jnp.full((4,), 0.5), jnp.array([0.2, 0.9, 0.1, 0.1]))
    # Group 0 has a success: A + 2 (0.5 - c_o); group 1 has none and keeps A.
    np.testing.assert_allclose(got, [1.6, -1.8, 0.0, 0.0], rtol=1e-6)

  def test_arm_neutral_is_grpo(self):
    reward = jnp.array([1.0, 0.0, 1.0, 1.0])
    adv = estimators.grpo(reward, group_size=2)
    conf = jnp.array([0.3, 0.1, 0.7, 0.2])
    np.testing.assert_array_equal(
        shaping.arm_advantage(adv, reward, conf, conf[::-1], group_size=2, alpha=0.0), adv)

  def test_fapo_reward_and_its_schedule(self):
    correct = jnp.array([True, True, False, False])
    flawed = jnp.array([False, True, True, False])  # flags on wrong answers are ignored
    np.testing.assert_array_equal(shaping.fapo_reward(correct, flawed), [1.0, 0.0, -1.0, -1.0])
    np.testing.assert_array_equal(shaping.fapo_reward(correct, flawed, penalty=0.0),
                                  [1.0, 1.0, -1.0, -1.0])
    # Warm-up: wrong rollouts outnumber fully correct ones, so the flawed positive (reward 0)
    # is above the group mean and is reinforced; later it is suppressed.
    early = estimators.grpo(shaping.fapo_reward(correct, flawed), group_size=4)
    late = estimators.grpo(shaping.fapo_reward(jnp.array([True, True, True, False]),
                                               jnp.array([False, False, True, False])),
                           group_size=4)
    self.assertGreater(float(early[1]), 0.0)
    self.assertLess(float(late[2]), 0.0)


if __name__ == "__main__":
  absltest.main()
