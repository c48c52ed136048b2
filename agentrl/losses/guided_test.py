# pylint: disable=invalid-name
"""Tests for agentrl.losses.guided: the importance weight of guided rows, its shaping, the
on-policy limit, exact zeros on masked tokens, ICPO's row gate and bonus, and Lens's CRPO row
weights and loss."""
from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import aggregation
from agentrl.losses import guided
from agentrl.losses import kl
from agentrl.losses import policy
from agentrl.losses import testing

LN = np.log


def _total(fn, **kw):
  def f(logp, old, sampler, adv, mask, guided_B):
    return aggregation.aggregate(fn(logp, old, sampler, adv, mask, guided_B, **kw)[0], mask,
                                 "token-mean")
  return f


class GuidedLossTest(absltest.TestCase):

  def test_behaviour_logp_picks_the_sampler_on_guided_rows(self):
    old, sampler = jnp.full((2, 3), -1.0), jnp.full((2, 3), -2.0)
    got = guided.behaviour_logp(old, sampler, jnp.array([0.0, 1.0]))
    np.testing.assert_array_equal(got, [[-1.0] * 3, [-2.0] * 3])

  def test_golden_clip_and_shaped(self):
    # One token per row, A = +1. Row 0 plain: ratio exp(-0.5 - -1) = e^0.5 > 1.2 -> clipped.
    # Row 1 guided: w = π/μ = 0.5 / 0.25 = 2 (old is ignored on it).
    logp = jnp.array([[-0.5], [LN(0.5)]], jnp.float32)
    old = jnp.array([[-1.0], [-9.0]], jnp.float32)
    sampler = jnp.array([[-7.0], [LN(0.25)]], jnp.float32)
    mask, adv, g = jnp.ones((2, 1)), jnp.ones((2, 1)), jnp.array([0.0, 1.0])
    clip, m = guided.guided_pg_loss(logp, old, sampler, adv, mask, g, weight="clip")
    np.testing.assert_allclose(clip[:, 0], [-1.2, -1.2], rtol=1e-6)
    np.testing.assert_allclose(m["guided/weight_mean"], 2.0, rtol=1e-6)
    np.testing.assert_allclose(m["guided/frac"], 0.5)
    shaped, _ = guided.guided_pg_loss(logp, old, sampler, adv, mask, g, weight="shaped",
                                      gamma=0.1)
    np.testing.assert_allclose(shaped[:, 0], [-1.2, -2.0 / 2.1], rtol=1e-6)
    # d(-f(w))/d logp = -f'(w) w = -γ w / (w + γ)²; the clipped plain row has zero gradient.
    grad = jax.grad(lambda lp: guided.guided_pg_loss(lp, old, sampler, adv, mask, g,
                                                     weight="shaped")[0].sum())(logp)
    np.testing.assert_allclose(grad[:, 0], [0.0, -0.1 * 2.0 / 2.1**2], rtol=1e-5)

  def test_on_policy_limit_is_ppo(self):
    # An empty hint: the sampler's log-probs are the old ones, w = ratio, and the loss and its
    # gradient are PPO's (GRPO's) bit for bit, whichever rows are flagged guided.
    logp, old, adv_BT, _, mask = testing.random_batch(seed=3)
    g = jnp.array([1.0, 0.0, 1.0, 1.0])
    want, _ = policy.ppo_clip(logp, old, adv_BT, mask)
    got, _ = guided.guided_pg_loss(logp, old, old, adv_BT, mask, g, weight="clip")
    np.testing.assert_array_equal(got, want)
    f = _total(guided.guided_pg_loss, weight="clip")
    g_want = jax.grad(lambda lp: aggregation.aggregate(
        policy.ppo_clip(lp, old, adv_BT, mask)[0], mask, "token-mean"))(logp)
    np.testing.assert_array_equal(jax.grad(f)(logp, old, old, adv_BT, mask, g), g_want)

  def test_masked_tokens_get_exactly_zero(self):
    # Prompt and hint positions (mask 0) hold garbage in every input; loss and gradient are 0.
    logp, old, adv_BT, _, mask = testing.random_batch(seed=4, garbage=55.0)
    sampler = jnp.where(mask > 0, old - 0.3, -1e30)
    g = jnp.array([1.0, 1.0, 0.0, 1.0])
    for weight in guided.WEIGHTS:
      loss, _ = guided.guided_pg_loss(logp, old, sampler, adv_BT, mask, g, weight=weight)
      grad = jax.grad(_total(guided.guided_pg_loss, weight=weight))(logp, old, sampler, adv_BT,
                                                                    mask, g)
      self.assertTrue(np.all(np.isfinite(grad)))
      np.testing.assert_array_equal(np.asarray(loss)[np.asarray(mask) == 0], 0.0)
      np.testing.assert_array_equal(np.asarray(grad)[np.asarray(mask) == 0], 0.0)

  def test_bad_weight_and_gamma(self):
    x = jnp.zeros((1, 1))
    with self.assertRaisesRegex(ValueError, "weight"):
      guided.guided_pg_loss(x, x, x, x, x, jnp.zeros(1), weight="luffy")
    with self.assertRaisesRegex(ValueError, "gamma"):
      guided.guided_pg_loss(x, x, x, x, x, jnp.zeros(1), weight="shaped", gamma=0.0)


class IcpoRowsTest(absltest.TestCase):

  def test_region_gate_keeps_plain_rows_and_correct_guided_rows(self):
    reward, g = jnp.array([0.0, 1.0, 0.0, 1.0]), jnp.array([0.0, 0.0, 1.0, 1.0])
    np.testing.assert_array_equal(guided.region_gate(reward, g), [1.0, 1.0, 0.0, 1.0])

  def test_expert_bonus_anneals_to_zero(self):
    reward, g = jnp.array([1.0, 1.0, 0.0]), jnp.array([0.0, 1.0, 1.0])
    np.testing.assert_allclose(guided.expert_bonus(reward, g, 0, bonus=0.5, anneal_steps=10),
                               [1.0, 1.5, 0.0])
    np.testing.assert_allclose(guided.expert_bonus(reward, g, 4, bonus=0.5, anneal_steps=10),
                               [1.0, 1.3, 0.0], rtol=1e-6)
    np.testing.assert_allclose(guided.expert_bonus(reward, g, 30, bonus=0.5, anneal_steps=10),
                               [1.0, 1.0, 0.0])
    with self.assertRaisesRegex(ValueError, "anneal_steps"):
      guided.expert_bonus(reward, g, 0, bonus=0.5, anneal_steps=0)


class CrpoTest(absltest.TestCase):

  def test_golden_row_weights(self):
    # G = 4. Group 0: one original success (row 0), one transferred row (2), ā = 1/4: the
    # success weighs 1/4, the transferred row and the failures left 3/4. Group 1: no transfer,
    # weight 1. Group 2: ā = 0 (every success transferred): all rows weigh 1.
    success = jnp.array([1, 0, 1, 0, 1, 0, 0, 0, 0, 1, 1, 0], jnp.float32)
    g = jnp.array([0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 0], jnp.float32)
    got = guided.crpo_row_weights(success, g, group_size=4)
    np.testing.assert_allclose(got, [0.25, 0.75, 0.75, 0.75] + [1.0] * 8)
    with self.assertRaisesRegex(ValueError, "groups of 5"):
      guided.crpo_row_weights(success, g, group_size=5)

  def test_golden_loss(self):
    # One token per row, A = +1. Row 0 original (weight 1/4): r = e^0.5 > 1.2 -> −1.2·1/4.
    # Row 1 transferred (weight 3/4): ρ = π_θ(x)/π_old(x') = 0.5/0.25 = 2 -> −1.2·3/4; with
    # w̃ = 4, ρ = 0.5 < 0.8 -> −0.5·3/4. KL (k3, β = 0.1): row 0 at the reference (0); row 1
    # ref − logp = ln 0.5: e^{ln .5} − ln .5 − 1 = 0.193147.
    logp = jnp.array([[-0.5], [LN(0.5)]], jnp.float32)
    old = jnp.array([[-1.0], [-9.0]], jnp.float32)
    sampler = jnp.array([[-7.0], [LN(0.25)]], jnp.float32)
    ref = jnp.array([[-0.5], [LN(0.25)]], jnp.float32)
    mask, adv, g = jnp.ones((2, 1)), jnp.ones((2, 1)), jnp.array([0.0, 1.0])
    w = jnp.array([0.25, 0.75])
    loss, m = guided.crpo_loss(logp, old, sampler, adv, mask, g, w)
    np.testing.assert_allclose(loss[:, 0], [-0.3, -0.9], rtol=1e-6)
    np.testing.assert_allclose(m["guided/weight_mean"], 2.0, rtol=1e-6)
    scaled, _ = guided.crpo_loss(logp, old, sampler, adv, mask, g, w,
                                 log_ratio_scale_B=jnp.array([0.0, LN(4.0)]))
    np.testing.assert_allclose(scaled[:, 0], [-0.3, -0.375], rtol=1e-6)
    with_kl, m = guided.crpo_loss(logp, old, sampler, adv, mask, g, w, ref, kl_coef=0.1)
    np.testing.assert_allclose(with_kl[:, 0], [-0.3, -0.9 + 0.0193147], rtol=1e-5)
    np.testing.assert_allclose(m["kl_loss"], 0.193147 / 2, rtol=1e-5)
    with self.assertRaisesRegex(ValueError, "ref_logp_BT"):
      guided.crpo_loss(logp, old, sampler, adv, mask, g, w, kl_coef=0.1)

  def test_without_transferred_rows_it_is_grpo_bit_for_bit(self):
    # No purified rows, unit weights: PPO's clip + β·KL, loss and gradient, bit for bit
    # (the sampler's log-probs are ignored on original rows).
    logp, old, adv_BT, _, mask = testing.random_batch(seed=5)
    ref = old - 0.2
    sampler = old + 3.0
    g, w = jnp.zeros(4), jnp.ones(4)

    def base(lp):
      pg, _ = policy.ppo_clip(lp, old, adv_BT, mask)
      return pg + 0.05 * kl.kl_penalty(lp, ref, "k3")

    got, _ = guided.crpo_loss(logp, old, sampler, adv_BT, mask, g, w, ref, kl_coef=0.05)
    np.testing.assert_array_equal(got, jnp.where(mask > 0, base(logp), 0.0))
    total = lambda lp: aggregation.aggregate(guided.crpo_loss(
        lp, old, sampler, adv_BT, mask, g, w, ref, kl_coef=0.05)[0], mask, "token-mean")
    want = lambda lp: aggregation.aggregate(base(lp), mask, "token-mean")
    np.testing.assert_array_equal(jax.grad(total)(logp), jax.grad(want)(logp))

  def test_masked_tokens_get_exactly_zero(self):
    logp, old, adv_BT, _, mask = testing.random_batch(seed=6, garbage=55.0)
    sampler = jnp.where(mask > 0, old - 0.3, -1e30)
    ref = jnp.where(mask > 0, old + 0.1, 1e30)
    g, w = jnp.array([1.0, 0.0, 1.0, 0.0]), jnp.array([0.75, 1.0, 0.75, 0.25])
    f = lambda lp: aggregation.aggregate(guided.crpo_loss(
        lp, old, sampler, adv_BT, mask, g, w, ref, kl_coef=0.1)[0], mask, "token-mean")
    loss, _ = guided.crpo_loss(logp, old, sampler, adv_BT, mask, g, w, ref, kl_coef=0.1)
    grad = jax.grad(f)(logp)
    self.assertTrue(np.all(np.isfinite(grad)))
    off = np.asarray(mask) == 0
    np.testing.assert_array_equal(np.asarray(loss)[off], 0.0)
    np.testing.assert_array_equal(np.asarray(grad)[off], 0.0)
    self.assertTrue(np.any(np.asarray(grad)[~off] != 0.0))


if __name__ == "__main__":
  absltest.main()
