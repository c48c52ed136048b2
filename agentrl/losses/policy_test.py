# pylint: disable=invalid-name
"""Tests for agentrl.losses.policy: the token-level surrogates and the re-exported names.

Golden numbers on a hand-made batch, float64 NumPy references (value and gradient by central
finite differences) on random masked batches, and the RL invariants of docs/algorithms.md §7. The
sequence-ratio and covariance losses are tested in sequence_test.py and covariance_test.py.
"""
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import covariance
from agentrl.losses import policy as pg
from agentrl.losses import ratios
from agentrl.losses import sequence
from agentrl.losses import testing
from agentrl.losses.testing import ADV_BT, LOGP, MASK, OLD, PPO_KL, RATIO_MEAN

jax.config.update("jax_numpy_rank_promotion", "raise")


# ---------------------------------------------------------------------------------------------
# Float64 NumPy references, written from docs/algorithms.md independently of the JAX code. Losses
# with a stop-gradient split take `frozen` (the value of logp inside sg).
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
                          "cum_ratio_mean", "cum_ratio_max", "ratio_mean", "ratio_max")]
    # ρ = (2, 1, 1.5) and (1.25, <masked>, 0.9375); ratio_* stay the per-token r's.
    np.testing.assert_allclose(got, [0.6, 0.4, 0.2, 0.2, 1.3375, 2.0, RATIO_MEAN, 2.0],
                               rtol=1e-5)
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
  def test_r2vpo(self):
    loss, m = self._run(pg.r2vpo, lam=0.5, delta=0.1)
    np.testing.assert_allclose(loss, [[-1.5, -0.375, -1.375], [1.28125, 0., 0.78125]], rtol=1e-5)
    np.testing.assert_allclose([m["ratio_var"], m["constraint_residual"], m["lam"]],
                               [0.325, 0.225, 0.5], rtol=1e-5)
    lam = self.variant(functools.partial(pg.r2vpo_dual_update, delta=0.1, lr=2.0))
    np.testing.assert_allclose(lam(0.5, m["ratio_var"]), 0.95, rtol=1e-5)
    self.assertEqual(float(lam(0.1, jnp.float32(0.0))), 0.0)


class ReferenceTest(parameterized.TestCase):
  """JAX (f32) vs NumPy (f64): per-element loss and the gradient of the aggregated loss."""

  _check = staticmethod(testing.check_against_reference)

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


class InvariantTest(parameterized.TestCase):
  """Masking and on-policy properties (the same checks run in sequence_ and covariance_test)."""

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
      "r2vpo": (pg.r2vpo, "token", "token-mean", dict(lam=2.0, delta=0.1)),
      "r2vpo_seq": (pg.r2vpo, "seq_bcast", "seq-mean-token-mean",
                    dict(lam=2.0, delta=0.1, level="sequence", center="mean")),
  }

  @parameterized.named_parameters(*[(k, k) for k in CASES])
  def test_masked_tokens_get_exactly_zero_gradient(self, name):
    testing.check_masked_tokens_get_exactly_zero_gradient(*self.CASES[name])

  @parameterized.named_parameters(*[(k, k) for k in CASES if k != "vanilla"])
  def test_on_policy_gradient_is_reinforce(self, name):
    testing.check_on_policy_gradient_is_reinforce(*self.CASES[name])

  @parameterized.parameters((pg.ctpo, "token-mean"), (pg.ppo_clip, "seq-mean-token-mean"))
  def test_tool_token_insertion_changes_nothing(self, fn, mode):
    testing.check_tool_token_insertion_changes_nothing(fn, mode, {})


class PpoTest(absltest.TestCase):

  def test_clipped_regions(self):
    # Ratios 1.5 (A>0), 4 (A<0, above c=3), 1.1 (A>0), 0.5 (A<0, below 1 − ε).
    old = jnp.zeros((1, 4))
    logp = jnp.log(jnp.array([[1.5, 4.0, 1.1, 0.5]]))
    adv, mask = jnp.array([[1., -1., 1., -1.]]), jnp.ones((1, 4))
    loss, _ = pg.ppo_clip(logp, old, adv, mask, dual_clip=3.0)
    np.testing.assert_allclose(loss, [[-1.2, 3.0, -1.1, 0.8]], rtol=1e-6)
    g = testing.grad(pg.ppo_clip, logp, old, adv, mask, "token-mean", dual_clip=3.0)
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
    loss, _, g = testing.jit_loss_and_grad(pg.ctpo, "token-mean")(logp, old, adv, mask)
    np.testing.assert_allclose(loss[:3, [0, -1]], [[-1.0513, -1.6487], [0.9753, 0.7788],
                                                   [1.0513, 1.6487]], rtol=1e-4)
    np.testing.assert_array_equal(g[:3, [0, -1]], 0.0)  # clipped or dual-clipped: no gradient
    # A > 0 with ρ below the window keeps its (unclipped) gradient −Aρ/N.
    np.testing.assert_allclose(g[3, [0, -1]], -np.exp(-5.0) / (4 * T) * np.ones(2), rtol=1e-5)

  def test_right_padding_changes_nothing(self):
    logp, old, adv_BT, _, mask = testing.random_batch()
    pad = lambda x, v: jnp.concatenate([x, jnp.full((4, 3), v)], axis=1)
    run = testing.jit_loss_and_grad(pg.ctpo, "token-mean")
    loss, agg, g = run(logp, old, adv_BT, mask)
    p_loss, p_agg, p_g = run(pad(logp, 2.0), pad(old, -5.0), pad(adv_BT, 9.0), pad(mask, 0.))
    np.testing.assert_allclose(p_loss[:, :6], loss, rtol=1e-6)
    np.testing.assert_array_equal(p_loss[:, 6:], 0.0)
    np.testing.assert_allclose(p_agg, agg, rtol=1e-6)
    np.testing.assert_allclose(p_g[:, :6], g, rtol=1e-6)
    self.assertGreater(np.abs(np.asarray(g)).max(), 0.0)


class R2vpoTest(absltest.TestCase):

  def test_penalty_vanishes_on_policy(self):
    logp, old, adv_BT, _, mask = testing.random_batch(on_policy=True)
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
      g = np.asarray(testing.grad(pg.r2vpo, logp, old, adv, mask, "token-mean", lam=1.0,
                                  delta=0.0, **kw))
      # Descent lowers logp above old and raises logp below old.
      np.testing.assert_array_equal(np.sign(g), [[1, -1, 1, -1]], err_msg=str(kw))

  def test_options(self):
    logp, old, adv_BT, adv_B, mask = testing.random_batch()
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
    logp, old, adv_BT, _, mask = testing.random_batch()
    total = lambda lam: testing.agg(
        pg.r2vpo(logp, old, adv_BT, mask, lam=lam, delta=0.1)[0], mask, "token-mean")
    self.assertEqual(float(jax.grad(total)(1.0)), 0.0)
    self.assertGreater(float(total(1.0) - total(0.0)), 1e-3)  # yet the penalty is there

  def test_dual_update(self):
    self.assertGreater(float(pg.r2vpo_dual_update(1.0, 0.5, delta=0.1, lr=0.1)), 1.0)
    self.assertLess(float(pg.r2vpo_dual_update(1.0, 0.05, delta=0.1, lr=0.1)), 1.0)
    self.assertEqual(float(pg.r2vpo_dual_update(0.01, 0.0, delta=0.1, lr=10.0)), 0.0)


class SapoTest(absltest.TestCase):

  def test_gradient_matches_derivation(self):
    logp, old, adv_BT, _, mask = testing.random_batch(scale=0.5)
    g = jax.grad(lambda lp: pg.sapo(lp, old, adv_BT, mask)[0].sum())(logp)
    r = np.exp(np.where(np.asarray(mask) > 0, np.asarray(logp - old, np.float64), 0.0))
    a = np.asarray(adv_BT, np.float64)
    tau = np.where(a > 0, 1.0, 1.05)
    want = np.where(np.asarray(mask) > 0, -a * r / np.cosh(tau * (r - 1) / 2) ** 2, 0.0)
    np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-7)


class ContractTest(absltest.TestCase):

  def test_family_modules_are_reexported(self):
    # docs/architecture.md §3 names every surrogate as agentrl.losses.policy.<name>.
    for name in ("gspo", "gspo_token", "gmpo", "holder_po"):
      self.assertIs(getattr(pg, name), getattr(sequence, name))
    for name in ("clip_cov", "kl_cov"):
      self.assertIs(getattr(pg, name), getattr(covariance, name))


class ArgumentsTest(absltest.TestCase):

  def test_bad_arguments_are_named(self):
    logp, old, adv_BT, adv_B, mask = testing.random_batch()
    with self.assertRaisesRegex(ValueError, "dual_clip must be > 1"):
      pg.ppo_clip(logp, old, adv_BT, mask, dual_clip=1.0)
    with self.assertRaisesRegex(ValueError, "adv_B\\[:, None\\]"):
      pg.ppo_clip(logp, old, adv_B, mask)
    with self.assertRaisesRegex(ValueError, "clip_mode 'la'"):
      pg.ctpo(logp, old, adv_BT, mask, clip_mode="la")
    with self.assertRaisesRegex(ValueError, "level 'turn'"):
      pg.r2vpo(logp, old, adv_BT, mask, lam=1.0, delta=0.1, level="turn")
    with self.assertRaisesRegex(ValueError, "tau_pos"):
      pg.sapo(logp, old, adv_BT, mask, tau_pos=0.0)


if __name__ == "__main__":
  absltest.main()
