# pylint: disable=invalid-name
"""Tests for agentrl.credit.spo: cut points and SPO-chain advantages against the official
episode generator's loop (math_episode_generator_with_mc_advantages.py), hand-computed values
and the masking invariants."""
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.credit import spo
from agentrl.losses import aggregation

jax.config.update("jax_numpy_rank_promotion", "raise")

# Column 0 is the prompt; response probabilities .95 .5 .99 .3 .97 .2 .99.
PROBS = np.array([[1.0, 0.95, 0.5, 0.99, 0.3, 0.97, 0.2, 0.99]])
LOGP = np.log(PROBS)
MASK = np.array([[0, 1, 1, 1, 1, 1, 1, 1]], np.float32)


def np_official_row(response_probs, cut_values, score, interval):
  """The official per-trajectory advantages on the response only (positions 0..n-1).

  Cut points: np.where(p < 0.9)[0] - 1, every `interval`-th; then the token-value chain and the
  backward fill of `_compute_token_advantages` and the `response_prob > 0.9` zeroing; the
  trainer's `use_prob_mask` then drops tokens with p >= 0.9 from the loss.
  """
  n = len(response_probs)
  all_cuts = cuts = (np.where(response_probs < 0.9)[0] - 1)[::interval]
  if len(cuts) == 0:
    return np.zeros(n), all_cuts
  values = [None] * n
  values[-1] = score
  base = None
  if cuts[0] == -1:
    base, cuts, cut_values = cut_values[0], cuts[1:], cut_values[1:]
  for idx, v in zip(cuts, cut_values):
    values[idx] = v
  adv = [None] * n
  for i in range(n):
    if values[i] is not None:
      adv[i] = 0.0 if base is None else values[i] - base
      base = values[i]
  for i in range(n - 1, -1, -1):
    if adv[i] is None:
      adv[i] = adv[i + 1]
  adv = np.array(adv, np.float64)
  adv[response_probs > 0.9] = 0.0
  adv[response_probs >= 0.9] = 0.0  # the loss mask (strict p < 0.9)
  return adv, all_cuts


class CutpointsTest(absltest.TestCase):

  def test_hand_example(self):
    cut, valid = spo.cutpoints(LOGP, MASK, interval=1)
    np.testing.assert_array_equal(cut, [[1, 3, 5]])  # before tokens 2, 4, 6
    np.testing.assert_array_equal(valid, [[True, True, True]])
    cut, valid = spo.cutpoints(LOGP, MASK, interval=2)
    np.testing.assert_array_equal(cut, [[1, 5]])
    cut, valid = spo.cutpoints(LOGP, MASK)  # the official default interval 5: the first only
    np.testing.assert_array_equal(cut, [[1]])

  def test_first_response_token_cut_is_the_prompt_state_and_padding(self):
    logp = np.log(np.array([[1.0, 0.5, 0.99, 0.99], [1.0, 1.0, 0.99, 0.99]]))
    mask = np.array([[0, 1, 1, 1], [0, 1, 1, 1]], np.float32)
    cut, valid = spo.cutpoints(logp, mask, interval=1)
    np.testing.assert_array_equal(cut, [[0], [-1]])  # column 0 = "prompt only"
    np.testing.assert_array_equal(valid, [[True], [False]])
    cut, valid = spo.cutpoints(LOGP, MASK, interval=1, max_cuts=2)
    np.testing.assert_array_equal(cut, [[1, 3]])

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "interval"):
      spo.cutpoints(LOGP, MASK, interval=0)


class MCRequestsTest(absltest.TestCase):

  def test_prefixes_budgets_and_values(self):
    tokens = [[7, 8, 9, 10, 11], [7, 5, 6]]
    cut = np.array([[0, 2], [1, -1]], np.int32)
    valid = np.array([[True, True], [True, False]])
    req = spo.mc_requests(tokens, cut, valid, num_samples=2, end_B=[6, 4])
    self.assertEqual(req.contexts, [[7], [7], [7, 8, 9], [7, 8, 9], [7, 5], [7, 5]])
    np.testing.assert_array_equal(req.row_N, [0, 0, 0, 0, 1, 1])
    np.testing.assert_array_equal(req.slot_N, [0, 0, 1, 1, 0, 0])
    np.testing.assert_array_equal(req.budget_N, [5, 5, 3, 3, 2, 2])
    values = spo.mc_values(np.array([1.0, 0.0, 1.0, 1.0, 0.0, 0.0]), req, cut.shape)
    np.testing.assert_allclose(values, [[0.5, 1.0], [0.0, 0.0]])

  def test_bad_arguments(self):
    cut, valid = np.array([[3]], np.int32), np.array([[True]])
    with self.assertRaisesRegex(ValueError, "budget"):
      spo.mc_requests([[1, 2, 3, 4, 5]], cut, valid, num_samples=1, end_B=[4])
    with self.assertRaisesRegex(ValueError, "num_samples"):
      spo.mc_requests([[1, 2, 3, 4, 5]], cut, valid, num_samples=0, end_B=[6])
    req = spo.mc_requests([[1, 2, 3, 4, 5]], cut, valid, num_samples=2, end_B=[6])
    with self.assertRaisesRegex(ValueError, "mc_values"):
      spo.mc_values(np.zeros(3), req, (1, 1))


class ChainAdvantagesTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    cut, valid = spo.cutpoints(LOGP, MASK, interval=1)
    fn = self.variant(functools.partial(spo.chain_advantages, whiten=False))
    adv = fn(jnp.array([[0.2, 0.5, 0.9]]), jnp.asarray(cut), jnp.asarray(valid),
             jnp.array([1.0]), jnp.asarray(LOGP), jnp.asarray(MASK))
    # Segments (2..3): V(3) - V(1) = 0.3, (4..5): 0.4, (6..7): score - V(5) = 0.1; only the
    # low-probability tokens 2, 4, 6 keep theirs. Tokens 0..1 precede the first cut: 0.
    np.testing.assert_allclose(adv, [[0, 0, 0.3, 0, 0.4, 0, 0.1, 0]], atol=1e-6)

  def test_against_official_loop(self):
    rng = np.random.default_rng(0)
    B, P, T = 6, 3, 40
    probs = np.where(rng.random((B, T)) < 0.3, rng.random((B, T)) * 0.9, 0.9 + 0.1 *
                     rng.random((B, T)))
    probs[:, :P] = 1.0
    probs[0, P] = 0.2  # a cut at the prompt state
    probs[1, P:] = 0.95  # no cut at all
    probs[2, P + 5] = 0.9  # exactly at the threshold: neither a cut nor trained
    lengths = rng.integers(10, T - P, size=B)
    mask = (np.arange(T)[None, :] >= P) & (np.arange(T)[None, :] < P + lengths[:, None])
    score = rng.integers(0, 2, size=B).astype(np.float32)
    for interval in (1, 3):
      cut, valid = spo.cutpoints(np.log(probs), mask, interval=interval)
      values = rng.random(cut.shape).astype(np.float32)
      got = np.asarray(spo.chain_advantages(
          jnp.asarray(values), jnp.asarray(cut), jnp.asarray(valid), jnp.asarray(score),
          jnp.asarray(np.log(probs), jnp.float32), jnp.asarray(mask, jnp.float32),
          whiten=False))
      for b in range(B):
        resp = probs[b, P:P + lengths[b]]
        want, cuts = np_official_row(resp, list(values[b, valid[b]]), score[b], interval)
        np.testing.assert_array_equal(cuts + P, cut[b, valid[b]])
        np.testing.assert_allclose(got[b, P:P + lengths[b]], want, atol=1e-6,
                                   err_msg=f"row {b}, interval {interval}")
        self.assertTrue(np.all(got[b, ~mask[b]] == 0.0))

  def test_whitening_over_the_probability_mask(self):
    cut, valid = spo.cutpoints(LOGP, MASK, interval=1)
    args = (jnp.array([[0.2, 0.5, 0.9]]), jnp.asarray(cut), jnp.asarray(valid),
            jnp.array([1.0]), jnp.asarray(LOGP), jnp.asarray(MASK))
    raw = spo.chain_advantages(*args, whiten=False)
    keep = spo.probability_mask(jnp.asarray(LOGP), jnp.asarray(MASK))
    np.testing.assert_array_equal(keep, [[0, 0, 1, 0, 1, 0, 1, 0]])
    np.testing.assert_allclose(spo.chain_advantages(*args),
                               aggregation.masked_whiten(raw, keep), rtol=1e-6)
    vals = np.array([0.3, 0.4, 0.1])
    np.testing.assert_allclose(np.asarray(spo.chain_advantages(*args))[0, [2, 4, 6]],
                               (vals - vals.mean()) / np.sqrt(vals.var(ddof=1) + 1e-8),
                               rtol=1e-5)

  def test_constant_values_give_zero(self):
    # V = score everywhere: no segment makes progress.
    cut, valid = spo.cutpoints(LOGP, MASK, interval=1)
    adv = spo.chain_advantages(jnp.full((1, 3), 0.7), jnp.asarray(cut), jnp.asarray(valid),
                               jnp.array([0.7]), jnp.asarray(LOGP), jnp.asarray(MASK))
    np.testing.assert_array_equal(adv, 0.0)

  def test_bad_shapes(self):
    with self.assertRaisesRegex(ValueError, "chain_advantages"):
      spo.chain_advantages(jnp.zeros((1, 2)), jnp.zeros((1, 3), jnp.int32),
                           jnp.zeros((1, 3), bool), jnp.zeros(1), jnp.asarray(LOGP),
                           jnp.asarray(MASK))


if __name__ == "__main__":
  absltest.main()
