# pylint: disable=invalid-name
"""Pallas TPU (Mosaic) decode attention: flash-decoding over the blocks a row can see.

Grid `(B, G, row tiles, KV blocks)`, the last axis "arbitrary": each step multiplies the
`[rows, K]` query tile of one (row, KV head) — the R query heads sharing that KV head times the
T new tokens, so every KV block is read once per (b, g) — with one `[slots, K]` block of keys
and values, and merges it into a running max, sum and weighted sum in VMEM (online softmax).

Ragged, as JAX's paged and ragged attention kernels are: the read range `[lo_b, hi)` is
scalar-prefetched into SMEM, the keys', values' and positions' `index_map` clamps the block
index into that range (`kv_block_index`), and the body runs only for blocks inside it. A grid
step outside the range asks for the block the previous step already holds, and the pipeline
issues no copy for a repeated block index: the empty tail `[hi, S)` of the cache and the
blocks before a row's first real token are never read (those steps cost only the grid step's
fixed overhead).

Out-of-bounds parts of a ragged last block hold garbage (NaN in interpret mode); every score
is masked with `where` and the values outside the range are zeroed before the matmul.

Layout: XLA's TPU layout for a cache whose head dim K is not a multiple of 128 (SmolLM2's and
Qwen2.5-0.5B's 64) puts the slots in the minor (lane) dimension, so the kernel reads such a
cache as `[B, G, K, S]` (a transpose that is free in that layout) and multiplies transposed
`[K, slots]` blocks; read as `[B, G, S, K]` the whole cache would be copied into the other
layout before every call (seen in decode steps compiled for TPU chips, docs/kernels.md §10.4).
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.attention import common


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """rows: query rows (R·T) per tile, a multiple of 8 (all rows when fewer); slots: KV slots
  per block, a multiple of 128 (all S when fewer)."""
  rows: int = 256
  slots: int = 512
  vmem_limit_bytes: int | None = None


def tiles(rows: int, num_slots: int, block_sizes: BlockSizes):
  if block_sizes.rows % 8 or block_sizes.slots % 128:
    raise ValueError(f"pallas_tpu.BlockSizes needs rows % 8 == 0 and slots % 128 == 0 "
                     f"(TPU (8, 128) tiling), got {block_sizes}.")
  tq = rows if rows <= block_sizes.rows else block_sizes.rows
  bk = num_slots if num_slots <= block_sizes.slots else block_sizes.slots
  return tq, bk


def kv_block_index(j, lo, hi, bk):
  """The KV block grid step j fetches: j clamped into the blocks overlapping `[lo, hi)`.

  Steps before the first such block fetch the first one (which the first step inside then
  reuses), steps after the last one keep the last. Needs 0 <= lo <= hi and hi >= 1.
  """
  first = jax.lax.div(jnp.minimum(lo, hi - 1), bk)   # lax.div: non-negative, no sign op
  last = jax.lax.div(hi + bk - 1, bk) - 1
  return jnp.clip(j, first, last)


def slots_minor(head_dim: int) -> bool:
  """Whether the kernel reads the cache with slots minor (`[B, G, K, S]`), see above."""
  return head_dim % 128 != 0


def _kernel(lo_ref, bounds_ref, q_slot_ref, q_pos_ref, q_ref, k_ref, v_ref, k_pos_ref, o_ref,
            m_sc, l_sc, acc_sc, *, bk, scale, softcap, slots_axis):
  b, j = pl.program_id(0), pl.program_id(3)
  lo, hi, window = lo_ref[b], bounds_ref[0], bounds_ref[1]

  @pl.when(j == 0)
  def _():
    m_sc[...] = jnp.full_like(m_sc, common.NEG_INF)
    l_sc[...] = jnp.zeros_like(l_sc)
    acc_sc[...] = jnp.zeros_like(acc_sc)

  # Inside the read range, the block kv_block_index fetched for step j is block j.
  @pl.when((j >= jax.lax.div(lo, bk)) & (j * bk < hi))
  def _():
    slot_1S = j * bk + jax.lax.broadcasted_iota(jnp.int32, (1, bk), 1)
    ok = common.allowed(slot_1S, k_pos_ref[...], q_slot_ref[...], q_pos_ref[...], lo, hi,
                        window)
    slot_v = j * bk + jax.lax.broadcasted_iota(jnp.int32, v_ref.shape, slots_axis)
    v = jnp.where((slot_v >= lo) & (slot_v < hi), v_ref[...], 0)
    s = common.scores(q_ref[...], k_ref[...], scale=scale, softcap=softcap,
                      slots_axis=slots_axis)
    m, l, acc = common.online_softmax_step(m_sc[...], l_sc[...], acc_sc[...], s, ok, v,
                                           slots_axis=slots_axis)
    m_sc[...], l_sc[...], acc_sc[...] = m, l, acc

  @pl.when(j == pl.num_programs(3) - 1)
  def _():
    o_ref[...] = common.normalize(acc_sc[...], l_sc[...]).astype(o_ref.dtype)


def attend(q_BGNK, k_BGSK, v_BGSK, q_slot_N1, q_pos_BN1, k_pos_B1S, lo_B, bounds_2, *,
           scale: float, softcap: float | None, block_sizes: BlockSizes = BlockSizes(),
           interpret=False):
  """`[B, G, N, K]` attention outputs of N = T·R query rows per (row, KV head) (ops.py lays
  them out); lo_B: int32 first slot read per row; bounds_2: int32 (hi, window)."""
  b, g, n, kd = q_BGNK.shape
  s_len = k_BGSK.shape[2]
  tq, bk = tiles(n, s_len, block_sizes)
  slots_axis = int(slots_minor(kd))
  kv = (k_BGSK, v_BGSK)
  if slots_axis:
    kv = tuple(jnp.swapaxes(x, 2, 3) for x in kv)   # [B, G, K, S]

  def kv_map(ib, ig, iq, j, lo_ref, bounds_ref):
    del iq
    block = kv_block_index(j, lo_ref[ib], bounds_ref[0], bk)
    return (ib, ig, 0, block) if slots_axis else (ib, ig, block, 0)

  def pos_map(ib, ig, iq, j, lo_ref, bounds_ref):
    del ig, iq
    return ib, 0, kv_block_index(j, lo_ref[ib], bounds_ref[0], bk)

  q_spec = pl.BlockSpec((None, None, tq, kd), lambda ib, ig, iq, j, *_: (ib, ig, iq, 0))
  kv_spec = pl.BlockSpec((None, None) + ((kd, bk) if slots_axis else (bk, kd)), kv_map)
  grid_spec = pltpu.PrefetchScalarGridSpec(
      num_scalar_prefetch=2,
      grid=(b, g, pl.cdiv(n, tq), pl.cdiv(s_len, bk)),
      in_specs=[pl.BlockSpec((tq, 1), lambda ib, ig, iq, j, *_: (iq, 0)),
                pl.BlockSpec((None, tq, 1), lambda ib, ig, iq, j, *_: (ib, iq, 0)),
                q_spec, kv_spec, kv_spec,
                pl.BlockSpec((None, 1, bk), pos_map)],
      out_specs=q_spec,
      scratch_shapes=[pltpu.VMEM((tq, 1), jnp.float32), pltpu.VMEM((tq, 1), jnp.float32),
                      pltpu.VMEM((tq, kd), jnp.float32)])
  return pl.pallas_call(
      functools.partial(_kernel, bk=bk, scale=scale, softcap=softcap, slots_axis=slots_axis),
      grid_spec=grid_spec,
      out_shape=jax.ShapeDtypeStruct((b, g, n, kd), v_BGSK.dtype),
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary"),
          vmem_limit_bytes=block_sizes.vmem_limit_bytes),
      interpret=interpret,
      name="decode_attention",
  )(lo_B, bounds_2, q_slot_N1, q_pos_BN1, q_BGNK, *kv, k_pos_B1S)
