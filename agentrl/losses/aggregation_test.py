# pylint: disable=invalid-name
"""Tests for agentrl.losses.aggregation."""
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import aggregation

jax.config.update("jax_numpy_rank_promotion", "raise")

TOKEN_MODES = tuple(m for m in aggregation.MODES if m != "seq-mean")

LOSS = jnp.arange(1.0, 13.0).reshape(3, 4)
MASK = jnp.array([[1.0, 1.0, 0.0, 1.0], [1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]])
# Unmasked: row 0 -> 1, 2, 4 (sum 7); row 1 -> 5, 6 (sum 11); row 2 is empty. T = 4.
GOLDEN = {
    "token-mean": 18.0 / 5.0,
    "token-sum": 18.0,
    "seq-mean-token-mean": (7.0 / 3.0 + 11.0 / 2.0) / 2.0,
    "seq-mean-token-sum": (7.0 + 11.0) / 2.0,
    # Dr.GRPO / verl: mean over the 2 valid rows of (token sum / C), C = T = 4 by default.
    "seq-mean-token-sum-norm": (7.0 / 4.0 + 11.0 / 4.0) / 2.0,
}


def _random_batch(seed, B=7, T=5):
  rng = np.random.default_rng(seed)
  loss = rng.normal(size=(B, T)).astype(np.float32)
  mask = (rng.random((B, T)) > 0.4).astype(np.float32)
  mask[2] = 0.0   # a fully masked row
  mask[5] = 1.0
  return jnp.asarray(loss), jnp.asarray(mask)


class AggregateTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(*TOKEN_MODES)
  def test_hand_computed(self, mode):
    fn = self.variant(functools.partial(aggregation.aggregate, mode=mode))
    np.testing.assert_allclose(fn(LOSS, MASK), GOLDEN[mode], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_seq_mean_hand_computed(self):
    fn = self.variant(functools.partial(aggregation.aggregate, mode="seq-mean"))
    np.testing.assert_allclose(fn(jnp.array([1.0, 2.0, 3.0]), jnp.array([1.0, 0.0, 1.0])), 2.0)

  @parameterized.parameters(*aggregation.MODES)
  def test_microbatch_invariance_with_global_normalizer(self, mode):
    loss, mask = _random_batch(0)
    if mode == "seq-mean":
      loss, mask = loss[:, 0], mask[:, 0]
    full = aggregation.aggregate(loss, mask, mode)
    norm = aggregation.normalizer(mask, mode)
    splits = [(0, 1), (1, 5), (5, 7)]  # uneven, one split holds the fully masked row
    parts = [aggregation.aggregate(loss[a:b], mask[a:b], mode, norm=norm) for a, b in splits]
    np.testing.assert_allclose(sum(parts), full, rtol=1e-5)
    if mode in ("token-mean", "seq-mean-token-mean", "seq-mean"):
      # Non-trivial side: per-split normalisation, averaged, is a different estimator.
      local = [aggregation.aggregate(loss[a:b], mask[a:b], mode) for a, b in splits]
      self.assertFalse(np.allclose(np.mean(local), full, rtol=1e-3))

  @chex.variants(with_jit=True, without_jit=True)
  def test_seq_mean_token_sum_norm_with_constant(self):
    # Dr.GRPO with MAX_TOKENS C = 10: mean over valid rows of (row sum / 10) = (0.7 + 1.1) / 2.
    fn = self.variant(functools.partial(aggregation.aggregate, mode="seq-mean-token-sum-norm",
                                        seq_norm_const=10))
    np.testing.assert_allclose(fn(LOSS, MASK), 0.9, rtol=1e-6)
    np.testing.assert_allclose(
        aggregation.normalizer(MASK, "seq-mean-token-sum-norm", seq_norm_const=10), 20.0)
    # The empty row is not a sequence: appending more of them changes nothing.
    padded = jnp.concatenate([MASK, jnp.zeros((3, 4))])
    np.testing.assert_allclose(fn(jnp.concatenate([LOSS, LOSS]), padded), 0.9, rtol=1e-6)

  @parameterized.parameters(None, 3.0, 50)
  def test_seq_mean_token_sum_norm_microbatch_invariance(self, const):
    loss, mask = _random_batch(3, B=9, T=6)
    mode = "seq-mean-token-sum-norm"
    full = aggregation.aggregate(loss, mask, mode, seq_norm_const=const)
    norm = aggregation.normalizer(mask, mode, seq_norm_const=const)
    parts = [aggregation.aggregate(loss[a:b], mask[a:b], mode, norm=norm)
             for a, b in [(0, 2), (2, 3), (3, 9)]]  # (2, 3) holds only the fully masked row
    np.testing.assert_allclose(sum(parts), full, rtol=1e-5)
    m, l = np.asarray(mask), np.asarray(loss)
    rows = m.sum(-1) > 0
    want = ((l * m).sum(-1)[rows] / (6 if const is None else const)).mean()
    np.testing.assert_allclose(full, want, rtol=1e-5)
    # Non-trivial side: per-split normalisation is a different estimator.
    local = [aggregation.aggregate(loss[a:b], mask[a:b], mode, seq_norm_const=const)
             for a, b in [(0, 2), (2, 3), (3, 9)]]
    self.assertFalse(np.allclose(sum(local), full, rtol=1e-3))

  def test_seq_norm_const_misuse_is_named(self):
    with self.assertRaisesRegex(ValueError, "only applies to 'seq-mean-token-sum-norm'"):
      aggregation.aggregate(LOSS, MASK, "token-mean", seq_norm_const=4)
    with self.assertRaisesRegex(ValueError, "pass seq_norm_const to normalizer"):
      aggregation.aggregate(LOSS, MASK, "seq-mean-token-sum-norm", norm=8.0, seq_norm_const=4)
    with self.assertRaisesRegex(ValueError, "must be > 0"):
      aggregation.normalizer(MASK, "seq-mean-token-sum-norm", seq_norm_const=0)

  @parameterized.parameters(*TOKEN_MODES)
  def test_fully_masked_rows_contribute_nothing(self, mode):
    loss, mask = _random_batch(1)
    garbage = jnp.full((2, loss.shape[1]), 1e6)
    padded_loss = jnp.concatenate([loss, garbage])
    padded_mask = jnp.concatenate([mask, jnp.zeros_like(garbage)])
    np.testing.assert_allclose(aggregation.aggregate(padded_loss, padded_mask, mode),
                               aggregation.aggregate(loss, mask, mode), rtol=1e-6)
    grad = jax.grad(lambda x: aggregation.aggregate(x, padded_mask, mode))(padded_loss)
    np.testing.assert_array_equal(grad[-2:], 0.0)
    self.assertTrue(np.all(np.asarray(grad)[np.asarray(padded_mask) > 0] != 0.0))

  @parameterized.parameters(*TOKEN_MODES)
  def test_masked_nan_does_not_leak(self, mode):
    loss, mask = _random_batch(2)
    poisoned = jnp.where(mask > 0, loss, jnp.nan)
    value, grad = jax.value_and_grad(
        lambda x: aggregation.aggregate(x, mask, mode))(poisoned)
    np.testing.assert_allclose(value, aggregation.aggregate(loss, mask, mode), rtol=1e-6)
    self.assertTrue(np.all(np.isfinite(grad)))
    np.testing.assert_array_equal(np.asarray(grad)[np.asarray(mask) == 0], 0.0)

  def test_bad_mode_names_valid_ones(self):
    with self.assertRaisesRegex(ValueError, "seq-mean-token-mean"):
      aggregation.aggregate(LOSS, MASK, "sequence-mean")


class MaskedStatsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_masked_mean(self):
    fn = self.variant(aggregation.masked_mean)
    np.testing.assert_allclose(fn(LOSS, MASK), 18.0 / 5.0, rtol=1e-6)
    per_row = self.variant(functools.partial(aggregation.masked_mean, axis=-1))(LOSS, MASK)
    np.testing.assert_allclose(per_row, [7.0 / 3.0, 5.5, 0.0], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_masked_whiten_hand_computed(self):
    x = jnp.array([[1.0, 2.0, 3.0], [4.0, jnp.nan, 0.0]])
    mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    # Valid [1, 2, 3, 4]: mean 2.5, unbiased var 5/3.
    s = np.sqrt(5.0 / 3.0 + 1e-8)
    expected = np.array([[-1.5, -0.5, 0.5], [1.5, 0.0, 0.0]]) / s
    np.testing.assert_allclose(self.variant(aggregation.masked_whiten)(x, mask), expected,
                               rtol=1e-6)
    unshifted = self.variant(functools.partial(aggregation.masked_whiten, shift_mean=False))(
        x, mask)
    np.testing.assert_allclose(unshifted, np.where(mask > 0, expected + 2.5, 0.0), rtol=1e-6)

  def test_masked_whiten_single_entry_is_finite(self):
    out = aggregation.masked_whiten(jnp.array([[3.0, 1.0]]), jnp.array([[1.0, 0.0]]))
    np.testing.assert_array_equal(out, [[0.0, 0.0]])


if __name__ == "__main__":
  absltest.main()
