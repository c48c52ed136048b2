# pylint: disable=invalid-name
"""Tests for agentrl.credit.siop: host-side clustering and target distribution, turn rewards
against a NumPy transcription of the official loops (dl-m9/SIOP@a871ef90,
verl/utils/siop/siop_process_reward.py and verl/trainer/ppo/core_algos.py), RL invariants."""
import functools
import math

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.credit import igpo
from agentrl.credit import siop

jax.config.update("jax_numpy_rank_promotion", "raise")


def np_official_rewards(prompt_logp, ref_logp, weight, q, n_turns, lam=0.5, eps=1e-8):
  """compute_siop_process_rewards, loop for loop: per-turn lists, zero-padded to [B, U]."""
  B, U, R = ref_logp.shape
  out = np.zeros((B, U))
  for i in range(B):
    refs = [r for r in range(R) if weight[i, r] > 0]
    if not refs or q[i] == 0.0:
      continue
    if n_turns[i] <= 1:
      out[i, 0] = (1.0 - lam) * q[i]
      continue

    def p_hat(logps):
      finite = [(weight[i, r], logps[r]) for r in refs if math.isfinite(logps[r])]
      return sum(a * math.exp(m) for a, m in finite) if finite else None

    p = [p_hat(prompt_logp[i])] + [p_hat(ref_logp[i, k]) for k in range(n_turns[i])]
    rews = []
    for k in range(1, len(p)):
      if p[k] is None or p[k - 1] is None:
        rews.append(0.0)
        continue
      rews.append(q[i] * (math.log(p[k] + eps) - math.log(p[k - 1] + eps)))
    rews[-1] += (1.0 - lam) * q[i]
    out[i, :len(rews)] = rews
  return out


def np_official_advantages(reward, n_turns, group_size, gamma, eps=1e-6):
  """compute_siop_turn_level_advantage on turn lists: pooled z-score, discounted sums."""
  out = np.zeros_like(reward, dtype=np.float64)
  for start in range(0, len(n_turns), group_size):
    rows = range(start, start + group_size)
    pool = np.array([reward[b, k] for b in rows for k in range(n_turns[b])], np.float64)
    if pool.size <= 1:
      continue
    std = pool.std(ddof=1)
    std = 1.0 if std < eps else std
    for b in rows:
      nxt = 0.0
      for k in reversed(range(n_turns[b])):
        nxt = (reward[b, k] - pool.mean()) / (std + eps) + gamma * nxt
        out[b, k] = nxt
  return out


class HostSideTest(absltest.TestCase):

  def test_normalize_answer(self):
    self.assertEqual(siop.normalize_answer("  The Eiffel-Tower!\n"), "the eiffel tower")

  def test_answer_clusters_exact_match(self):
    ids = siop.answer_clusters(["Paris", "paris.", None, "London", "", " PARIS ", "  "])
    np.testing.assert_array_equal(ids, [0, 0, -1, 1, -1, 0, -1])

  def test_answer_clusters_greedy_seed_semantics(self):
    # The official pass compares each unassigned answer with the mode's first member only,
    # so a non-transitive judge does not chain: "aaaa" is 2 away from the seed "aa".
    near = lambda a, b: abs(len(a) - len(b)) <= 1
    np.testing.assert_array_equal(siop.answer_clusters(["aa", "aaa", "aaaa"], equivalent=near),
                                  [0, 0, 1])

  def test_cluster_references(self):
    answers = ["Paris", "paris", "Paris ", "Lyon", None]
    refs, weight = siop.cluster_references(answers, np.array([0, 0, 0, 1, -1]), num_refs=3)
    self.assertEqual(refs, [["Paris", "paris"]] * 3 + [["Lyon"], []])
    np.testing.assert_allclose(weight, [[0.5, 0.5, 0]] * 3 + [[1, 0, 0], [0, 0, 0]])
    refs, weight = siop.cluster_references(["a", "b", "c"], np.zeros(3, np.int32), num_refs=2)
    self.assertEqual(refs[2], ["a", "b"])
    np.testing.assert_allclose(weight[2], [0.5, 0.5])

  def test_target_distribution(self):
    ids = np.array([0, 0, 1, -1, 0, 0, 0, -1])
    np.testing.assert_allclose(siop.target_distribution(ids, group_size=4),
                               [2 / 3, 2 / 3, 1 / 3, 0, 1, 1, 1, 0], rtol=1e-6)
    # log-odds 0.9 vs 0.1 on top of 2:1 frequencies: q0 = 2 e^0.9 / (2 e^0.9 + e^0.1).
    evidence = np.array([0.9, np.nan, 0.1, 0.5, 0.2, 0.3, np.nan, 0.0])
    q0 = 2 / (2 + math.exp(-0.8))
    np.testing.assert_allclose(siop.target_distribution(ids, group_size=4, evidence=evidence),
                               [q0, q0, 1 - q0, 0, 1, 1, 1, 0], rtol=1e-6)
    np.testing.assert_allclose(
        siop.target_distribution(ids, group_size=4, evidence=evidence, eta=0.0),
        siop.target_distribution(ids, group_size=4), rtol=1e-6)
    with self.assertRaisesRegex(ValueError, "groups of 3"):
      siop.target_distribution(ids, group_size=3)


class TurnRewardsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # Two references with alpha 1/2; q = 0.6; lambda = 0.5; three turns.
    prompt = jnp.log(jnp.array([[0.1, 0.3]]))
    refs = jnp.log(jnp.array([[[0.2, 0.2], [0.4, 0.6], [0.9, 0.7]]]))
    weight = jnp.array([[0.5, 0.5]])
    fn = self.variant(siop.turn_rewards)
    got = fn(prompt, refs, weight, jnp.array([0.6]), jnp.ones((1, 3)))
    p = [0.2, 0.2, 0.5, 0.8]  # mixture likelihoods: baseline, then after each turn
    want = [0.6 * (math.log(p[k + 1] + 1e-8) - math.log(p[k] + 1e-8)) for k in range(3)]
    want[-1] += 0.5 * 0.6
    np.testing.assert_allclose(got, [want], rtol=1e-5, atol=1e-7)

  def test_matches_official_loops(self):
    rng = np.random.default_rng(0)
    B, U, R = 8, 4, 3
    n_turns = np.array([1, 2, 4, 3, 0, 4, 2, 1])
    mask = (np.arange(U)[None] < n_turns[:, None]).astype(np.float32)
    prompt = -rng.uniform(0.1, 4, size=(B, R)).astype(np.float32)
    refs = -rng.uniform(0.1, 4, size=(B, U, R)).astype(np.float32)
    refs[2, 1, 0] = np.nan        # a failed score: skipped, alpha not renormalised
    refs[5, 2, :] = np.nan        # no finite score at a turn: that turn and the next get 0
    weight = np.zeros((B, R), np.float32)
    for b, n_refs in enumerate([1, 2, 3, 1, 0, 2, 3, 2]):
      weight[b, :n_refs] = 1.0 / max(n_refs, 1)
    q = rng.uniform(0, 1, size=B).astype(np.float32)
    q[7] = 0.0
    for lam in (0.5, 0.2):
      got = siop.turn_rewards(jnp.asarray(prompt), jnp.asarray(refs), jnp.asarray(weight),
                              jnp.asarray(q), jnp.asarray(mask), lam=lam)
      np.testing.assert_allclose(got, np_official_rewards(prompt, refs, weight, q, n_turns, lam),
                                 rtol=1e-5, atol=1e-6)

  def test_gold_reference_mode_gives_igpo_log_prob_gains(self):
    # SIOP's IGPO mode (q = 1, the gold answer as the only reference): every turn but the
    # last gets IGPO's log_prob_diff gain, when the context after turn k is the one IGPO
    # scores at the start of turn k + 1.
    rng = np.random.default_rng(1)
    v = -rng.uniform(0.1, 3, size=(4, 5)).astype(np.float32)   # IGPO's v_0 .. v_4
    mask = (np.arange(4)[None] < np.array([4, 2, 3, 1])[:, None]).astype(np.float32)
    got = siop.turn_rewards(jnp.asarray(v[:, :1]), jnp.asarray(v[:, 1:, None]),
                            jnp.ones((4, 1)), jnp.ones(4), jnp.asarray(mask), eps=0.0)
    want = igpo.turn_rewards(jnp.asarray(v[:, :4]), jnp.asarray(mask), jnp.zeros(4))
    body = np.asarray(mask * (1 - igpo.last_turn(jnp.asarray(mask))))
    np.testing.assert_allclose(np.asarray(got) * body, np.asarray(want) * body, rtol=1e-5,
                               atol=1e-6)
    self.assertGreater(np.abs(np.asarray(want) * body).min(initial=1.0, where=body > 0), 0.0)

  def test_bad_shapes(self):
    with self.assertRaisesRegex(ValueError, r"\[B, U, R\]"):
      siop.turn_rewards(jnp.zeros((2, 3)), jnp.zeros((2, 4, 2)), jnp.ones((2, 3)),
                        jnp.ones(2), jnp.ones((2, 4)))
    with self.assertRaisesRegex(ValueError, "group_size=3"):
      siop.turn_advantages(jnp.zeros((4, 2)), jnp.ones((4, 2)), group_size=3)


class TurnAdvantagesTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # Pool {0, 0.2, 0.7}: mean 0.3, unbiased variance (0.09 + 0.01 + 0.16) / 2 = 0.13.
    reward = jnp.array([[0.0, 0.2], [0.7, 0.0]])
    mask = jnp.array([[1, 1], [1, 0]])
    s = math.sqrt(0.13) + 1e-6
    fn = self.variant(functools.partial(siop.turn_advantages, group_size=2))
    np.testing.assert_allclose(fn(reward, mask), [[-0.4 / s, -0.1 / s], [0.4 / s, 0.0]],
                               rtol=1e-5)
    fn = self.variant(functools.partial(siop.turn_advantages, group_size=2, gamma=0.5))
    np.testing.assert_allclose(fn(reward, mask), [[-0.35 / s, -0.1 / s], [0.4 / s, 0.0]],
                               rtol=1e-5)

  def test_matches_official_and_degenerate_pools(self):
    rng = np.random.default_rng(2)
    n_turns = np.array([3, 1, 2, 4, 0, 2, 1, 0])
    mask = (np.arange(4)[None] < n_turns[:, None]).astype(np.float32)
    reward = np.where(mask > 0, rng.normal(size=(8, 4)), 5.0).astype(np.float32)
    for gamma in (1.0, 0.9):
      got = siop.turn_advantages(jnp.asarray(reward), jnp.asarray(mask), group_size=2,
                                 gamma=gamma)
      np.testing.assert_allclose(got, np_official_advantages(reward, n_turns, 2, gamma),
                                 rtol=1e-5, atol=1e-6)
      # The last group has one valid reward: the official code leaves it at 0.
      np.testing.assert_array_equal(np.asarray(got)[6:], 0.0)
      self.assertTrue(np.all(np.asarray(got)[mask == 0] == 0.0))
    self.assertTrue(np.all(np.asarray(got)[:4][mask[:4] > 0] != 0.0))  # non-trivial side

  def test_identical_trajectories_and_permutations(self):
    same = jnp.tile(jnp.array([[0.3, 0.3, 0.3]]), (3, 1))
    np.testing.assert_array_equal(siop.turn_advantages(same, jnp.ones((3, 3)), group_size=3),
                                  0.0)
    # Different rewards per turn: pooled over turns, so only the first turn's return is 0.
    same = jnp.tile(jnp.array([[0.1, -0.2, 0.4]]), (3, 1))
    adv = siop.turn_advantages(same, jnp.ones((3, 3)), group_size=3)
    np.testing.assert_allclose(adv[:, 0], 0.0, atol=1e-6)
    rng = np.random.default_rng(3)
    reward = rng.normal(size=(6, 3)).astype(np.float32)
    mask = (rng.random((6, 3)) > 0.2).cumprod(axis=1).astype(np.float32)
    perm = np.array([1, 2, 0, 5, 3, 4])
    adv = siop.turn_advantages(jnp.asarray(reward), jnp.asarray(mask), group_size=3)
    np.testing.assert_allclose(
        siop.turn_advantages(jnp.asarray(reward[perm]), jnp.asarray(mask[perm]), group_size=3),
        np.asarray(adv)[perm], rtol=1e-6, atol=1e-6)

  def test_observation_tokens_get_zero(self):
    turn = jnp.array([[-1, 0, 0, 0, 1, 1], [-1, 0, 0, 1, 1, 1]])
    loss_mask = jnp.array([[0, 1, 0, 0, 1, 1], [0, 1, 1, 0, 0, 1]])
    adv_BU = siop.turn_advantages(jnp.array([[0.2, 0.5], [0.0, 0.9]]), jnp.ones((2, 2)),
                                  group_size=2)
    adv_BT = np.asarray(estimators.broadcast_turn_to_tokens(adv_BU, turn, loss_mask))
    self.assertTrue(np.all(adv_BT[np.asarray(loss_mask) == 0] == 0.0))
    self.assertTrue(np.all(adv_BT[np.asarray(loss_mask) > 0] != 0.0))


if __name__ == "__main__":
  absltest.main()
