# pylint: disable=invalid-name
"""Tests of policy.token_logprobs: alignment, temperature, entropy, soft-cap, gradients."""
from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.models import policy
from agentrl.models import testing
from agentrl.models import transformer

jax.config.update("jax_numpy_rank_promotion", "raise")


def naive_logprobs(model, tokens_BT, positions_BT, mask_BT, temperature):
  """Oracle from the full [B, T, V] logits: log softmax at t - 1, picked at tokens[t]."""
  logp_BTV = jax.nn.log_softmax(model(tokens_BT, positions_BT, mask_BT) / temperature)
  picked_BT = jnp.take_along_axis(logp_BTV[:, :-1], tokens_BT[:, 1:, None], axis=-1)[..., 0]
  entropy_BT = -(jnp.exp(logp_BTV) * logp_BTV).sum(-1)[:, :-1]
  pad = lambda x: jnp.pad(x, ((0, 0), (1, 0)))
  return pad(picked_BT), pad(entropy_BT)


class TokenLogprobsTest(absltest.TestCase):

  def test_matches_naive_log_softmax(self):
    # Gemma 2's final soft-cap goes through the fused op's `softcap`; "auto" is the chunked
    # XLA kernel on CPU.
    cfg = transformer.Config.named("tiny", vocab=128, final_logit_softcap=2.0,
                                   tie_embeddings=False)
    impl = "auto"
    graphdef, params = testing.random_params(cfg)
    tokens_BT = jnp.asarray(np.random.default_rng(0).integers(0, cfg.vocab, (2, 7)), jnp.int32)
    mask_BT = jnp.array([[True] * 7, [False, False] + [True] * 5])
    positions_BT = jnp.maximum(jnp.cumsum(mask_BT, axis=1) - 1, 0)

    @jax.jit
    def run(params):
      m = nnx.merge(graphdef, params)
      got = policy.token_logprobs(m, tokens_BT, positions_BT, mask_BT, temperature=0.7,
                                  return_entropy=True, impl=impl)
      plain = policy.token_logprobs(m, tokens_BT, positions_BT, mask_BT, impl=impl)
      want = naive_logprobs(m, tokens_BT, positions_BT, mask_BT, 0.7)
      grad = jax.grad(lambda p: policy.token_logprobs(
          nnx.merge(graphdef, p), tokens_BT, positions_BT, mask_BT, impl=impl)[:, 1:].sum())(
              params)
      return got, plain, want, naive_logprobs(m, tokens_BT, positions_BT, mask_BT, 1.0)[0], grad

    (logp_BT, entropy_BT), plain_BT, (want_logp_BT, want_entropy_BT), want_plain_BT, grad = run(
        params)
    self.assertEqual((logp_BT.shape, logp_BT.dtype), ((2, 7), jnp.float32))
    np.testing.assert_array_equal(logp_BT[:, 0], 0.0)
    np.testing.assert_array_equal(entropy_BT[:, 0], 0.0)
    np.testing.assert_allclose(logp_BT, want_logp_BT, atol=2e-5)
    np.testing.assert_allclose(entropy_BT, want_entropy_BT, atol=2e-5)
    np.testing.assert_allclose(plain_BT, want_plain_BT, atol=2e-5)
    self.assertTrue(np.all(np.asarray(plain_BT[:, 1:]) < 0.0))
    self.assertGreater(float(jnp.abs(logp_BT - plain_BT).max()), 1e-3)  # temperature matters
    grad_norm = sum(float(jnp.abs(g).sum()) for g in jax.tree.leaves(grad))
    self.assertTrue(np.isfinite(grad_norm) and grad_norm > 0.0)


if __name__ == "__main__":
  absltest.main()
