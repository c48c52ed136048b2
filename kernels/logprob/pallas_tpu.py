# pylint: disable=invalid-name
"""Pallas TPU (Mosaic) kernels for per-token log-probs and their backward (docs/kernels.md §4, §8).

Forward: grid `(N/tn "parallel", V/tv "arbitrary")`; each step computes a `[tn, tv]` logit tile
(bf16 in, float32 accumulate), masks the ragged last vocab tile by iota, and merges the tile into
running `(m, l, t, a)` statistics held in VMEM scratch (online logsumexp, as Cut Cross-Entropy
and Levanter's fused CE). The kernel returns the raw statistics, so the same call serves the
single-device op and a vocab-parallel wrapper (common.py).

Backward: two kernels that each recompute the logit tile (the FlashAttention dq/dkv split,
10NDV): `dh` with grid `(N/tn "parallel", V/tv "arbitrary")` accumulating `[tn, D]` in VMEM, and
`dW` with grid `(V/tv "parallel", N/tn "arbitrary")` accumulating `[D, tv]`.

Ragged N and V are not padded in HBM: out-of-bounds block reads hold garbage (NaN in interpret
mode), so every tile is masked with `where` before it can reach a sum or a matmul.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from kernels.logprob import common


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes: rows (tokens, multiple of 8) and vocab (multiple of 128).

  docs/kernels.md §3: rows ≥ 512–1024 keeps the W stream above the ridge point; vocab is bounded
  by scoped VMEM (`D·vocab·2B·2 + rows·vocab·4B`). Both are clipped to the problem size.
  """
  rows: int = 512
  vocab: int = 1024
  vmem_limit_bytes: int | None = None


def tiles(n: int, v: int, block_sizes: BlockSizes):
  if block_sizes.rows % 8 or block_sizes.vocab % 128:
    raise ValueError(f"pallas_tpu.BlockSizes needs rows % 8 == 0 and vocab % 128 == 0 "
                     f"(TPU (8, 128) tiling), got {block_sizes}.")
  return min(block_sizes.rows, pl.cdiv(n, 8) * 8), min(block_sizes.vocab, pl.cdiv(v, 128) * 128)


def compiler_params(block_sizes: BlockSizes, semantics):
  return pltpu.CompilerParams(dimension_semantics=semantics,
                              vmem_limit_bytes=block_sizes.vmem_limit_bytes)


def _tile_logits(h_ref, w_ref, v_tile, *, tv, v, temperature, softcap):
  """`(z, dz/ds, col, valid)` for the `[tn, tv]` tile at vocab block `v_tile`."""
  s = jnp.dot(h_ref[...], w_ref[...], preferred_element_type=jnp.float32)
  z, dz_ds = common.transform(s, temperature=temperature, softcap=softcap)
  col = v_tile * tv + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
  return z, dz_ds, col, col < v


def _fwd_kernel(h_ref, w_ref, y_ref, m_ref, l_ref, t_ref, a_ref, m_sc, l_sc, t_sc, a_sc, *,
                tv, v, temperature, softcap, with_entropy):
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _():
    m_sc[...] = jnp.full_like(m_sc, common.NEG_INF)
    for ref in (l_sc, t_sc, a_sc):
      ref[...] = jnp.zeros_like(ref)

  z, _, col, valid = _tile_logits(h_ref, w_ref, j, tv=tv, v=v, temperature=temperature,
                                  softcap=softcap)
  tile = common.tile_stats(z, col, y_ref[...], valid, with_entropy)
  new = common.merge(m_sc[...], l_sc[...], t_sc[...], a_sc[...], *tile)
  for ref, x in zip((m_sc, l_sc, t_sc, a_sc), new):
    ref[...] = x

  @pl.when(j == pl.num_programs(1) - 1)
  def _():
    for out, ref in zip((m_ref, l_ref, t_ref, a_ref), (m_sc, l_sc, t_sc, a_sc)):
      out[...] = ref[...]


def forward_stats(hidden_ND, w_DV, targets_N, *, temperature: float = 1.0,
                  softcap: float | None = None, with_entropy: bool = False,
                  block_sizes: BlockSizes = BlockSizes(), interpret=False) -> common.Stats:
  """Per-token `Stats` over the columns of `w_DV` (targets outside `[0, V)` give t = 0)."""
  (n, d), v = hidden_ND.shape, w_DV.shape[1]
  tn, tv = tiles(n, v, block_sizes)
  row_spec = pl.BlockSpec((tn, 1), lambda i, j: (i, 0))
  stats = pl.pallas_call(
      functools.partial(_fwd_kernel, tv=tv, v=v, temperature=temperature, softcap=softcap,
                        with_entropy=with_entropy),
      grid=(pl.cdiv(n, tn), pl.cdiv(v, tv)),
      in_specs=[pl.BlockSpec((tn, d), lambda i, j: (i, 0)),  # h tile resident over j
                pl.BlockSpec((d, tv), lambda i, j: (0, j)),  # W streamed
                row_spec],
      out_specs=[row_spec] * 4,
      out_shape=[jax.ShapeDtypeStruct((n, 1), jnp.float32)] * 4,
      scratch_shapes=[pltpu.VMEM((tn, 1), jnp.float32)] * 4,
      compiler_params=compiler_params(block_sizes, ("parallel", "arbitrary")),
      interpret=interpret,
      name="logprob_fwd",
  )(hidden_ND, w_DV, targets_N.astype(jnp.int32).reshape(n, 1))
  return common.Stats(*(x[:, 0] for x in stats))


def _tile_dlogits(h_ref, w_ref, y_ref, tok_ref, v_tile, *, tv, v, temperature, softcap,
                  with_entropy, row_valid=None):
  z, dz_ds, col, valid = _tile_logits(h_ref, w_ref, v_tile, tv=tv, v=v,
                                      temperature=temperature, softcap=softcap)
  if row_valid is not None:
    valid = jnp.logical_and(valid, row_valid)
  tok = tok_ref[...]  # [tn, 4]: lse, E_p[z], g, g_ent
  lse, mean_z, g, g_ent = (tok[:, k:k + 1] for k in range(4))
  return common.dlogits(z, dz_ds, col, y_ref[...], valid, lse, mean_z, g,
                        g_ent if with_entropy else None)


def _dh_kernel(h_ref, w_ref, y_ref, tok_ref, dh_ref, acc_sc, *, tv, v, **kw):
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _():
    acc_sc[...] = jnp.zeros_like(acc_sc)

  ds = _tile_dlogits(h_ref, w_ref, y_ref, tok_ref, j, tv=tv, v=v, **kw)
  # Zero the out-of-range W columns too: 0 · NaN garbage would still be NaN in the matmul.
  col_1v = j * tv + jax.lax.broadcasted_iota(jnp.int32, (1, tv), 1)
  w = jnp.where(col_1v < v, w_ref[...], 0).astype(w_ref.dtype)
  acc_sc[...] += jax.lax.dot_general(ds.astype(w.dtype), w, (((1,), (1,)), ((), ())),
                                     preferred_element_type=jnp.float32)

  @pl.when(j == pl.num_programs(1) - 1)
  def _():
    dh_ref[...] = acc_sc[...]


def _dw_kernel(h_ref, w_ref, y_ref, tok_ref, dw_ref, acc_sc, *, tn, tv, n, v, **kw):
  j, i = pl.program_id(0), pl.program_id(1)

  @pl.when(i == 0)
  def _():
    acc_sc[...] = jnp.zeros_like(acc_sc)

  row = i * tn + jax.lax.broadcasted_iota(jnp.int32, (tn, 1), 0)
  ds = _tile_dlogits(h_ref, w_ref, y_ref, tok_ref, j, tv=tv, v=v, row_valid=row < n, **kw)
  h = jnp.where(row < n, h_ref[...], 0).astype(h_ref.dtype)
  acc_sc[...] += jax.lax.dot_general(h, ds.astype(h.dtype), (((0,), (0,)), ((), ())),
                                     preferred_element_type=jnp.float32)

  @pl.when(i == pl.num_programs(1) - 1)
  def _():
    dw_ref[...] = acc_sc[...]


def backward(hidden_ND, w_DV, targets_N, lse_N, mean_z_N, g_N, g_ent_N, *,
             temperature: float = 1.0, softcap: float | None = None,
             block_sizes: BlockSizes = BlockSizes(), interpret=False):
  """Returns float32 `(dh_ND, dW_DV)`; same contract as `xla.backward`."""
  (n, d), v = hidden_ND.shape, w_DV.shape[1]
  tn, tv = tiles(n, v, block_sizes)
  with_entropy = g_ent_N is not None
  g_ent_N = jnp.zeros_like(g_N) if g_ent_N is None else g_ent_N
  # One [N, 4] operand instead of four [N, 1] ones: fewer DMAs per grid step.
  tok_N4 = jnp.stack([lse_N, mean_z_N, g_N, g_ent_N], axis=1).astype(jnp.float32)
  y_N1 = targets_N.astype(jnp.int32).reshape(n, 1)
  kw = dict(tv=tv, v=v, temperature=temperature, softcap=softcap, with_entropy=with_entropy)
  grid = (pl.cdiv(n, tn), pl.cdiv(v, tv))
  dh = pl.pallas_call(
      functools.partial(_dh_kernel, **kw),
      grid=grid,
      in_specs=[pl.BlockSpec((tn, d), lambda i, j: (i, 0)),
                pl.BlockSpec((d, tv), lambda i, j: (0, j)),
                pl.BlockSpec((tn, 1), lambda i, j: (i, 0)),
                pl.BlockSpec((tn, 4), lambda i, j: (i, 0))],
      out_specs=pl.BlockSpec((tn, d), lambda i, j: (i, 0)),
      out_shape=jax.ShapeDtypeStruct((n, d), jnp.float32),
      scratch_shapes=[pltpu.VMEM((tn, d), jnp.float32)],
      compiler_params=compiler_params(block_sizes, ("parallel", "arbitrary")),
      interpret=interpret,
      name="logprob_bwd_dh",
  )(hidden_ND, w_DV, y_N1, tok_N4)
  dw = pl.pallas_call(
      functools.partial(_dw_kernel, tn=tn, n=n, **kw),
      grid=grid[::-1],
      in_specs=[pl.BlockSpec((tn, d), lambda j, i: (i, 0)),
                pl.BlockSpec((d, tv), lambda j, i: (0, j)),
                pl.BlockSpec((tn, 1), lambda j, i: (i, 0)),
                pl.BlockSpec((tn, 4), lambda j, i: (i, 0))],
      out_specs=pl.BlockSpec((d, tv), lambda j, i: (0, j)),
      out_shape=jax.ShapeDtypeStruct((d, v), jnp.float32),
      scratch_shapes=[pltpu.VMEM((d, tv), jnp.float32)],
      compiler_params=compiler_params(block_sizes, ("parallel", "arbitrary")),
      interpret=interpret,
      name="logprob_bwd_dw",
  )(hidden_ND, w_DV, y_N1, tok_N4)
  return dh, dw
