# pylint: disable=invalid-name
"""Tests for agentrl.credit.prm: hand-computed PRM-dense (sum and min form) and VPPO rewards,
the returns they give, first-error localisation and masked turns (docs/algorithms.md §15.3).
"""
import functools

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.credit import prm
from agentrl.credit import probes
from agentrl.rewards import process
from agentrl.rollout import agent_loop

jax.config.update("jax_numpy_rank_promotion", "raise")


def returns(r_BU, mask_BU):
  return np.asarray(estimators.discounted_turn_returns(r_BU, mask_BU, gamma=1.0))


class ReturnsToRewardsTest(absltest.TestCase):

  def test_golden_and_round_trip(self):
    ret = jnp.array([[3.0, 2.0, 5.0], [1.0, 9.0, 4.0]])
    mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
    r = prm.returns_to_rewards(ret, mask)
    np.testing.assert_allclose(r, [[1.0, -3.0, 5.0], [-3.0, 0.0, 4.0]])
    np.testing.assert_allclose(returns(r, mask), np.asarray(ret) * np.asarray(mask))


class DenseTest(absltest.TestCase):

  def test_sum_form_golden(self):
    r = prm.dense_turn_rewards(jnp.array([[0.9, 0.2, 0.8]]), jnp.array([1.0]),
                               jnp.ones((1, 3)), form="sum")
    np.testing.assert_allclose(r, [[0.9, 0.2, 1.8]], rtol=1e-6)
    np.testing.assert_allclose(returns(r, jnp.ones((1, 3))), [[2.9, 2.0, 1.8]], rtol=1e-6)

  def test_math_shepherd_ppo_is_the_score_alone(self):
    s = jnp.array([[0.9, 0.2, 0.8], [0.1, 0.7, 0.0]])
    mask = jnp.array([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    r = prm.dense_turn_rewards(s, jnp.array([1.0, 0.0]), mask, form="sum", outcome_coef=0.0)
    np.testing.assert_allclose(r, s * mask)

  def test_min_form_golden(self):
    r = prm.dense_turn_rewards(jnp.array([[0.9, 0.2, 0.8]]), jnp.array([1.0]),
                               jnp.ones((1, 3)), form="min")
    # Suffix minima 0.2, 0.2, 0.8, plus the outcome 1 in every return.
    np.testing.assert_allclose(returns(r, jnp.ones((1, 3))), [[1.2, 1.2, 1.8]], rtol=1e-6)
    np.testing.assert_allclose(r, [[0.0, -0.6, 1.8]], rtol=1e-6)

  def test_min_form_skips_invalid_turns(self):
    s = jnp.array([[0.5, 0.0, 0.3, 0.9]])     # turn 1 and 3 did not happen
    mask = jnp.array([[1.0, 0.0, 1.0, 0.0]])
    r = prm.dense_turn_rewards(s, jnp.array([2.0]), mask, form="min", process_coef=2.0,
                               outcome_coef=0.5)
    np.testing.assert_allclose(returns(r, mask), [[1.6, 0.0, 1.6, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(r, [[0.0, 0.0, 1.6, 0.0]], rtol=1e-6)

  def test_min_form_process_return_is_bounded_by_the_scores(self):
    rng = np.random.default_rng(0)
    s = jnp.asarray(rng.uniform(size=(8, 5)), jnp.float32)
    mask = jnp.asarray(np.arange(5)[None] < rng.integers(1, 6, size=(8, 1)), jnp.float32)
    ret = returns(prm.dense_turn_rewards(s, jnp.zeros(8), mask, form="min"), mask)
    s_np, m = np.asarray(s), np.asarray(mask) > 0
    for b in range(8):
      n = int(m[b].sum())
      want = [s_np[b, k:n].min() for k in range(n)]
      np.testing.assert_allclose(ret[b, :n], want, rtol=1e-6)
      np.testing.assert_array_equal(ret[b, n:], 0.0)

  def test_jits_and_checks(self):
    f = jax.jit(functools.partial(prm.dense_turn_rewards, form="min"))
    self.assertEqual(f(jnp.zeros((2, 3)), jnp.zeros(2), jnp.ones((2, 3))).shape, (2, 3))
    with self.assertRaisesRegex(ValueError, "form='max'"):
      prm.dense_turn_rewards(jnp.zeros((1, 2)), jnp.zeros(1), jnp.ones((1, 2)), form="max")
    with self.assertRaisesRegex(ValueError, "outcome_B has shape"):
      prm.dense_turn_rewards(jnp.zeros((1, 2)), jnp.zeros(2), jnp.ones((1, 2)))


class VppoTest(absltest.TestCase):

  def test_first_error(self):
    correct = jnp.array([[1, 1, 0, 1], [1, 1, 1, 1], [0, 1, 1, 0], [1, 0, 1, 1]], bool)
    mask = jnp.array([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    # Row 3's wrong step did not happen: it is fully verified (k* = its 1 valid step).
    np.testing.assert_array_equal(prm.first_error(correct, mask), [2, 3, 0, 1])
    np.testing.assert_array_equal(prm.prefix_mask(correct, mask),
                                  [[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 0, 0]])

  def test_rewards_golden(self):
    correct = jnp.array([[1, 1, 0, 1], [1, 0, 1, 1], [0, 1, 1, 1]], bool)
    success = jnp.array([False, True, False])
    mask = jnp.ones((3, 4))
    r = prm.vppo_turn_rewards(correct, success, mask)
    # Failed row 0: prefix (steps 0-1) is credited 0.5 at its last step; success row 1 keeps
    # the outcome whatever its steps; failed row 2 has no good prefix.
    np.testing.assert_allclose(r, [[0, 0.5, 0, 0], [0, 0, 0, 1], [0, 0, 0, 0]])
    np.testing.assert_allclose(returns(r, mask),
                               [[0.5, 0.5, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])

  def test_penalty_only_after_the_first_error(self):
    correct = jnp.array([[1, 1, 0, 1]], bool)
    r = prm.vppo_turn_rewards(correct, jnp.array([False]), jnp.ones((1, 4)), fail_reward=-1.0)
    np.testing.assert_allclose(r, [[0, 1.5, 0, -1]])
    np.testing.assert_allclose(returns(r, jnp.ones((1, 4))), [[0.5, 0.5, -1, -1]])

  def test_no_step_judgement_is_outcome_only(self):
    # All steps correct on a failure: the whole row is a verified prefix; success_reward =
    # prefix_reward = fail_reward reduces to a constant return.
    correct = jnp.ones((2, 3), bool)
    mask = jnp.array([[1, 1, 1], [1, 1, 0]])
    r = prm.vppo_turn_rewards(correct, jnp.array([True, False]), mask, prefix_reward=0.25)
    np.testing.assert_allclose(returns(r, mask), [[1, 1, 1], [0.25, 0.25, 0]])


def traj(turn, loss_mask, *, success, parent=-1, fork_at=0):
  turn, n = np.asarray(turn, np.int32), len(turn)
  turns = int(turn.max()) + 1
  return agent_loop.Trajectory(
      tokens=np.arange(n, dtype=np.int32), loss_mask=np.asarray(loss_mask, np.float32),
      turn=turn, sampler_logp=np.zeros(n, np.float32), turn_rewards=[0.0] * turns,
      reward=float(success), done=True, truncated=False, prompt_len=2, parent=parent,
      fork_at=fork_at)


class PrmStepsTest(absltest.TestCase):

  def test_layout_of_a_branching_rollout_and_its_labels(self):
    trajs = [
        traj([-1, -1, 0, 0, 0, 1, 1, 1, 2], [0, 0, 1, 1, 0, 1, 1, 0, 1], success=0),
        # Forks after row 0's observation of turn 0: shares step 0.
        traj([-1, -1, 0, 0, 0, 1, 1, 2, 2], [0, 0, 1, 1, 0, 1, 0, 1, 1], success=1, parent=0,
             fork_at=5),
        # Forks inside row 0's step 1: still shares step 0 only.
        traj([-1, -1, 0, 0, 0, 1, 1], [0, 0, 1, 1, 0, 1, 1], success=1, parent=0, fork_at=6),
    ]
    steps = probes.prm_steps(trajs, max_steps=3)
    np.testing.assert_array_equal(steps["step_end"], [[3, 6, 8], [3, 5, 8], [3, 6, 0]])
    np.testing.assert_array_equal(steps["step_mask"], [[1, 1, 1], [1, 1, 1], [1, 1, 0]])
    np.testing.assert_array_equal(steps["shared"], [0, 1, 1])
    np.testing.assert_array_equal(steps["parent"], [-1, 0, 0])
    cut = probes.prm_steps(trajs, max_steps=3, max_len=8)
    np.testing.assert_array_equal(cut["step_mask"], [[1, 1, 0], [1, 1, 0], [1, 1, 0]])
    succ, total = process.continuation_counts(
        np.array([t.reward for t in trajs]), steps["num_steps"], max_steps=3,
        parent_B=steps["parent"], shared_B=steps["shared"])
    soft, mask = process.mc_labels(succ, total, mode="soft")
    # Step 0 (owned by row 0) has the three rows as continuations, two succeed.
    np.testing.assert_allclose(soft, [[2 / 3, 0, 0], [2 / 3, 1, 1], [2 / 3, 1, 0]])
    np.testing.assert_array_equal(mask, steps["step_mask"])


if __name__ == "__main__":
  absltest.main()
