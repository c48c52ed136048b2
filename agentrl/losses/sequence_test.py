# pylint: disable=invalid-name
"""Tests for agentrl.losses.sequence: GSPO, GMPO and HölderPO (sequence-ratio losses).

Golden numbers on a hand-made batch, float64 NumPy references (value and gradient by central
finite differences) on random masked batches, and the RL invariants of docs/algorithms.md §7 and
§2.8. The functions are called through `agentrl.losses.policy`, where the API contract names
them.
"""
import functools
import math

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import policy as pg
from agentrl.losses import testing
from agentrl.losses.testing import ADV_B, ADV_BT, LOGP, MASK, OLD

jax.config.update("jax_numpy_rank_promotion", "raise")


# ---------------------------------------------------------------------------------------------
# Float64 NumPy references, written from docs/algorithms.md (and, for "sequence_w_clip", the
# HölderPO maths learner) independently of the JAX code.
# ---------------------------------------------------------------------------------------------
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


def np_holder(logp, old, adv_B, m, p, eps=0.2, clip_mode="sequence"):
  """Direct power mean ((1/L) Σ r^p)^(1/p), not the log-space form used by the library."""
  out = np.zeros(m.shape[0])
  for b in range(m.shape[0]):
    idx = np.flatnonzero(m[b])
    if not idx.size:
      continue
    ell, a = logp[b, idx] - old[b, idx], adv_B[b]
    if clip_mode == "token":
      ell = _np_pessimistic(ell, np.log(1 - eps), np.log(1 + eps), a)
    elif clip_mode == "sequence_w_clip":
      ell = np.clip(ell, -np.log(1 + eps), np.log(1 + eps))
    r = np.exp(ell)
    rho = np.exp(ell.mean()) if p == 0 else np.mean(r ** p) ** (1.0 / p)
    if clip_mode == "token":
      out[b] = -a * rho
    else:
      out[b] = max(-a * rho, -a * np.clip(rho, 1 - eps, 1 + eps))
  return out


class GoldenTest(chex.TestCase):
  """Hand-computed numbers on the fixture (each under jit and without)."""

  def _run(self, fn, adv=ADV_BT, **kw):
    return self.variant(functools.partial(fn, **kw))(LOGP, OLD, adv, MASK)

  @chex.variants(with_jit=True, without_jit=True)
  def test_gspo(self):
    loss, m = self._run(pg.gspo, adv=ADV_B)
    np.testing.assert_allclose(loss, [-1.0004, 0.9997], rtol=1e-6)
    np.testing.assert_allclose([m["seq_ratio_mean"], m["seq_ratio_max"], m["seq_clipfrac"]],
                               [(1.14471424 + 0.96824584) / 2, 1.14471424, 1.0], rtol=1e-5)
    self.assertNotIn("clipfrac", m)  # no token-level clip in the sequence form
    loss, m = self._run(pg.gspo_token)
    np.testing.assert_allclose(loss, [[-1.0004] * 3, [0.9997, 0., 0.9997]], rtol=1e-6)
    np.testing.assert_allclose(m["clipfrac_high"], 0.6, rtol=1e-6)
    np.testing.assert_allclose([m["seq_ratio_mean"], m["seq_ratio_max"]],  # s_i, over rows
                               [(1.14471424 + 0.96824584) / 2, 1.14471424], rtol=1e-5)
    self.assertNotIn("ratio_mean", m)  # the per-token π/π_old is not what it clips

  @chex.variants(with_jit=True, without_jit=True)
  def test_gmpo(self):
    loss, m = self._run(pg.gmpo, adv=ADV_B)
    np.testing.assert_allclose(loss, [-1.03625951, 0.96824584], rtol=1e-5)
    # Row 0 (A > 0): ℓ = (0.69, -0.69, 0.41) against ±0.4, the clipped ℓ̂ taken at 0.69 and
    # 0.41 only (at -0.69, min(ℓ, ℓ̂) = ℓ); verl's GMPO figure would count -0.69 too (0.6).
    np.testing.assert_allclose([m["clipfrac"], m["clipfrac_high"], m["clipfrac_low"]],
                               [0.4, 0.4, 0.0], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_holder_po(self):
    loss, m = self._run(pg.holder_po, adv=ADV_B, p=jnp.float32(1.0))
    np.testing.assert_allclose(loss, [-1.2, 1.0], rtol=1e-5)
    np.testing.assert_allclose([m["seq_clipfrac"], m["seq_clipfrac_high"], m["holder_p"]],
                               [0.5, 0.5, 1.0], rtol=1e-6)
    loss, m = self._run(pg.holder_po, adv=ADV_B, p=2.0, clip_mode="token")
    np.testing.assert_allclose(loss, [-1.0214369, 1.0494046], rtol=1e-5)
    # Every ℓ is outside [log 0.8, log 1.2], but the clipped ℓ̂ is taken only where the sign
    # of A makes it the pessimistic one: 2 high (A > 0) + 1 low (A < 0) of 5 tokens.
    np.testing.assert_allclose([m["clipfrac"], m["clipfrac_high"], m["clipfrac_low"]],
                               [0.6, 0.4, 0.2], rtol=1e-6)

  @chex.variants(with_jit=True, without_jit=True)
  def test_holder_po_sequence_w_clip(self):
    # eps = 0.3: each ℓ is clamped to ±log(1.3) whatever the sign of A, so the ratios become
    # row 0: (1.3, 1/1.3, 1.3) and row 1: (1.25, <masked>, 1/1.3); 4 of 5 tokens clamped.
    loss, m = self._run(pg.holder_po, adv=ADV_B, p=1.0, eps_low=0.3, eps_high=0.3,
                        clip_mode="sequence_w_clip")
    rho = [(1.3 + 1 / 1.3 + 1.3) / 3, (1.25 + 1 / 1.3) / 2]  # 1.1230769, 1.0096154
    np.testing.assert_allclose(loss, [-rho[0], rho[1]], rtol=1e-5)  # inside [0.7, 1.3]
    np.testing.assert_allclose([m["clipfrac"], m["seq_clipfrac"], m["seq_ratio_mean"]],
                               [0.8, 0.0, (rho[0] + rho[1]) / 2], rtol=1e-5)
    # eps = 0.2, p = 2: every token is clamped, ratios (1.2, 1/1.2, 1.2) and (1.2, 1/1.2).
    loss, m = self._run(pg.holder_po, adv=ADV_B, p=2.0, clip_mode="sequence_w_clip")
    np.testing.assert_allclose(loss, [-1.09155004, 1.03306448], rtol=1e-5)
    self.assertEqual(float(m["clipfrac"]), 1.0)


class ReferenceTest(parameterized.TestCase):
  """JAX (f32) vs NumPy (f64): per-element loss and the gradient of the aggregated loss."""

  _check = staticmethod(testing.check_against_reference)

  def test_gspo(self):
    kw = dict(eps_low=0.02, eps_high=0.03)  # some rows inside the window, some outside
    self._check(pg.gspo, np_gspo, "seq-mean", seq_adv=True, np_kw=kw, **kw)
    self._check(pg.gspo_token, np_gspo_token, "seq-mean-token-mean", frozen=True, np_kw=kw, **kw)

  def test_gmpo(self):
    self._check(pg.gmpo, np_gmpo, "seq-mean", seq_adv=True, eps_low=0.2, eps_high=0.2,
                np_kw=dict(eps=0.2))

  @parameterized.product(p=[-2.0, 0.0, 0.5, 1.0, 3.0],
                         clip_mode=["sequence", "token", "sequence_w_clip"])
  def test_holder_po(self, p, clip_mode):
    self._check(pg.holder_po, np_holder, "seq-mean", seq_adv=True, p=p, clip_mode=clip_mode,
                eps_low=0.1, eps_high=0.1, np_kw=dict(p=p, eps=0.1, clip_mode=clip_mode))


class InvariantTest(parameterized.TestCase):
  """Masking and on-policy properties (the same checks run in policy_ and covariance_test)."""

  # (function, advantage kind, aggregation, kwargs)
  CASES = {
      "gspo": (pg.gspo, "seq", "seq-mean", {}),
      "gspo_token": (pg.gspo_token, "token", "seq-mean-token-mean", {}),
      "gmpo": (pg.gmpo, "seq", "seq-mean", {}),
      "holder_m2": (pg.holder_po, "seq", "seq-mean", dict(p=-2.0)),
      "holder_0": (pg.holder_po, "seq", "seq-mean", dict(p=0.0)),
      "holder_tok": (pg.holder_po, "seq", "seq-mean", dict(p=0.5, clip_mode="token")),
      "holder_wclip": (pg.holder_po, "seq", "seq-mean",
                       dict(p=1.5, clip_mode="sequence_w_clip")),
  }

  @parameterized.named_parameters(*[(k, k) for k in CASES])
  def test_masked_tokens_get_exactly_zero_gradient(self, name):
    testing.check_masked_tokens_get_exactly_zero_gradient(*self.CASES[name])

  @parameterized.named_parameters(*[(k, k) for k in CASES])
  def test_on_policy_gradient_is_reinforce(self, name):
    testing.check_on_policy_gradient_is_reinforce(*self.CASES[name])

  @parameterized.parameters("sequence", "sequence_w_clip")
  def test_tool_token_insertion_changes_nothing(self, clip_mode):
    testing.check_tool_token_insertion_changes_nothing(
        pg.holder_po, "seq-mean", dict(p=-1.5, clip_mode=clip_mode))


class HolderSequenceWithClipTest(absltest.TestCase):
  """The maths learner's `sequence_w_clip`: token clamp at ±log(1 + ε), then the sequence clip."""

  def test_inactive_token_clip_equals_plain_sequence_variant(self):
    logp, old, _, adv_B, mask = testing.random_batch(scale=0.2)
    ell = np.asarray(logp - old)[np.asarray(mask) > 0]
    kw = dict(p=2.0, eps_low=0.9, eps_high=0.9)  # token window ±log(1.9) = ±0.64
    self.assertLess(np.abs(ell).max(), math.log(1.9))  # precondition: nothing is clamped
    with_clip = testing.jit_loss_and_grad(pg.holder_po, "seq-mean", clip_mode="sequence_w_clip",
                                          **kw)
    plain = testing.jit_loss_and_grad(pg.holder_po, "seq-mean", clip_mode="sequence", **kw)
    for adv in (adv_B, -adv_B):
      (l_w, agg_w, g_w), (l_s, agg_s, g_s) = with_clip(logp, old, adv, mask), plain(
          logp, old, adv, mask)
      np.testing.assert_allclose(l_w, l_s, rtol=1e-6)
      np.testing.assert_allclose(agg_w, agg_s, rtol=1e-6)
      np.testing.assert_allclose(g_w, g_s, rtol=1e-6, atol=1e-9)
    # Non-trivial side: with a narrow window the clamp is active and the two differ.
    narrow = dict(p=2.0, eps_low=0.05, eps_high=0.05)
    l_w, m = pg.holder_po(logp, old, adv_B, mask, clip_mode="sequence_w_clip", **narrow)
    l_s, _ = pg.holder_po(logp, old, adv_B, mask, **narrow)
    self.assertGreater(float(m["clipfrac"]), 0.2)
    self.assertGreater(np.abs(np.asarray(l_w - l_s)).max(), 1e-3)

  def test_clamped_tokens_get_no_gradient_whatever_the_sign_of_a(self):
    # ℓ = (0.5, −0.5, 0.1, −0.05): the first two leave ±log(1.2) = ±0.182 and are clamped even
    # where that raises the ratio for A > 0 (ℓ = −0.5) or lowers it for A < 0 (ℓ = 0.5).
    old, mask = jnp.zeros((2, 4)), jnp.ones((2, 4))
    logp = jnp.tile(jnp.array([[0.5, -0.5, 0.1, -0.05]]), (2, 1))
    g = testing.grad(pg.holder_po, logp, old, jnp.array([1.0, -1.0]), mask, "seq-mean", p=1.0,
                     clip_mode="sequence_w_clip")
    np.testing.assert_array_equal(g[:, :2], 0.0)
    self.assertTrue(np.all(np.asarray(g[:, 2:]) != 0.0))
    loss, _ = pg.holder_po(logp, old, jnp.array([1.0, -1.0]), mask, p=1.0,
                           clip_mode="sequence_w_clip")
    rho = np.mean([1.2, 1 / 1.2, np.exp(0.1), np.exp(-0.05)])
    np.testing.assert_allclose(loss, [-rho, rho], rtol=1e-6)


class ArgumentsTest(absltest.TestCase):

  def test_sequence_forms_accept_token_advantages(self):
    logp, old, _, adv_B, mask = testing.random_batch()
    for fn, kw in [(pg.gspo, {}), (pg.gmpo, {}), (pg.holder_po, dict(p=2.0))]:
      want, _ = fn(logp, old, adv_B, mask, **kw)
      got, _ = fn(logp, old, adv_B[:, None], mask, **kw)
      np.testing.assert_allclose(got, want, rtol=1e-6)
      self.assertGreater(np.abs(np.asarray(want)).max(), 0.1)

  def test_bad_arguments_are_named(self):
    logp, old, _, adv_B, mask = testing.random_batch()
    with self.assertRaisesRegex(ValueError, "adv_B must have shape"):
      pg.gspo(logp, old, adv_B[:2], mask)
    with self.assertRaisesRegex(ValueError, "clip_mode 'seq'"):
      pg.holder_po(logp, old, adv_B, mask, p=1.0, clip_mode="seq")
    with self.assertRaisesRegex(ValueError, "eps_low < 1"):
      pg.holder_po(logp, old, adv_B, mask, p=1.0, eps_low=1.0)


if __name__ == "__main__":
  absltest.main()
