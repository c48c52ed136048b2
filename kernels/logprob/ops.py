# pylint: disable=invalid-name
"""Per-token log-probs (and entropy) from hidden states and the unembedding, one public op.

  token_logprobs(hidden_ND, w_DV, targets_N, *, temperature=1.0, return_entropy=False,
                 impl="auto", softcap=None) -> logp_N  (or (logp_N, entropy_N))

`logp_t = log softmax(z_t)[y_t]` with `z_t = cap·tanh(h_t W / cap) / temperature` (Gemma-2
soft-capping, arXiv 2408.00118, only when `softcap` is set; temperature as in verl/Liger), and
`entropy_t = −Σ_v p_tv log p_tv`, all float32. Implementations (docs/kernels.md §8):

  "xla"         token-chunked `lax.map`/`scan` with a hand-written backward (xla.py).
  "pallas_tpu"  Mosaic kernels tiled over tokens × vocab with an online logsumexp.
  "pallas_gpu"  Triton-lowered Pallas kernels (the backend present in jax 0.10–0.12).
  "pallas"      the Pallas kernel for the current backend (TPU kernel when interpreting on CPU).
  "reference"   naive: materializes `[N, V]` float32 logits; plain autodiff. A test oracle.
  "auto"        TPU: pallas_tpu; GPU: pallas_gpu (its Triton forward and, by default, the XLA
                path's backward: faster than xla in both directions on an H200,
                kernels/README.md); CPU: xla.

Every non-reference implementation is one `jax.custom_vjp` whose residuals are `h, W, y, lse,
E_p[z]` (never `[N, V]`); the backward takes per-token cotangents for logp and entropy and
recomputes logit tiles.

Vocab-parallel use (a sharded W): `logprob_stats` on each local vocab shard (targets shifted
into the shard's range; out-of-shard targets contribute 0), `allreduce_stats` across the vocab
axis, `common.finalize`; the backward is `logprob_backward` with the global `lse`/`E_p[z]`,
whose `dh` is summed over the vocab axis (Megatron-style, docs/kernels.md §8.5).
"""
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from kernels.logprob import common
from kernels.logprob import pallas_gpu
from kernels.logprob import pallas_tpu
from kernels.logprob import xla

IMPLS = ("auto", "xla", "pallas", "pallas_tpu", "pallas_gpu", "reference")
_MODULES = {"xla": xla, "pallas_tpu": pallas_tpu, "pallas_gpu": pallas_gpu}

Stats = common.Stats
finalize = common.finalize
merge_stats = common.merge_stats


def token_logprobs_reference(hidden_ND, w_DV, targets_N, *, temperature: float = 1.0,
                             return_entropy: bool = False, softcap: float | None = None):
  """Naive oracle: materializes [N, V] float32 logits. log softmax(z)[target], z as above."""
  logits_NV = jnp.einsum("nd,dv->nv", hidden_ND, w_DV, preferred_element_type=jnp.float32)
  if softcap is not None:
    logits_NV = softcap * jnp.tanh(logits_NV / softcap)
  logits_NV = logits_NV / temperature
  logp_NV = jax.nn.log_softmax(logits_NV, axis=-1)
  logp_N = jnp.take_along_axis(logp_NV, targets_N[:, None].astype(jnp.int32), -1)[:, 0]
  if not return_entropy:
    return logp_N
  entropy_N = -(jnp.exp(logp_NV) * logp_NV).sum(-1)
  return logp_N, entropy_N


def default_impl(backend: str | None = None) -> str:
  """The implementation `impl="auto"` resolves to on `backend` (default: JAX's default)."""
  backend = backend or jax.default_backend()
  return {"tpu": "pallas_tpu", "gpu": "pallas_gpu"}.get(backend, "xla")


def _resolve(impl: str, interpret) -> str:
  if impl not in IMPLS:
    raise ValueError(f"Unknown logprob impl {impl!r}; expected one of {IMPLS}.")
  if impl == "auto":
    return default_impl()
  if impl != "pallas":
    return impl
  backend = jax.default_backend()
  if backend == "gpu":
    return "pallas_gpu"
  if backend != "tpu" and not interpret:
    raise ValueError(f"impl='pallas' needs a TPU or GPU backend (found {backend!r}); pass "
                     "interpret=True to run the TPU kernel in interpret mode, or use impl='xla'.")
  return "pallas_tpu"


@dataclasses.dataclass(frozen=True)
class _Config:
  """Static (hashable) arguments of the custom_vjp."""
  impl: str
  temperature: float
  softcap: float | None
  with_entropy: bool
  block_sizes: Any
  interpret: Any


def _impl_kwargs(cfg: _Config):
  kw = dict(temperature=cfg.temperature, softcap=cfg.softcap, block_sizes=cfg.block_sizes)
  if cfg.impl != "xla":
    kw["interpret"] = cfg.interpret
  return kw


def _fused_fwd(hidden_ND, w_DV, targets_N, cfg: _Config):
  stats = _MODULES[cfg.impl].forward_stats(hidden_ND, w_DV, targets_N,
                                           with_entropy=cfg.with_entropy, **_impl_kwargs(cfg))
  logp_N, lse_N, mean_z_N = common.finalize(stats)
  out = (logp_N, lse_N - mean_z_N) if cfg.with_entropy else logp_N
  return out, (hidden_ND, w_DV, targets_N, lse_N, mean_z_N)


def _fused_bwd(cfg: _Config, residuals, cotangent):
  hidden_ND, w_DV, targets_N, lse_N, mean_z_N = residuals
  g_N, g_ent_N = cotangent if cfg.with_entropy else (cotangent, None)
  dh_ND, dw_DV = _MODULES[cfg.impl].backward(hidden_ND, w_DV, targets_N, lse_N, mean_z_N, g_N,
                                             g_ent_N, **_impl_kwargs(cfg))
  return dh_ND.astype(hidden_ND.dtype), dw_DV.astype(w_DV.dtype), None


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _fused(hidden_ND, w_DV, targets_N, cfg: _Config):
  return _fused_fwd(hidden_ND, w_DV, targets_N, cfg)[0]


_fused.defvjp(_fused_fwd, _fused_bwd)


def _validate(hidden_ND, w_DV, targets_N, temperature, softcap):
  if hidden_ND.ndim != 2 or w_DV.ndim != 2 or hidden_ND.shape[1] != w_DV.shape[0]:
    raise ValueError(f"Expected hidden_ND [N, D] and w_DV [D, V]; got {hidden_ND.shape} and "
                     f"{w_DV.shape}. Flatten [B, T, D] hidden states to [B*T, D] first.")
  if targets_N.shape != hidden_ND.shape[:1]:
    raise ValueError(f"targets_N must be [N] = {hidden_ND.shape[:1]}; got {targets_N.shape}.")
  if not jnp.issubdtype(targets_N.dtype, jnp.integer):
    raise ValueError(f"targets_N must hold integer token ids; got dtype {targets_N.dtype}.")
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0; got {temperature}.")
  if softcap is not None and not softcap > 0:
    raise ValueError(f"softcap must be None or > 0; got {softcap}.")


def _config(impl, temperature, softcap, with_entropy, block_sizes, interpret) -> _Config:
  impl = _resolve(impl, interpret)
  block_sizes = block_sizes or _MODULES[impl].BlockSizes()
  if not isinstance(block_sizes, _MODULES[impl].BlockSizes):
    raise ValueError(f"block_sizes for impl={impl!r} must be {impl}.BlockSizes; got "
                     f"{type(block_sizes).__module__}.{type(block_sizes).__name__}.")
  return _Config(impl, float(temperature), None if softcap is None else float(softcap),
                 bool(with_entropy), block_sizes, interpret)


def _same_dtype(hidden_ND, w_DV):
  dtype = jnp.promote_types(hidden_ND.dtype, w_DV.dtype)  # kernels need one matmul dtype
  return hidden_ND.astype(dtype), w_DV.astype(dtype)


def token_logprobs(hidden_ND, w_DV, targets_N, *, temperature: float = 1.0,
                   return_entropy: bool = False, impl: str = "auto",
                   softcap: float | None = None, block_sizes=None, interpret=False):
  """log softmax(z)[target], float32 `[N]` (+ entropy `[N]`), without materializing [N, V].

  Args:
    hidden_ND: final hidden states, flattened over batch and time (bf16 or f32).
    w_DV: unembedding (for tied embeddings, the transposed embedding table).
    targets_N: integer token ids in [0, V); pad positions may hold any valid id.
    temperature, softcap: Python floats (static); see the module docstring.
    return_entropy: also return the per-token entropy, differentiable like logp.
    impl: one of IMPLS.
    block_sizes: the chosen implementation's `BlockSizes` (defaults when None).
    interpret: run Pallas kernels in interpret mode (CPU tests): True or pltpu.InterpretParams.
  """
  _validate(hidden_ND, w_DV, targets_N, temperature, softcap)
  if impl == "reference":
    return token_logprobs_reference(hidden_ND, w_DV, targets_N, temperature=temperature,
                                    return_entropy=return_entropy, softcap=softcap)
  cfg = _config(impl, temperature, softcap, return_entropy, block_sizes, interpret)
  return _fused(*_same_dtype(hidden_ND, w_DV), targets_N.astype(jnp.int32), cfg)


def logprob_stats(hidden_ND, w_DV, targets_N, *, temperature: float = 1.0,
                  softcap: float | None = None, with_entropy: bool = False, impl: str = "auto",
                  block_sizes=None, interpret=False) -> Stats:
  """Per-token partial `Stats(m, l, t, a)` over the columns of a (local) `w_DV` shard.

  Forward only (no gradient). Targets outside `[0, V_local)` contribute t = 0, so a shard
  holding columns `[v0, v0 + V_local)` is called with `targets_N − v0`. Combine shards with
  `allreduce_stats` (inside shard_map) or `merge_stats`, then `finalize`.
  """
  _validate(hidden_ND, w_DV, targets_N, temperature, softcap)
  cfg = _config("xla" if impl == "reference" else impl, temperature, softcap, with_entropy,
                block_sizes, interpret)
  hidden_ND, w_DV = _same_dtype(hidden_ND, w_DV)
  return _MODULES[cfg.impl].forward_stats(hidden_ND, w_DV, targets_N.astype(jnp.int32),
                                          with_entropy=with_entropy, **_impl_kwargs(cfg))


def logprob_backward(hidden_ND, w_DV, targets_N, lse_N, mean_z_N, g_N, g_ent_N=None, *,
                     temperature: float = 1.0, softcap: float | None = None,
                     impl: str = "auto", block_sizes=None, interpret=False):
  """Float32 `(dh_ND, dW_DV)` of `Σ g·logp + g_ent·entropy` for a (local) vocab shard.

  `lse_N` and `mean_z_N` (= E_p[z]) must be the global values from `finalize`; with a sharded
  W the returned `dh_ND` is this shard's partial sum (psum it over the vocab axis).
  """
  _validate(hidden_ND, w_DV, targets_N, temperature, softcap)
  cfg = _config("xla" if impl == "reference" else impl, temperature, softcap,
                g_ent_N is not None, block_sizes, interpret)
  hidden_ND, w_DV = _same_dtype(hidden_ND, w_DV)
  return _MODULES[cfg.impl].backward(hidden_ND, w_DV, targets_N.astype(jnp.int32), lse_N,
                                     mean_z_N, g_N, g_ent_N, **_impl_kwargs(cfg))


def allreduce_stats(stats: Stats, axis_name) -> Stats:
  """Merges per-shard `Stats` across a named (vocab) axis: pmax for m, rescaled psums."""
  m = jax.lax.pmax(stats.m, axis_name)
  scale = jnp.exp(stats.m - m)
  return Stats(m, jax.lax.psum(stats.l * scale, axis_name), jax.lax.psum(stats.t, axis_name),
               jax.lax.psum(stats.a * scale, axis_name))
