# pylint: disable=invalid-name
"""Tests for agentrl.credit.matchtir: similarity and matching numbers from the official
formulas, OT goldens from POT, and the dual-level advantage against the official loop."""
import collections
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.credit import matchtir

jax.config.update("jax_numpy_rank_promotion", "raise")

PREDS = [{"name": "search", "arguments": {"q": "paris", "k": 3}},
         {"name": "Search", "arguments": {"q": "rome"}},
         {"name": "calc", "arguments": {"expr": "1+1"}}]
GOLDS = [{"name": "search", "parameters": {"q": "paris", "k": 5}},
         {"name": "calc", "arguments": {"expr": "1+1"}}]


def np_dual_advantage(turn_reward, turn_mask, group_size, gamma=0.9, eps=1e-6):
  """MatchTIR's `compute_grpo_outcome_advantage` (core_algos.py) on compacted turns, float64."""
  B = turn_reward.shape[0]
  turns = [[float(r) for r, m in zip(turn_reward[b], turn_mask[b]) if m] for b in range(B)]
  scores = [sum(t) for t in turns]
  by_prompt = collections.defaultdict(list)
  for b in range(B):
    by_prompt[b // group_size].append(scores[b])
  group_adv = []
  for b in range(B):
    vals = by_prompt[b // group_size]
    mean, std = (0.0, 1.0) if len(vals) == 1 else (np.mean(vals), np.std(vals, ddof=1))
    group_adv.append((scores[b] - mean) / (std + eps))
  disc = []
  for t in turns:
    acc, d = 0.0, [0.0] * len(t)
    for j in reversed(range(len(t))):
      acc = t[j] + gamma * acc
      d[j] = acc
    disc.append(d)
  by_key = collections.defaultdict(list)
  for b in range(B):
    for j, v in enumerate(disc[b]):
      by_key[b // group_size, j].append(v)
  out = np.zeros(turn_reward.shape)
  for b in range(B):
    for j, v in enumerate(disc[b]):
      vals = by_key[b // group_size, j]
      mean, std = (0.0, 1.0) if len(vals) == 1 else (np.mean(vals), np.std(vals, ddof=1))
      out[b, j] = (group_adv[b] + (v - mean) / (std + eps)) / 2
  return out


class SimilarityTest(absltest.TestCase):

  def test_key_overlap(self):
    self.assertEqual(matchtir.key_overlap([], []), 1.0)
    self.assertEqual(matchtir.key_overlap(["a"], []), 0.0)
    self.assertEqual(matchtir.key_overlap(["a", "b"], ["b", "a"]), 1.0)
    self.assertAlmostEqual(matchtir.key_overlap(["a", "b"], ["a", "c"]), 1 / 3)
    self.assertAlmostEqual(matchtir.key_overlap(["a", "a", "b"], ["a"]), 1 / 3)

  def test_call_similarity_hand_computed(self):
    # (1 name + key Jaccard + matching values) / (2 + #gold args), the official tool_similarity.
    self.assertAlmostEqual(matchtir.call_similarity(PREDS[0], GOLDS[0]), (1 + 1 + 1) / 4)
    self.assertAlmostEqual(matchtir.call_similarity(PREDS[1], GOLDS[0]), (1 + 0.5 + 0) / 4)
    self.assertEqual(matchtir.call_similarity(PREDS[2], GOLDS[0]), 0.0)
    self.assertEqual(matchtir.call_similarity({"name": "f"}, {"name": "F", "arguments": {}}), 1.0)
    self.assertAlmostEqual(
        matchtir.call_similarity({"name": "f", "arguments": ["x"]},
                                 {"name": "f", "arguments": {"x": 1}}), 1 / 3)
    np.testing.assert_allclose(matchtir.similarity_matrix(PREDS, GOLDS),
                               [[0.75, 0.0], [0.375, 0.0], [0.0, 1.0]])


class AssignmentTest(absltest.TestCase):

  def test_greedy_is_not_optimal_and_kuhn_munkres_is(self):
    S = np.array([[0.9, 0.8], [0.85, 0.0]])
    self.assertEqual(matchtir.greedy_assignment(S), [0, None])
    self.assertEqual(matchtir.kuhn_munkres_assignment(S), [1, 0])

  def test_greedy_ties_go_in_row_major_order(self):
    self.assertEqual(matchtir.greedy_assignment(np.array([[0.5, 0.5], [0.5, 0.5]])), [0, 1])
    self.assertEqual(matchtir.greedy_assignment(np.zeros((2, 2))), [None, None])

  def test_assign_rewards_hard(self):
    self.assertEqual(matchtir.assign_rewards(PREDS, GOLDS), [0.75, 0.0, 1.0])
    self.assertEqual(matchtir.assign_rewards(PREDS, GOLDS, unmatched_penalty=-0.5),
                     [0.75, -0.5, 1.0])
    self.assertEqual(matchtir.assign_rewards(PREDS, GOLDS, method="kuhn_munkres"),
                     [0.75, 0.0, 1.0])
    self.assertEqual(matchtir.assign_rewards(PREDS, [], unmatched_penalty=-0.5), [-0.5] * 3)
    self.assertEqual(matchtir.assign_rewards([], GOLDS), [])
    with self.assertRaisesRegex(ValueError, "method="):
      matchtir.assign_rewards(PREDS, GOLDS, method="hungarian")

  def test_optimal_transport_golden(self):
    # Golden from POT 0.9.7: (ot.sinkhorn(1/3, 1/2, -S, reg=0.1) * S).sum(1), as the official
    # assign_rewards_ot computes it.
    np.testing.assert_allclose(matchtir.assign_rewards(PREDS, GOLDS, method="ot"),
                               [0.24471205718245756, 0.06514382615963783, 0.3333329459923729],
                               rtol=1e-12)
    self.assertEqual(matchtir.assign_rewards(PREDS, [], method="ot"), [0.0] * 3)

  def test_sinkhorn_marginals(self):
    rng = np.random.default_rng(0)
    S = rng.random((3, 5))
    T = matchtir.sinkhorn(np.full(3, 1 / 3), np.full(5, 1 / 5), -S, reg=0.1)
    np.testing.assert_allclose(T.sum(1), 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(T.sum(0), 1 / 5, rtol=1e-6)

  def test_turn_rewards(self):
    calls = [[PREDS[0], PREDS[1]], [], [PREDS[2]], [PREDS[0]]]
    # Joint greedy matching over all four calls: 0.75, 0 (gold 0 taken), 1.0, 0 (taken).
    self.assertEqual(matchtir.turn_rewards(calls, GOLDS), [0.375, 0.0, 1.0, 0.0])
    # The answer turn ignores its calls and carries the answer score.
    self.assertEqual(matchtir.turn_rewards(calls, GOLDS, answer_score=0.5),
                     [0.375, 0.0, 1.0, 0.5])
    self.assertEqual(matchtir.turn_rewards([], GOLDS), [])


class DualAdvantageTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # One prompt, G = 2, two turns each. Scores 1.5 and 0.2: A_traj = +-0.65 / (std + eps),
    # std = 1.3 / sqrt(2). Discounted returns: [0.5 + 0.9, 1.0] and [0.2, 0.0]; turn 0 group
    # {1.4, 0.2}, turn 1 group {1.0, 0.0}.
    fn = self.variant(functools.partial(matchtir.dual_advantage, group_size=2))
    adv = fn(jnp.array([[0.5, 1.0], [0.2, 0.0]]), jnp.ones((2, 2)))
    z = lambda d, s: d / (s + 1e-6)
    a_traj = z(0.65, 1.3 / np.sqrt(2))
    t0, t1 = z(0.6, 1.2 / np.sqrt(2)), z(0.5, 1.0 / np.sqrt(2))
    np.testing.assert_allclose(adv, [[(a_traj + t0) / 2, (a_traj + t1) / 2],
                                     [(-a_traj - t0) / 2, (-a_traj - t1) / 2]], rtol=1e-5)

  def test_against_official_loop(self):
    rng = np.random.default_rng(0)
    B, U, G = 12, 5, 4
    reward = rng.random((B, U)).astype(np.float32)
    n = rng.integers(1, U + 1, size=B)
    mask = (np.arange(U)[None, :] < n[:, None]).astype(np.float32)
    np.testing.assert_allclose(
        matchtir.dual_advantage(jnp.asarray(reward), jnp.asarray(mask), group_size=G),
        np_dual_advantage(reward, mask, G), rtol=1e-4, atol=1e-5)

  def test_identical_trajectories_masked_turns_and_permutations(self):
    same = matchtir.dual_advantage(jnp.tile(jnp.array([[0.3, 0.1, 0.7]]), (3, 1)),
                                   jnp.tile(jnp.array([[1.0, 1.0, 0.0]]), (3, 1)), group_size=3)
    np.testing.assert_array_equal(same, 0.0)
    rng = np.random.default_rng(1)
    reward = rng.random((8, 3)).astype(np.float32)
    mask = np.ones((8, 3), np.float32)
    mask[2, 2] = mask[5, 1:] = 0.0
    adv = np.asarray(matchtir.dual_advantage(jnp.asarray(reward), jnp.asarray(mask),
                                             group_size=4))
    self.assertTrue(np.all(adv[mask == 0] == 0.0))
    perm = np.concatenate([rng.permutation(4), 4 + rng.permutation(4)])
    adv_perm = matchtir.dual_advantage(jnp.asarray(reward[perm]), jnp.asarray(mask[perm]),
                                       group_size=4)
    np.testing.assert_allclose(adv_perm, adv[perm], rtol=1e-6, atol=1e-7)

  def test_single_turn_reduces_to_grpo(self):
    # With one turn per trajectory both levels are the same z-score: the fusion is GRPO.
    reward = jnp.array([[1.0], [0.0], [0.5], [0.5]])
    adv = matchtir.dual_advantage(reward, jnp.ones((4, 1)), group_size=2)
    np.testing.assert_allclose(adv[:, 0], estimators.grpo(reward[:, 0], group_size=2),
                               rtol=1e-6)

  def test_bad_shapes(self):
    with self.assertRaisesRegex(ValueError, "matching"):
      matchtir.dual_advantage(jnp.zeros((2, 3)), jnp.zeros((2, 2)), group_size=2)


if __name__ == "__main__":
  absltest.main()
