"""Decode attention over the KV cache: `kernels.attention.decode_attention` is
`ops.decode_attention` (Pallas kernels for TPU and GPU, the XLA path as reference)."""
from kernels.attention.ops import CacheMask
from kernels.attention.ops import cache_mask
from kernels.attention.ops import decode_attention

__all__ = ["CacheMask", "cache_mask", "decode_attention"]
