# pylint: disable=invalid-name
"""Tile math shared by every decode-attention implementation (docs/kernels.md §10).

The same jnp functions build the dense `[B, T, S]` mask of the XLA path (ops.py) and the
`[rows, slots]` mask of one KV block inside each Pallas kernel, and run the online softmax
over KV blocks in both kernels, so the implementations agree by construction.

A decode step's mask is never stored: it is rebuilt from per-slot and per-query vectors
(docs/kernels.md §10.2). Query t of row b may attend to slot s iff

  lo_b <= s < hi                   (the blocks a kernel reads; hi = last query slot + 1),
  k_pos[b, s] != INVALID_POS       (the slot holds a real token),
  s <= q_slot[t]                   (causal over slots), and
  q_pos[b, t] - k_pos[b, s] < window  (sliding-window layers; NO_WINDOW on global ones).
"""
import jax
import jax.numpy as jnp
import numpy as np

# Finite "-inf" for masked scores and the running-max init: exp(m_old - m_new) stays NaN-free
# while every score so far is masked (inf - inf would be NaN).
NEG_INF = -1e30
INVALID_POS = int(np.iinfo(np.int32).min)   # k_pos of a slot without a real token
NO_WINDOW = int(np.iinfo(np.int32).max)     # window of a global-attention layer


def allowed(slot, k_pos, q_slot, q_pos, lo, hi, window):
  """Which (query, slot) pairs may attend, for any broadcastable shapes (module docstring).

  `q_pos - k_pos` may wrap for an invalid slot (INVALID_POS); the validity test masks it.
  """
  in_range = (slot >= lo) & (slot < hi)
  return in_range & (k_pos != INVALID_POS) & (slot <= q_slot) & (q_pos - k_pos < window)


def scores(q, k, *, scale: float, softcap: float | None, slots_axis: int = 0):
  """Float32 `[rows, slots]` scores `q kᵀ · scale`, soft-capped `cap·tanh(s/cap)` (Gemma 2).

  k is `[slots, K]`, or `[K, slots]` with slots_axis=1.
  """
  s = jax.lax.dot_general(q, k, (((1,), (1 - slots_axis,)), ((), ())),
                          preferred_element_type=jnp.float32) * scale
  if softcap is not None:
    s = softcap * jnp.tanh(s * (1.0 / softcap))
  return s


def online_softmax_step(m, l, acc, s, ok, v, slots_axis: int = 0):
  """Merges one KV block into the running `(max, Σ exp, Σ exp · v)` of each query row.

  m, l: `[rows, 1]`; acc: float32 `[rows, K]`; s: float32 scores `[rows, slots]`; ok: the
  block's mask; v: values `[slots, K]` (`[K, slots]` with slots_axis=1), zero on slots outside
  the read range (0 · NaN garbage would still be NaN in the matmul). Masked entries add exactly
  0, also while a row has seen no allowed slot (then m = NEG_INF and exp(s - m) would be 1).
  """
  s = jnp.where(ok, s, NEG_INF)
  m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
  correction = jnp.exp(m - m_new)
  p = jnp.where(ok, jnp.exp(s - m_new), 0.0)
  l_new = correction * l + jnp.sum(p, axis=1, keepdims=True)
  pv = jax.lax.dot_general(p.astype(v.dtype), v, (((1,), (slots_axis,)), ((), ())),
                           preferred_element_type=jnp.float32)
  return m_new, l_new, correction * acc + pv


def normalize(acc, l):
  """`acc / l`, and 0 for a query row with no allowed slot (l = 0)."""
  return jnp.where(l > 0, acc / jnp.where(l > 0, l, 1.0), 0.0)
