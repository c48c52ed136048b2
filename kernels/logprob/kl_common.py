# pylint: disable=invalid-name
"""Tile math of the teacher-student KL op, shared by kl_xla.py and kl_pallas.py.

docs/kernels.md §9. Both models' logits `z = h W / temperature` cover one vocabulary. With `A`
the distribution the expectation is taken under and `B` the other one,

  KL(p_A || p_B) = Σ_v p_A (log p_A − log p_B) = E_A[z_A − z_B] − lse_A + lse_B,

so one pass over the vocabulary keeps, per token, running statistics over any column subset
(a tile, a chunk, a shard):

  m_a = max z_A,  l_a = Σ exp(z_A − m_a),  a = Σ exp(z_A − m_a)·(z_A − z_B),
  m_b = max z_B,  l_b = Σ exp(z_B − m_b)

which merge exactly (the online logsumexp of common.merge). Forward KL(p_T || p_S) takes
A = teacher, reverse KL(p_S || p_T) takes A = student. The gradient w.r.t. the student's
logits (`dlogits`) needs only the per-token `lse_s`, `lse_t` and the KL itself:

  forward:  ∂KL/∂z_s = p_s − p_t
  reverse:  ∂KL/∂z_s = p_s · (log p_s − log p_t − KL)
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp

from kernels.logprob import common

KINDS = ("forward", "reverse")


class KLStats(NamedTuple):
  """Per-token partial statistics over a vocabulary subset, each float32 (see module docstring)."""
  m_a: jax.Array
  l_a: jax.Array
  a: jax.Array
  m_b: jax.Array
  l_b: jax.Array


def anchor_first(z_s, z_t, kind: str):
  """`(z_A, z_B)`: the distribution the KL's expectation is taken under comes first."""
  return (z_t, z_s) if kind == "forward" else (z_s, z_t)


def tile_stats(z_a, z_b, valid) -> KLStats:
  """Statistics of one tile of float32 logits `[n, v]`; `valid` masks real vocab columns.

  Returns 2-D `[n, 1]` arrays. Masked columns may hold NaN garbage (ragged Pallas tiles): every
  use goes through `where`.
  """
  z_a = jnp.where(valid, z_a, common.NEG_INF)
  z_b = jnp.where(valid, z_b, common.NEG_INF)
  m_a = jnp.max(z_a, axis=1, keepdims=True)
  m_b = jnp.max(z_b, axis=1, keepdims=True)
  e_a = jnp.where(valid, jnp.exp(z_a - m_a), 0.0)
  e_b = jnp.where(valid, jnp.exp(z_b - m_b), 0.0)
  a = jnp.sum(e_a * jnp.where(valid, z_a - z_b, 0.0), axis=1, keepdims=True)
  return KLStats(m_a, jnp.sum(e_a, axis=1, keepdims=True), a, m_b,
                 jnp.sum(e_b, axis=1, keepdims=True))


def merge(x: KLStats, y: KLStats) -> KLStats:
  """Exact merge of two disjoint column subsets (common.merge's rescaling for both models)."""
  m_a, l_a, _, a = common.merge(x.m_a, x.l_a, 0.0, x.a, y.m_a, y.l_a, 0.0, y.a)
  m_b, l_b, _, _ = common.merge(x.m_b, x.l_b, 0.0, 0.0, y.m_b, y.l_b, 0.0, 0.0)
  return KLStats(m_a, l_a, a, m_b, l_b)


def finalize(stats: KLStats, kind: str):
  """Returns `(kl, lse_s, lse_t)` from full-vocabulary statistics."""
  lse_a = stats.m_a + jnp.log(stats.l_a)
  lse_b = stats.m_b + jnp.log(stats.l_b)
  kl = stats.a / stats.l_a - lse_a + lse_b
  return (kl, lse_b, lse_a) if kind == "forward" else (kl, lse_a, lse_b)


def dlogits(z_s, z_t, valid, lse_s, lse_t, kl, g, kind: str):
  """Cotangent of the student's logits `z_s` for per-token cotangents `g` of the KL.

  Per-token inputs (`lse_s`, `lse_t`, `kl`, `g`) are `[n, 1]`; zero on masked columns.
  """
  lp_s = jnp.where(valid, z_s - lse_s, common.NEG_INF)
  lp_t = jnp.where(valid, z_t - lse_t, common.NEG_INF)
  p_s = jnp.exp(lp_s)
  if kind == "forward":
    dz = p_s - jnp.exp(lp_t)
  else:
    dz = p_s * (lp_s - lp_t - kl)
  return jnp.where(valid, g * dz, 0.0)
