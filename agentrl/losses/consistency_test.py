# pylint: disable=invalid-name
"""Tests for agentrl.losses.consistency (COPO's blended surrogate).

The reference transcribes hijih/copo-code `compute_policy_loss_with_global` (c15c75f): two
dual-clip PPO terms on one ratio, blended per row as global * (1 - w) + local * w.
"""
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import consistency
from agentrl.losses import policy
from agentrl.losses import testing

jax.config.update("jax_numpy_rank_promotion", "raise")

GLOBAL_B = jnp.array([0.8, -1.2, 0.3, 0.5])
WEIGHT_B = jnp.array([0.3, 1.0, 0.0, 0.6])


def np_dual_ppo(ratio, adv, eps=0.2, c=3.0):
  loss1 = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - eps, 1 + eps))
  return np.where(adv < 0, np.minimum(-adv * c, loss1), loss1)


def np_copo(logp, old, adv, m, *, global_adv, weight):
  ratio = np.exp(np.clip(np.where(m > 0, logp - old, 0.0), -20, 20))
  local = np_dual_ppo(ratio, np.broadcast_to(adv, m.shape))
  glob = np_dual_ppo(ratio, np.broadcast_to(global_adv[:, None], m.shape))
  return np.where(m > 0, glob * (1 - weight[:, None]) + local * weight[:, None], 0.0)


class CopoPpoTest(chex.TestCase):

  KW = dict(global_adv_B=GLOBAL_B, local_weight_B=WEIGHT_B)

  def test_against_transcription(self):
    testing.check_against_reference(
        consistency.copo_ppo, np_copo, "seq-mean-token-mean",
        np_kw=dict(global_adv=np.asarray(GLOBAL_B), weight=np.asarray(WEIGHT_B)), **self.KW)

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # r = 1.5, local A = 1 (clipped at 1.2), global A = -1 (unclipped above): w = 0.25.
    logp, old, mask = jnp.log(jnp.array([[1.5]])), jnp.zeros((1, 1)), jnp.ones((1, 1))
    fn = self.variant(functools.partial(consistency.copo_ppo, global_adv_B=jnp.array([-1.0]),
                                        local_weight_B=jnp.array([0.25])))
    loss, metrics = fn(logp, old, jnp.ones((1, 1)), mask)
    np.testing.assert_allclose(loss, [[0.75 * 1.5 + 0.25 * -1.2]], rtol=1e-6)
    np.testing.assert_allclose(metrics["clipfrac"], 1.0)
    np.testing.assert_allclose(metrics["global_clipfrac"], 0.0)
    np.testing.assert_allclose(metrics["local_weight_mean"], 0.25)

  def test_neutral_settings(self):
    logp, old, adv, _, mask = testing.random_batch(seed=3, scale=0.4)
    ones, zeros = jnp.ones(4), jnp.zeros(4)
    got, _ = consistency.copo_ppo(logp, old, adv, mask, global_adv_B=GLOBAL_B,
                                  local_weight_B=ones)
    np.testing.assert_allclose(got, policy.ppo_clip(logp, old, adv, mask, dual_clip=3.0)[0],
                               rtol=1e-6)
    got, _ = consistency.copo_ppo(logp, old, adv, mask, global_adv_B=GLOBAL_B,
                                  local_weight_B=zeros)
    np.testing.assert_allclose(
        got, policy.ppo_clip(logp, old, GLOBAL_B[:, None], mask, dual_clip=3.0)[0], rtol=1e-6)

  def test_invariants(self):
    testing.check_masked_tokens_get_exactly_zero_gradient(
        consistency.copo_ppo, "token", "seq-mean-token-mean", self.KW)
    # On-policy the gradient is REINFORCE's with the blended advantage.
    logp, old, adv, _, mask = testing.random_batch(on_policy=True)
    got = testing.grad(consistency.copo_ppo, logp, old, adv, mask, "seq-mean-token-mean",
                       **self.KW)
    blended = (1 - WEIGHT_B[:, None]) * GLOBAL_B[:, None] + WEIGHT_B[:, None] * adv
    want = testing.grad(policy.vanilla_pg, logp, old, blended, mask, "seq-mean-token-mean")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    testing.check_tool_token_insertion_changes_nothing(
        consistency.copo_ppo, "seq-mean-token-mean",
        dict(global_adv_B=jnp.array([-0.4]), local_weight_B=jnp.array([0.5])))

  def test_bad_shapes_raise(self):
    logp, old, adv, _, mask = testing.random_batch()
    with self.assertRaisesRegex(ValueError, "global_adv_B and local_weight_B"):
      consistency.copo_ppo(logp, old, adv, mask, global_adv_B=jnp.zeros(3),
                           local_weight_B=jnp.zeros(4))


if __name__ == "__main__":
  absltest.main()
