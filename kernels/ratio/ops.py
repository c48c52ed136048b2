# pylint: disable=invalid-name
"""Ratio math of one minibatch: token log-ratio, CTPO cumulative log-ratio, clip statistics.

  ratio_stats(logp_BT, old_logp_BT, mask_BT, adv_BT, *, clamp=20., max_log_ratio=10.,
              a_lo=0.025, a_hi=0.05, kappa=0.5, geomean=False, impl="auto") -> RatioStats

Definitions (CTPO, arXiv 2605.07331; docs/algorithms.md §1.2, verl conventions §0.4), m = mask:

  ℓ_t = clip(logp_t − old_logp_t, −clamp, clamp), 0 where m_t = 0
  S_t = Σ_{s≤t} m_s ℓ_s   (S_t / n_t with geomean),   n_t = Σ_{s≤t} m_s
  log ρ_t = min(S_t, max_log_ratio); window [−a_lo·max(n_t,1)^κ, a_hi·max(n_t,1)^κ]
  clip_high / clip_low: policy tokens with log ρ_t above / below the window
  clipfrac_high = #(clip_high ∧ A > 0) / #policy tokens, clipfrac_low = #(clip_low ∧ A < 0) / #

The standard window [1 − ε_lo, 1 + ε_hi] is a_lo = −log(1 − ε_lo), a_hi = log(1 + ε_hi),
kappa = 0. Gradients: `log_ratio_BT` is differentiable (1 w.r.t. logp inside the clamp, 0 where
the clamp binds or the token is masked); `cum_log_ratio_BT` is returned stop-gradiented, as
CTPO uses sg(S_t). Everything else is a statistic.

impl: "xla" (plain jnp; XLA fuses it), "pallas" (pallas.py, Mosaic/TPU, or interpret mode on
CPU), "pallas_tpu" (the same kernel without the backend check, for AOT export), "auto" = "xla"
on every backend: the Pallas kernel has not been shown faster anywhere it was measured
(kernels/README.md), and docs/kernels.md §5 expects XLA to win on this O(B·T) data.
"""
import dataclasses
import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from kernels.ratio import pallas

IMPLS = ("auto", "xla", "pallas", "pallas_tpu")


class RatioStats(NamedTuple):
  log_ratio_BT: jax.Array  # f32, ℓ_t (0 where masked)
  cum_log_ratio_BT: jax.Array  # f32, S_t or S_t/n_t (0 where masked), no gradient
  position_BT: jax.Array  # f32, n_t (masked positions hold the count so far)
  clip_high_BT: jax.Array  # bool
  clip_low_BT: jax.Array  # bool
  clipfrac_high: jax.Array  # f32 scalar
  clipfrac_low: jax.Array  # f32 scalar
  num_tokens: jax.Array  # f32 scalar, Σ m


@dataclasses.dataclass(frozen=True)
class _Config:
  clamp: float
  max_log_ratio: float
  a_lo: float
  a_hi: float
  kappa: float
  geomean: bool
  block_sizes: Any = None
  interpret: Any = False


def ratio_stats_reference(logp_BT, old_logp_BT, mask_BT, adv_BT, cfg: _Config) -> RatioStats:
  """Plain jnp version (the "xla" impl and the test oracle)."""
  valid_BT = mask_BT > 0
  lr_BT = jnp.where(valid_BT, jnp.clip(logp_BT - old_logp_BT, -cfg.clamp, cfg.clamp), 0.0)
  cum_BT = jnp.cumsum(jax.lax.stop_gradient(lr_BT), axis=-1)
  pos_BT = jnp.cumsum(valid_BT.astype(jnp.float32), axis=-1)
  if cfg.geomean:
    cum_BT = cum_BT / jnp.maximum(pos_BT, 1.0)
  log_rho_BT = jnp.minimum(cum_BT, cfg.max_log_ratio)
  scale_BT = jnp.maximum(pos_BT, 1.0) ** cfg.kappa
  high_BT = valid_BT & (log_rho_BT > cfg.a_hi * scale_BT)
  low_BT = valid_BT & (log_rho_BT < -cfg.a_lo * scale_BT)
  count = valid_BT.sum().astype(jnp.float32)
  frac = lambda x: x.sum().astype(jnp.float32) / jnp.maximum(count, 1.0)
  return RatioStats(lr_BT, jnp.where(valid_BT, cum_BT, 0.0), pos_BT, high_BT, low_BT,
                    frac(high_BT & (adv_BT > 0)), frac(low_BT & (adv_BT < 0)), count)


def _pallas_fwd(logp_BT, old_logp_BT, mask_BT, adv_BT, cfg: _Config):
  lr, cum, pos, code, count_B, high_B, low_B = pallas.ratio_math(
      logp_BT, old_logp_BT, mask_BT, adv_BT, clamp=cfg.clamp, max_log_ratio=cfg.max_log_ratio,
      a_lo=cfg.a_lo, a_hi=cfg.a_hi, kappa=cfg.kappa, geomean=cfg.geomean,
      block_sizes=cfg.block_sizes, interpret=cfg.interpret)
  count = count_B.sum()
  denom = jnp.maximum(count, 1.0)
  out = RatioStats(lr, cum, pos, code > 0, code < 0, high_B.sum() / denom, low_B.sum() / denom,
                   count)
  return out, (logp_BT - old_logp_BT, mask_BT)


def _pallas_bwd(cfg: _Config, residuals, cotangents):
  diff_BT, mask_BT = residuals
  # Only ℓ carries gradient: S_t is stop-gradiented and the rest are statistics.
  inside = (mask_BT > 0) & (jnp.abs(diff_BT) <= cfg.clamp)
  d_BT = jnp.where(inside, cotangents.log_ratio_BT, 0.0)
  return d_BT, -d_BT, None, None


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _ratio_pallas(logp_BT, old_logp_BT, mask_BT, adv_BT, cfg: _Config) -> RatioStats:
  return _pallas_fwd(logp_BT, old_logp_BT, mask_BT, adv_BT, cfg)[0]


_ratio_pallas.defvjp(_pallas_fwd, _pallas_bwd)


def _resolve(impl: str, interpret) -> str:
  if impl not in IMPLS:
    raise ValueError(f"Unknown ratio impl {impl!r}; expected one of {IMPLS}.")
  if impl in ("auto", "xla"):
    return "xla"
  backend = jax.default_backend()
  if impl == "pallas" and backend != "tpu" and not interpret:
    raise ValueError(f"impl='pallas' is a TPU (Mosaic) kernel and the backend is {backend!r}; "
                     "use impl='xla', or interpret=True for CPU tests.")
  return "pallas_tpu"


def ratio_stats(logp_BT, old_logp_BT, mask_BT, adv_BT, *, clamp: float = 20.0,
                max_log_ratio: float = 10.0, a_lo: float = 0.025, a_hi: float = 0.05,
                kappa: float = 0.5, geomean: bool = False, impl: str = "auto",
                block_sizes: pallas.BlockSizes | None = None, interpret=False) -> RatioStats:
  """CTPO ratio math for one minibatch (see the module docstring). Inputs `[B, T]`.

  `adv_BT` may also be `[B]` or `[B, 1]` (a sequence advantage); it only decides which clipped
  tokens count towards clipfrac_high (A > 0) and clipfrac_low (A < 0).
  """
  if logp_BT.ndim != 2 or old_logp_BT.shape != logp_BT.shape or mask_BT.shape != logp_BT.shape:
    raise ValueError(f"logp_BT, old_logp_BT and mask_BT must share one [B, T] shape; got "
                     f"{logp_BT.shape}, {old_logp_BT.shape}, {mask_BT.shape}.")
  if adv_BT.ndim == 1:
    adv_BT = adv_BT[:, None]
  adv_BT = jnp.broadcast_to(adv_BT, logp_BT.shape).astype(jnp.float32)
  if min(clamp, a_lo, a_hi) <= 0:
    raise ValueError(f"clamp, a_lo and a_hi must be > 0; got {clamp}, {a_lo}, {a_hi}.")
  impl = _resolve(impl, interpret)
  cfg = _Config(float(clamp), float(max_log_ratio), float(a_lo), float(a_hi), float(kappa),
                bool(geomean), block_sizes or pallas.BlockSizes(), interpret)
  args = (logp_BT.astype(jnp.float32), old_logp_BT.astype(jnp.float32),
          mask_BT.astype(jnp.float32), adv_BT)
  if impl == "xla":
    return ratio_stats_reference(*args, cfg)
  return _ratio_pallas(*args, cfg)
