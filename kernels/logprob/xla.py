# pylint: disable=invalid-name
"""Token-chunked XLA implementation of per-token log-probs (docs/kernels.md §8.4).

A `lax.map`/`lax.scan` over token chunks of `rows` tokens; each chunk materializes full-V
float32 logits (`rows × V × 4` bytes, never `[N, V]`), as Liger's fused linear cross-entropy and
Tunix's `compute_chunked_logps` do. The backward recomputes the logits chunk by chunk and folds
the per-token cotangents in before the `dW` sum (6NDV with the forward's 2NDV: 8NDV in all).

The backward has two loop orders with the same FLOPs. Over token chunks (`"tokens"`), every
chunk adds into the whole float32 `dW` (a read-modify-write of V×D per chunk); over vocabulary
chunks (`"vocab"`), each chunk of `cols` columns sees all N tokens, writes its slice of `dW`
once and adds into `dh` (N×D per chunk) instead. With chunks sized by the same byte budget the
traffic ratio is V/N, so `"auto"` picks `"vocab"` when V > N (large vocabularies, the common
LLM case) and `"tokens"` otherwise.

Both functions are building blocks for the `custom_vjp` in ops.py and for a vocab-parallel
wrapper: `forward_stats` on a local vocab shard returns partial `Stats`, and `backward` takes the
*global* lse and E_p[z] and returns this shard's `dh` (to be summed over shards) and `dW`.
"""
import dataclasses

import jax
import jax.numpy as jnp

from kernels.logprob import common


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tokens per chunk: `rows`, or when None balanced chunks: as few as keep each chunk's
  `rows × V` float32 logits within `chunk_bytes`, all of one size (a multiple of 8), so the
  last one is not mostly padding (N = 1020, V = 49152: 4 × 256, not 4 × 336). Peak extra
  memory is about two such buffers (+ the f32 dW in the backward). The 64 MiB default bounds
  memory on any V; accelerators reach higher matmul intensity with rows ≈ 1–4k
  (docs/kernels.md §3, §8.4) where memory allows.
  """
  rows: int | None = None
  chunk_bytes: int = 64 * 2**20
  backward: str = "auto"      # "tokens", "vocab", or "auto" (vocab when V > N)
  cols: int | None = None     # vocab columns per backward chunk; None: from chunk_bytes


def split_rows(x, rows: int):
  """Pads the leading axis to a multiple of `rows` and reshapes to `[chunks, rows, ...]`."""
  n = x.shape[0]
  pad = (-n) % rows
  if pad:
    x = jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1))
  return x.reshape((n + pad) // rows, rows, *x.shape[1:])


def chunk_rows(n: int, v: int, block_sizes: BlockSizes) -> int:
  rows = block_sizes.rows
  if rows is None:
    cap = max(8, block_sizes.chunk_bytes // (4 * v) // 8 * 8)
    chunks = -(-n // cap)
    rows = -(-n // (8 * chunks)) * 8   # ceil(n / chunks), rounded up to a multiple of 8
  if rows <= 0:
    raise ValueError(f"xla.BlockSizes.rows must be positive, got {rows}.")
  return min(rows, n)


def chunk_logits(h_nD, w_DV):
  return jnp.dot(h_nD, w_DV, preferred_element_type=jnp.float32)


def forward_stats(hidden_ND, w_DV, targets_N, *, temperature: float = 1.0,
                  softcap: float | None = None, with_entropy: bool = False,
                  block_sizes: BlockSizes = BlockSizes()) -> common.Stats:
  """Per-token `Stats` over the columns of `w_DV` (targets outside `[0, V)` give t = 0)."""
  n, v = hidden_ND.shape[0], w_DV.shape[1]
  rows = chunk_rows(n, v, block_sizes)
  col_1V = jnp.arange(v, dtype=jnp.int32)[None, :]

  def one_chunk(args):
    h_nD, y_n = args
    z_nV, _ = common.transform(chunk_logits(h_nD, w_DV), temperature=temperature, softcap=softcap)
    return common.tile_stats(z_nV, col_1V, y_n[:, None], True, with_entropy)

  m, l, t, a = jax.lax.map(one_chunk, (split_rows(hidden_ND, rows), split_rows(targets_N, rows)))
  return common.Stats(*(x.reshape(-1)[:n] for x in (m, l, t, a)))


def backward(hidden_ND, w_DV, targets_N, lse_N, mean_z_N, g_N, g_ent_N, *,
             temperature: float = 1.0, softcap: float | None = None,
             block_sizes: BlockSizes = BlockSizes()):
  """Returns float32 `(dh_ND, dW_DV)` for per-token cotangents of logp (g) and entropy (g_ent).

  `lse_N` and `mean_z_N` are over the full vocabulary; `g_ent_N` may be None.
  """
  n, v = hidden_ND.shape[0], w_DV.shape[1]
  order = block_sizes.backward
  if order not in ("auto", "tokens", "vocab"):
    raise ValueError(f"xla.BlockSizes.backward must be 'auto', 'tokens' or 'vocab', got "
                     f"{order!r}.")
  if order == "auto":
    order = "vocab" if v > n else "tokens"
  fn = _backward_vocab if order == "vocab" else _backward_tokens
  return fn(hidden_ND, w_DV, targets_N, lse_N, mean_z_N, g_N, g_ent_N, temperature=temperature,
            softcap=softcap, block_sizes=block_sizes)


def _backward_vocab(hidden_ND, w_DV, targets_N, lse_N, mean_z_N, g_N, g_ent_N, *,
                    temperature, softcap, block_sizes):
  """Loop over vocabulary chunks: each writes its columns of dW once and adds into dh."""
  n, d = hidden_ND.shape
  v = w_DV.shape[1]
  cols = block_sizes.cols or max(128, block_sizes.chunk_bytes // (4 * n) // 128 * 128)
  if cols <= 0:
    raise ValueError(f"xla.BlockSizes.cols must be positive, got {cols}.")
  cols = min(cols, v)
  num = -(-v // cols)
  y_n1 = targets_N[:, None]
  lse, mean_z, g = (x.astype(jnp.float32)[:, None] for x in (lse_N, mean_z_N, g_N))
  g_ent = None if g_ent_N is None else g_ent_N.astype(jnp.float32)[:, None]

  def step(carry, c):
    dh_ND, dw_DV = carry
    # A ragged last chunk is shifted left to end at V; the columns it shares with the previous
    # chunk are masked out of dh and keep the dW the previous chunk wrote. No padded copy of W.
    start = jnp.minimum(c * cols, v - cols)
    w_Dc = jax.lax.dynamic_slice_in_dim(w_DV, start, cols, axis=1)
    col_1c = start + jnp.arange(cols, dtype=jnp.int32)[None, :]
    fresh_1c = col_1c >= c * cols
    z_Nc, dz_ds = common.transform(chunk_logits(hidden_ND, w_Dc), temperature=temperature,
                                   softcap=softcap)
    ds_Nc = common.dlogits(z_Nc, dz_ds, col_1c, y_n1, fresh_1c, lse, mean_z, g, g_ent)
    ds_Nc = ds_Nc.astype(w_DV.dtype)
    return common.add_vocab_chunk_grads(dh_ND, dw_DV, hidden_ND, w_Dc, ds_Nc, start,
                                        fresh_1c), None

  init = (jnp.zeros((n, d), jnp.float32), jnp.zeros((d, v), jnp.float32))
  (dh_ND, dw_DV), _ = jax.lax.scan(step, init, jnp.arange(num))
  return dh_ND, dw_DV


def _backward_tokens(hidden_ND, w_DV, targets_N, lse_N, mean_z_N, g_N, g_ent_N, *,
                     temperature, softcap, block_sizes):
  """Loop over token chunks: each recomputes full-V logits and adds into the whole dW."""
  n, d = hidden_ND.shape
  v = w_DV.shape[1]
  rows = chunk_rows(n, v, block_sizes)
  col_1V = jnp.arange(v, dtype=jnp.int32)[None, :]
  # Padded rows have g = g_ent = 0 and h = 0, so they add nothing to dW.
  per_token = [lse_N, mean_z_N, g_N] + ([] if g_ent_N is None else [g_ent_N])
  xs = (split_rows(hidden_ND, rows), split_rows(targets_N, rows),
        [split_rows(x.astype(jnp.float32), rows) for x in per_token])

  def step(dw_VD, args):
    h_nD, y_n, per_tok = args
    lse, mean_z, g = (x[:, None] for x in per_tok[:3])
    g_ent = per_tok[3][:, None] if g_ent_N is not None else None
    z_nV, dz_ds = common.transform(chunk_logits(h_nD, w_DV), temperature=temperature,
                                   softcap=softcap)
    ds_nV = common.dlogits(z_nV, dz_ds, col_1V, y_n[:, None], True, lse, mean_z, g, g_ent)
    # dS in the matmul dtype (bf16 on accelerators) with float32 accumulation, as Liger does.
    ds_nV = ds_nV.astype(w_DV.dtype)
    dh_nD = jax.lax.dot_general(ds_nV, w_DV, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
    # dW accumulates as [V, D] = dSᵀ h: on CPU the hᵀ dS form ([D, V] output) runs at half
    # the matmul speed; one transpose at the end is cheap.
    dw_VD = dw_VD + jax.lax.dot_general(ds_nV, h_nD, (((0,), (0,)), ((), ())),
                                        preferred_element_type=jnp.float32)
    return dw_VD, dh_nD

  dw_VD, dh_cnD = jax.lax.scan(step, jnp.zeros((v, d), jnp.float32), xs)
  return dh_cnD.reshape(-1, d)[:n], dw_VD.T
