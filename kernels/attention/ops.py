# pylint: disable=invalid-name
"""Decode attention of a few new tokens against a KV cache layer, one public op.

  decode_attention(q_BTHK, k_BGSK, v_BGSK, mask, *, scale, softcap=None, impl="auto")
      -> [B, T, H, K]

The cache layout is the model's (`transformer.KVCache`): per layer `[B, G, S, K]`, KV heads
before slots; the R = H / G query heads of KV head g are heads g·R ... g·R + R − 1 (grouped-
query attention). `mask` is a `CacheMask`: the factors of `decoder_math.allowed` (causal over
slots, real tokens only, an optional sliding window) plus each row's first real slot, from
which the kernels rebuild each block's mask instead of reading a `[B, T, S]` array
(docs/kernels.md §10). Slots at or after the last query slot + 1 (`kv_len`) are never
attended to, so the kernels never read them: early in a rollout most of the cache is that
empty tail. A query row with no allowed slot gets zeros.

Implementations:

  "xla"         the dense mask and a masked float32 softmax over all S slots (the reference).
  "pallas_tpu"  Mosaic kernel, KV blocks clamped to the read range by scalar prefetch.
  "pallas_gpu"  Triton-lowered kernel, KV loop bounds from the read range, KV splits.
  "pallas"      chosen when the program is lowered (`lax.platform_dependent`, so an ahead-of-
                time compile for a TPU gets the Mosaic kernel): TPU → pallas_tpu, CUDA →
                pallas_gpu, any other platform → pallas_tpu in interpret mode (slow: tests).
  "auto"        the backend's kernel on a TPU or GPU (`default_impl`), "xla" elsewhere.
"""
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from kernels.attention import common
from kernels.attention import pallas_gpu
from kernels.attention import pallas_tpu

IMPLS = ("auto", "xla", "pallas", "pallas_tpu", "pallas_gpu")
_KERNELS = {"pallas_tpu": pallas_tpu, "pallas_gpu": pallas_gpu}
INVALID_POS = common.INVALID_POS
NO_WINDOW = common.NO_WINDOW


class CacheMask(NamedTuple):
  """Which cache slots each new token may attend to (a pytree of small arrays).

  Query t of row b may attend to slot s iff kv_start_B[b] <= s <= q_slot_T[t], k_pos_BS[b, s]
  != INVALID_POS (the slot holds a real token) and q_pos_BT[b, t] − k_pos_BS[b, s] < window.
  Build it with `cache_mask`, once per decode step: every layer reuses it.
  """
  q_pos_BT: jax.Array    # int32 rotary position of each new token
  q_slot_T: jax.Array    # int32 cache slot of each new token
  k_pos_BS: jax.Array    # int32 rotary position of each slot's token, INVALID_POS if none
  kv_start_B: jax.Array  # int32 first real slot of each row (0 for a row without one)
  window: jax.Array      # int32 scalar: sliding window, NO_WINDOW for global attention


def cache_mask(q_pos_BT, q_slot_T, k_pos_BS, k_valid_BS, window=None) -> CacheMask:
  """The `CacheMask` of `decoder_math.allowed(cfg, q_pos_BT, k_pos_BS, q_slot_T, k_valid_BS)`
  (its global mask; its local one with `window=cfg.sliding_window`)."""
  k_valid_BS = k_valid_BS.astype(bool)
  return CacheMask(
      q_pos_BT=q_pos_BT.astype(jnp.int32), q_slot_T=q_slot_T.astype(jnp.int32),
      k_pos_BS=jnp.where(k_valid_BS, k_pos_BS.astype(jnp.int32), INVALID_POS),
      kv_start_B=jnp.argmax(k_valid_BS, axis=1).astype(jnp.int32),
      window=jnp.asarray(NO_WINDOW if window is None else window, jnp.int32))


def kv_len(mask: CacheMask, num_slots: int):
  """The read bound: one past the last query slot (causal), within [1, S]."""
  return jnp.clip(jnp.max(mask.q_slot_T) + 1, 1, num_slots)


def dense_mask(mask: CacheMask, num_slots: int):
  """The `[B, T, S]` bool mask `mask` stands for."""
  slot_S = jnp.arange(num_slots, dtype=jnp.int32)
  return common.allowed(slot_S[None, None], mask.k_pos_BS[:, None], mask.q_slot_T[None, :, None],
                        mask.q_pos_BT[..., None], mask.kv_start_B[:, None, None],
                        kv_len(mask, num_slots), mask.window)


def decode_attention_reference(q_BTHK, k_BGSK, v_BGSK, mask: CacheMask, *, scale: float,
                               softcap: float | None = None):
  """The "xla" impl: float32 scores and softmax over all S slots with the dense mask, at
  full matmul precision; slots outside `[kv_start, kv_len)` are zeroed, never read."""
  b, t, h, kd = q_BTHK.shape
  g, s_len = k_BGSK.shape[1], k_BGSK.shape[2]
  ok_BTS = dense_mask(mask, s_len)
  slot_S = jnp.arange(s_len, dtype=jnp.int32)
  read_BS = (slot_S[None] >= mask.kv_start_B[:, None]) & (slot_S[None] < kv_len(mask, s_len))
  zero = lambda x: jnp.where(read_BS[:, None, :, None], x, 0).astype(jnp.float32)
  q_BTGRK = q_BTHK.reshape(b, t, g, h // g, kd).astype(jnp.float32)
  einsum = functools.partial(jnp.einsum, precision=jax.lax.Precision.HIGHEST)
  s_BGRTS = einsum("btgrk,bgsk->bgrts", q_BTGRK, zero(k_BGSK)) * scale
  if softcap is not None:
    s_BGRTS = softcap * jnp.tanh(s_BGRTS / softcap)
  ok_BGRTS = jnp.broadcast_to(ok_BTS[:, None, None], s_BGRTS.shape)
  s_BGRTS = jnp.where(ok_BGRTS, s_BGRTS, common.NEG_INF)
  p_BGRTS = jnp.where(ok_BGRTS, jnp.exp(s_BGRTS - jnp.max(s_BGRTS, -1, keepdims=True)), 0.0)
  l_BGRT1 = jnp.sum(p_BGRTS, -1, keepdims=True)
  o_BGRTK = common.normalize(einsum("bgrts,bgsk->bgrtk", p_BGRTS, zero(v_BGSK)), l_BGRT1)
  return jnp.einsum("bgrtk->btgrk", o_BGRTK).reshape(b, t, h, kd).astype(v_BGSK.dtype)


def default_impl(backend: str | None = None) -> str:
  """The implementation `impl="auto"` resolves to on `backend` (default: JAX's default)."""
  backend = backend or jax.default_backend()
  return {"tpu": "pallas_tpu", "gpu": "pallas_gpu"}.get(backend, "xla")


def _kernel_call(impl, q_BTHK, k_BGSK, v_BGSK, mask: CacheMask, *, scale, softcap,
                 block_sizes, interpret):
  """Lays the query heads out as `[B, G, T·R, K]` rows (t major, r minor) for `impl`."""
  b, t, h, kd = q_BTHK.shape
  g, s_len = k_BGSK.shape[1], k_BGSK.shape[2]
  r = h // g
  hi = kv_len(mask, s_len)
  q_BGNK = jnp.einsum("btgrk->bgtrk", q_BTHK.reshape(b, t, g, r, kd)).reshape(b, g, t * r, kd)
  rows = lambda x: jnp.repeat(x.astype(jnp.int32), r, axis=-1)[..., None]  # [..., T·R, 1]
  o_BGNK = _KERNELS[impl].attend(
      q_BGNK.astype(k_BGSK.dtype), k_BGSK, v_BGSK, rows(mask.q_slot_T), rows(mask.q_pos_BT),
      mask.k_pos_BS[:, None, :], jnp.clip(mask.kv_start_B, 0, hi).astype(jnp.int32),
      jnp.stack([hi, mask.window]).astype(jnp.int32), scale=scale, softcap=softcap,
      block_sizes=block_sizes or _KERNELS[impl].BlockSizes(), interpret=interpret)
  return jnp.einsum("bgtrk->btgrk", o_BGNK.reshape(b, g, t, r, kd)).reshape(b, t, h, kd)


def _validate(q_BTHK, k_BGSK, v_BGSK, mask, impl, block_sizes):
  if impl not in IMPLS:
    raise ValueError(f"Unknown decode attention impl {impl!r}; expected one of {IMPLS}.")
  if q_BTHK.ndim != 4 or k_BGSK.ndim != 4 or k_BGSK.shape != v_BGSK.shape:
    raise ValueError(f"Expected q [B, T, H, K] and k, v [B, G, S, K]; got {q_BTHK.shape}, "
                     f"{k_BGSK.shape}, {v_BGSK.shape}.")
  (b, t, h, kd), (_, g, s_len, _) = q_BTHK.shape, k_BGSK.shape
  if k_BGSK.shape[::3] != (b, kd) or h % g:
    raise ValueError(f"q {q_BTHK.shape} does not fit k, v {k_BGSK.shape}: same B and K, and "
                     "H a multiple of G.")
  if (mask.q_pos_BT.shape, mask.q_slot_T.shape, mask.k_pos_BS.shape, mask.kv_start_B.shape,
      jnp.shape(mask.window)) != ((b, t), (t,), (b, s_len), (b,), ()):
    raise ValueError("CacheMask shapes do not fit q and k: build it with cache_mask().")
  if block_sizes is not None and impl not in _KERNELS:
    raise ValueError(f"block_sizes needs impl='pallas_tpu' or 'pallas_gpu', not {impl!r}.")


def decode_attention(q_BTHK, k_BGSK, v_BGSK, mask: CacheMask, *, scale: float,
                     softcap: float | None = None, impl: str = "auto", block_sizes=None,
                     interpret=False):
  """Softmax attention of T new tokens over the cache slots `mask` allows, `[B, T, H, K]`.

  Args:
    q_BTHK: queries (rotary already applied), H = G·R heads.
    k_BGSK, v_BGSK: one layer's cache, the new tokens' keys and values already written.
    mask: `cache_mask(...)` of this step.
    scale, softcap: Python floats: scores are `cap·tanh(q·k·scale / cap)` when softcap is set.
    impl: one of IMPLS (module docstring).
    block_sizes: `pallas_tpu.BlockSizes` / `pallas_gpu.BlockSizes` for those impls.
    interpret: run the pallas_tpu / pallas_gpu kernel in interpret mode (CPU tests);
      impl="pallas" interprets wherever it has no compiled kernel.
  Returns:
    the attention outputs in the values' dtype.
  """
  _validate(q_BTHK, k_BGSK, v_BGSK, mask, impl, block_sizes)
  impl = default_impl() if impl == "auto" else impl
  kw = dict(scale=float(scale), softcap=None if softcap is None else float(softcap))
  if impl == "xla":
    return decode_attention_reference(q_BTHK, k_BGSK, v_BGSK, mask, **kw)
  call = functools.partial(_kernel_call, q_BTHK=q_BTHK, k_BGSK=k_BGSK, v_BGSK=v_BGSK,
                           mask=mask, block_sizes=block_sizes, **kw)
  if impl != "pallas":
    return call(impl, interpret=interpret)
  branch = lambda impl, interpret: lambda: call(impl, interpret=interpret)
  return jax.lax.platform_dependent(tpu=branch("pallas_tpu", False),
                                    cuda=branch("pallas_gpu", False),
                                    default=branch("pallas_tpu", True))
