"""Tests for agentrl.rollout.sampler on the tiny transformer config."""
import dataclasses

from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.models import policy
from agentrl.models import testing
from agentrl.models import transformer
from agentrl.rollout import sampler as sampler_lib

jax.config.update("jax_numpy_rank_promotion", "raise")

PAD = 0
PROMPTS = [[5, 6, 7, 8, 9], [11, 12, 13], [3, 4, 5, 6, 7, 8, 9]]   # 3 rows -> batch bucket 4
# How far a bfloat16 rollout's log-probs may be from the trainer's: the largest gap between
# bfloat16 and float32 forwards of the tiny model is ~0.05 nats (mean ~0.01).
BF16_LOGP_ATOL = 0.1


def _model(seed=0):
  return transformer.Transformer(transformer.Config.named("tiny"), rngs=nnx.Rngs(seed))


def _full_sequences(prompts, out):
  """Right-padded prompt + sampled tokens, as the trainer would see them."""
  seqs = [list(p) + list(out.tokens_BN[i, :out.lengths_B[i]]) for i, p in enumerate(prompts)]
  T = max(len(s) for s in seqs)
  tokens_BT = np.full((len(seqs), T), PAD, np.int32)
  mask_BT = np.zeros((len(seqs), T), bool)
  for i, s in enumerate(seqs):
    tokens_BT[i, :len(s)], mask_BT[i, :len(s)] = s, True
  positions_BT = np.broadcast_to(np.arange(T, dtype=np.int32), tokens_BT.shape)
  return jnp.asarray(tokens_BT), jnp.asarray(positions_BT), jnp.asarray(mask_BT)


class SamplerTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.model = _model()
    cls.graphdef, cls.params = nnx.split(cls.model)
    cls.sampler = sampler_lib.Sampler(cls.graphdef, pad_id=PAD)
    cls.vocab = transformer.Config.named("tiny").vocab

  def _generate(self, prompts=PROMPTS, seed=0, **kw):
    kw.setdefault("max_new_tokens", 10)
    return self.sampler.generate(self.params, prompts, rng=jax.random.key(seed), **kw)

  def test_logp_equals_token_logprobs(self):
    out = self._generate(temperature=0.7)
    self.assertTrue(np.all(out.lengths_B == 10))
    tokens_BT, positions_BT, mask_BT = _full_sequences(PROMPTS, out)
    logp_BT = policy.token_logprobs(self.model, tokens_BT, positions_BT, mask_BT,
                                    temperature=0.7)
    for i, p in enumerate(PROMPTS):
      n = out.lengths_B[i]
      np.testing.assert_allclose(out.logp_BN[i, :n], logp_BT[i, len(p):len(p) + n], atol=1e-5,
                                 rtol=0)
    self.assertTrue(np.all(out.logp_BN < 0))        # real log-probs, not zeros

  def test_bfloat16_logp_matches_the_trainer(self):
    cfg = transformer.Config.named("tiny", dtype="bfloat16", param_dtype="bfloat16")
    graphdef, params = testing.random_params(cfg)
    out = sampler_lib.Sampler(graphdef, pad_id=PAD).generate(
        params, PROMPTS, rng=jax.random.key(0), max_new_tokens=16)
    tokens_BT, positions_BT, mask_BT = _full_sequences(PROMPTS, out)

    def gaps(**overrides):
      trainer = transformer.Transformer(dataclasses.replace(cfg, **overrides),
                                        rngs=nnx.Rngs(0))
      nnx.update(trainer, jax.tree.map(lambda x: x.astype(trainer.cfg.param_dtype), params))
      logp_BT = policy.token_logprobs(trainer, tokens_BT, positions_BT, mask_BT)
      return np.concatenate([np.abs(out.logp_BN[i, :n] - logp_BT[i, len(p):len(p) + n])
                             for i, (p, n) in enumerate(zip(PROMPTS, out.lengths_B))])

    # The trainer in bfloat16 (either attention) runs the sampler's arithmetic: on CPU the
    # two agree to float32 rounding, and anywhere within the stated tolerance.
    for attention in ("xla", "fused"):
      gap = gaps(attention=attention)
      self.assertLess(gap.max(), BF16_LOGP_ATOL)
      if jax.default_backend() == "cpu":
        np.testing.assert_allclose(gap, 0.0, atol=1e-5)
    # A float32 trainer of the same weights: bfloat16 rounding is the whole gap.
    gap = gaps(dtype="float32", param_dtype="float32")
    self.assertLess(gap.max(), BF16_LOGP_ATOL)
    self.assertGreater(gap.max(), 1e-3)   # the two really computed in different precisions

  def test_truncated_logp_is_renormalized_over_top_k(self):
    tempered = self._generate(top_k=3, seed=1)
    truncated = self._generate(top_k=3, seed=1, logp_mode="truncated")
    np.testing.assert_array_equal(tempered.tokens_BN, truncated.tokens_BN)
    # Renormalizing over 3 of V tokens raises every log-prob, and never above 0.
    self.assertTrue(np.all(truncated.logp_BN > tempered.logp_BN))
    self.assertTrue(np.all(truncated.logp_BN <= 0))

  def test_greedy_equals_argmax_of_full_forward(self):
    out = self._generate(greedy=True)
    tokens_BT, positions_BT, mask_BT = _full_sequences(PROMPTS, out)
    logits_BTV = self.model(tokens_BT, positions_BT, mask_BT)
    argmax_BT = np.asarray(jnp.argmax(logits_BTV, -1))
    for i, p in enumerate(PROMPTS):
      n = out.lengths_B[i]
      # Logits at t predict token t + 1.
      np.testing.assert_array_equal(out.tokens_BN[i, :n], argmax_BT[i, len(p) - 1:len(p) + n - 1])
    sampled = self._generate(seed=3)
    self.assertFalse(np.array_equal(sampled.tokens_BN, out.tokens_BN))

  def test_top_k_1_and_tiny_top_p_equal_greedy(self):
    greedy = self._generate(greedy=True)
    np.testing.assert_array_equal(self._generate(top_k=1, seed=5).tokens_BN, greedy.tokens_BN)
    np.testing.assert_array_equal(self._generate(top_p=1e-6, seed=5).tokens_BN,
                                  greedy.tokens_BN)

  def test_stop_ids_max_tokens_and_early_exit(self):
    greedy = self._generate(greedy=True)
    stop = int(greedy.tokens_BN[0, 2])
    out = self._generate(greedy=True, stop_ids=[[stop], [], []], max_new_tokens=[10, 4, 0])
    first = int(np.argmax(greedy.tokens_BN[0] == stop))       # first occurrence of stop in row 0
    np.testing.assert_array_equal(out.lengths_B, [first + 1, 4, 0])
    np.testing.assert_array_equal(out.stopped_B, [True, False, False])
    np.testing.assert_array_equal(out.tokens_BN[0, :first + 1], greedy.tokens_BN[0, :first + 1])
    np.testing.assert_array_equal(out.tokens_BN[0, first + 1:], PAD)
    np.testing.assert_array_equal(out.tokens_BN[1, 4:], PAD)
    np.testing.assert_array_equal(out.logp_BN[2], 0.0)
    # Every row is done after max(first + 1, 4) tokens: the loop exits long before 16 steps.
    self.assertEqual(out.num_steps, max(first + 1, 4))
    self.assertLess(out.num_steps, 16)

  def test_same_bucket_reuses_program_and_params_are_arguments(self):
    sampler = sampler_lib.Sampler(self.graphdef, pad_id=PAD)
    a = sampler.generate(self.params, [[1, 2, 3, 4, 5], [6]], rng=jax.random.key(0),
                         max_new_tokens=5, greedy=True)
    sampler.generate(self.params, [[1, 2, 3, 4, 5, 6, 7], [8, 9]], rng=jax.random.key(0),
                     max_new_tokens=7, greedy=True)
    self.assertEqual(sampler.num_traces, 1)      # P, B and N buckets all unchanged
    _, other_params = nnx.split(_model(seed=1))
    b = sampler.generate(other_params, [[1, 2, 3, 4, 5], [6]], rng=jax.random.key(0),
                         max_new_tokens=5, greedy=True)
    self.assertEqual(sampler.num_traces, 1)      # new weights, same program
    self.assertFalse(np.array_equal(a.tokens_BN, b.tokens_BN))
    sampler.generate(self.params, [list(range(1, 21)), [6]], rng=jax.random.key(0),
                     max_new_tokens=5)
    self.assertEqual(sampler.num_traces, 2)      # prompt bucket 32 is a new program

  def test_categorical_frequencies_match_softmax(self):
    z_V = jnp.log(jnp.array([0.1, 0.0, 0.6, 0.3]))              # token 1 has probability 0
    keys_N = jax.random.split(jax.random.key(0), 20000)
    draws_N = sampler_lib.categorical(keys_N, jnp.broadcast_to(z_V, (20000, 4)))
    freq_V = np.bincount(np.asarray(draws_N), minlength=4) / 20000
    np.testing.assert_allclose(freq_V, [0.1, 0.0, 0.6, 0.3], atol=0.015)
    self.assertEqual(freq_V[1], 0.0)

  def test_top_p_bisection_equals_sorted_nucleus(self):
    z_BV = np.array(jax.random.normal(jax.random.key(1), (6, 300)) * 3.0)
    z_BV[5, :10] = z_BV[5].max() + 1.0                            # ties at the top
    for top_p in (0.01, 0.3, 0.9, 0.999):
      keep_BV = np.asarray(sampler_lib._top_p_keep(jnp.asarray(z_BV), top_p))
      for z_V, keep_V in zip(z_BV, keep_BV):
        p_V = np.exp(z_V - z_V.max()) / np.exp(z_V - z_V.max()).sum()
        order = np.argsort(-p_V, kind="stable")
        n = int(np.searchsorted(np.cumsum(p_V[order]), top_p) + 1)  # smallest prefix >= p
        expected_V = p_V >= p_V[order][n - 1]                      # plus ties at the cutoff
        np.testing.assert_array_equal(keep_V, expected_V, err_msg=f"top_p={top_p}")
      self.assertTrue(keep_BV.sum() < keep_BV.size)                 # something was removed

  def test_bucket(self):
    self.assertEqual([sampler_lib.bucket(n, 16) for n in (1, 16, 17, 33)], [16, 16, 32, 64])
    self.assertEqual([sampler_lib.bucket(n) for n in (1, 3, 4, 5)], [1, 4, 4, 8])

  def test_bad_input_names_the_value(self):
    with self.assertRaisesRegex(ValueError, "prompt 1 is empty"):
      self._generate(prompts=[[1], []])
    with self.assertRaisesRegex(ValueError, "temperature"):
      self._generate(temperature=0.0)
    with self.assertRaisesRegex(ValueError, "logp_mode"):
      self._generate(logp_mode="renormalized")
    with self.assertRaisesRegex(ValueError, "max_new_tokens has 2 entries"):
      self._generate(max_new_tokens=[1, 2])


def _np_entropy_temperature(logits_BV, temperature, a_6, eps=1e-6):
  tau, signed, m, s, pos_max, neg_min = a_6
  z_BV = logits_BV - logits_BV.max(-1, keepdims=True)
  p_BV = np.exp(z_BV) / np.exp(z_BV).sum(-1, keepdims=True)
  h_B = -(p_BV * np.log(p_BV)).sum(-1)
  h_B = (np.log(np.maximum(h_B, eps)) - m) / (s + eps)
  h_hat_B = np.where(h_B > 0, h_B / pos_max, h_B / (-neg_min if signed else neg_min))
  return temperature * (1 + tau * np.clip(h_hat_B, -1, 1))


class EntropyTemperatureTest(absltest.TestCase):
  LOGITS = np.array([[2.0, 0.0, -1.0], [0.0, 0.0, 0.0], [1.0, 0.5, 0.0]], np.float32)

  def test_hand_computed(self):
    # Row 0: H = 0.5243, log H = -0.6458 -> h_hat = -0.6458 / -0.5 -> clipped to 1 (released
    # sign) or -1 (signed): T = 1.1 or 0.9. Row 1: H = log 3, log H = 0.0940, h_hat = 0.047.
    unsigned = (0.1, 0.0, 0.0, 1.0, 2.0, -0.5)
    got = sampler_lib.entropy_temperature(jnp.asarray(self.LOGITS), 1.0, jnp.asarray(unsigned))
    np.testing.assert_allclose(np.asarray(got)[:2, 0], [1.1, 1.0 + 0.1 * 0.0940 / 2], atol=2e-5)
    signed = (0.1, 1.0) + unsigned[2:]
    got = sampler_lib.entropy_temperature(jnp.asarray(self.LOGITS), 1.0, jnp.asarray(signed))
    self.assertAlmostEqual(float(got[0, 0]), 0.9, places=5)

  def test_matches_numpy_and_tau_zero_is_the_temperature(self):
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(6, 11)).astype(np.float32) * 3
    for a_6 in [(0.05, 1.0, -0.3, 0.8, 1.7, -2.2), (0.3, 0.0, 0.4, 1.3, 0.9, -0.4)]:
      got = sampler_lib.entropy_temperature(jnp.asarray(logits), 0.7, jnp.asarray(a_6))
      np.testing.assert_allclose(np.asarray(got)[:, 0],
                                 _np_entropy_temperature(logits, 0.7, a_6), rtol=1e-5)
    zero = sampler_lib.entropy_temperature(jnp.asarray(logits), 0.7,
                                           jnp.asarray((0.0, 1.0, 0.1, 1.0, 1.0, -1.0)))
    np.testing.assert_array_equal(np.asarray(zero), np.full((6, 1), 0.7, np.float32))

  def test_adaptive_params_names_the_bad_value(self):
    self.assertIsNone(sampler_lib.adaptive_params(None))
    self.assertEqual(sampler_lib.adaptive_params(range(6)).dtype, np.float32)
    with self.assertRaisesRegex(ValueError, "6 finite floats"):
      sampler_lib.adaptive_params((0.1, 1.0, 0.0, float("nan"), 1.0, -1.0))
    with self.assertRaisesRegex(ValueError, "tau must be in"):
      sampler_lib.adaptive_params((1.0, 1.0, 0.0, 1.0, 1.0, -1.0))


if __name__ == "__main__":
  absltest.main()
