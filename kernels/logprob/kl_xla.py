# pylint: disable=invalid-name,protected-access
"""Chunked XLA implementation of the teacher-student KL op (docs/kernels.md §9).

Full vocabulary: a `lax.map` over token chunks computes both models' float32 logits for the
chunk (`rows × V` each, never `[N, V]`) and reduces them to `kl_common.KLStats`. The backward
recomputes the logits: over token chunks (`"tokens"`, each chunk adds into the whole float32
dW) or over vocabulary chunks (`"vocab"`, each chunk of `cols` columns sees all N tokens, writes
its dW columns once and adds into dh), the same two loop orders and the same `"auto"` rule
(vocab when V > N) as the log-prob op's xla.py. `xla.BlockSizes` is reused; its `chunk_bytes`
budget covers both models' logits, so a chunk holds half the rows the log-prob op would take.

Top-k (`topk_forward`, `topk_backward`): the teacher's chunk logits give its top-k ids
(`lax.top_k`, ties to the lower id); both models are then renormalised over those k ids. The
student's k logits are `h · W[:, ids]` (a gather of k columns per token, O(n·k·D)), so the
backward needs no V-wide matmul; its residuals are the ids and the teacher's k logits `[N, k]`.
"""
import dataclasses

import jax
import jax.numpy as jnp

from kernels.logprob import common
from kernels.logprob import kl_common
from kernels.logprob import xla

BlockSizes = xla.BlockSizes


def _half_budget(block_sizes: BlockSizes) -> BlockSizes:
  """Both models' logits share the chunk budget."""
  return dataclasses.replace(block_sizes, chunk_bytes=block_sizes.chunk_bytes // 2)


def _logits(h_nD, w_DV, temperature):
  return common.transform(xla.chunk_logits(h_nD, w_DV), temperature=temperature, softcap=None)[0]


def forward_stats(h_s, w_s, h_t, w_t, *, kind: str, temperature: float = 1.0,
                  block_sizes: BlockSizes = BlockSizes()) -> kl_common.KLStats:
  """Per-token full-vocabulary `KLStats` (1-D `[N]` fields)."""
  n, v = h_s.shape[0], w_s.shape[1]
  rows = xla.chunk_rows(n, v, _half_budget(block_sizes))

  def one_chunk(args):
    hs_nD, ht_nD = args
    z_a, z_b = kl_common.anchor_first(_logits(hs_nD, w_s, temperature),
                                      _logits(ht_nD, w_t, temperature), kind)
    return kl_common.tile_stats(z_a, z_b, True)

  stats = jax.lax.map(one_chunk, (xla.split_rows(h_s, rows), xla.split_rows(h_t, rows)))
  return kl_common.KLStats(*(x.reshape(-1)[:n] for x in stats))


def backward(h_s, w_s, h_t, w_t, lse_s, lse_t, kl, g, *, kind: str, temperature: float = 1.0,
             block_sizes: BlockSizes = BlockSizes()):
  """Float32 `(dh_s, dW_s)` of `Σ g·KL` (full vocabulary); lse's and KL from the forward."""
  n, v = h_s.shape[0], w_s.shape[1]
  order = block_sizes.backward
  if order not in ("auto", "tokens", "vocab"):
    raise ValueError(f"xla.BlockSizes.backward must be 'auto', 'tokens' or 'vocab', got "
                     f"{order!r}.")
  if order == "auto":
    order = "vocab" if v > n else "tokens"
  per_token = [x.astype(jnp.float32) for x in (lse_s, lse_t, kl, g)]
  fn = _backward_vocab if order == "vocab" else _backward_tokens
  return fn(h_s, w_s, h_t, w_t, per_token, kind=kind, temperature=temperature,
            block_sizes=_half_budget(block_sizes))


def _ds(hs, ws, ht, wt, valid, per_token, *, kind, temperature):
  """Cotangent of the student's raw logits for one block, in the matmul dtype."""
  z_s, z_t = _logits(hs, ws, temperature), _logits(ht, wt, temperature)
  dz = kl_common.dlogits(z_s, z_t, valid, *per_token, kind)
  # dS in the matmul dtype with float32 accumulation, as the log-prob op's backward.
  return (dz * (1.0 / temperature)).astype(ws.dtype)


def _backward_tokens(h_s, w_s, h_t, w_t, per_token, *, kind, temperature, block_sizes):
  n, d = h_s.shape
  v = w_s.shape[1]
  rows = xla.chunk_rows(n, v, block_sizes)
  # Padded rows have g = 0, so they add nothing to dW.
  xs = (xla.split_rows(h_s, rows), xla.split_rows(h_t, rows), [xla.split_rows(x, rows) for x in per_token])

  def step(dw_VD, args):
    hs_nD, ht_nD, tok = args
    ds_nV = _ds(hs_nD, w_s, ht_nD, w_t, True, [x[:, None] for x in tok], kind=kind,
                temperature=temperature)
    dh_nD = jax.lax.dot_general(ds_nV, w_s, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
    # [V, D] accumulator: XLA:CPU runs dSᵀh twice as fast as hᵀdS (kernels/README.md).
    dw_VD = dw_VD + jax.lax.dot_general(ds_nV, hs_nD, (((0,), (0,)), ((), ())),
                                        preferred_element_type=jnp.float32)
    return dw_VD, dh_nD

  dw_VD, dh_cnD = jax.lax.scan(step, jnp.zeros((v, d), jnp.float32), xs)
  return dh_cnD.reshape(-1, d)[:n], dw_VD.T


def _backward_vocab(h_s, w_s, h_t, w_t, per_token, *, kind, temperature, block_sizes):
  n, d = h_s.shape
  v = w_s.shape[1]
  cols = block_sizes.cols or max(128, block_sizes.chunk_bytes // (4 * n) // 128 * 128)
  if cols <= 0:
    raise ValueError(f"xla.BlockSizes.cols must be positive, got {cols}.")
  cols = min(cols, v)
  tok = [x[:, None] for x in per_token]

  def step(carry, c):
    dh_ND, dw_DV = carry
    # A ragged last chunk is shifted left to end at V; the overlap with the previous chunk is
    # masked (fresh) so W is never padded or copied (as xla._backward_vocab).
    start = jnp.minimum(c * cols, v - cols)
    ws_Dc = jax.lax.dynamic_slice_in_dim(w_s, start, cols, axis=1)
    wt_Dc = jax.lax.dynamic_slice_in_dim(w_t, start, cols, axis=1)
    fresh_1c = start + jnp.arange(cols, dtype=jnp.int32)[None, :] >= c * cols
    ds_Nc = _ds(h_s, ws_Dc, h_t, wt_Dc, fresh_1c, tok, kind=kind, temperature=temperature)
    return common.add_vocab_chunk_grads(dh_ND, dw_DV, h_s, ws_Dc, ds_Nc, start, fresh_1c), None

  init = (jnp.zeros((n, d), jnp.float32), jnp.zeros((d, v), jnp.float32))
  (dh_ND, dw_DV), _ = jax.lax.scan(step, init, jnp.arange(-(-v // cols)))
  return dh_ND, dw_DV


def _gathered_logits(h_nD, w_DV, ids_nk, temperature):
  """Float32 logits of the k columns `ids_nk` per token, and the gathered W `[D, n, k]`."""
  w_Dnk = jnp.take(w_DV, ids_nk, axis=1)
  s_nk = jnp.einsum("nd,dnk->nk", h_nD, w_Dnk, preferred_element_type=jnp.float32)
  return common.transform(s_nk, temperature=temperature, softcap=None)[0], w_Dnk


def _kl_over_k(zs_nk, zt_nk, kind):
  """(kl, lse_s, lse_t) `[n, 1]` of the two distributions renormalised over the k ids."""
  stats = kl_common.tile_stats(*kl_common.anchor_first(zs_nk, zt_nk, kind), True)
  return kl_common.finalize(stats, kind)


def topk_forward(h_s, w_s, h_t, w_t, *, k: int, kind: str, temperature: float = 1.0,
                 block_sizes: BlockSizes = BlockSizes()):
  """Returns `(kl_N, ids_Nk, zt_Nk)`: the KL over the teacher's top-k ids, the ids, and the
  teacher's (temperature-scaled) logits there."""
  (n, d), v = h_s.shape, w_s.shape[1]
  # Per token: the teacher's V logits and the student's gathered k columns of W (D·k values).
  rows = xla.chunk_rows(n, v + d * k, block_sizes)

  def one_chunk(args):
    hs_nD, ht_nD = args
    zt_nk, ids_nk = jax.lax.top_k(_logits(ht_nD, w_t, temperature), k)
    zs_nk, _ = _gathered_logits(hs_nD, w_s, ids_nk, temperature)
    return _kl_over_k(zs_nk, zt_nk, kind)[0][:, 0], ids_nk, zt_nk

  kl, ids, zt = jax.lax.map(one_chunk, (xla.split_rows(h_s, rows), xla.split_rows(h_t, rows)))
  return kl.reshape(-1)[:n], ids.reshape(-1, k)[:n], zt.reshape(-1, k)[:n]


def topk_backward(h_s, w_s, ids_Nk, zt_Nk, kl, g, *, kind: str, temperature: float = 1.0,
                  block_sizes: BlockSizes = BlockSizes()):
  """Float32 `(dh_s, dW_s)` of `Σ g·KL_topk`: gathered columns only, scatter-added into dW."""
  (n, d), v = h_s.shape, w_s.shape[1]
  rows = xla.chunk_rows(n, 2 * d * ids_Nk.shape[1], block_sizes)  # gathered W and its dW, [D, n, k]
  xs = (xla.split_rows(h_s, rows), xla.split_rows(ids_Nk, rows), xla.split_rows(zt_Nk, rows),
        xla.split_rows(kl.astype(jnp.float32), rows), xla.split_rows(g.astype(jnp.float32), rows))

  def step(dw_DV, args):
    hs_nD, ids_nk, zt_nk, kl_n, g_n = args
    zs_nk, w_Dnk = _gathered_logits(hs_nD, w_s, ids_nk, temperature)
    _, lse_s, lse_t = _kl_over_k(zs_nk, zt_nk, kind)
    dz_nk = kl_common.dlogits(zs_nk, zt_nk, True, lse_s, lse_t, kl_n[:, None], g_n[:, None],
                              kind)
    ds_nk = (dz_nk * (1.0 / temperature)).astype(w_s.dtype)
    dh_nD = jnp.einsum("nk,dnk->nd", ds_nk, w_Dnk, preferred_element_type=jnp.float32)
    dw_Dnk = jnp.einsum("nd,nk->dnk", hs_nD, ds_nk, preferred_element_type=jnp.float32)
    # Padded rows have g = 0 (and ids 0): their scatter adds exact zeros.
    return dw_DV.at[:, ids_nk].add(dw_Dnk), dh_nD

  dw_DV, dh_cnD = jax.lax.scan(step, jnp.zeros((d, v), jnp.float32), xs)
  return dh_cnD.reshape(-1, d)[:n], dw_DV
