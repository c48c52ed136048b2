# pylint: disable=invalid-name
"""Tile math shared by every log-prob implementation (docs/kernels.md §1).

The same jnp functions run on a whole `[n, V]` chunk (xla.py) and on a `[tn, tv]` tile inside a
Pallas kernel (pallas_tpu.py, pallas_gpu.py), so all implementations agree by construction.

Notation: raw logits `s = h @ W`; transformed logits `z = cap·tanh(s/cap) / T` (Gemma-2 final
soft-capping, arXiv 2408.00118 §2, then the sampling temperature, verl/Liger semantics).

Per-token streaming statistics over any subset of the vocabulary (a tile, a chunk, a shard):

  m = max_v z_v,  l = Σ_v exp(z_v − m),  a = Σ_v exp(z_v − m)·z_v,  t = z_y (0 if y ∉ subset)

so that `lse = m + log l`, `logp = t − lse`, `E_p[z] = a / l` and `entropy = lse − E_p[z]`.
Two subsets merge exactly (`merge_stats`), which is what the online vocab loop, the GPU vocab
splits and a vocab-parallel (sharded W) wrapper all do.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp

# Finite "-inf" for masked vocab columns and the running-max init: exp(m_old − m_new) stays
# NaN-free when a whole tile is masked (inf − inf would be NaN).
NEG_INF = -1e30


class Stats(NamedTuple):
  """Per-token partial statistics over a vocabulary subset, each float32 `[N]`."""
  m: jax.Array  # running max of z
  l: jax.Array  # Σ exp(z − m)
  t: jax.Array  # target logit z_y, 0 when the target is outside the subset
  a: jax.Array  # Σ exp(z − m)·z (zeros when entropy was not requested)


def transform(s, *, temperature: float, softcap: float | None):
  """Returns `(z, dz/ds)`: soft-capped, temperature-scaled logits and their derivative."""
  inv_t = 1.0 / temperature
  if softcap is None:
    return s * inv_t, inv_t
  th = jnp.tanh(s * (1.0 / softcap))
  # d/ds cap·tanh(s/cap) = 1 − tanh²(s/cap).
  return th * (softcap * inv_t), (1.0 - th * th) * inv_t


def tile_stats(z, col, y, valid, with_entropy: bool):
  """Statistics of one tile. z: f32 `[n, v]`; col: global vocab ids `[n, v]` or `[1, v]`;
  y: targets `[n, 1]`; valid: bool mask of real vocab columns. Returns 2-D `[n, 1]` stats."""
  z = jnp.where(valid, z, NEG_INF)
  m = jnp.max(z, axis=1, keepdims=True)
  e = jnp.exp(z - m)
  l = jnp.sum(e, axis=1, keepdims=True)
  # Target by iota comparison: gathers and one_hot do not lower inside Pallas (docs/kernels.md §2.1).
  t = jnp.sum(jnp.where(jnp.logical_and(valid, col == y), z, 0.0), axis=1, keepdims=True)
  a = jnp.sum(e * z, axis=1, keepdims=True) if with_entropy else jnp.zeros_like(l)
  return m, l, t, a


def merge(m1, l1, t1, a1, m2, l2, t2, a2):
  """Exact merge of the statistics of two disjoint vocabulary subsets (online logsumexp)."""
  m = jnp.maximum(m1, m2)
  c1, c2 = jnp.exp(m1 - m), jnp.exp(m2 - m)
  return m, l1 * c1 + l2 * c2, t1 + t2, a1 * c1 + a2 * c2


def merge_stats(x: Stats, y: Stats) -> Stats:
  """`merge` on `Stats` tuples (for vocab splits or shards of W)."""
  return Stats(*merge(*x, *y))


def finalize(stats: Stats):
  """Returns `(logp_N, lse_N, mean_z_N)` from merged full-vocabulary statistics."""
  lse = stats.m + jnp.log(stats.l)
  return stats.t - lse, lse, stats.a / stats.l


def dlogits(z, dz_ds, col, y, valid, lse, mean_z, g, g_ent):
  """Cotangent of the raw logits `s` for one tile (docs/kernels.md §1), zero on masked columns.

  dz = g·(1[v=y] − p) + g_ent·p·(E_p[z] − z), with p = exp(z − lse); dS = dz · dz/ds.
  All per-token inputs (lse, mean_z, g, g_ent, y) are `[n, 1]`; g_ent may be None.
  """
  p = jnp.exp(jnp.where(valid, z, NEG_INF) - lse)
  dz = g * (jnp.where(col == y, 1.0, 0.0) - p)
  if g_ent is not None:
    dz = dz + g_ent * p * (mean_z - z)
  # `where`, not a multiply: masked columns may hold NaN garbage from out-of-bounds reads.
  return jnp.where(valid, dz * dz_ds, 0.0)


def add_vocab_chunk_grads(dh_ND, dw_DV, hidden_ND, w_Dc, ds_Nc, start, fresh_1c):
  """One vocabulary chunk's backward: dh += dS W_c^T, and dW[:, start:start + c] = h^T dS on
  the chunk's fresh columns (a ragged last chunk overlaps the previous one), written in place
  into the [D, V] result: no [V, D] accumulator and no transposed copy."""
  dh_ND = dh_ND + jax.lax.dot_general(ds_Nc, w_Dc, (((1,), (1,)), ((), ())),
                                      preferred_element_type=jnp.float32)
  dw_Dc = jax.lax.dot_general(hidden_ND, ds_Nc, (((0,), (0,)), ((), ())),
                              preferred_element_type=jnp.float32)
  old_Dc = jax.lax.dynamic_slice_in_dim(dw_DV, start, w_Dc.shape[1], axis=1)
  dw_DV = jax.lax.dynamic_update_slice_in_dim(dw_DV, jnp.where(fresh_1c, dw_Dc, old_Dc),
                                              start, axis=1)
  return dh_ND, dw_DV
