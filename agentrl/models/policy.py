# pylint: disable=invalid-name
"""Per-token log-probs and entropies of a `transformer.Transformer` policy.

  logp_BT = token_logprobs(model, tokens_BT, positions_BT, input_mask_BT)
  logp_BT[:, t] = log pi(tokens[:, t] | tokens[:, <t]) for t >= 1, and logp_BT[:, 0] = 0

(docs/architecture.md §3). The [B, T, V] logits are never materialized: the final hidden states and
the unembedding go to the fused `kernels.logprob.ops.token_logprobs` op, which computes
log softmax(cap·tanh(h W / cap) / temperature)[target] in float32 (soft-cap only for Gemma 2).
Sampler and learner therefore agree to float32 rounding when both use the same params.
"""
import jax
import jax.numpy as jnp

from agentrl.models import transformer
from kernels.logprob import ops


def token_logprobs(model: transformer.Transformer, tokens_BT: jax.Array,
                   positions_BT: jax.Array, input_mask_BT: jax.Array | None = None, *,
                   temperature: float = 1.0, return_entropy: bool = False,
                   impl: str = "auto"):
  """Float32 [B, T] log-probs of each token given its prefix (and the predictive entropy).

  Column t scores token t with the distribution computed at t - 1 (logits at t predict
  t + 1), so column 0 has no prediction and is 0 (entropy too). Padding positions get values
  of no meaning; mask them with the loss mask. `temperature` divides the logits (sampler
  semantics); `impl` selects the kernel (see kernels.logprob.ops.IMPLS).
  """
  b, t = tokens_BT.shape
  h_BTD = model.hidden(tokens_BT, positions_BT, input_mask_BT)
  h_ND = h_BTD[:, :-1].reshape(b * (t - 1), h_BTD.shape[-1])
  targets_N = tokens_BT[:, 1:].reshape(b * (t - 1))
  kwargs = {}
  if model.cfg.final_logit_softcap:
    kwargs["softcap"] = float(model.cfg.final_logit_softcap)
  out = ops.token_logprobs(h_ND, model.unembed_DV(), targets_N, temperature=temperature,
                           return_entropy=return_entropy, impl=impl, **kwargs)
  pad = lambda x_N: jnp.pad(x_N.reshape(b, t - 1), ((0, 0), (1, 0)))
  if return_entropy:
    logp_N, entropy_N = out
    return pad(logp_N), pad(entropy_N)
  return pad(out)
