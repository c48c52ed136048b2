# pylint: disable=invalid-name
"""Pallas GPU (Triton-lowered) decode attention: flash-decoding with KV splits.

The Triton backend of `pl.pallas_call` (`plgpu.CompilerParams`, from
`jax.experimental.pallas.triton`) is present in jax 0.10.2 and 0.12 (docs/kernels.md §4).
Grid `(B, G · row tiles, splits)`: program (b, g·i, c) holds the `[rows, K]` query tile of one
(row, KV head) — the R query heads sharing that KV head times the T new tokens, so each KV
block is read once per (b, g) and split — and loops (`fori_loop`) over its share of the KV
blocks overlapping the row's read range `[lo_b, hi)`, merging each `[slots, K]` block into a
running max, sum and weighted sum (online softmax). The loop bounds come from `lo_b` and `hi`
at run time, so the empty tail `[hi, S)` and the blocks before a row's first real token are
never loaded, and the splits divide the range that is read (not all S slots) between them:
flash-decoding's parallelism over the KV axis when B·G programs would leave SMs idle. Each
split writes its unnormalised partials, merged afterwards (`merge_splits`).

Triton tensors have power-of-two shapes (≥ 16 for `tl.dot`): the row tile and head dim are
padded with masked loads, so any R·T and K work.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.attention import common


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """rows: most query rows per program; slots: KV slots per block (powers of two ≥ 16);
  splits: programs sharing one (row, KV head)'s read range."""
  rows: int = 64
  slots: int = 64
  splits: int = 8
  num_warps: int = 4
  num_stages: int = 2


def _pow2(x: int) -> int:
  return 1 << max(4, (x - 1).bit_length())   # >= 16


def tiles(rows: int, head_dim: int, block_sizes: BlockSizes):
  for name in ("rows", "slots"):
    x = getattr(block_sizes, name)
    if x < 16 or x & (x - 1):
      raise ValueError(f"pallas_gpu.BlockSizes.{name} must be a power of two >= 16 (Triton "
                       f"tensor shapes and tl.dot), got {x}.")
  if block_sizes.splits < 1:
    raise ValueError(f"pallas_gpu.BlockSizes.splits must be >= 1, got {block_sizes.splits}.")
  return min(_pow2(rows), block_sizes.rows), block_sizes.slots, _pow2(head_dim)


def split_range(split, splits: int, lo, hi, bk):
  """`[start, end)` KV blocks of split `split`: an even share of those overlapping `[lo, hi)`."""
  div = jax.lax.div   # operands are non-negative
  first, last = div(lo, bk), div(hi + bk - 1, bk)
  per = div(jnp.maximum(last - first, 0) + splits - 1, splits)
  start = first + split * per
  return start, jnp.minimum(start + per, last)


def _iota(shape, axis, start=0):
  return start + jax.lax.broadcasted_iota(jnp.int32, shape, axis)


def _kernel(lo_ref, bounds_ref, q_slot_ref, q_pos_ref, q_ref, k_ref, v_ref, k_pos_ref,
            o_ref, m_ref, l_ref, *, tq, bk, kp, row_tiles, splits, scale, softcap):
  n, kd = q_ref.shape[2], q_ref.shape[3]
  s_len = k_ref.shape[2]
  b, gi, c = pl.program_id(0), pl.program_id(1), pl.program_id(2)
  g, r0 = jax.lax.div(gi, row_tiles), jax.lax.rem(gi, row_tiles) * tq
  lo, hi, window = lo_ref[b], bounds_ref[0], bounds_ref[1]
  row_ok = _iota((tq, 1), 0, r0) < n
  dim_ok = _iota((1, kp), 1) < kd
  q = plgpu.load(q_ref.at[b, g, pl.ds(r0, tq), pl.ds(0, kp)], mask=row_ok & dim_ok, other=0.0)
  q_slot = plgpu.load(q_slot_ref.at[pl.ds(r0, tq), :], mask=row_ok, other=0)
  q_pos = plgpu.load(q_pos_ref.at[b, pl.ds(r0, tq), :], mask=row_ok, other=0)

  def body(blk, carry):
    s0 = blk * bk
    slot_1S, slot_S1 = _iota((1, bk), 1, s0), _iota((bk, 1), 0, s0)
    kv_mask = (slot_S1 < s_len) & dim_ok
    k = plgpu.load(k_ref.at[b, g, pl.ds(s0, bk), pl.ds(0, kp)], mask=kv_mask, other=0.0)
    v = plgpu.load(v_ref.at[b, g, pl.ds(s0, bk), pl.ds(0, kp)], mask=kv_mask, other=0.0)
    k_pos = plgpu.load(k_pos_ref.at[b, :, pl.ds(s0, bk)], mask=slot_1S < s_len,
                       other=common.INVALID_POS)
    ok = common.allowed(slot_1S, k_pos, q_slot, q_pos, lo, hi, window)
    v = jnp.where((slot_S1 >= lo) & (slot_S1 < hi), v, 0)
    s = common.scores(q, k, scale=scale, softcap=softcap)
    return common.online_softmax_step(*carry, s, ok, v)

  start, end = split_range(c, splits, lo, hi, bk)
  init = (jnp.full((tq, 1), common.NEG_INF, jnp.float32), jnp.zeros((tq, 1), jnp.float32),
          jnp.zeros((tq, kp), jnp.float32))
  m, l, acc = jax.lax.fori_loop(start, end, body, init)
  plgpu.store(o_ref.at[c, b, g, pl.ds(r0, tq), pl.ds(0, kp)], acc, mask=row_ok & dim_ok)
  plgpu.store(m_ref.at[c, b, g, pl.ds(r0, tq), :], m, mask=row_ok)
  plgpu.store(l_ref.at[c, b, g, pl.ds(r0, tq), :], l, mask=row_ok)


def merge_splits(acc_CBGNK, m_CBGN1, l_CBGN1):
  """Normalised outputs from the splits' partials (a split that read nothing has l = 0)."""
  w_CBGN1 = jnp.exp(m_CBGN1 - jnp.max(m_CBGN1, axis=0, keepdims=True))
  return common.normalize(jnp.sum(w_CBGN1 * acc_CBGNK, axis=0), jnp.sum(w_CBGN1 * l_CBGN1, 0))


def attend(q_BGNK, k_BGSK, v_BGSK, q_slot_N1, q_pos_BN1, k_pos_B1S, lo_B, bounds_2, *,
           scale: float, softcap: float | None, block_sizes: BlockSizes = BlockSizes(),
           interpret=False):
  """`[B, G, N, K]` attention outputs; same contract as `pallas_tpu.attend`."""
  b, g, n, kd = q_BGNK.shape
  tq, bk, kp = tiles(n, kd, block_sizes)
  row_tiles, splits = pl.cdiv(n, tq), block_sizes.splits
  kernel = functools.partial(_kernel, tq=tq, bk=bk, kp=kp, row_tiles=row_tiles, splits=splits,
                             scale=scale, softcap=softcap)
  part = lambda last, dtype: jax.ShapeDtypeStruct((splits, b, g, n, last), dtype)
  acc, m, l = pl.pallas_call(
      kernel,
      grid=(b, g * row_tiles, splits),
      out_shape=[part(kd, jnp.float32), part(1, jnp.float32), part(1, jnp.float32)],
      compiler_params=plgpu.CompilerParams(num_warps=block_sizes.num_warps,
                                           num_stages=block_sizes.num_stages),
      interpret=interpret,
      name="decode_attention_triton",
  )(lo_B, bounds_2, q_slot_N1, q_pos_BN1, q_BGNK, k_BGSK, v_BGSK, k_pos_B1S)
  return merge_splits(acc, m, l).astype(v_BGSK.dtype)
