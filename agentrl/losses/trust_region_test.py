# pylint: disable=invalid-name
"""Tests for agentrl.losses.trust_region (HAPO, ETR).

The HAPO references are float64 transcriptions of starriver030515/HAPO
`verl/trainer/ppo/core_algos.py` (commit 7671dde): `compute_entropy_h`, `ada_clip`,
`ada_advantage` and `compute_policy_loss`. ETR has no public code; its references follow the
docstring's reconstruction.
"""
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import policy
from agentrl.losses import testing
from agentrl.losses import trust_region as tr

jax.config.update("jax_numpy_rank_promotion", "raise")


def np_entropy_h(entropy, mask, pivot=0.8, eps=1e-8):
  """`compute_entropy_h`, with torch_quantile(..., interpolation="nearest") as Python round."""
  valid = mask > 0
  e = np.log(np.maximum(entropy, eps))
  vals = np.sort(e[valid])
  median = vals[round(pivot * (len(vals) - 1))]  # kthvalue(idx + 1); round: ties to even
  h = e - median
  n = max(valid.sum(), 1)
  h = h / np.sqrt(max(np.where(valid, h ** 2, 0.0).sum() / n, eps))
  pos_max = max(np.where(valid & (h > 0), h, 0.0).max(), eps)
  neg_min = min(np.where(valid & (h < 0), h, 0.0).min(), -eps)
  return np.where(valid, np.where(h > 0, h * (1.0 / pos_max), h * (1.0 / neg_min)), 0.0)


def np_hapo(logp, old, adv, m, *, eps_low=0.2, eps_high=0.2, c=10.0, pivot=0.8, alpha=1.0,
            beta=1.0):
  """HAPO's `compute_policy_loss` (adaptive_clip and adaptive_advantage on); entropy = -old."""
  ratio = np.exp(np.clip(np.where(m > 0, logp - old, 0.0), -20, 20))
  h = np_entropy_h(-old, m, pivot)
  lo = np.where(h <= 0, eps_low * (1 - h * alpha), eps_low)
  hi = np.where(h > 0, eps_high * (1 + h * alpha), eps_high)
  adv = np.broadcast_to(adv, m.shape)
  adv_ent = adv * (1 + beta * h)
  band = (ratio > 1 - lo / 2) & (ratio < 1 + hi / 2)
  adv = np.where(h > 0, np.where(band, adv, adv_ent), np.where(band, adv_ent, adv))
  loss1 = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - lo, 1 + hi))
  loss = np.where(adv < 0, np.minimum(-adv * c, loss1), loss1)
  return np.where(m > 0, loss, 0.0)


def hapo_from_old(logp, old, adv, mask, **kw):
  """hapo_ppo with the entropy taken from old_logp (positive, and defined on masked slots)."""
  return tr.hapo_ppo(logp, old, adv, mask, entropy_BT=-old, **kw)


class HapoSignalTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # log H = 0..5 on valid tokens; pivot 0.5 over N = 6: index round(2.5) = 2 (ties to even),
    # so m = 2, h = [-2, -1, 0, 1, 2, 3] / rms, rms = sqrt(19 / 6).
    entropy = jnp.exp(jnp.array([[0.0, 1.0, 2.0, 40.0], [3.0, 4.0, 5.0, 0.0]]))
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 0.0]])
    fn = self.variant(functools.partial(tr.hapo_entropy_signal, pivot=0.5))
    np.testing.assert_allclose(fn(entropy, mask), [[1, 0.5, 0, 0], [1 / 3, 2 / 3, 1, 0]],
                               rtol=1e-6, atol=1e-7)
    # The statistics the rollout's adaptive temperature reads: (m, rms, max h, min h).
    rms = np.sqrt(19 / 6)
    np.testing.assert_allclose(tr.hapo_entropy_stats(entropy, mask, pivot=0.5),
                               [2.0, rms, 3 / rms, -2 / rms], rtol=1e-6)
    signed = self.variant(functools.partial(tr.hapo_entropy_signal, pivot=0.5, signed=True))
    np.testing.assert_allclose(signed(entropy, mask), [[-1, -0.5, 0, 0], [1 / 3, 2 / 3, 1, 0]],
                               rtol=1e-6, atol=1e-7)

  def test_against_transcription(self):
    rng = np.random.default_rng(0)
    for seed_pivot in (0.8, 0.5, 0.0, 1.0):
      entropy = rng.uniform(1e-3, 4.0, (5, 7))
      mask = (rng.uniform(size=(5, 7)) > 0.3).astype(np.float64)
      got = tr.hapo_entropy_signal(jnp.asarray(entropy), jnp.asarray(mask), pivot=seed_pivot)
      np.testing.assert_allclose(got, np_entropy_h(entropy, mask, seed_pivot), rtol=1e-5,
                                 atol=1e-6)
      # The released sign convention: h_hat in [0, 1], i.e. no token is "low entropy".
      self.assertGreaterEqual(float(np.min(got)), 0.0)

  def test_masked_entries_never_read(self):
    mask = jnp.array([[1.0, 1.0, 0.0, 1.0]])
    a = tr.hapo_entropy_signal(jnp.array([[0.5, 2.0, jnp.nan, 1.0]]), mask)
    b = tr.hapo_entropy_signal(jnp.array([[0.5, 2.0, 1e9, 1.0]]), mask)
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(tr.hapo_entropy_signal(jnp.ones((2, 3)), jnp.zeros((2, 3))),
                                  0.0)

  def test_clip_bounds_and_redistribution_hand_computed(self):
    lo, hi = tr.hapo_clip_bounds(jnp.array([[-0.5, 0.0, 0.5]]))
    np.testing.assert_allclose(lo, [[0.3, 0.2, 0.2]], rtol=1e-6)
    np.testing.assert_allclose(hi, [[0.2, 0.2, 0.3]], rtol=1e-6)
    eps = jnp.full((1, 4), 0.2)
    adv = tr.hapo_redistribute_advantage(
        jnp.array([[1.0, 1.0, -1.0, -1.0]]), jnp.array([[0.5, 0.5, -0.5, -0.5]]),
        jnp.array([[1.0, 1.5, 1.0, 1.5]]), eps, eps)
    # Band (0.9, 1.1): high entropy keeps A inside and gets A (1 + h) outside; low the reverse.
    np.testing.assert_allclose(adv, [[1.0, 1.5, -0.5, -1.0]], rtol=1e-6)


class HapoPpoTest(chex.TestCase):

  def test_against_transcription(self):
    for kw in ({}, {"pivot": 0.5, "clip_alpha": 0.7, "adv_beta": 2.0}):
      np_kw = {"pivot": kw.get("pivot", 0.8), "alpha": kw.get("clip_alpha", 1.0),
               "beta": kw.get("adv_beta", 1.0)}
      testing.check_against_reference(hapo_from_old, np_hapo, "token-mean", np_kw=np_kw, **kw)

  def test_neutral_setting_is_ppo(self):
    logp, old, adv, _, mask = testing.random_batch(seed=3, scale=0.4)
    got, _ = hapo_from_old(logp, old, adv, mask, clip_alpha=0.0, adv_beta=0.0)
    want, _ = policy.ppo_clip(logp, old, adv, mask, dual_clip=10.0)
    np.testing.assert_allclose(got, want, rtol=1e-6)

  def test_invariants(self):
    testing.check_masked_tokens_get_exactly_zero_gradient(hapo_from_old, "token", "token-mean",
                                                           {})
    testing.check_on_policy_gradient_is_reinforce(hapo_from_old, "token", "token-mean", {})
    testing.check_tool_token_insertion_changes_nothing(hapo_from_old, "token-mean", {})

  def test_signed_on_policy_gradient_uses_redistributed_advantage(self):
    logp, old, adv, _, mask = testing.random_batch(on_policy=True)
    h = tr.hapo_entropy_signal(-old, mask, signed=True)
    self.assertLess(float(h.min()), 0.0)  # some tokens really are low-entropy
    lo, hi = tr.hapo_clip_bounds(h)
    want_adv = tr.hapo_redistribute_advantage(adv, h, jnp.ones_like(h), lo, hi)
    got = testing.grad(functools.partial(hapo_from_old, signed=True), logp, old, adv, mask,
                       "token-mean")
    want = testing.grad(policy.vanilla_pg, logp, old, want_adv, mask, "token-mean")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)

  def test_metrics(self):
    logp, old, adv, _, mask = testing.random_batch(seed=4)
    _, metrics = hapo_from_old(logp, old, adv, mask)
    for key in ("ratio_mean", "clipfrac", "clipfrac_lower", "entropy_signal_mean",
                "eps_low_mean", "eps_high_mean"):
      self.assertIn(key, metrics)
    self.assertGreater(float(metrics["eps_high_mean"]), 0.2)  # widened where h_hat > 0


def np_etr(logp, old, adv, m, *, var, alpha, beta, eps=0.2):
  ratio = np.exp(np.clip(np.where(m > 0, logp - old, 0.0), -20, 20))
  adv = np.broadcast_to(adv, m.shape)
  e = eps * (1 + alpha * np.abs(adv)) * (1 + beta * 4 * var[:, None])
  loss = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - e, 1 + e))
  return np.where(m > 0, loss, 0.0)


class EtrTest(chex.TestCase):

  VAR = jnp.array([0.25, 0.1, 0.0, 0.2])

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_window(self):
    # r = 1.25, A = 1: PPO clips at 1.2; ETR with alpha 0.5 widens to 1.3 and keeps r.
    logp, old, mask = jnp.log(jnp.array([[1.25]])), jnp.zeros((1, 1)), jnp.ones((1, 1))
    fn = self.variant(functools.partial(tr.etr_ppo, group_var_B=jnp.zeros(1), alpha=0.5,
                                        beta=0.0))
    loss, metrics = fn(logp, old, jnp.ones((1, 1)), mask)
    np.testing.assert_allclose(loss, [[-1.25]], rtol=1e-6)
    np.testing.assert_allclose(metrics["eps_high_mean"], 0.3, rtol=1e-6)
    ppo, _ = policy.ppo_clip(logp, old, jnp.ones((1, 1)), mask)
    np.testing.assert_allclose(ppo, [[-1.2]], rtol=1e-6)
    # Macro level: a pass-rate-1/2 group (variance 1/4) doubles the window with beta = 1.
    loss, _ = tr.etr_ppo(jnp.log(jnp.array([[1.45]])), old, jnp.ones((1, 1)), mask,
                         group_var_B=jnp.array([0.25]), alpha=0.0, beta=1.0)
    np.testing.assert_allclose(loss, [[-1.4]], rtol=1e-6)

  def test_against_reference_and_neutral(self):
    kw = dict(group_var_B=self.VAR, alpha=0.8, beta=0.5)
    testing.check_against_reference(tr.etr_ppo, np_etr, "token-mean",
                                    np_kw=dict(var=np.asarray(self.VAR), alpha=0.8, beta=0.5),
                                    **kw)
    logp, old, adv, _, mask = testing.random_batch(seed=5, scale=0.4)
    got, _ = tr.etr_ppo(logp, old, adv, mask, group_var_B=self.VAR, alpha=0.0, beta=0.0)
    np.testing.assert_allclose(got, policy.ppo_clip(logp, old, adv, mask)[0], rtol=1e-6)

  def test_invariants(self):
    kw = dict(group_var_B=self.VAR, alpha=0.8, beta=0.5)
    testing.check_masked_tokens_get_exactly_zero_gradient(tr.etr_ppo, "token", "token-mean", kw)
    testing.check_on_policy_gradient_is_reinforce(tr.etr_ppo, "token", "token-mean", kw)
    testing.check_tool_token_insertion_changes_nothing(
        tr.etr_ppo, "token-mean", dict(group_var_B=jnp.array([0.2]), alpha=0.8, beta=0.5))

  def test_bad_arguments_raise(self):
    logp, old, adv, _, mask = testing.random_batch()
    with self.assertRaisesRegex(ValueError, "alpha and beta"):
      tr.etr_ppo(logp, old, adv, mask, group_var_B=self.VAR, alpha=-1.0, beta=0.0)
    with self.assertRaisesRegex(ValueError, "group_var_B"):
      tr.etr_ppo(logp, old, adv, mask, group_var_B=jnp.zeros(3), alpha=0.0, beta=0.0)
    with self.assertRaisesRegex(ValueError, "pivot"):
      tr.hapo_entropy_signal(jnp.ones((1, 2)), jnp.ones((1, 2)), pivot=1.5)


if __name__ == "__main__":
  absltest.main()
