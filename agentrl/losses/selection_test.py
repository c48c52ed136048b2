# pylint: disable=invalid-name
"""Tests for agentrl.losses.selection (D3S selection, DelTA token weights)."""
import functools
import itertools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import aggregation
from agentrl.losses import policy
from agentrl.losses import selection

jax.config.update("jax_numpy_rank_promotion", "raise")


def brute_force_max_variance(x, k):
  return max(np.var(np.array(c)) for c in itertools.combinations(x, k))


class TopFractionMaskTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_batch_and_row(self):
    score = jnp.array([[5.0, 1.0, jnp.nan, 3.0], [4.0, 2.0, 0.0, 9.0]])
    mask = jnp.array([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    # 6 valid tokens, ceil(0.5 * 6) = 3: scores 5, 4, 3 (the masked 9 and NaN never count).
    batch = self.variant(functools.partial(selection.top_fraction_mask, fraction=0.5))(
        score, mask)
    np.testing.assert_array_equal(batch, [[1, 0, 0, 1], [1, 0, 0, 0]])
    # Per row: ceil(0.5 * 3) = 2 each.
    row = self.variant(functools.partial(selection.top_fraction_mask, fraction=0.5,
                                         scope="row"))(score, mask)
    np.testing.assert_array_equal(row, [[1, 0, 0, 1], [1, 1, 0, 0]])

  def test_counts_ties_and_extremes(self):
    mask = jnp.ones((2, 5))
    score = jnp.zeros((2, 5))  # all tied: the earliest positions win
    np.testing.assert_array_equal(
        selection.top_fraction_mask(score, mask, fraction=0.2), [[1, 1, 0, 0, 0], [0] * 5])
    # 0.2 * 10 is 2 in exact arithmetic (float32 rounds it up): exactly 2 tokens.
    self.assertEqual(float(selection.top_fraction_mask(score, mask, fraction=0.2).sum()), 2.0)
    self.assertEqual(float(selection.top_fraction_mask(score, mask, fraction=1e-4).sum()), 1.0)
    np.testing.assert_array_equal(selection.top_fraction_mask(score, mask, fraction=1.0), mask)
    empty = jnp.zeros((2, 5))
    np.testing.assert_array_equal(selection.top_fraction_mask(score, empty, fraction=0.5), 0.0)

  def test_traced_fraction(self):
    score = jnp.arange(10.0).reshape(2, 5)
    mask = jnp.ones((2, 5))
    fn = jax.jit(lambda f: selection.top_fraction_mask(score, mask, fraction=f))
    for f, n in ((0.1, 1), (0.3, 3), (0.55, 6)):
      self.assertEqual(float(fn(f).sum()), n)

  def test_bad_arguments_raise(self):
    with self.assertRaisesRegex(ValueError, "scope"):
      selection.top_fraction_mask(jnp.zeros((1, 2)), jnp.ones((1, 2)), fraction=0.5,
                                  scope="group")
    with self.assertRaisesRegex(ValueError, "matching"):
      selection.top_fraction_mask(jnp.zeros((1, 2)), jnp.ones((1, 3)), fraction=0.5)


class MaxVarianceSubsetTest(chex.TestCase):

  def test_against_brute_force(self):
    rng = np.random.default_rng(0)
    G = 7
    for trial in range(6):
      values = rng.normal(size=(3, G)) if trial % 2 else rng.integers(0, 3, (3, G)) * 1.0
      for k in range(1, G + 1):
        keep = np.asarray(selection.max_variance_subset(jnp.asarray(values.reshape(-1)),
                                                        group_size=G, k=k)).reshape(3, G)
        np.testing.assert_array_equal(keep.sum(-1), k)
        for p in range(3):
          got = np.var(values[p][keep[p]])
          np.testing.assert_allclose(got, brute_force_max_variance(values[p], k), rtol=1e-5,
                                     atol=1e-6, err_msg=f"trial {trial} k {k} group {p}")

  @chex.variants(with_jit=True, without_jit=True)
  def test_binary_rewards_are_balanced(self):
    # Hand-computed: 4 correct, 2 wrong, k = 4 -> 2 + 2 (variance 0.25, the maximum).
    reward = jnp.array([1.0, 1.0, 0.0, 1.0, 0.0, 1.0])
    keep = self.variant(functools.partial(selection.max_variance_subset, group_size=6, k=4))(
        reward)
    # Two subsets tie at 0.25 here; either way it is two of each.
    self.assertEqual(int(np.asarray(keep).sum()), 4)
    self.assertEqual(float(np.asarray(reward)[np.asarray(keep)].sum()), 2.0)

  def test_group_permutation_keeps_the_same_values(self):
    rng = np.random.default_rng(1)
    x = rng.normal(size=8)
    perm = rng.permutation(8)
    keep = np.asarray(selection.max_variance_subset(jnp.asarray(x), group_size=8, k=3))
    keep_p = np.asarray(selection.max_variance_subset(jnp.asarray(x[perm]), group_size=8, k=3))
    np.testing.assert_allclose(np.sort(x[keep]), np.sort(x[perm][keep_p]))

  def test_bad_k_raises(self):
    with self.assertRaisesRegex(ValueError, "k must be"):
      selection.max_variance_subset(jnp.zeros(4), group_size=2, k=3)
    with self.assertRaisesRegex(ValueError, "divisible"):
      selection.max_variance_subset(jnp.zeros(5), group_size=2, k=1)


class D3STest(chex.TestCase):

  def test_token_mask_hand_computed(self):
    adv = jnp.array([[2.0], [-1.0]])
    entropy = jnp.array([[0.1, 1.0, 0.5], [3.0, 0.2, 9.0]])
    mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    # |A| H = [0.2, 2.0, 1.0 | 3.0, 0.2, (9 masked)]; keep ceil(0.4 * 5) = 2: 3.0 and 2.0.
    keep = selection.d3s_token_mask(adv, entropy, mask, keep_ratio=0.4)
    np.testing.assert_array_equal(keep, [[0, 1, 0], [1, 0, 0]])

  def test_dropped_tokens_get_exactly_zero_gradient(self):
    rng = np.random.default_rng(2)
    mask = jnp.array([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    old = jnp.asarray(-rng.uniform(0.5, 2.0, (2, 4)), jnp.float32)
    logp = old + jnp.asarray(rng.normal(0.0, 0.1, (2, 4)), jnp.float32)
    adv = jnp.array([[1.0], [-0.5]])
    keep = selection.d3s_token_mask(adv, jnp.asarray(rng.uniform(0, 2, (2, 4))), mask,
                                    keep_ratio=0.5)
    grad = jax.grad(lambda lp: aggregation.aggregate(
        policy.ppo_clip(lp, old, adv, keep)[0], keep, "token-mean"))(logp)
    np.testing.assert_array_equal(np.asarray(grad)[np.asarray(keep) == 0], 0.0)
    self.assertTrue(np.all(np.asarray(grad)[np.asarray(keep) == 1] != 0.0))

  def test_keep_ratio_schedule(self):
    ratio = functools.partial(selection.d3s_keep_ratio, start=0.25, end=0.75, total_steps=100)
    np.testing.assert_allclose([ratio(0), ratio(50), ratio(100), ratio(400)],
                               [0.25, 0.5, 0.75, 0.75], rtol=1e-6)
    np.testing.assert_allclose(ratio(25, schedule="sin"), 0.25 + 0.5 * (1 - np.cos(np.pi / 4)) / 2,
                               rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda s: ratio(s))(jnp.int32(30)), 0.4, rtol=1e-6)
    with self.assertRaisesRegex(ValueError, "schedule"):
      ratio(0, schedule="cosine")


def np_delta_weights(h, logp, adv, mask, steps=1, lo=0.8, hi=1.2, eps=1e-8):
  """float64 transcription of RUCBM/DelTA dp_actor.py `compute_log_prob_h` ("Normal")."""
  v = (1.0 - np.exp(logp))[..., None] * h
  v = np.where(mask[..., None] > 0, v, 0.0)
  w_pos0 = np.clip(adv, 0, None)[:, None] * mask
  w_neg0 = np.clip(-adv, 0, None)[:, None] * mask
  mu_pos = (w_pos0[..., None] * v).sum((0, 1)) / max(w_pos0.sum(), eps)
  mu_neg = (w_neg0[..., None] * v).sum((0, 1)) / max(w_neg0.sum(), eps)
  pos_mask = (adv > 0)[:, None] * mask
  neg_mask = (adv < 0)[:, None] * mask

  def margins(mp, mn):
    d_pos = ((v - mp) ** 2).sum(-1)
    d_neg = ((v - mn) ** 2).sum(-1)
    return d_neg - d_pos, d_pos - d_neg

  def gamma(m, sel):
    n = max(sel.sum(), 1.0)
    mean = (m * sel).sum() / n
    return np.sqrt(max((m ** 2 * sel).sum() / n - mean ** 2, eps))

  m_pos, m_neg = margins(mu_pos, mu_neg)
  g_pos, g_neg = gamma(m_pos, pos_mask), gamma(m_neg, neg_mask)
  sig = lambda x: 1.0 / (1.0 + np.exp(-x))
  for _ in range(steps):
    m_pos, m_neg = margins(mu_pos, mu_neg)
    w_pos = sig(m_pos / g_pos) * np.clip(adv, 0, None)[:, None] * pos_mask
    w_neg = sig(m_neg / g_neg) * np.clip(-adv, 0, None)[:, None] * neg_mask
    mu_pos = (w_pos[..., None] * v).sum((0, 1)) / max(w_pos.sum(), eps)
    mu_neg = (w_neg[..., None] * v).sum((0, 1)) / max(w_neg.sum(), eps)
    g_pos, g_neg = gamma(m_pos, pos_mask), gamma(m_neg, neg_mask)
  m_pos, m_neg = margins(mu_pos, mu_neg)
  w_pos = lo + (hi - lo) * sig(m_pos / g_pos)
  w_neg = lo + (hi - lo) * sig(m_neg / g_neg)
  pos_seq = (adv > 0)[:, None]
  neg_seq = (adv < 0)[:, None]
  weight = (w_pos * pos_seq + w_neg * neg_seq + lo * (1 - pos_seq - neg_seq)) * mask
  return weight * (mask.sum() / max(weight.sum(), 1e-8))


class DeltaTokenWeightsTest(chex.TestCase):

  def _batch(self, seed=0):
    rng = np.random.default_rng(seed)
    B, T, D = 5, 6, 4
    h = rng.normal(size=(B, T, D))
    logp = -rng.uniform(0.01, 3.0, (B, T))
    adv = np.array([1.2, -0.7, 0.0, 0.4, -1.5])
    mask = (rng.uniform(size=(B, T)) > 0.25).astype(np.float64)
    mask[:, 0] = 1.0
    return h, logp, adv, mask

  @chex.variants(with_jit=True, without_jit=True)
  def test_against_transcription_of_official_code(self):
    h, logp, adv, mask = self._batch()
    for steps in (0, 1, 3):
      fn = self.variant(functools.partial(selection.delta_token_weights, steps=steps))
      got = fn(*(jnp.asarray(x, jnp.float32) for x in (h, logp, adv, mask)))
      want = np_delta_weights(h, logp, adv, mask, steps=steps)
      np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6, err_msg=f"steps={steps}")
      self.assertGreater(np.ptp(want[mask > 0]), 0.05)  # the weights are not all equal

  def test_invariants(self):
    h, logp, adv, mask = self._batch(1)
    h = np.where(mask[..., None] > 0, h, np.nan)  # padding hidden states are never read
    logp_j = jnp.asarray(np.where(mask > 0, logp, np.nan), jnp.float32)
    args = (jnp.asarray(h, jnp.float32), logp_j, jnp.asarray(adv, jnp.float32),
            jnp.asarray(mask, jnp.float32))
    w = np.asarray(selection.delta_token_weights(*args))
    self.assertTrue(np.all(np.isfinite(w)))
    np.testing.assert_array_equal(w[mask == 0], 0.0)
    np.testing.assert_allclose(w[mask > 0].mean(), 1.0, rtol=1e-6)
    # A zero-advantage row gets the floor coefficient on every token (then the batch rescale).
    np.testing.assert_allclose(np.ptp(w[2][mask[2] > 0]), 0.0, atol=1e-7)
    # Rows are exchangeable: permuting them permutes the weights.
    perm = np.array([3, 0, 4, 1, 2])
    w_perm = selection.delta_token_weights(*(x[perm] for x in args))
    np.testing.assert_allclose(w_perm, w[perm], rtol=1e-5, atol=1e-6)

  def test_neutral_setting_is_grpo(self):
    h, logp, adv, mask = self._batch(2)
    args = [jnp.asarray(x, jnp.float32) for x in (h, logp, adv, mask)]
    w = selection.delta_token_weights(*args, w_min=1.0, w_max=1.0)
    np.testing.assert_allclose(w, mask, atol=1e-6)
    old = args[1]
    lp = old + 0.1
    adv_BT = args[2][:, None]
    ppo = lambda a: aggregation.aggregate(policy.ppo_clip(lp, old, a, args[3])[0], args[3],
                                          "token-mean")
    np.testing.assert_allclose(ppo(adv_BT * w), ppo(adv_BT), rtol=1e-6)

  def test_bad_shapes_raise(self):
    with self.assertRaisesRegex(ValueError, "expects h"):
      selection.delta_token_weights(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros(2),
                                    jnp.ones((2, 3)))


if __name__ == "__main__":
  absltest.main()
