# pylint: disable=invalid-name
r"""Numerical study: variance of importance-ratio gradient weights, and Hölder concentration.

  python scripts/ratio_variance_study.py                     # table + runs/ratio_variance_study.png
  python scripts/ratio_variance_study.py --sigma=0.2 --length=512 --out=/tmp/study.png

Part 1 (the CTPO claim, arXiv 2605.07331). Token log-ratios ℓ_t are sampled i.i.d. from
N(−σ²/2, σ²), so r_t = exp(ℓ_t) has mean 1 under the behaviour policy, as a real ratio does.
Each method multiplies ∇logp_t by a weight:

  token       r_t                         (PPO / GRPO)
  cumulative  Π_{s≤t} r_s                  (CTPO; prefix products form a mean-1 martingale)
  sequence    Π_{s≤T} r_s                  (the exact full-sequence correction)
  gspo        exp((1/T) Σ_s ℓ_s)           (GSPO's length-normalised ratio)

The table prints Var[weight] over samples at several positions t. Expected: token and GSPO
small and flat, cumulative growing like exp(σ²t) − 1, and cumulative ≤ sequence at every t
(it reaches the sequence value at each row's last policy token). A random fraction of positions is masked as tool tokens: they neither
add to the cumulative product nor advance the position, so t counts policy tokens.

Part 2 (HölderPO, arXiv 2605.12058). For exponents p, the sequence ratio ρ = exp(M_p(ℓ)) has
gradient ρ·softmax_t(pℓ) w.r.t. ℓ. "Concentration" is the mean largest per-token share
max_t softmax_t(pℓ) (1/T for uniform weights; larger p piles the gradient onto the tokens whose
probability rose most), alongside Var[ρ] and the variance of the gradient norm: the trade-off
the paper's p schedules move along.

All weights come from the library functions in agentrl.losses.ratios.
"""
import os

from absl import app, flags
import jax
import jax.numpy as jnp
import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top,wrong-import-position

from agentrl.losses import ratios  # pylint: disable=wrong-import-position

_SAMPLES = flags.DEFINE_integer("samples", 4096, "Synthetic sequences.")
_LENGTH = flags.DEFINE_integer("length", 256, "Positions per sequence (policy + tool).")
_SIGMA = flags.DEFINE_float("sigma", 0.1, "Std of the per-token log-ratio (part 1).")
_HOLDER_SIGMA = flags.DEFINE_float("holder_sigma", 0.5,
                                   "Std of the per-token log-ratio (part 2, Hölder).")
_TOOL_FRAC = flags.DEFINE_float("tool_fraction", 0.2, "Fraction of positions masked as tool.")
_SEED = flags.DEFINE_integer("seed", 0, "PRNG seed.")
_OUT = flags.DEFINE_string("out", "runs/ratio_variance_study.png", "PNG output path.")
_HOLDER_P = (-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 3.0)


def sample_log_ratios(rng, samples: int, length: int, sigma: float, tool_fraction: float):
  """ℓ ~ N(−σ²/2, σ²) so E[r] = 1; mask 1 on policy tokens (first token always policy)."""
  k_ratio, k_mask = jax.random.split(rng)
  log_ratio_BT = -0.5 * sigma**2 + sigma * jax.random.normal(k_ratio, (samples, length))
  mask_BT = (jax.random.uniform(k_mask, (samples, length)) >= tool_fraction)
  mask_BT = mask_BT.at[:, 0].set(True).astype(jnp.float32)
  return log_ratio_BT, mask_BT


@jax.jit
def gradient_weights(log_ratio_BT, mask_BT):
  """Per-token gradient weights of the four ratio families, each f32 [B, T] (0 on tool)."""
  old_BT = jnp.zeros_like(log_ratio_BT)  # logp − old_logp = ℓ
  token_BT = jnp.exp(ratios.token_log_ratio(log_ratio_BT, old_BT, mask_BT))
  # Large log-ratio clamps off: this study measures the estimator, not the safety net.
  cum_log_BT, n_BT = ratios.cumulative_log_ratio(log_ratio_BT, old_BT, mask_BT,
                                                 max_log_ratio=jnp.inf)
  seq_log_B = jnp.where(mask_BT > 0, log_ratio_BT, 0.0).sum(-1)  # = the last prefix sum
  gspo_log_B = ratios.sequence_log_ratio(log_ratio_BT, old_BT, mask_BT)
  valid = mask_BT > 0
  return {
      "token": jnp.where(valid, token_BT, 0.0),
      "cumulative": jnp.where(valid, jnp.exp(cum_log_BT), 0.0),
      "sequence": jnp.where(valid, jnp.exp(seq_log_B)[:, None], 0.0),
      "gspo": jnp.where(valid, jnp.exp(gspo_log_B)[:, None], 0.0),
  }, n_BT


def variance_by_position(weights, n_BT, mask_BT, positions):
  """Var over samples of each weight at the policy-token position n (1-indexed)."""
  at_n = (n_BT[None, :, :] == jnp.asarray(positions, jnp.float32)[:, None, None]) & (
      mask_BT[None] > 0)  # [P, B, T]: the unique column holding policy token number n
  out = {}
  for name, w_BT in weights.items():
    vals_PB = jnp.where(at_n, w_BT[None], 0.0).sum(-1)
    has_PB = at_n.any(-1)
    count_P = jnp.maximum(has_PB.sum(-1), 2)
    mean_P = vals_PB.sum(-1) / count_P
    out[name] = np.asarray(
        (jnp.where(has_PB, (vals_PB - mean_P[:, None]) ** 2, 0.0)).sum(-1) / (count_P - 1))
  return out


def holder_study(log_ratio_BT, mask_BT):
  """Rows of (p, Var[ρ], Var[|∇ρ|], mean max-share, effective-token fraction)."""
  rows = []
  for p in _HOLDER_P:
    def rho_B(lr_BT, p=p):
      return jnp.exp(ratios.holder_log_ratio(lr_BT, mask_BT, p=p))

    rho = rho_B(log_ratio_BT)
    grad_BT = jax.grad(lambda lr: rho_B(lr).sum())(log_ratio_BT)  # rows are independent
    share_BT = grad_BT / jnp.maximum(rho[:, None], 1e-30)          # = softmax_t(pℓ)
    count_B = mask_BT.sum(-1)
    eff_B = 1.0 / jnp.maximum((share_BT**2).sum(-1), 1e-30) / count_B
    rows.append((p, float(rho.var(ddof=1)),
                 float(jnp.linalg.norm(grad_BT, axis=-1).var(ddof=1)),
                 float(share_BT.max(-1).mean()), float(eff_B.mean())))
  return rows


def main(argv):
  del argv
  rng = jax.random.PRNGKey(_SEED.value)
  log_ratio_BT, mask_BT = sample_log_ratios(rng, _SAMPLES.value, _LENGTH.value, _SIGMA.value,
                                            _TOOL_FRAC.value)
  weights, n_BT = gradient_weights(log_ratio_BT, mask_BT)
  max_n = int(n_BT[:, -1].min())  # every sample has at least this many policy tokens
  positions = sorted({1, 2, 4, 8, 16, 32, 64, 128, max_n} & set(range(1, max_n + 1)))
  var = variance_by_position(weights, n_BT, mask_BT, positions)

  sigma = _SIGMA.value
  print(f"Part 1: Var[gradient weight] by policy-token position "
        f"({_SAMPLES.value} samples, {_LENGTH.value} positions, σ={sigma}, "
        f"{_TOOL_FRAC.value:.0%} tool tokens)")
  print(f"{'t':>6} {'token':>10} {'cumulative':>11} {'sequence':>10} {'gspo':>10} "
        f"{'exp(σ²t)-1':>11} {'cum<=seq':>9}")
  for i, t in enumerate(positions):
    print(f"{t:>6} {var['token'][i]:>10.4g} {var['cumulative'][i]:>11.4g} "
          f"{var['sequence'][i]:>10.4g} {var['gspo'][i]:>10.4g} "
          f"{np.expm1(sigma**2 * t):>11.4g} {str(var['cumulative'][i] <= var['sequence'][i]):>9}")

  log_ratio_BT, mask_BT = sample_log_ratios(jax.random.fold_in(rng, 1), _SAMPLES.value,
                                            _LENGTH.value, _HOLDER_SIGMA.value, _TOOL_FRAC.value)
  print(f"\nPart 2: Hölder power mean ρ = exp(M_p): gradient concentration vs variance "
        f"(σ={_HOLDER_SIGMA.value})")
  print(f"{'p':>6} {'Var[rho]':>10} {'Var[|grad|]':>12} {'max share':>10} {'eff. tokens':>12}")
  rows = holder_study(log_ratio_BT, mask_BT)
  for p, v_rho, v_grad, share, eff in rows:
    print(f"{p:>6.2f} {v_rho:>10.4g} {v_grad:>12.4g} {share:>10.4f} {eff:>12.4f}")

  fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
  for name in ("token", "cumulative", "sequence", "gspo"):
    ax1.plot(positions, np.maximum(var[name], 1e-12), marker="o", label=name)
  ax1.set(xscale="log", yscale="log", xlabel="policy-token position t",
          ylabel="Var[gradient weight]", title=f"Ratio weights (σ={sigma})")
  ax1.legend()
  ps = [r[0] for r in rows]
  ax2.plot(ps, [r[3] for r in rows], marker="o", color="C3", label="mean max share")
  ax2.set(xlabel="Hölder exponent p", ylabel="max_t softmax(pℓ)", title="HölderPO")
  ax2b = ax2.twinx()
  ax2b.plot(ps, [r[1] for r in rows], marker="s", color="C0", label="Var[ρ]")
  ax2b.set(ylabel="Var[ρ]", yscale="log")
  ax2.legend(loc="upper left")
  ax2b.legend(loc="lower right")
  fig.tight_layout()
  os.makedirs(os.path.dirname(_OUT.value) or ".", exist_ok=True)
  fig.savefig(_OUT.value, dpi=120)
  print(f"\nWrote {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
