# pylint: disable=invalid-name
"""Tests for agentrl.credit.spa: turn-end gathering, the progress loss and its gradient, and the
dense reward with the official grounding weights (SPA-RL-Agent, prm/rl_data_org.py)."""
import functools

from absl.testing import absltest
import chex
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.credit import spa
from agentrl.models import heads

jax.config.update("jax_numpy_rank_promotion", "raise")

# Row 0: prompt, turn 0 (2 tokens), observation, turn 1 (1 token), padding.
# Row 1: prompt, turn 0 (1 token), observation, then nothing.
TURN = jnp.array([[-1, 0, 0, 0, 1, -1], [-1, 0, 0, -1, -1, -1]])
MASK = jnp.array([[0, 1, 1, 0, 1, 0], [0, 1, 0, 0, 0, 0]], jnp.float32)


class TurnEndValuesTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_example(self):
    x = jnp.arange(12, dtype=jnp.float32).reshape(2, 6)
    values, mask = self.variant(functools.partial(spa.turn_end_values, num_turns=3))(x, TURN,
                                                                                    MASK)
    np.testing.assert_array_equal(values, [[2.0, 4.0, 0.0], [7.0, 0.0, 0.0]])
    np.testing.assert_array_equal(mask, [[True, True, False], [True, False, False]])

  def test_linear_head_on_logits_is_the_official_estimator(self):
    # The official prm_model: Linear(V, 1) on the logits at each turn's last token, summed.
    rng = np.random.default_rng(0)
    logits = jnp.asarray(rng.normal(size=(2, 6, 5)), jnp.float32)
    head = heads.ValueHead(5, rngs=nnx.Rngs(0))
    w, b = rng.normal(size=5).astype(np.float32), np.float32(0.3)
    head.w_D[...] = jnp.asarray(w)
    head.b[...] = jnp.asarray(b)
    values, mask = spa.turn_end_values(head(logits), TURN, MASK, num_turns=2)
    want = [[logits[0, 2] @ w + b, logits[0, 4] @ w + b], [logits[1, 1] @ w + b, 0.0]]
    np.testing.assert_allclose(values, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(mask, [[True, True], [True, False]])

  def test_bad_shapes(self):
    with self.assertRaisesRegex(ValueError, r"\[B, T\]"):
      spa.turn_end_values(jnp.zeros((2, 5)), TURN, MASK, num_turns=2)


class ProgressLossTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_and_gradient(self):
    c = jnp.array([[0.2, 0.3, 9.0], [0.5, 0.5, 0.5]])
    m = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    outcome = jnp.array([1.0, 1.5])
    loss, metrics = self.variant(spa.progress_loss)(c, m, outcome)
    np.testing.assert_allclose(loss, [0.25, 0.0], atol=1e-6)  # (0.5 - 1)^2, (1.5 - 1.5)^2
    np.testing.assert_allclose(metrics["progress_mae"], 0.25, rtol=1e-6)
    np.testing.assert_allclose(metrics["progress_within_0.1"], 0.5)
    grad = jax.grad(lambda c: spa.progress_loss(c, m, outcome)[0].mean())(c)
    # d/dc_u of mean_b (sum c - R)^2 = 2 (sum c - R) / B on valid turns; absent turns get 0.
    np.testing.assert_allclose(grad, [[-0.5, -0.5, 0.0], [0.0, 0.0, 0.0]], atol=1e-6)

  def test_contributions_that_sum_to_the_outcome_have_zero_loss(self):
    rng = np.random.default_rng(0)
    c = rng.normal(size=(4, 3)).astype(np.float32)
    loss, _ = spa.progress_loss(jnp.asarray(c), jnp.ones((4, 3)), jnp.asarray(c.sum(1)))
    np.testing.assert_allclose(loss, 0.0, atol=1e-10)

  def test_bad_shapes(self):
    with self.assertRaisesRegex(ValueError, "progress_loss"):
      spa.progress_loss(jnp.zeros((2, 3)), jnp.zeros((2, 3)), jnp.zeros(3))


class DenseRewardTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_official_weights(self):
    c = jnp.array([[0.1, -0.2, 0.4, 7.0], [0.3, 0.2, 0.0, 0.0]])
    grounded = jnp.array([[1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 1.0, 1.0]])
    m = jnp.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
    reward = self.variant(spa.dense_reward)(c, grounded, m)
    # c + 0.5 g, and the last valid turn always gets 0.5 (rl_data_org.py); absent turns 0.
    np.testing.assert_allclose(reward, [[0.6, -0.2, 0.9, 0.0], [0.3, 0.7, 0.0, 0.0]],
                               rtol=1e-6)

  def test_last_turn_option_and_weights(self):
    c = jnp.array([[1.0, 2.0]])
    reward = spa.dense_reward(c, jnp.array([[1.0, 0.0]]), jnp.ones((1, 2)),
                              last_turn_grounded=False, grounding_weight=1.0,
                              contribution_weight=0.5)
    np.testing.assert_allclose(reward, [[1.5, 1.0]])
    grad = jax.grad(lambda c: spa.dense_reward(c, jnp.ones((1, 2)), jnp.ones((1, 2))).sum())(c)
    np.testing.assert_array_equal(grad, 0.0)  # the estimator's output is data for the policy


if __name__ == "__main__":
  absltest.main()
