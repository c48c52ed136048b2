# pylint: disable=invalid-name
"""Per-token teacher-student KL from both models' hidden states and unembeddings, one op.

  distill_kl(h_student_ND, w_student_DV, h_teacher_ND, w_teacher_DV, *, kind="forward",
             top_k=None, temperature=1.0, impl="auto", block_sizes=None,
             interpret=False) -> kl_N  (float32)

With `z = h W / temperature` for each model and p = softmax(z):

  kind="forward"  KL(p_T || p_S) = Σ_v p_T (log p_T − log p_S)   (GKD's forward KL; OPSD β = 0)
  kind="reverse"  KL(p_S || p_T) = Σ_v p_S (log p_S − log p_T)   (on-policy distillation's KL)

`top_k=k` restricts both distributions to the teacher's k most likely ids of that token and
renormalises each over them before the KL: the convention of OPSD's `top_k_loss`
(siyan-zhao/OPSD `opsd_trainer.generalized_jsd_loss`: `topk` of the teacher's
temperature-scaled logits, both logits gathered there, then `log_softmax` over the k). Ties in
the teacher's logits go to the lower token id (`lax.top_k`).

Differentiable w.r.t. the student's `h` and `W` only: the teacher's inputs get stop-gradient.
Student and teacher must share the vocabulary (one tokenizer); their widths D may differ.
Implementations (docs/kernels.md §9):

  "xla"         token-chunked `lax.map`/`scan`, custom_vjp with a recomputing backward
                (kl_xla.py); residuals h, W of both models and lse_s, lse_t, KL `[N]`.
  "pallas_tpu"  Mosaic kernels, online logsumexp over vocab tiles (kl_pallas.py).
  "pallas"      the TPU kernel (on CPU only with interpret=True); no GPU kernel: use "xla".
  "reference"   naive `[N, V]` logits for both models, plain autodiff (the test oracle).
  "auto"        TPU: pallas_tpu; GPU and CPU: xla.

`top_k` always runs the xla top-k path (the selection needs a sort that Mosaic does not lower;
what follows is O(N·k·D)); its residuals are the ids and the teacher's k logits `[N, k]`.
"""
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from kernels.logprob import kl_common
from kernels.logprob import kl_pallas
from kernels.logprob import kl_xla

KINDS = kl_common.KINDS
IMPLS = ("auto", "xla", "pallas", "pallas_tpu", "reference")
_MODULES = {"xla": kl_xla, "pallas_tpu": kl_pallas}


def distill_kl_reference(h_student_ND, w_student_DV, h_teacher_ND, w_teacher_DV, *,
                         kind: str = "forward", top_k: int | None = None,
                         temperature: float = 1.0):
  """Naive oracle: materializes both models' `[N, V]` float32 logits."""
  logits = lambda h, w: jnp.einsum("nd,dv->nv", h, w, preferred_element_type=jnp.float32)
  z_s_NV = logits(h_student_ND, w_student_DV) / temperature
  z_t_NV = jax.lax.stop_gradient(logits(h_teacher_ND, w_teacher_DV)) / temperature
  if top_k is not None:
    _, ids_Nk = jax.lax.top_k(z_t_NV, top_k)
    z_s_NV = jnp.take_along_axis(z_s_NV, ids_Nk, axis=-1)
    z_t_NV = jnp.take_along_axis(z_t_NV, ids_Nk, axis=-1)
  logp_s, logp_t = jax.nn.log_softmax(z_s_NV, -1), jax.nn.log_softmax(z_t_NV, -1)
  if kind == "forward":
    return jnp.sum(jnp.exp(logp_t) * (logp_t - logp_s), -1)
  return jnp.sum(jnp.exp(logp_s) * (logp_s - logp_t), -1)


def default_impl(backend: str | None = None) -> str:
  """The implementation `impl="auto"` resolves to on `backend` (default: JAX's default)."""
  return "pallas_tpu" if (backend or jax.default_backend()) == "tpu" else "xla"


def _resolve(impl: str, top_k, interpret) -> str:
  if impl not in IMPLS:
    raise ValueError(f"Unknown distill_kl impl {impl!r}; expected one of {IMPLS}.")
  if top_k is not None and impl != "reference":
    return "xla"
  if impl == "auto":
    return default_impl()
  if impl != "pallas":
    return impl
  if jax.default_backend() != "tpu" and not interpret:
    raise ValueError(f"impl='pallas' for distill_kl is a TPU kernel (found backend "
                     f"{jax.default_backend()!r}); pass interpret=True to emulate it, or use "
                     "impl='xla' (the GPU and CPU default).")
  return "pallas_tpu"


@dataclasses.dataclass(frozen=True)
class _Config:
  """Static (hashable) arguments of the custom_vjp."""
  impl: str
  kind: str
  top_k: int | None
  temperature: float
  block_sizes: Any
  interpret: Any


def _impl_kwargs(cfg: _Config):
  kw = dict(kind=cfg.kind, temperature=cfg.temperature, block_sizes=cfg.block_sizes)
  if cfg.impl == "pallas_tpu":
    kw["interpret"] = cfg.interpret
  return kw


def _fused_fwd(h_s, w_s, h_t, w_t, cfg: _Config):
  if cfg.top_k is not None:
    kl, ids, zt = kl_xla.topk_forward(h_s, w_s, h_t, w_t, k=cfg.top_k, **_impl_kwargs(cfg))
    return kl, (h_s, w_s, ids, zt, kl)
  stats = _MODULES[cfg.impl].forward_stats(h_s, w_s, h_t, w_t, **_impl_kwargs(cfg))
  kl, lse_s, lse_t = kl_common.finalize(stats, cfg.kind)
  return kl, (h_s, w_s, h_t, w_t, lse_s, lse_t, kl)


def _fused_bwd(cfg: _Config, residuals, g_N):
  if cfg.top_k is not None:
    h_s, w_s, ids, zt, kl = residuals
    dh, dw = kl_xla.topk_backward(h_s, w_s, ids, zt, kl, g_N, **_impl_kwargs(cfg))
  else:
    h_s, w_s, h_t, w_t, lse_s, lse_t, kl = residuals
    dh, dw = _MODULES[cfg.impl].backward(h_s, w_s, h_t, w_t, lse_s, lse_t, kl, g_N,
                                         **_impl_kwargs(cfg))
  # The teacher is data: None is a zero cotangent without materialising one.
  return dh.astype(h_s.dtype), dw.astype(w_s.dtype), None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _fused(h_s, w_s, h_t, w_t, cfg: _Config):
  return _fused_fwd(h_s, w_s, h_t, w_t, cfg)[0]


_fused.defvjp(_fused_fwd, _fused_bwd)


def _validate(h_s, w_s, h_t, w_t, kind, top_k, temperature):
  for name, h, w in (("student", h_s, w_s), ("teacher", h_t, w_t)):
    if h.ndim != 2 or w.ndim != 2 or h.shape[1] != w.shape[0]:
      raise ValueError(f"Expected h_{name}_ND [N, D] and w_{name}_DV [D, V]; got {h.shape} and "
                       f"{w.shape}. Flatten [B, T, D] hidden states to [B*T, D] first.")
  if h_s.shape[0] != h_t.shape[0]:
    raise ValueError(f"Student and teacher must score the same N token positions; got N = "
                     f"{h_s.shape[0]} and {h_t.shape[0]} (align the teacher's positions to the "
                     "student's first, e.g. agentrl.losses.distill.align_to_student).")
  if w_s.shape[1] != w_t.shape[1]:
    raise ValueError(f"Student and teacher vocabularies differ (V = {w_s.shape[1]} vs "
                     f"{w_t.shape[1]}): the per-token KL needs one shared tokenizer; "
                     "cross-tokenizer distillation is out of scope.")
  if kind not in KINDS:
    raise ValueError(f"Unknown distill_kl kind {kind!r}; expected one of {KINDS} "
                     "(forward = KL(p_T || p_S), reverse = KL(p_S || p_T)).")
  if top_k is not None and not (isinstance(top_k, int) and 1 <= top_k <= w_s.shape[1]):
    raise ValueError(f"top_k must be None or an int in [1, V = {w_s.shape[1]}]; got {top_k!r}.")
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0; got {temperature}.")


def _config(impl, kind, top_k, temperature, block_sizes, interpret) -> _Config:
  impl = _resolve(impl, top_k, interpret)
  module = _MODULES[impl]
  block_sizes = block_sizes or module.BlockSizes()
  if not isinstance(block_sizes, module.BlockSizes):
    raise ValueError(f"block_sizes for distill_kl impl={impl!r}"
                     f"{' (top_k runs the xla path)' if top_k is not None else ''} must be "
                     f"{module.BlockSizes.__module__}.{module.BlockSizes.__name__}; got "
                     f"{type(block_sizes).__module__}.{type(block_sizes).__name__}.")
  return _Config(impl, kind, top_k, float(temperature), block_sizes, interpret)


def _same_dtype(h_ND, w_DV):
  dtype = jnp.promote_types(h_ND.dtype, w_DV.dtype)  # kernels need one matmul dtype per model
  return h_ND.astype(dtype), w_DV.astype(dtype)


def distill_kl(h_student_ND, w_student_DV, h_teacher_ND, w_teacher_DV, *,
               kind: str = "forward", top_k: int | None = None, temperature: float = 1.0,
               impl: str = "auto", block_sizes=None, interpret=False):
  """Float32 `[N]` per-token KL between the two models' next-token distributions.

  Never materializes `[N, V]` (except impl="reference").

  Args:
    h_student_ND, w_student_DV: the student's final hidden states `[N, D_s]` (flattened over
      batch and time) and unembedding `[D_s, V]`; the only differentiated inputs.
    h_teacher_ND, w_teacher_DV: the teacher's, `[N, D_t]` and `[D_t, V]` (stop-gradient).
      Row n of both must predict the same next token (same prefix up to the models' contexts).
    kind: "forward" or "reverse" (module docstring).
    top_k: None for the full vocabulary, or k: the teacher's top-k ids, both renormalised.
    temperature: static Python float dividing both models' logits.
    impl: one of IMPLS.
    block_sizes: the implementation's BlockSizes (kl_xla.BlockSizes = xla.BlockSizes,
      kl_pallas.BlockSizes = pallas_tpu.BlockSizes); top_k takes kl_xla.BlockSizes.
    interpret: run the Pallas kernels in interpret mode (CPU tests).
  """
  _validate(h_student_ND, w_student_DV, h_teacher_ND, w_teacher_DV, kind, top_k, temperature)
  h_t, w_t = (jax.lax.stop_gradient(x) for x in _same_dtype(h_teacher_ND, w_teacher_DV))
  if impl == "reference":
    return distill_kl_reference(h_student_ND, w_student_DV, h_t, w_t, kind=kind, top_k=top_k,
                                temperature=temperature)
  cfg = _config(impl, kind, top_k, temperature, block_sizes, interpret)
  return _fused(*_same_dtype(h_student_ND, w_student_DV), h_t, w_t, cfg)
