# pylint: disable=invalid-name
"""Tests for agentrl.losses.policy.

Golden numbers on a hand-made batch, float64 NumPy references (value and gradient by central
finite differences) on random masked batches, and the RL invariants of algorithms.md §7.
"""
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.losses import ratios

jax.config.update("jax_numpy_rank_promotion", "raise")

LN = np.log
# Row 0: ratios (2, 0.5, 1.5), A = +1. Row 1: ratios (1.25, <masked>, 0.75), A = -1; its masked
# token carries a garbage log-prob. old_logp = -1 everywhere, so logp = -1 + ℓ.
MASK = jnp.array([[1., 1., 1.], [1., 0., 1.]])
ELL = np.array([[LN(2.), -LN(2.), LN(1.5)], [LN(1.25), 0., LN(0.75)]])
OLD = jnp.full((2, 3), -1.0)
LOGP = jnp.asarray(np.where(np.asarray(MASK) > 0, -1.0 + ELL, 40.0), jnp.float32)
ADV_B = jnp.array([1.0, -1.0])
ADV_BT = ADV_B[:, None]
RATIO_MEAN = 1.2  # mean of (2, 0.5, 1.5, 1.25, 0.75)
PPO_KL = -0.06818532


def _random_batch(seed=0, scale=0.3, on_policy=False, garbage=7.0):
  """[4, 6] batch: holes (tool tokens), a masked prompt prefix, a fully masked row."""
  rng = np.random.default_rng(seed)
  mask = np.array([[1, 1, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1],
                   [0, 1, 1, 0, 0, 1]], np.float32)
  old = -rng.uniform(0.1, 3.0, mask.shape)
  logp = old if on_policy else old + rng.normal(0.0, scale, mask.shape)
  logp = np.where(mask > 0, logp, garbage)
  adv_BT = rng.normal(0.0, 1.0, mask.shape)
  adv_B = rng.normal(0.0, 1.0, mask.shape[:1])
  return (jnp.asarray(logp, jnp.float32), jnp.asarray(old, jnp.float32),
          jnp.asarray(adv_BT, jnp.float32), jnp.asarray(adv_B, jnp.float32), jnp.asarray(mask))


def _agg(loss, mask_BT, mode):
  if mode == "seq-mean":
    return aggregation.aggregate(loss, mask_BT.sum(-1) > 0, "seq-mean")
  return aggregation.aggregate(loss, mask_BT, mode)


def _grad(fn, logp, old, adv, mask, mode, **kw):
  return jax.grad(lambda lp: _agg(fn(lp, old, adv, mask, **kw)[0], mask, mode))(logp)


def _jit_loss_and_grad(fn, mode, **kw):
  """One compiled (loss, aggregate, d aggregate/d logp): cheaper than eager on a new shape."""
  def f(logp, old, adv, mask):
    agg = lambda lp: _agg(fn(lp, old, adv, mask, **kw)[0], mask, mode)
    return fn(logp, old, adv, mask, **kw)[0], agg(logp), jax.grad(agg)(logp)
  return jax.jit(f)


# ---------------------------------------------------------------------------------------------
# Float64 NumPy references, written from algorithms.md independently of the JAX code. Losses
# with a stop-gradient split take `frozen` (the value of logp inside sg); finite differences
# with `frozen` held fixed then give the gradient the split defines.
# ---------------------------------------------------------------------------------------------
def np_ppo(logp, frozen, old, adv, m, eps_low=0.2, eps_high=0.2, dual=None):
  del frozen
  r = np.exp(np.clip(np.where(m > 0, logp - old, 0.0), -20, 20))
  out = np.maximum(-adv * r, -adv * np.clip(r, 1 - eps_low, 1 + eps_high))
  if dual is not None:
    out = np.where(adv < 0, np.minimum(out, -adv * dual), out)
  return np.where(m > 0, out, 0.0)


def np_cispo(logp, frozen, old, adv, m, eps_low=10.0, eps_high=0.2):
  w = np.clip(np.exp(np.clip(frozen - old, -20, 20)), 1 - eps_low, 1 + eps_high)
  return np.where(m > 0, -w * adv * logp, 0.0)


def np_ctpo(logp, frozen, old, adv, m, mode="la", geomean=False, kappa=0.5, a_lo=0.025,
            a_hi=0.05, a_c=0.05, eps=0.2, dual=3.0):
  valid = m > 0
  cum = np.cumsum(np.where(valid, np.clip(frozen - old, -20, 20), 0.0), axis=-1)
  n = np.cumsum(valid, axis=-1).astype(np.float64)
  if geomean:
    cum = cum / np.maximum(n, 1)
  log_rho = np.minimum(cum + logp - frozen, 10.0)
  rho = np.exp(log_rho)
  if mode == "la":
    scale = np.maximum(n, 1) ** kappa
    rho_bar = np.exp(np.clip(log_rho, -a_lo * scale, a_hi * scale))
    threshold = np.exp(a_c * scale)
  else:
    rho_bar, threshold = np.clip(rho, 1 - eps, 1 + eps), dual
  out = np.maximum(-adv * rho, -adv * rho_bar)
  out = np.where(adv < 0, np.minimum(out, -adv * threshold), out)
  return np.where(valid, out, 0.0)


def np_gspo(logp, old, adv_B, m, eps_low=3e-4, eps_high=4e-4):
  valid = m > 0
  s = np.exp(np.minimum(np.where(valid, logp - old, 0).sum(-1) / np.maximum(m.sum(-1), 1), 10))
  out = np.maximum(-adv_B * s, -adv_B * np.clip(s, 1 - eps_low, 1 + eps_high))
  return np.where(valid.any(-1), out, 0.0)


def np_gspo_token(logp, frozen, old, adv, m, eps_low=3e-4, eps_high=4e-4):
  valid = m > 0
  log_s = np.where(valid, frozen - old, 0).sum(-1) / np.maximum(m.sum(-1), 1)
  s = np.exp(np.minimum(log_s[:, None] + logp - frozen, 10))
  out = np.maximum(-adv * s, -adv * np.clip(s, 1 - eps_low, 1 + eps_high))
  return np.where(valid, out, 0.0)


def _np_pessimistic(ell, lo, hi, a):
  clipped = np.clip(ell, lo, hi)
  return np.minimum(ell, clipped) if a > 0 else np.maximum(ell, clipped) if a < 0 else ell


def np_gmpo(logp, old, adv_B, m, eps=0.4):
  out = np.zeros(m.shape[0])
  for b in range(m.shape[0]):
    idx = np.flatnonzero(m[b])
    if idx.size:
      ell = _np_pessimistic(logp[b, idx] - old[b, idx], -eps, eps, adv_B[b])
      out[b] = -adv_B[b] * np.exp(ell.mean())
  return out


def np_holder(logp, old, adv_B, m, p, eps=0.2, token_clip=False):
  """Direct power mean ((1/L) Σ r^p)^(1/p), not the log-space form used by the library."""
  out = np.zeros(m.shape[0])
  for b in range(m.shape[0]):
    idx = np.flatnonzero(m[b])
    if not idx.size:
      continue
    ell, a = logp[b, idx] - old[b, idx], adv_B[b]
    if token_clip:
      ell = _np_pessimistic(ell, np.log(1 - eps), np.log(1 + eps), a)
    r = np.exp(ell)
    rho = np.exp(ell.mean()) if p == 0 else np.mean(r ** p) ** (1.0 / p)
    out[b] = -a * rho if token_clip else max(-a * rho, -a * np.clip(rho, 1 - eps, 1 + eps))
  return out


def np_agg(loss, m, mode):
  rows = m.sum(-1) > 0
  if mode == "token-mean":
    return (loss * m).sum() / max(m.sum(), 1)
  if mode == "seq-mean-token-mean":
    return ((loss * m).sum(-1) / np.maximum(m.sum(-1), 1))[rows].sum() / max(rows.sum(), 1)
  return loss[rows].sum() / max(rows.sum(), 1)  # seq-mean


def fd_grad(f, x, h=1e-6):
  g = np.zeros_like(x)
  for idx in np.ndindex(*x.shape):
    e = np.zeros_like(x)
    e[idx] = h
    g[idx] = (f(x + e) - f(x - e)) / (2 * h)
  return g


class GoldenTest(chex.TestCase):
  """Hand-computed numbers on the fixture (each under jit and without)."""

  def _run(self, fn, adv=ADV_BT, **kw):
    return self.variant(functools.partial(fn, **kw))(LOGP, OLD, adv, MASK)

  @chex.variants(with_jit=True, without_jit=True)
  def test_vanilla_pg(self):
    loss, m = self._run(pg.vanilla_pg)
    np.testing.assert_allclose(loss, [[0.30685282, 1.69314718, 0.59453489],
                                      [-0.77685645, 0., -1.28768207]], rtol=1e-5)
    np.testing.assert_allclose([m["ratio_mean"], m["ratio_max"], m["ppo_kl"]],
                               [RATIO_MEAN, 2.0, PPO_KL], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_ppo_clip(self):
    loss, m = self._run(pg.ppo_clip, eps_low=0.2, eps_high=0.2)
    np.testing.assert_allclose(loss, [[-1.2, -0.5, -1.2], [1.25, 0., 0.8]], rtol=1e-5)
    loss, m = self._run(pg.ppo_clip, eps_low=0.2, eps_high=0.2, dual_clip=1.1)
    np.testing.assert_allclose(loss, [[-1.2, -0.5, -1.2], [1.1, 0., 0.8]], rtol=1e-5)
    got = [m[k] for k in ("clipfrac", "clipfrac_high", "clipfrac_low", "clipfrac_lower",
                          "ratio_mean", "ratio_max", "ppo_kl")]
    np.testing.assert_allclose(got, [0.6, 0.4, 0.2, 0.2, RATIO_MEAN, 2.0, PPO_KL], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_ctpo(self):
    e05, e_hi3, e_lo2 = 1.0512711, 1.0904632, 0.96526236
    loss, m = self._run(pg.ctpo)  # CTPO-LA defaults, kappa 0.5
    np.testing.assert_allclose(loss, [[-e05, -1.0, -e_hi3], [e05, 0., e_lo2]], rtol=1e-5)
    got = [m[k] for k in ("clipfrac", "clipfrac_high", "clipfrac_low", "clipfrac_lower",
                          "ratio_mean", "ratio_max")]
    np.testing.assert_allclose(got, [0.6, 0.4, 0.2, 0.2, 1.3375, 2.0], rtol=1e-5)
    loss, _ = self._run(pg.ctpo, geomean=True)
    np.testing.assert_allclose(loss, [[-e05, -1.0, -e_hi3], [e05, 0., 0.96824584]], rtol=1e-5)
    loss, _ = self._run(pg.ctpo, clip_mode="standard")  # cum-token-cumprod, eps 0.2, c = 3
    np.testing.assert_allclose(loss, [[-1.2, -1.0, -1.2], [1.25, 0., 0.9375]], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_cispo(self):
    loss, m = self._run(pg.cispo)
    np.testing.assert_allclose(loss, [[0.36822338, 0.84657359, 0.71344187],
                                      [-0.93222774, 0., -0.96576155]], rtol=1e-5)
    np.testing.assert_allclose([m["clipfrac"], m["clipfrac_high"], m["clipfrac_low"]],
                               [0.6, 0.6, 0.0], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_sapo(self):
    loss, m = self._run(pg.sapo)
    np.testing.assert_allclose(loss, [[-2.92423431, -1.51016268, -2.48983732],
                                      [2.15333618, 0., 1.65618763]], rtol=1e-5)
    np.testing.assert_allclose(m["gate_mean"], 2.14675162, rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_gspo(self):
    loss, m = self._run(pg.gspo, adv=ADV_B)
    np.testing.assert_allclose(loss, [-1.0004, 0.9997], rtol=1e-6)
    np.testing.assert_allclose([m["ratio_mean"], m["ratio_max"], m["clipfrac"]],
                               [(1.14471424 + 0.96824584) / 2, 1.14471424, 1.0], rtol=1e-5)
    loss, m = self._run(pg.gspo_token)
    np.testing.assert_allclose(loss, [[-1.0004] * 3, [0.9997, 0., 0.9997]], rtol=1e-6)
    np.testing.assert_allclose(m["clipfrac_high"], 0.6, rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_gmpo(self):
    loss, m = self._run(pg.gmpo, adv=ADV_B)
    np.testing.assert_allclose(loss, [-1.03625951, 0.96824584], rtol=1e-5)
    np.testing.assert_allclose([m["clipfrac"], m["clipfrac_high"], m["clipfrac_low"]],
                               [0.6, 0.4, 0.0], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_holder_po(self):
    loss, m = self._run(pg.holder_po, adv=ADV_B, p=jnp.float32(1.0))
    np.testing.assert_allclose(loss, [-1.2, 1.0], rtol=1e-5)
    np.testing.assert_allclose([m["clipfrac"], m["clipfrac_high"], m["holder_p"]],
                               [0.5, 0.5, 1.0], rtol=1e-6)
    loss, _ = self._run(pg.holder_po, adv=ADV_B, p=2.0, token_clip=True)
    np.testing.assert_allclose(loss, [-1.0214369, 1.0494046], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_r2vpo(self):
    loss, m = self._run(pg.r2vpo, lam=0.5, delta=0.1)
    np.testing.assert_allclose(loss, [[-1.5, -0.375, -1.375], [1.28125, 0., 0.78125]], rtol=1e-5)
    np.testing.assert_allclose([m["ratio_var"], m["constraint_residual"], m["lam"]],
                               [0.325, 0.225, 0.5], rtol=1e-5)
    lam = self.variant(functools.partial(pg.r2vpo_dual_update, delta=0.1, lr=2.0))
    np.testing.assert_allclose(lam(0.5, m["ratio_var"]), 0.95, rtol=1e-5)
    self.assertEqual(float(lam(0.1, jnp.float32(0.0))), 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_kl_cov(self):
    # cov = (A − mean A)(logp − mean logp) = (3, −3, −2.4, 2.4); ℓ = (0.1, 0.2, −0.1, 0.3).
    logp = jnp.array([[-0.5, -2.5, -0.7, -2.3]])
    old = logp - jnp.array([[0.1, 0.2, -0.1, 0.3]])
    adv, mask = jnp.array([[3., 3., -3., -3.]]), jnp.ones((1, 4))
    base = np.array([-3.31551275, -3.66420827, 2.71451225, 4.04957642])
    run = lambda ratio: self.variant(functools.partial(pg.kl_cov, kl_cov_ratio=ratio))(
        logp, old, adv, mask)
    loss, m = run(0.25)
    np.testing.assert_allclose(loss[0], base + [0.1, 0, 0, 0], rtol=1e-5)
    loss, m = run(0.5)
    np.testing.assert_allclose(loss[0], base + [0.1, 0, 0, 0.3], rtol=1e-5)
    np.testing.assert_allclose([m["cov_kl_frac"], m["ppo_kl_abs"], m["ppo_kl"]],
                               [0.5, 0.175, -0.125], rtol=1e-5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_clip_cov(self):
    # On-policy, cov = (3, −3, −3, 3): tokens 0 and 3 lie in (1, 5).
    logp = jnp.array([[-0.5, -2.5, -0.5, -2.5]])
    adv, mask = jnp.array([[3., 3., -3., -3.]]), jnp.ones((1, 4))
    run = lambda ratio: self.variant(
        lambda rng: pg.clip_cov(logp, logp, adv, mask, clip_cov_ratio=ratio, rng=rng))
    loss, m = run(0.5)(jax.random.key(0))
    np.testing.assert_allclose(loss, [[0., -3., 3., 0.]], rtol=1e-6)
    np.testing.assert_allclose(m["cov_clipfrac"], 0.5)
    excluded, quarter = set(), run(0.25)
    for seed in range(8):  # one of the two candidates, chosen at random
      loss, m = quarter(jax.random.key(seed))
      zero = tuple(np.flatnonzero(np.asarray(loss[0]) == 0.0))
      self.assertIn(zero, ((0,), (3,)))
      excluded.add(zero)
    self.assertLen(excluded, 2)


class ReferenceTest(parameterized.TestCase):
  """JAX (f32) vs NumPy (f64): per-element loss and the gradient of the aggregated loss."""

  def _check(self, fn, np_fn, mode, seq_adv=False, frozen=False, np_kw=None, **kw):
    logp, old, adv_BT, adv_B, mask = _random_batch(seed=1)
    adv = adv_B if seq_adv else adv_BT
    loss, _ = fn(logp, old, adv, mask, **kw)
    g = _grad(fn, logp, old, adv, mask, mode, **kw)
    lp, o, a, m = (np.asarray(x, np.float64) for x in (logp, old, adv, mask))
    np_kw = np_kw or {}
    ref = (lambda x, fz: np_fn(x, fz, o, a, m, **np_kw)) if frozen else (
        lambda x, fz: np_fn(x, o, a, m, **np_kw))
    np.testing.assert_allclose(loss, ref(lp, lp), rtol=1e-5, atol=1e-6)
    g_ref = fd_grad(lambda x: np_agg(ref(x, lp), m, mode), lp)
    np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=2e-7)
    self.assertGreater(np.abs(g_ref).max(), 1e-3)  # the comparison is not between zeros

  @parameterized.parameters(None, 3.0)
  def test_ppo(self, dual):
    self._check(pg.ppo_clip, np_ppo, "token-mean", frozen=True, dual_clip=dual,
                eps_high=0.28, np_kw=dict(dual=dual, eps_high=0.28))

  def test_cispo(self):
    self._check(pg.cispo, np_cispo, "token-mean", frozen=True)

  @parameterized.parameters(("log_adaptive", False, 0.5), ("log_adaptive", True, -0.5),
                            ("standard", False, 0.5), ("log_adaptive", False, 0.0))
  def test_ctpo(self, clip_mode, geomean, kappa):
    self._check(pg.ctpo, np_ctpo, "token-mean", frozen=True, clip_mode=clip_mode,
                geomean=geomean, kappa=kappa,
                np_kw=dict(mode="la" if clip_mode == "log_adaptive" else "std", geomean=geomean,
                           kappa=kappa))

  def test_gspo(self):
    kw = dict(eps_low=0.02, eps_high=0.03)  # some rows inside the window, some outside
    self._check(pg.gspo, np_gspo, "seq-mean", seq_adv=True, np_kw=kw, **kw)
    self._check(pg.gspo_token, np_gspo_token, "seq-mean-token-mean", frozen=True, np_kw=kw, **kw)

  def test_gmpo(self):
    self._check(pg.gmpo, np_gmpo, "seq-mean", seq_adv=True, eps_low=0.2, eps_high=0.2,
                np_kw=dict(eps=0.2))

  @parameterized.product(p=[-2.0, 0.0, 0.5, 1.0, 3.0], token_clip=[False, True])
  def test_holder_po(self, p, token_clip):
    self._check(pg.holder_po, np_holder, "seq-mean", seq_adv=True, p=p, token_clip=token_clip,
                eps_low=0.1, eps_high=0.1, np_kw=dict(p=p, eps=0.1, token_clip=token_clip))


class InvariantTest(parameterized.TestCase):
  """Masking and on-policy properties shared by every surrogate."""

  # (function, advantage kind, aggregation, kwargs)
  CASES = {
      "vanilla": (pg.vanilla_pg, "token", "token-mean", {}),
      "ppo": (pg.ppo_clip, "token", "token-mean", dict(dual_clip=3.0)),
      "grpo": (pg.ppo_clip, "seq_bcast", "seq-mean-token-mean", {}),
      "ctpo": (pg.ctpo, "token", "token-mean", {}),
      "ctpo_std": (pg.ctpo, "token", "token-mean", dict(clip_mode="standard")),
      "ctpo_geo": (pg.ctpo, "token", "token-mean", dict(geomean=True, kappa=-0.5)),
      "cispo": (pg.cispo, "token", "token-mean", {}),
      "sapo": (pg.sapo, "token", "seq-mean-token-mean", {}),
      "gspo": (pg.gspo, "seq", "seq-mean", {}),
      "gspo_token": (pg.gspo_token, "token", "seq-mean-token-mean", {}),
      "gmpo": (pg.gmpo, "seq", "seq-mean", {}),
      "holder_m2": (pg.holder_po, "seq", "seq-mean", dict(p=-2.0)),
      "holder_0": (pg.holder_po, "seq", "seq-mean", dict(p=0.0)),
      "holder_tok": (pg.holder_po, "seq", "seq-mean", dict(p=0.5, token_clip=True)),
      "r2vpo": (pg.r2vpo, "token", "token-mean", dict(lam=2.0, delta=0.1)),
      "r2vpo_seq": (pg.r2vpo, "seq_bcast", "seq-mean-token-mean",
                    dict(lam=2.0, delta=0.1, level="sequence", center="mean")),
      "kl_cov": (pg.kl_cov, "token", "token-mean", dict(kl_cov_ratio=0.2)),
      # A high lower bound keeps every token out of the covariance clip in this test.
      "clip_cov": (pg.clip_cov, "token", "token-mean",
                   dict(rng=jax.random.key(0), clip_cov_lb=50.0, clip_cov_ub=60.0)),
  }

  def _adv(self, kind, adv_BT, adv_B):
    return {"token": adv_BT, "seq": adv_B, "seq_bcast": adv_B[:, None]}[kind]

  @parameterized.named_parameters(*[(k, k) for k in CASES])
  def test_masked_tokens_get_exactly_zero_gradient(self, name):
    fn, kind, mode, kw = self.CASES[name]
    for on_policy in (False, True):
      logp, old, adv_BT, adv_B, mask = _random_batch(on_policy=on_policy)
      logp = logp.at[1, 0].set(jnp.nan).at[0, 2].set(-jnp.inf).at[3, 0].set(1e4)  # masked
      g = np.asarray(_grad(fn, logp, old, self._adv(kind, adv_BT, adv_B), mask, mode, **kw))
      mask_np = np.asarray(mask)
      np.testing.assert_array_equal(g[mask_np == 0], 0.0)
      self.assertTrue(np.all(np.isfinite(g)))
      if on_policy:  # nothing is clipped on-policy, so every policy token moves
        self.assertTrue(np.all(g[mask_np == 1] != 0.0))

  @parameterized.named_parameters(*[(k, k) for k in CASES if k != "vanilla"])
  def test_on_policy_gradient_is_reinforce(self, name):
    fn, kind, mode, kw = self.CASES[name]
    logp, old, adv_BT, adv_B, mask = _random_batch(on_policy=True)
    adv = self._adv(kind, adv_BT, adv_B)
    ref_adv = adv_B[:, None] if kind == "seq" else adv
    ref_mode = "seq-mean-token-mean" if mode == "seq-mean" else mode
    want = _grad(pg.vanilla_pg, logp, old, ref_adv, mask, ref_mode)
    got = _grad(fn, logp, old, adv, mask, mode, **kw)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    self.assertGreater(np.abs(np.asarray(want)).max(), 1e-2)

  def test_tool_token_insertion_changes_nothing(self):
    logp, old, _, _, _ = _random_batch()
    p_logp, p_old, p_mask = logp[2:3, :4], old[2:3, :4], jnp.ones((1, 4))
    ins = lambda x, fill: jnp.concatenate([x[:, :2], jnp.full((1, 2), fill), x[:, 2:]], axis=1)
    i_logp, i_old, i_mask = ins(p_logp, 3.0), ins(p_old, -8.0), jnp.array([[1., 1., 0, 0, 1, 1]])
    keep = np.array([0, 1, 4, 5])
    for fn, mode, kw in [(pg.ctpo, "token-mean", {}), (pg.ppo_clip, "seq-mean-token-mean", {}),
                         (pg.holder_po, "seq-mean", dict(p=-1.5))]:
      adv = jnp.array([0.7]) if mode == "seq-mean" else jnp.array([[0.7]])
      run = _jit_loss_and_grad(fn, mode, **kw)
      _, ref, g_ref = run(p_logp, p_old, adv, p_mask)
      _, got, g_got = run(i_logp, i_old, adv, i_mask)
      np.testing.assert_allclose(got, ref, rtol=1e-6)
      np.testing.assert_allclose(g_got[:, keep], g_ref, rtol=1e-6)
      np.testing.assert_array_equal(g_got[:, 2:4], 0.0)
      self.assertGreater(np.abs(np.asarray(g_ref)).max(), 0.0)


class PpoTest(absltest.TestCase):

  def test_clipped_regions(self):
    # Ratios 1.5 (A>0), 4 (A<0, above c=3), 1.1 (A>0), 0.5 (A<0, below 1 − ε).
    old = jnp.zeros((1, 4))
    logp = jnp.log(jnp.array([[1.5, 4.0, 1.1, 0.5]]))
    adv, mask = jnp.array([[1., -1., 1., -1.]]), jnp.ones((1, 4))
    loss, _ = pg.ppo_clip(logp, old, adv, mask, dual_clip=3.0)
    np.testing.assert_allclose(loss, [[-1.2, 3.0, -1.1, 0.8]], rtol=1e-6)
    g = _grad(pg.ppo_clip, logp, old, adv, mask, "token-mean", dual_clip=3.0)
    np.testing.assert_allclose(g, [[0.0, 0.0, -1.1 / 4, 0.0]], rtol=1e-6)
    loss_far, _ = pg.ppo_clip(logp * 2.0, old, adv, mask, dual_clip=3.0)
    self.assertEqual(float(loss_far[0, 1]), 3.0)  # the dual-clip loss is a constant


class CtpoTest(absltest.TestCase):

  def test_clip_windows_match_spec_table(self):
    # Rows: A=+1 with ρ huge; A=−1 with ρ tiny; A=−1 with ρ huge (dual clip); A=+1 with ρ tiny.
    # S_1 = S_100 = ±5 and S_t = 0 in between, so only t = 1 and t = 100 leave the window.
    T = 100
    ell = np.zeros((4, T))
    ell[:, 0], ell[:, 1], ell[:, -1] = 5.0, -5.0, 5.0
    ell[[1, 3]] *= -1.0
    logp, old, mask = jnp.asarray(ell, jnp.float32), jnp.zeros((4, T)), jnp.ones((4, T))
    adv = jnp.array([[1.0], [-1.0], [-1.0], [1.0]])
    loss, _, g = _jit_loss_and_grad(pg.ctpo, "token-mean")(logp, old, adv, mask)
    np.testing.assert_allclose(loss[:3, [0, -1]], [[-1.0513, -1.6487], [0.9753, 0.7788],
                                                   [1.0513, 1.6487]], rtol=1e-4)
    np.testing.assert_array_equal(g[:3, [0, -1]], 0.0)  # clipped or dual-clipped: no gradient
    # A > 0 with ρ below the window keeps its (unclipped) gradient −Aρ/N.
    np.testing.assert_allclose(g[3, [0, -1]], -np.exp(-5.0) / (4 * T) * np.ones(2), rtol=1e-5)

  def test_right_padding_changes_nothing(self):
    logp, old, adv_BT, _, mask = _random_batch()
    pad = lambda x, v: jnp.concatenate([x, jnp.full((4, 3), v)], axis=1)
    run = _jit_loss_and_grad(pg.ctpo, "token-mean")
    loss, agg, g = run(logp, old, adv_BT, mask)
    p_loss, p_agg, p_g = run(pad(logp, 2.0), pad(old, -5.0), pad(adv_BT, 9.0), pad(mask, 0.))
    np.testing.assert_allclose(p_loss[:, :6], loss, rtol=1e-6)
    np.testing.assert_array_equal(p_loss[:, 6:], 0.0)
    np.testing.assert_allclose(p_agg, agg, rtol=1e-6)
    np.testing.assert_allclose(p_g[:, :6], g, rtol=1e-6)
    self.assertGreater(np.abs(np.asarray(g)).max(), 0.0)


class R2vpoTest(absltest.TestCase):

  def test_penalty_vanishes_on_policy(self):
    logp, old, adv_BT, _, mask = _random_batch(on_policy=True)
    for center in ("one", "mean"):
      for lam in (0.0, 5.0):
        loss, m = pg.r2vpo(logp, old, adv_BT, mask, lam=lam, delta=0.1, center=center)
        np.testing.assert_allclose(loss, jnp.where(mask > 0, -adv_BT, 0.0), rtol=1e-6)
        self.assertEqual(float(m["ratio_var"]), 0.0)

  def test_zero_advantage_pulls_logp_toward_old(self):
    old, mask, adv = jnp.zeros((1, 4)), jnp.ones((1, 4)), jnp.zeros((1, 1))
    logp = jnp.array([[0.3, -0.3, 0.1, -0.2]])
    for kw in (dict(), dict(center="mean"), dict(ratio_cap=5.0),
               dict(staleness_B=jnp.array([2]), stale_decay=0.5)):
      g = np.asarray(_grad(pg.r2vpo, logp, old, adv, mask, "token-mean", lam=1.0, delta=0.0,
                           **kw))
      # Descent lowers logp above old and raises logp below old.
      np.testing.assert_array_equal(np.sign(g), [[1, -1, 1, -1]], err_msg=str(kw))

  def test_options(self):
    logp, old, adv_BT, adv_B, mask = _random_batch()
    _, m = pg.r2vpo(logp, old, adv_BT, mask, lam=1.0, delta=0.0, ratio_cap=1.1)
    self.assertGreater(float(m["capfrac"]), 0.0)
    w, _ = pg.r2vpo(logp, old, adv_BT, mask, lam=1.0, delta=0.0, staleness_B=jnp.arange(4.),
                    stale_decay=0.5)
    u, _ = pg.r2vpo(logp, old, adv_BT, mask, lam=1.0, delta=0.0)
    np.testing.assert_allclose(w, u * 0.5 ** jnp.arange(4.)[:, None], rtol=1e-6)
    seq, m = pg.r2vpo(logp, old, adv_B[:, None], mask, lam=1.0, delta=0.0, level="sequence")
    s_B = np.exp(np.asarray(ratios.sequence_log_ratio(logp, old, mask)))
    np.testing.assert_allclose(m["ratio_var"], np.mean((s_B[[0, 2, 3]] - 1) ** 2), rtol=1e-5)
    self.assertEqual(seq.shape, (4, 6))

  def test_multiplier_is_detached(self):
    logp, old, adv_BT, _, mask = _random_batch()
    total = lambda lam: _agg(pg.r2vpo(logp, old, adv_BT, mask, lam=lam, delta=0.1)[0], mask,
                             "token-mean")
    self.assertEqual(float(jax.grad(total)(1.0)), 0.0)
    self.assertGreater(float(total(1.0) - total(0.0)), 1e-3)  # yet the penalty is there

  def test_dual_update(self):
    self.assertGreater(float(pg.r2vpo_dual_update(1.0, 0.5, delta=0.1, lr=0.1)), 1.0)
    self.assertLess(float(pg.r2vpo_dual_update(1.0, 0.05, delta=0.1, lr=0.1)), 1.0)
    self.assertEqual(float(pg.r2vpo_dual_update(0.01, 0.0, delta=0.1, lr=10.0)), 0.0)


class SapoTest(absltest.TestCase):

  def test_gradient_matches_derivation(self):
    logp, old, adv_BT, _, mask = _random_batch(scale=0.5)
    g = jax.grad(lambda lp: pg.sapo(lp, old, adv_BT, mask)[0].sum())(logp)
    r = np.exp(np.where(np.asarray(mask) > 0, np.asarray(logp - old, np.float64), 0.0))
    a = np.asarray(adv_BT, np.float64)
    tau = np.where(a > 0, 1.0, 1.05)
    want = np.where(np.asarray(mask) > 0, -a * r / np.cosh(tau * (r - 1) / 2) ** 2, 0.0)
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-7)


class ClipCovTest(absltest.TestCase):

  def test_ppo_clipped_tokens_are_not_candidates(self):
    logp = jnp.array([[-0.5, -2.5, -0.5, -2.5]])
    old = logp - jnp.array([[1.0, 0.0, 0.0, 0.0]])  # token 0: ratio e > 1.2 with A > 0
    adv, mask = jnp.array([[3., 3., -3., -3.]]), jnp.ones((1, 4))
    for seed in range(4):
      loss, _ = pg.clip_cov(logp, old, adv, mask, clip_cov_ratio=0.5, rng=jax.random.key(seed))
      np.testing.assert_allclose(loss, [[-3.6, -3., 3., 0.]], rtol=1e-6)  # only token 3 out


class ArgumentsTest(absltest.TestCase):

  def test_sequence_forms_accept_token_advantages(self):
    logp, old, _, adv_B, mask = _random_batch()
    for fn, kw in [(pg.gspo, {}), (pg.gmpo, {}), (pg.holder_po, dict(p=2.0))]:
      want, _ = fn(logp, old, adv_B, mask, **kw)
      got, _ = fn(logp, old, adv_B[:, None], mask, **kw)
      np.testing.assert_allclose(got, want, rtol=1e-6)
      self.assertGreater(np.abs(np.asarray(want)).max(), 0.1)

  def test_bad_arguments_are_named(self):
    logp, old, adv_BT, adv_B, mask = _random_batch()
    with self.assertRaisesRegex(ValueError, "dual_clip must be > 1"):
      pg.ppo_clip(logp, old, adv_BT, mask, dual_clip=1.0)
    with self.assertRaisesRegex(ValueError, "adv_B\\[:, None\\]"):
      pg.ppo_clip(logp, old, adv_B, mask)
    with self.assertRaisesRegex(ValueError, "adv_B must have shape"):
      pg.gspo(logp, old, adv_B[:2], mask)
    with self.assertRaisesRegex(ValueError, "clip_mode 'la'"):
      pg.ctpo(logp, old, adv_BT, mask, clip_mode="la")
    with self.assertRaisesRegex(ValueError, "level 'turn'"):
      pg.r2vpo(logp, old, adv_BT, mask, lam=1.0, delta=0.1, level="turn")
    with self.assertRaisesRegex(ValueError, "tau_pos"):
      pg.sapo(logp, old, adv_BT, mask, tau_pos=0.0)


if __name__ == "__main__":
  absltest.main()
