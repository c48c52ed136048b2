"""Fused per-token log-probs: `kernels.logprob.token_logprobs` is `ops.token_logprobs`.

`vocab_parallel_token_logprobs` is the same op with the vocabulary split over a mesh axis;
`distill_kl` (kl.py) is the per-token teacher-student KL built on the same tile math.
"""
from kernels.logprob.kl import distill_kl
from kernels.logprob.kl import distill_kl_reference
from kernels.logprob.ops import token_logprobs
from kernels.logprob.ops import token_logprobs_reference
from kernels.logprob.vocab_parallel import vocab_parallel_token_logprobs

__all__ = ["distill_kl", "distill_kl_reference", "token_logprobs", "token_logprobs_reference",
           "vocab_parallel_token_logprobs"]
