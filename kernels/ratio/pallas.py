# pylint: disable=invalid-name
"""Pallas TPU (Mosaic) kernel for the ratio math of one minibatch (CTPO, arXiv 2605.07331).

One pass over `[B, T]` computes, per token: the clamped log-ratio ℓ_t, the masked cumulative
log-ratio S_t = Σ_{s≤t} m_s ℓ_s and the policy-token position n_t (docs/algorithms.md §1.2 steps
1–3), the CTPO-LA clip masks of log ρ_t = min(S_t, max_log_ratio) against the
position-adaptive window [−a_lo·n_t^κ, a_hi·n_t^κ], and per-row clip counts.

Grid `(B/tb "parallel", T/tt "arbitrary")`: the T axis is sequential so the running sums
(S, n) carry across tiles in VMEM scratch. Inside a tile the prefix sum is a matmul with an
upper-triangular ones matrix (Mosaic has no cumsum lowering; the MXU does it in one op) at
HIGHEST precision so float32 log-ratios are not rounded to bf16.

docs/kernels.md §5 expects XLA's fusion of the same math to be as fast (the data is O(B·T)); the
benchmark in scripts/bench_ratio.py decides, and ops.py keeps XLA as the default.
"""
import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """rows: sequences per tile (multiple of 8); tokens: positions per tile (multiple of 128)."""
  rows: int = 8
  tokens: int = 512


def _kernel(lp_ref, old_ref, mask_ref, adv_ref,
            lr_ref, cum_ref, pos_ref, code_ref, cnt_ref, hi_ref, lo_ref,
            s_sc, n_sc, cnt_sc, hi_sc, lo_sc, *,
            tt, clamp, max_log_ratio, a_lo, a_hi, kappa, geomean):
  j = pl.program_id(1)

  @pl.when(j == 0)
  def _():
    for ref in (s_sc, n_sc, cnt_sc, hi_sc, lo_sc):
      ref[...] = jnp.zeros_like(ref)

  valid = mask_ref[...] > 0
  m = valid.astype(jnp.float32)
  lr = jnp.where(valid, jnp.clip(lp_ref[...] - old_ref[...], -clamp, clamp), 0.0)
  tri = (jax.lax.broadcasted_iota(jnp.int32, (tt, tt), 0)
         <= jax.lax.broadcasted_iota(jnp.int32, (tt, tt), 1)).astype(jnp.float32)
  prefix = functools.partial(jnp.dot, precision=jax.lax.Precision.HIGHEST,
                             preferred_element_type=jnp.float32)
  cum = prefix(lr, tri) + s_sc[...]
  pos = prefix(m, tri) + n_sc[...]
  s_sc[...] += jnp.sum(lr, axis=1, keepdims=True)
  n_sc[...] += jnp.sum(m, axis=1, keepdims=True)

  pos1 = jnp.maximum(pos, 1.0)
  if geomean:
    cum = cum / pos1
  log_rho = jnp.minimum(cum, max_log_ratio)
  scale = jnp.exp(kappa * jnp.log(pos1)) if kappa else 1.0  # max(n, 1)^κ
  high = jnp.logical_and(valid, log_rho > a_hi * scale)
  low = jnp.logical_and(valid, log_rho < -a_lo * scale)
  lr_ref[...] = lr
  cum_ref[...] = jnp.where(valid, cum, 0.0)
  pos_ref[...] = pos
  code_ref[...] = jnp.where(high, 1, jnp.where(low, -1, 0)).astype(jnp.int32)
  adv = adv_ref[...]
  cnt_sc[...] += jnp.sum(m, axis=1, keepdims=True)
  hi_sc[...] += jnp.sum(jnp.where(jnp.logical_and(high, adv > 0), 1.0, 0.0), 1, keepdims=True)
  lo_sc[...] += jnp.sum(jnp.where(jnp.logical_and(low, adv < 0), 1.0, 0.0), 1, keepdims=True)

  @pl.when(j == pl.num_programs(1) - 1)
  def _():
    cnt_ref[...] = cnt_sc[...]
    hi_ref[...] = hi_sc[...]
    lo_ref[...] = lo_sc[...]


def ratio_math(logp_BT, old_logp_BT, mask_BT, adv_BT, *, clamp: float, max_log_ratio: float,
               a_lo: float, a_hi: float, kappa: float, geomean: bool,
               block_sizes: BlockSizes = BlockSizes(), interpret=False):
  """Returns `(log_ratio, cum, position, clip_code, count_B, high_B, low_B)`.

  Inputs are float32 `[B, T]`; clip_code is int32 (+1 above the window, −1 below, 0 inside or
  masked); the three per-row counts are float32 `[B]`.
  """
  if block_sizes.rows % 8 or block_sizes.tokens % 128:
    raise ValueError(f"ratio pallas.BlockSizes needs rows % 8 == 0 and tokens % 128 == 0; got "
                     f"{block_sizes}.")
  b, t = logp_BT.shape
  tb = min(block_sizes.rows, pl.cdiv(b, 8) * 8)
  tt = min(block_sizes.tokens, pl.cdiv(t, 128) * 128)
  bp, tp = pl.cdiv(b, tb) * tb, pl.cdiv(t, tt) * tt
  # Padding is O(B·T) (cheap here) and keeps ragged tiles out of the prefix sums; mask = 0 there.
  pad = lambda x: jnp.pad(x, ((0, bp - b), (0, tp - t)))
  tile = pl.BlockSpec((tb, tt), lambda i, j: (i, j))
  row = pl.BlockSpec((tb, 1), lambda i, j: (i, 0))
  kernel = functools.partial(_kernel, tt=tt, clamp=clamp, max_log_ratio=max_log_ratio,
                             a_lo=a_lo, a_hi=a_hi, kappa=kappa, geomean=geomean)
  f32 = lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32)
  outs = pl.pallas_call(
      kernel,
      grid=(bp // tb, tp // tt),
      in_specs=[tile] * 4,
      out_specs=[tile] * 4 + [row] * 3,
      out_shape=[f32((bp, tp))] * 3 + [jax.ShapeDtypeStruct((bp, tp), jnp.int32)]
      + [f32((bp, 1))] * 3,
      scratch_shapes=[pltpu.VMEM((tb, 1), jnp.float32)] * 5,
      compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "arbitrary")),
      interpret=interpret,
      name="ctpo_ratio",
  )(pad(logp_BT), pad(old_logp_BT), pad(mask_BT), pad(adv_BT))
  return tuple(x[:b, :t] for x in outs[:4]) + tuple(x[:b, 0] for x in outs[4:])
