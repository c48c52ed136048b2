# pylint: disable=invalid-name
"""Pallas GPU (Triton-lowered) kernels for per-token log-probs and their backward.

The Triton backend of `pl.pallas_call` (compiler_params = `plgpu.CompilerParams`, from
`jax.experimental.pallas.triton`) is present in jax 0.10.2 and 0.12 (deprecated since 0.11 in
favour of Mosaic GPU, whose API changed between those releases; docs/kernels.md §4). Triton has no
sequential grid axes or scratch buffers, so each program loops over its tiles with `fori_loop`:

- Forward, grid `(N/tn, splits)`: program (i, k) streams vocab split k in `[tn, tv]` tiles,
  each tile a K-loop over `th`-wide slices of D (masked, so any D works; Triton tensors must be
  powers of two), and writes partial `(m, l, t, a)` per split, merged afterwards (verl's
  vocab-split design). Splits raise parallelism when N/tn is below the SM count.
- Backward (`BlockSizes.backward`): `"xla"` (default) hands the residuals to the XLA path's
  backward (`xla.backward`: recomputed logit chunks as cuBLAS GEMMs); `"triton"` runs two
  kernels that recompute the logit tiles (10NDV): `dh` with one program per token block, `dW`
  with one program per vocab block. Each program owns its output rows/columns and accumulates
  into them in HBM (read-modify-write per `th` slice), so there are no races and no `[tn, D]`
  register accumulator (D is up to several thousand). On an H200 the Triton backward measured
  several times slower than the XLA one (kernels/README.md: the `dh` grid has only N/tn
  programs, each looping over the whole vocabulary), hence the default.

Tested compiled on a GPU (ops_test.py, ops_accelerator_test.py) and in interpret mode on CPU.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from kernels.logprob import common
from kernels.logprob import xla


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes (powers of two, ≥ 16 for `tl.dot`): rows, vocab, depth (slice of D).

  `backward`: "xla" (`xla.backward` with `xla_blocks`) or "triton" (this module's kernels).
  """
  rows: int = 128
  vocab: int = 256
  depth: int = 64
  vocab_splits: int = 8
  num_warps: int = 8
  num_stages: int = 3
  backward: str = "xla"
  xla_blocks: xla.BlockSizes = xla.BlockSizes()


def _check(block_sizes: BlockSizes):
  if block_sizes.backward not in ("xla", "triton"):
    raise ValueError("pallas_gpu.BlockSizes.backward must be 'xla' or 'triton', got "
                     f"{block_sizes.backward!r}.")
  for name in ("rows", "vocab", "depth"):
    x = getattr(block_sizes, name)
    if x < 16 or x & (x - 1):
      raise ValueError(f"pallas_gpu.BlockSizes.{name} must be a power of two >= 16 (Triton "
                       f"tensor shapes and tl.dot), got {x}.")


def _params(block_sizes: BlockSizes):
  return plgpu.CompilerParams(num_warps=block_sizes.num_warps,
                              num_stages=block_sizes.num_stages)


def _iota(shape, axis, start):
  return start + jax.lax.broadcasted_iota(jnp.int32, shape, axis)


def _load_rows(ref, r0, tn, n, other=0.0):
  """Masked `[tn, 1]` load of rows `r0 : r0 + tn` of an `[N, 1]` ref."""
  return plgpu.load(ref.at[pl.ds(r0, tn), :], mask=_iota((tn, 1), 0, r0) < n, other=other)


def _logits(h_ref, w_ref, r0, c0, *, tn, tv, th, n, d, v):
  """Raw float32 logits of rows `r0:r0+tn` × columns `c0:c0+tv`, masked loads (OOB → 0)."""
  row_ok = _iota((tn, 1), 0, r0) < n
  col_ok = _iota((1, tv), 1, c0) < v

  def k_step(kk, acc):
    k0 = kk * th
    h = plgpu.load(h_ref.at[pl.ds(r0, tn), pl.ds(k0, th)],
                   mask=row_ok & (_iota((1, th), 1, k0) < d), other=0.0)
    w = plgpu.load(w_ref.at[pl.ds(k0, th), pl.ds(c0, tv)],
                   mask=(_iota((th, 1), 0, k0) < d) & col_ok, other=0.0)
    return acc + jnp.dot(h, w, preferred_element_type=jnp.float32)

  return jax.lax.fori_loop(0, pl.cdiv(d, th), k_step, jnp.zeros((tn, tv), jnp.float32))


def _fwd_kernel(h_ref, w_ref, y_ref, m_ref, l_ref, t_ref, a_ref, *, tn, tv, th, n, d, v,
                tiles_per_split, temperature, softcap, with_entropy):
  i, k = pl.program_id(0), pl.program_id(1)
  r0 = i * tn
  y = _load_rows(y_ref, r0, tn, n, other=-1)

  def v_step(jj, carry):
    c0 = (k * tiles_per_split + jj) * tv
    s = _logits(h_ref, w_ref, r0, c0, tn=tn, tv=tv, th=th, n=n, d=d, v=v)
    z, _ = common.transform(s, temperature=temperature, softcap=softcap)
    col = _iota((1, tv), 1, c0)
    return common.merge(*carry, *common.tile_stats(z, col, y, col < v, with_entropy))

  init = (jnp.full((tn, 1), common.NEG_INF, jnp.float32),) + (jnp.zeros((tn, 1), jnp.float32),) * 3
  stats = jax.lax.fori_loop(0, tiles_per_split, v_step, init)
  row_ok = _iota((tn, 1), 0, r0) < n
  for ref, x in zip((m_ref, l_ref, t_ref, a_ref), stats):
    plgpu.store(ref.at[pl.ds(r0, tn), pl.ds(k, 1)], x, mask=row_ok)


def forward_stats(hidden_ND, w_DV, targets_N, *, temperature: float = 1.0,
                  softcap: float | None = None, with_entropy: bool = False,
                  block_sizes: BlockSizes = BlockSizes(), interpret=False) -> common.Stats:
  """Per-token `Stats` over the columns of `w_DV` (targets outside `[0, V)` give t = 0)."""
  _check(block_sizes)
  (n, d), v = hidden_ND.shape, w_DV.shape[1]
  tn, tv, th = block_sizes.rows, block_sizes.vocab, block_sizes.depth
  num_tiles = pl.cdiv(v, tv)
  tiles_per_split = pl.cdiv(num_tiles, max(1, block_sizes.vocab_splits))
  splits = pl.cdiv(num_tiles, tiles_per_split)  # every split holds >= 1 real column
  kernel = functools.partial(
      _fwd_kernel, tn=tn, tv=tv, th=th, n=n, d=d, v=v, tiles_per_split=tiles_per_split,
      temperature=temperature, softcap=softcap, with_entropy=with_entropy)
  parts = pl.pallas_call(
      kernel,
      grid=(pl.cdiv(n, tn), splits),
      out_shape=[jax.ShapeDtypeStruct((n, splits), jnp.float32)] * 4,
      compiler_params=_params(block_sizes),
      interpret=interpret,
      name="logprob_fwd_triton",
  )(hidden_ND, w_DV, targets_N.astype(jnp.int32).reshape(n, 1))
  stats = common.Stats(*(x[:, 0] for x in parts))
  for k in range(1, splits):
    stats = common.merge_stats(stats, common.Stats(*(x[:, k] for x in parts)))
  return stats


def _tile_dlogits(refs, r0, c0, *, tn, tv, th, n, d, v, temperature, softcap):
  """Recomputed `dS` tile (float32, zero outside the real rows/columns)."""
  h_ref, w_ref, y_ref, lse_ref, mz_ref, g_ref, ge_ref = refs
  s = _logits(h_ref, w_ref, r0, c0, tn=tn, tv=tv, th=th, n=n, d=d, v=v)
  z, dz_ds = common.transform(s, temperature=temperature, softcap=softcap)
  col = _iota((1, tv), 1, c0)
  valid = (_iota((tn, 1), 0, r0) < n) & (col < v)
  ld = functools.partial(_load_rows, r0=r0, tn=tn, n=n)
  g_ent = None if ge_ref is None else ld(ge_ref)
  return common.dlogits(z, dz_ds, col, ld(y_ref, other=-1), valid, ld(lse_ref), ld(mz_ref),
                        ld(g_ref), g_ent)


def _dh_kernel(*refs, tn, tv, th, n, d, v, **kw):
  *in_refs, dh_ref = refs
  w_ref = in_refs[1]
  r0 = pl.program_id(0) * tn
  row_ok = _iota((tn, 1), 0, r0) < n
  dh_slice = lambda k0: dh_ref.at[pl.ds(r0, tn), pl.ds(k0, th)]
  dh_mask = lambda k0: row_ok & (_iota((1, th), 1, k0) < d)

  @pl.loop(0, pl.cdiv(d, th))
  def _(kk):
    plgpu.store(dh_slice(kk * th), jnp.zeros((tn, th), jnp.float32), mask=dh_mask(kk * th))

  @pl.loop(0, pl.cdiv(v, tv))
  def _(jj):
    c0 = jj * tv
    ds = _tile_dlogits(in_refs, r0, c0, tn=tn, tv=tv, th=th, n=n, d=d, v=v, **kw)
    ds = ds.astype(w_ref.dtype)

    @pl.loop(0, pl.cdiv(d, th))
    def _(kk):
      k0 = kk * th
      w = plgpu.load(w_ref.at[pl.ds(k0, th), pl.ds(c0, tv)],
                     mask=(_iota((th, 1), 0, k0) < d) & (_iota((1, tv), 1, c0) < v), other=0.0)
      upd = jax.lax.dot_general(ds, w, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
      cur = plgpu.load(dh_slice(k0), mask=dh_mask(k0), other=0.0)
      plgpu.store(dh_slice(k0), cur + upd, mask=dh_mask(k0))


def _dw_kernel(*refs, tn, tv, th, n, d, v, **kw):
  *in_refs, dw_ref = refs
  h_ref = in_refs[0]
  c0 = pl.program_id(0) * tv
  col_ok = _iota((1, tv), 1, c0) < v
  dw_slice = lambda k0: dw_ref.at[pl.ds(k0, th), pl.ds(c0, tv)]
  dw_mask = lambda k0: (_iota((th, 1), 0, k0) < d) & col_ok

  @pl.loop(0, pl.cdiv(d, th))
  def _(kk):
    plgpu.store(dw_slice(kk * th), jnp.zeros((th, tv), jnp.float32), mask=dw_mask(kk * th))

  @pl.loop(0, pl.cdiv(n, tn))
  def _(ii):
    r0 = ii * tn
    ds = _tile_dlogits(in_refs, r0, c0, tn=tn, tv=tv, th=th, n=n, d=d, v=v, **kw)
    ds = ds.astype(h_ref.dtype)

    @pl.loop(0, pl.cdiv(d, th))
    def _(kk):
      k0 = kk * th
      h = plgpu.load(h_ref.at[pl.ds(r0, tn), pl.ds(k0, th)],
                     mask=(_iota((tn, 1), 0, r0) < n) & (_iota((1, th), 1, k0) < d), other=0.0)
      upd = jax.lax.dot_general(h, ds, (((0,), (0,)), ((), ())),
                                preferred_element_type=jnp.float32)
      cur = plgpu.load(dw_slice(k0), mask=dw_mask(k0), other=0.0)
      plgpu.store(dw_slice(k0), cur + upd, mask=dw_mask(k0))


def backward(hidden_ND, w_DV, targets_N, lse_N, mean_z_N, g_N, g_ent_N, *,
             temperature: float = 1.0, softcap: float | None = None,
             block_sizes: BlockSizes = BlockSizes(), interpret=False):
  """Returns float32 `(dh_ND, dW_DV)`; same contract as `xla.backward`."""
  _check(block_sizes)
  if block_sizes.backward == "xla":
    return xla.backward(hidden_ND, w_DV, targets_N, lse_N, mean_z_N, g_N, g_ent_N,
                        temperature=temperature, softcap=softcap,
                        block_sizes=block_sizes.xla_blocks)
  (n, d), v = hidden_ND.shape, w_DV.shape[1]
  tn, tv, th = block_sizes.rows, block_sizes.vocab, block_sizes.depth
  col = lambda x: x.astype(jnp.float32).reshape(n, 1)
  per_token = [col(lse_N), col(mean_z_N), col(g_N)]
  if g_ent_N is not None:
    per_token.append(col(g_ent_N))
  args = (hidden_ND, w_DV, targets_N.astype(jnp.int32).reshape(n, 1), *per_token)

  def kernel(body):
    def with_refs(*refs):
      ins, out = refs[:len(args)], refs[len(args):]
      ins = ins + (None,) * (7 - len(ins))  # no entropy cotangent: g_ent ref is None
      body(*ins, *out, tn=tn, tv=tv, th=th, n=n, d=d, v=v, temperature=temperature,
           softcap=softcap)
    return with_refs

  common_kw = dict(compiler_params=_params(block_sizes), interpret=interpret)
  dh = pl.pallas_call(kernel(_dh_kernel), grid=(pl.cdiv(n, tn),),
                      out_shape=jax.ShapeDtypeStruct((n, d), jnp.float32),
                      name="logprob_bwd_dh_triton", **common_kw)(*args)
  dw = pl.pallas_call(kernel(_dw_kernel), grid=(pl.cdiv(v, tv),),
                      out_shape=jax.ShapeDtypeStruct((d, v), jnp.float32),
                      name="logprob_bwd_dw_triton", **common_kw)(*args)
  return dh, dw
