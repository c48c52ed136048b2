# pylint: disable=invalid-name
"""Per-token log-probs with the vocabulary split over a mesh axis (docs/kernels.md §8.5).

Megatron's vocab-parallel cross-entropy (Shoeybi et al. 2019) as one `shard_map` +
`custom_vjp` around the `ops` building blocks: each device scores its vocabulary shard and
pmax/psum merge the partial statistics, so neither the `[N, V]` logits nor the vocabulary axis
of the unembedding is ever gathered. The mesh and its axis names are arguments; the defaults
are the `(data, fsdp, tensor)` axes of `agentrl.sharding.make_mesh`.
"""
import functools
import math

import jax
from jax.sharding import PartitionSpec as P
import jax.numpy as jnp

from kernels.logprob import ops


def _check_vma(impl: str) -> bool:
  """shard_map's varying-axes check works for jnp bodies but not around a pallas_call."""
  resolved = ops.default_impl() if impl == "auto" else impl
  return resolved in ("xla", "reference")


def _local_targets(y_n, w_Dv, vocab_axis):
  """The shard holding vocab columns [v0, v0 + v) scores target y as column y - v0."""
  return y_n - jax.lax.axis_index(vocab_axis) * w_Dv.shape[1]


def vocab_parallel_token_logprobs(hidden_ND, w_DV, targets_N, *, mesh: jax.sharding.Mesh,
                                  row_axes=("data", "fsdp"), vocab_axis: str = "tensor",
                                  temperature: float = 1.0, softcap: float | None = None,
                                  return_entropy: bool = False, impl: str = "auto",
                                  block_sizes=None, interpret=False):
  """`ops.token_logprobs` with W's vocabulary split over `vocab_axis` of `mesh`.

  Tokens are split over `row_axes` and the vocabulary over `vocab_axis`; W's `D` axis is
  gathered (FSDP). Each device computes partial statistics `(max, Σexp, target logit[, Σexp·z])`
  over its vocab shard with the kernel for `impl`, then pmax/psum merge them
  (`ops.allreduce_stats`): the `[N, V]` logits and `W`'s `V` axis are never gathered. The
  backward is the kernel's hand-written one with the global lse; `dh` is psum'd over
  `vocab_axis` and `dW` over `row_axes`. A `custom_vjp` spans the whole op, so no autodiff runs
  through pmax (which has no differentiation rule). Requires N divisible by the product of the
  `row_axes` sizes and V by the `vocab_axis` size. Returns float32 logp_N (and entropy_N).
  `temperature`, `softcap`, `impl`, `block_sizes` and `interpret` are as in
  `ops.token_logprobs` (a Pallas body runs with check_vma=False).
  """
  rows = (row_axes,) if isinstance(row_axes, str) else tuple(row_axes)
  unknown = [a for a in rows + (vocab_axis,) if a not in mesh.axis_names]
  if unknown:
    raise ValueError(f"vocab_parallel_token_logprobs: mesh axes {unknown} are not in the mesh "
                     f"{mesh.axis_names}; pass row_axes= and vocab_axis= for this mesh.")
  n, v = targets_N.shape[0], w_DV.shape[-1]
  ways, shards = math.prod(mesh.shape[a] for a in rows), mesh.shape[vocab_axis]
  if n % ways or v % shards:
    raise ValueError(f"vocab_parallel_token_logprobs needs N={n} divisible by {'*'.join(rows)}="
                     f"{ways} and V={v} divisible by {vocab_axis}={shards}.")
  kw = dict(temperature=float(temperature), softcap=None if softcap is None else float(softcap),
            impl=impl, block_sizes=block_sizes, interpret=interpret)
  local = functools.partial(jax.shard_map, mesh=mesh)

  @local(in_specs=(P(rows, None), P(None, vocab_axis), P(rows)), out_specs=(P(rows),) * 3,
         check_vma=_check_vma(impl))
  def forward(h_nD, w_Dv, y_n):
    stats = ops.logprob_stats(h_nD, w_Dv, _local_targets(y_n, w_Dv, vocab_axis),
                              with_entropy=return_entropy, **kw)
    return ops.finalize(ops.allreduce_stats(stats, vocab_axis))

  # Every kernel backward scans dW from a plain jnp.zeros carry, which check_vma rejects as
  # unvarying; the body's collectives are the explicit psums below either way.
  @local(in_specs=(P(rows, None), P(None, vocab_axis), P(rows)) + (P(rows),) * 4,
         out_specs=(P(rows, None), P(None, vocab_axis)), check_vma=False)
  def backward(h_nD, w_Dv, y_n, lse_n, mean_z_n, g_n, g_ent_n):
    dh_nD, dw_Dv = ops.logprob_backward(h_nD, w_Dv, _local_targets(y_n, w_Dv, vocab_axis),
                                        lse_n, mean_z_n, g_n,
                                        g_ent_n if return_entropy else None, **kw)
    return jax.lax.psum(dh_nD, vocab_axis), jax.lax.psum(dw_Dv, rows)

  def fwd(h_ND, w_DV, y_N):
    logp_N, lse_N, mean_z_N = forward(h_ND, w_DV, y_N)
    out = (logp_N, lse_N - mean_z_N) if return_entropy else logp_N
    return out, (h_ND, w_DV, y_N, lse_N, mean_z_N)

  def bwd(residuals, g):
    h_ND, w_DV, y_N, lse_N, mean_z_N = residuals
    g_N, g_ent_N = g if return_entropy else (g, jnp.zeros_like(g))
    dh_ND, dw_DV = backward(h_ND, w_DV, y_N, lse_N, mean_z_N, g_N, g_ent_N)
    return dh_ND.astype(h_ND.dtype), dw_DV.astype(w_DV.dtype), None

  @jax.custom_vjp
  def logprobs(h_ND, w_DV, y_N):
    return fwd(h_ND, w_DV, y_N)[0]

  logprobs.defvjp(fwd, bwd)
  dtype = jnp.promote_types(hidden_ND.dtype, w_DV.dtype)
  return logprobs(hidden_ND.astype(dtype), w_DV.astype(dtype), targets_N.astype(jnp.int32))
