# pylint: disable=invalid-name
"""Per-token log-probs (and entropy) from hidden states and the unembedding, one public op.

  token_logprobs(hidden_ND, w_DV, targets_N, *, temperature=1.0, return_entropy=False,
                 impl="auto") -> logp_N  (or (logp_N, entropy_N))

This file currently holds the public op and the naive reference. The chunked-XLA and Pallas
implementations (kernels.md §8) plug in behind the same `impl` switch.
"""
import jax
import jax.numpy as jnp

IMPLS = ("auto", "reference")


def token_logprobs_reference(hidden_ND, w_DV, targets_N, *, temperature: float = 1.0,
                             return_entropy: bool = False):
  """Naive oracle: materializes [N, V] float32 logits. log softmax(h @ w / T)[target]."""
  logits_NV = jnp.einsum("nd,dv->nv", hidden_ND, w_DV, preferred_element_type=jnp.float32)
  logits_NV = logits_NV / temperature
  logp_NV = jax.nn.log_softmax(logits_NV, axis=-1)
  logp_N = jnp.take_along_axis(logp_NV, targets_N[:, None].astype(jnp.int32), -1)[:, 0]
  if not return_entropy:
    return logp_N
  entropy_N = -(jnp.exp(logp_NV) * logp_NV).sum(-1)
  return logp_N, entropy_N


def token_logprobs(hidden_ND, w_DV, targets_N, *, temperature: float = 1.0,
                   return_entropy: bool = False, impl: str = "auto"):
  """log softmax(hidden @ w / temperature)[target], float32 `[N]` (+ entropy `[N]`)."""
  if impl not in IMPLS:
    raise ValueError(f"Unknown logprob impl {impl!r}; expected one of {IMPLS}.")
  return token_logprobs_reference(hidden_ND, w_DV, targets_N, temperature=temperature,
                                  return_entropy=return_entropy)
