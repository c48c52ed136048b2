# pylint: disable=invalid-name,protected-access
"""Pallas TPU (Mosaic) kernels for the teacher-student KL op (docs/kernels.md §9).

The log-prob kernels of pallas_tpu.py with two models: every grid step computes the student's
and the teacher's `[tn, tv]` logit tiles from their own `[tn, D]` hidden tiles and `[D, tv]`
unembedding tiles (D may differ between the models; V may not).

Forward: grid `(N/tn "parallel", V/tv "arbitrary")`, the five `kl_common.KLStats` running in
VMEM scratch and merged tile by tile (online logsumexp). Backward: a `dh` kernel (grid
`(N/tn, V/tv)`, accumulating `[tn, D]`) and a `dW` kernel (grid `(V/tv, N/tn)`, accumulating
`[D, tv]`), each recomputing both logit tiles; the per-token `lse_s, lse_t, KL, g` travel as
one `[N, 4]` operand. Ragged N and V are masked with `where`, never padded in HBM.

Full vocabulary only: the top-k variant needs a per-token sort, which Mosaic does not lower,
and its restricted part is O(N·k·D); `kl.distill_kl` runs it on the xla path (kl_xla.py).
"""
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.logprob import common
from kernels.logprob import kl_common
from kernels.logprob import pallas_tpu

BlockSizes = pallas_tpu.BlockSizes


def _tile_logits(hs_ref, ws_ref, ht_ref, wt_ref, v_tile, *, tv, v, temperature):
  """`(z_s, z_t, col, valid)` for the `[tn, tv]` tiles at vocab block `v_tile`."""
  z_s, z_t = (common.transform(jnp.dot(h_ref[...], w_ref[...], preferred_element_type=jnp.float32),
                               temperature=temperature, softcap=None)[0]
              for h_ref, w_ref in ((hs_ref, ws_ref), (ht_ref, wt_ref)))
  col = v_tile * tv + jax.lax.broadcasted_iota(jnp.int32, z_s.shape, 1)
  return z_s, z_t, col, col < v


def _fwd_kernel(hs_ref, ws_ref, ht_ref, wt_ref, *refs, tv, v, temperature, kind):
  out_refs, scratch = refs[:5], refs[5:]
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _():
    for ref, init in zip(scratch, (common.NEG_INF, 0.0, 0.0, common.NEG_INF, 0.0)):
      ref[...] = jnp.full_like(ref, init)

  z_s, z_t, _, valid = _tile_logits(hs_ref, ws_ref, ht_ref, wt_ref, j, tv=tv, v=v,
                                    temperature=temperature)
  tile = kl_common.tile_stats(*kl_common.anchor_first(z_s, z_t, kind), valid)
  new = kl_common.merge(kl_common.KLStats(*(ref[...] for ref in scratch)), tile)
  for ref, x in zip(scratch, new):
    ref[...] = x

  @pl.when(j == pl.num_programs(1) - 1)
  def _():
    for out, ref in zip(out_refs, scratch):
      out[...] = ref[...]


def _specs(tn, tv, d_s, d_t, order):
  """BlockSpecs of h_s, W_s, h_t, W_t for grid index order "tv" (i, j) or "vt" (j, i)."""
  row = (lambda i, j: (i, 0)) if order == "tv" else (lambda j, i: (i, 0))
  col = (lambda i, j: (0, j)) if order == "tv" else (lambda j, i: (0, j))
  return [pl.BlockSpec((tn, d_s), row), pl.BlockSpec((d_s, tv), col),
          pl.BlockSpec((tn, d_t), row), pl.BlockSpec((d_t, tv), col)]


def forward_stats(h_s, w_s, h_t, w_t, *, kind: str, temperature: float = 1.0,
                  block_sizes: BlockSizes = BlockSizes(), interpret=False) -> kl_common.KLStats:
  """Per-token full-vocabulary `KLStats` (1-D `[N]` fields)."""
  (n, d_s), d_t, v = h_s.shape, h_t.shape[1], w_s.shape[1]
  tn, tv = pallas_tpu.tiles(n, v, block_sizes)
  row_spec = pl.BlockSpec((tn, 1), lambda i, j: (i, 0))
  stats = pl.pallas_call(
      functools.partial(_fwd_kernel, tv=tv, v=v, temperature=temperature, kind=kind),
      grid=(pl.cdiv(n, tn), pl.cdiv(v, tv)),
      in_specs=_specs(tn, tv, d_s, d_t, "tv"),
      out_specs=[row_spec] * 5,
      out_shape=[jax.ShapeDtypeStruct((n, 1), jnp.float32)] * 5,
      scratch_shapes=[pltpu.VMEM((tn, 1), jnp.float32)] * 5,
      compiler_params=pallas_tpu.compiler_params(block_sizes, ("parallel", "arbitrary")),
      interpret=interpret,
      name="distill_kl_fwd",
  )(h_s, w_s, h_t, w_t)
  return kl_common.KLStats(*(x[:, 0] for x in stats))


def _tile_ds(hs_ref, ws_ref, ht_ref, wt_ref, tok_ref, v_tile, *, tv, v, temperature, kind,
             row_valid=None):
  """Cotangent of the student's raw logit tile (zero on masked rows and columns)."""
  z_s, z_t, _, valid = _tile_logits(hs_ref, ws_ref, ht_ref, wt_ref, v_tile, tv=tv, v=v,
                                    temperature=temperature)
  if row_valid is not None:
    valid = jnp.logical_and(valid, row_valid)
  tok = tok_ref[...]  # [tn, 4]: lse_s, lse_t, KL, g
  lse_s, lse_t, kl, g = (tok[:, k:k + 1] for k in range(4))
  dz = kl_common.dlogits(z_s, z_t, valid, lse_s, lse_t, kl, g, kind)
  return (dz * (1.0 / temperature)).astype(ws_ref.dtype)


def _dh_kernel(hs_ref, ws_ref, ht_ref, wt_ref, tok_ref, dh_ref, acc_sc, *, tv, v, **kw):
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _():
    acc_sc[...] = jnp.zeros_like(acc_sc)

  ds = _tile_ds(hs_ref, ws_ref, ht_ref, wt_ref, tok_ref, j, tv=tv, v=v, **kw)
  # Out-of-range W columns may be NaN garbage: 0 · NaN would still poison the matmul.
  col_1v = j * tv + jax.lax.broadcasted_iota(jnp.int32, (1, tv), 1)
  w = jnp.where(col_1v < v, ws_ref[...], 0).astype(ws_ref.dtype)
  acc_sc[...] += jax.lax.dot_general(ds, w, (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32)

  @pl.when(j == pl.num_programs(1) - 1)
  def _():
    dh_ref[...] = acc_sc[...]


def _dw_kernel(hs_ref, ws_ref, ht_ref, wt_ref, tok_ref, dw_ref, acc_sc, *, tn, tv, n, v, **kw):
  j, i = pl.program_id(0), pl.program_id(1)

  @pl.when(i == 0)
  def _():
    acc_sc[...] = jnp.zeros_like(acc_sc)

  row = i * tn + jax.lax.broadcasted_iota(jnp.int32, (tn, 1), 0)
  ds = _tile_ds(hs_ref, ws_ref, ht_ref, wt_ref, tok_ref, j, tv=tv, v=v, row_valid=row < n, **kw)
  h = jnp.where(row < n, hs_ref[...], 0).astype(hs_ref.dtype)
  acc_sc[...] += jax.lax.dot_general(h, ds, (((0,), (0,)), ((), ())),
                                     preferred_element_type=jnp.float32)

  @pl.when(i == pl.num_programs(1) - 1)
  def _():
    dw_ref[...] = acc_sc[...]


def backward(h_s, w_s, h_t, w_t, lse_s, lse_t, kl, g, *, kind: str, temperature: float = 1.0,
             block_sizes: BlockSizes = BlockSizes(), interpret=False):
  """Float32 `(dh_s, dW_s)`; same contract as `kl_xla.backward`."""
  (n, d_s), d_t, v = h_s.shape, h_t.shape[1], w_s.shape[1]
  tn, tv = pallas_tpu.tiles(n, v, block_sizes)
  tok_N4 = jnp.stack([lse_s, lse_t, kl, g], axis=1).astype(jnp.float32)
  kw = dict(tv=tv, v=v, temperature=temperature, kind=kind)
  params = pallas_tpu.compiler_params(block_sizes, ("parallel", "arbitrary"))
  grid = (pl.cdiv(n, tn), pl.cdiv(v, tv))
  dh = pl.pallas_call(
      functools.partial(_dh_kernel, **kw),
      grid=grid,
      in_specs=_specs(tn, tv, d_s, d_t, "tv") + [pl.BlockSpec((tn, 4), lambda i, j: (i, 0))],
      out_specs=pl.BlockSpec((tn, d_s), lambda i, j: (i, 0)),
      out_shape=jax.ShapeDtypeStruct((n, d_s), jnp.float32),
      scratch_shapes=[pltpu.VMEM((tn, d_s), jnp.float32)],
      compiler_params=params,
      interpret=interpret,
      name="distill_kl_bwd_dh",
  )(h_s, w_s, h_t, w_t, tok_N4)
  dw = pl.pallas_call(
      functools.partial(_dw_kernel, tn=tn, n=n, **kw),
      grid=grid[::-1],
      in_specs=_specs(tn, tv, d_s, d_t, "vt") + [pl.BlockSpec((tn, 4), lambda j, i: (i, 0))],
      out_specs=pl.BlockSpec((d_s, tv), lambda j, i: (0, j)),
      out_shape=jax.ShapeDtypeStruct((d_s, v), jnp.float32),
      scratch_shapes=[pltpu.VMEM((d_s, tv), jnp.float32)],
      compiler_params=params,
      interpret=interpret,
      name="distill_kl_bwd_dw",
  )(h_s, w_s, h_t, w_t, tok_N4)
  return dh, dw
