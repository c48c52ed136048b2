# pylint: disable=invalid-name
"""Compiled Pallas log-prob kernels at production tile sizes (BUILD tags: requires-gpu/tpu).

The small-shape compiled tests live in ops_test.py (`TokenLogprobsPallasTest`, with its
interpret-mode twin); these use the default `BlockSizes` on a SmolLM2-sized head, which is too
slow to interpret on CPU, so the whole class skips without an accelerator.
"""
from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from kernels.logprob import ops
from kernels.logprob import pallas_gpu

jax.config.update("jax_numpy_rank_promotion", "raise")

_KERNEL = {"tpu": "pallas_tpu", "gpu": "pallas_gpu"}


class TokenLogprobsCompiledTest(parameterized.TestCase):

  def setUp(self):
    super().setUp()
    if jax.default_backend() not in _KERNEL:
      self.skipTest("Needs a TPU or GPU; ops_test.py covers the kernels in interpret mode.")

  @parameterized.parameters(dict(softcap=None, entropy=False, backward="xla"),
                            dict(softcap=30.0, entropy=True, backward="xla"),
                            dict(softcap=30.0, entropy=True, backward="triton"))
  def test_default_blocks_match_xla(self, softcap, entropy, backward):
    # `backward` applies to the GPU kernel only (the TPU kernel has one backward): its
    # default, the XLA path's backward, and its own Triton kernels.
    if jax.default_backend() == "tpu" and backward == "triton":
      self.skipTest("The Triton backward is GPU-only.")
    n, d, v = 2048 + 5, 576, 49152 + 7  # ragged against every default tile
    k = jax.random.split(jax.random.key(0), 4)
    h_ND = jax.random.normal(k[0], (n, d), jnp.bfloat16)
    w_DV = (0.1 * jax.random.normal(k[1], (d, v))).astype(jnp.bfloat16)
    y_N = jax.random.randint(k[2], (n,), 0, v)
    g_N = jax.random.normal(k[3], (n,))

    @jax.jit
    def run_all(h_ND, w_DV):
      def run(impl):
        def objective(h, w):
          blocks = pallas_gpu.BlockSizes(backward=backward) if impl == "pallas_gpu" else None
          out = ops.token_logprobs(h, w, y_N, softcap=softcap, return_entropy=entropy,
                                   impl=impl, block_sizes=blocks)
          logp_N = out[0] if entropy else out
          extra = jnp.sum(out[1]) if entropy else 0.0
          return jnp.sum(g_N * logp_N) + extra, logp_N
        return jax.value_and_grad(objective, (0, 1), has_aux=True)(h_ND, w_DV)
      return run(_KERNEL[jax.default_backend()]), run("xla")

    ((_, got_logp), got_grads), ((_, want_logp), want_grads) = run_all(h_ND, w_DV)
    np.testing.assert_allclose(got_logp, want_logp, atol=2e-2)
    for got, want in zip(got_grads, want_grads):
      got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
      np.testing.assert_allclose(got, want, atol=2e-2 * float(np.abs(want).max()))


if __name__ == "__main__":
  absltest.main()
