# pylint: disable=invalid-name
"""Tests for agentrl.credit.oprl: implicit step rewards (and their shaping identity), the
trajectory DPO loss through `losses.preference.dpo`, and the fused advantage's invariants."""
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.credit import oprl
from agentrl.losses import aggregation
from agentrl.losses import preference

jax.config.update("jax_numpy_rank_promotion", "raise")

# Row 0: prompt, turn 0 (2 tokens), observation, turn 1 (1 token). Row 1: prompt, turn 0 (3).
TURN = jnp.array([[-1, 0, 0, 0, 1], [-1, 0, 0, 0, -1]])
MASK = jnp.array([[0, 1, 1, 0, 1], [0, 1, 1, 1, 0]], jnp.float32)


class StepRewardTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    prm = jnp.array([[9.0, -1.0, -2.0, 5.0, -0.5], [9.0, -1.0, -1.0, -1.0, 9.0]])
    old = jnp.array([[0.0, -1.5, -2.0, 0.0, -1.0], [0.0, -0.5, -1.0, -2.0, 0.0]])
    fn = self.variant(functools.partial(oprl.implicit_step_reward, num_turns=3, beta=0.1))
    reward, mask = fn(prm, old, TURN, MASK)
    # beta * sum over the turn's policy tokens of (log pi_phi - log pi_old).
    np.testing.assert_allclose(reward, [[0.05, 0.05, 0.0], [0.05, 0.0, 0.0]], atol=1e-7)
    np.testing.assert_array_equal(mask, [[True, True, False], [True, False, False]])

  def test_step_rewards_sum_to_the_trajectory_dpo_reward(self):
    # The potential-shaping identity: sum_u r_u = beta (log pi_phi(tau) - log pi_old(tau)).
    rng = np.random.default_rng(0)
    prm, old = (jnp.asarray(rng.normal(size=(2, 5)), jnp.float32) for _ in range(2))
    reward, _ = oprl.implicit_step_reward(prm, old, TURN, MASK, num_turns=2, beta=0.3)
    want = 0.3 * (preference.sequence_logp(prm, MASK) - preference.sequence_logp(old, MASK))
    np.testing.assert_allclose(reward.sum(1), want, rtol=1e-5)

  def test_bad_shapes(self):
    with self.assertRaisesRegex(ValueError, r"\[B, T\]"):
      oprl.turn_sums(jnp.zeros((2, 4)), TURN, MASK, num_turns=2)


class PrmLossTest(chex.TestCase):

  def test_pairs(self):
    chosen, rejected, valid = oprl.preference_pairs(jnp.array([1.0, 0.0, 0.5, 0.5]),
                                                    group_size=2)
    np.testing.assert_array_equal(chosen, [0, 0, 1, 1, 2, 2, 3, 3])
    np.testing.assert_array_equal(rejected, [0, 1, 0, 1, 2, 3, 2, 3])
    np.testing.assert_array_equal(valid, [0, 1, 0, 0, 0, 0, 0, 0])  # equal outcomes: no pair

  @chex.variants(with_jit=True, without_jit=True)
  def test_loss_is_dpo_on_each_pair(self):
    rng = np.random.default_rng(1)
    prm = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
    old = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
    mask = jnp.tile(MASK[:1], (4, 1))
    outcome = jnp.array([0.0, 1.0, 0.2, 0.2])
    fn = self.variant(functools.partial(oprl.prm_loss, group_size=2, beta=0.5))
    loss, metrics = fn(prm, old, mask, outcome)
    seq = lambda x: preference.sequence_logp(x, mask)
    want, _ = preference.dpo(seq(prm)[1:2], seq(prm)[0:1], seq(old)[1:2], seq(old)[0:1],
                             beta=0.5)
    np.testing.assert_allclose(loss, [0, 0, float(want[0]), 0, 0, 0, 0, 0], rtol=1e-6)
    self.assertEqual(float(metrics["prm_pairs"]), 1.0)
    margin = (seq(prm) - seq(old))[1] - (seq(prm) - seq(old))[0]
    self.assertEqual(float(metrics["prm_accuracy"]), float(margin > 0))

  def test_gradient_reaches_only_policy_tokens_of_paired_rows(self):
    rng = np.random.default_rng(2)
    prm = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
    old = jnp.asarray(rng.normal(size=(4, 5)), jnp.float32)
    mask = jnp.tile(MASK[:1], (4, 1))
    outcome = jnp.array([1.0, 0.0, 0.3, 0.3])  # the second group has no pair

    def total(prm):
      loss, _ = oprl.prm_loss(prm, old, mask, outcome, group_size=2, beta=0.1)
      _, _, valid = oprl.preference_pairs(outcome, group_size=2)
      return aggregation.masked_mean(loss, valid)

    grad = np.asarray(jax.grad(total)(prm))
    self.assertTrue(np.all(grad[:, np.asarray(MASK[0]) == 0] == 0.0))
    self.assertTrue(np.all(grad[2:] == 0.0))
    self.assertTrue(np.all(grad[:2, np.asarray(MASK[0]) > 0] != 0.0))
    self.assertTrue(np.all(np.isfinite(grad)))


class OprlAdvantageTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # One prompt, G = 2. Outcomes 1, 0: episode advantage +-0.5 / (sqrt(0.5) + eps).
    # Step rewards over the group's three valid turns {0.3, 0.1, -0.1}: mean 0.1, std 0.2.
    fn = self.variant(functools.partial(oprl.oprl_advantage, group_size=2, alpha=0.5))
    adv = fn(jnp.array([1.0, 0.0]), jnp.array([[0.3, 0.1], [-0.1, 5.0]]),
             jnp.array([[1.0, 1.0], [1.0, 0.0]]))
    a = 0.5 / (np.sqrt(0.5) + 1e-6)
    z = lambda x: (x - 0.1) / (0.2 + 1e-6)
    np.testing.assert_allclose(adv, [[a + 0.5 * z(0.3), a + 0.5 * z(0.1)],
                                     [-a + 0.5 * z(-0.1), 0.0]], rtol=1e-5, atol=1e-6)

  def test_alpha_zero_is_grpo_and_identical_trajectories_are_zero(self):
    rng = np.random.default_rng(3)
    outcome = jnp.asarray(rng.integers(0, 2, size=8), jnp.float32)
    step = jnp.asarray(rng.normal(size=(8, 3)), jnp.float32)
    mask = jnp.asarray(rng.random((8, 3)) > 0.2, jnp.float32)
    adv = oprl.oprl_advantage(outcome, step, mask, group_size=4, alpha=0.0)
    grpo_B = estimators.grpo(outcome, group_size=4)
    np.testing.assert_allclose(adv, jnp.where(mask > 0, grpo_B[:, None], 0.0), rtol=1e-6)
    same = oprl.oprl_advantage(jnp.full((3,), 0.4), jnp.full((3, 2), -0.7), jnp.ones((3, 2)),
                               group_size=3)
    np.testing.assert_array_equal(same, 0.0)
    lone = oprl.oprl_advantage(jnp.array([1.0, 0.0]), jnp.array([[2.0], [0.0]]),
                               jnp.array([[1.0], [0.0]]), group_size=2, alpha=1.0)
    np.testing.assert_allclose(lone[:, 0], [0.5 / (np.sqrt(0.5) + 1e-6), 0.0], rtol=1e-6)

  def test_turn_step_norm(self):
    # Per (prompt, turn index): turn 0 pools rows 0, 1 (0.3, -0.1), turn 1 holds row 0 alone.
    adv = oprl.oprl_advantage(jnp.array([1.0, 0.0]), jnp.array([[0.3, 0.1], [-0.1, 5.0]]),
                              jnp.array([[1.0, 1.0], [1.0, 0.0]]), group_size=2, alpha=0.5,
                              step_norm="turn")
    a = 0.5 / (np.sqrt(0.5) + 1e-6)
    z = 0.2 / (np.sqrt(0.08) + 1e-6)
    np.testing.assert_allclose(adv, [[a + 0.5 * z, a], [-a - 0.5 * z, 0.0]], rtol=1e-5)
    # Identical multi-turn trajectories: every turn's step group is constant, so exactly 0.
    step = jnp.tile(jnp.array([[0.9, -0.4, 2.0]]), (4, 1))
    same = oprl.oprl_advantage(jnp.full((4,), 1.0), step, jnp.ones((4, 3)), group_size=4,
                               step_norm="turn")
    np.testing.assert_array_equal(same, 0.0)
    with self.assertRaisesRegex(ValueError, "step_norm"):
      oprl.oprl_advantage(jnp.zeros(2), step[:2], jnp.ones((2, 3)), group_size=2,
                          step_norm="batch")

  def test_permutation(self):
    rng = np.random.default_rng(4)
    outcome = rng.integers(0, 2, size=8).astype(np.float32)
    step = rng.normal(size=(8, 3)).astype(np.float32)
    mask = np.ones((8, 3), np.float32)
    perm = np.concatenate([rng.permutation(4), 4 + rng.permutation(4)])
    adv = np.asarray(oprl.oprl_advantage(jnp.asarray(outcome), jnp.asarray(step),
                                         jnp.asarray(mask), group_size=4))
    np.testing.assert_allclose(
        oprl.oprl_advantage(jnp.asarray(outcome[perm]), jnp.asarray(step[perm]),
                            jnp.asarray(mask[perm]), group_size=4), adv[perm], rtol=1e-5,
        atol=1e-6)

  def test_bad_shapes(self):
    with self.assertRaisesRegex(ValueError, "oprl_advantage"):
      oprl.oprl_advantage(jnp.zeros(3), jnp.zeros((2, 2)), jnp.zeros((2, 2)), group_size=2)


if __name__ == "__main__":
  absltest.main()
