"""Fused per-token log-probs: `kernels.logprob.token_logprobs` is `ops.token_logprobs`."""
from kernels.logprob.ops import token_logprobs
from kernels.logprob.ops import token_logprobs_reference

__all__ = ["token_logprobs", "token_logprobs_reference"]
