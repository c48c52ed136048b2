# pylint: disable=invalid-name
"""Tests of the value and reward heads (shared and separate backbones)."""
from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.models import heads
from agentrl.models import testing
from agentrl.models import transformer

jax.config.update("jax_numpy_rank_promotion", "raise")


class HeadsTest(absltest.TestCase):

  def test_last_token_index(self):
    mask_BT = jnp.array([[1, 1, 1, 0, 0], [0, 0, 1, 1, 1], [1, 1, 1, 1, 1]], bool)
    np.testing.assert_array_equal(heads.last_token_index(mask_BT), [2, 4, 4])

  def test_value_head_is_per_token_and_starts_at_zero(self):
    head = heads.ValueHead(4)
    h_BTD = jnp.arange(24, dtype=jnp.float32).reshape(2, 3, 4)
    np.testing.assert_array_equal(head(h_BTD), np.zeros((2, 3)))
    head.w_D[...] = jnp.array([1.0, 0.0, 0.0, -1.0])
    head.b[...] = jnp.array(0.5)
    np.testing.assert_allclose(head(h_BTD), h_BTD[..., 0] - h_BTD[..., 3] + 0.5)

  def test_step_head_reads_each_step_end_and_only_there(self):
    head = heads.StepHead(3)
    head.score.w_D[...] = jnp.array([1.0, -2.0, 0.5])
    head.score.b[...] = jnp.array(0.25)
    h_BTD = jax.random.normal(jax.random.key(0), (2, 5, 3))
    end_BU = jnp.array([[1, 4], [3, 0]])
    mask_BU = jnp.array([[1, 1], [1, 0]])
    want = np.asarray(h_BTD) @ np.array([1.0, -2.0, 0.5]) + 0.25
    np.testing.assert_allclose(head(h_BTD, end_BU, mask_BU),
                               [[want[0, 1], want[0, 4]], [want[1, 3], 0.0]], rtol=1e-6)
    # Only the hidden states at labelled step ends get gradient.
    grad_BTD = jax.grad(lambda h: head(h, end_BU, mask_BU).sum())(h_BTD)
    touched_BT = np.abs(np.asarray(grad_BTD)).sum(-1) > 0
    np.testing.assert_array_equal(touched_BT, [[0, 1, 0, 0, 1], [0, 0, 0, 1, 0]])

  def test_reward_model_reads_the_last_real_token_left_or_right_padded(self):
    cfg = transformer.Config.named("tiny", vocab=64, depth=1)
    _, backbone = testing.random_params(cfg)
    graphdef_rm, state = nnx.split(nnx.eval_shape(lambda: heads.RewardModel(cfg, rngs=nnx.Rngs(0))))
    pure = nnx.to_pure_dict(state)
    pure["backbone"] = nnx.to_pure_dict(backbone)
    pure["head"]["score"] = {"w_D": np.random.default_rng(0).standard_normal(cfg.width),
                             "b": np.zeros((), np.float32)}
    nnx.replace_by_pure_dict(state, pure)
    seq = jnp.array([5, 9, 3, 7], jnp.int32)
    tokens_BT = jnp.stack([jnp.pad(seq, (0, 2)), jnp.pad(seq, (2, 0)), jnp.pad(seq[:3], (3, 0))])
    mask_BT = tokens_BT != 0
    positions_BT = jnp.maximum(jnp.cumsum(mask_BT, axis=1) - 1, 0)
    reward_B = jax.jit(lambda s: nnx.merge(graphdef_rm, s)(tokens_BT, positions_BT, mask_BT))(
        state)
    self.assertEqual(reward_B.shape, (3,))
    np.testing.assert_allclose(reward_B[0], reward_B[1], rtol=1e-5)  # same sequence
    self.assertGreater(abs(float(reward_B[0] - reward_B[2])), 1e-4)   # a prefix scores apart

  def test_value_model_shapes(self):
    cfg = transformer.Config.named("tiny", vocab=64, depth=1)
    vm = nnx.eval_shape(lambda: heads.ValueModel(cfg, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(vm)
    out = jax.eval_shape(lambda s: nnx.merge(graphdef, s)(
        jnp.zeros((2, 5), jnp.int32), jnp.zeros((2, 5), jnp.int32)), state)
    self.assertEqual((out.shape, out.dtype), ((2, 5), jnp.float32))


  def test_process_reward_model_shapes(self):
    cfg = transformer.Config.named("tiny", vocab=64, depth=1)
    graphdef, state = nnx.split(
        nnx.eval_shape(lambda: heads.ProcessRewardModel(cfg, rngs=nnx.Rngs(0))))
    tokens_BT = jnp.zeros((2, 5), jnp.int32)
    out = jax.eval_shape(lambda s: nnx.merge(graphdef, s)(
        tokens_BT, tokens_BT, jnp.zeros((2, 3), jnp.int32), jnp.ones((2, 3))), state)
    self.assertEqual((out.shape, out.dtype), ((2, 3), jnp.float32))

  def test_policy_prm_is_the_policy_backbone_and_a_step_head(self):
    cfg = transformer.Config.named("tiny", vocab=64, depth=1)
    graphdef, params = nnx.split(transformer.Transformer(cfg, rngs=nnx.Rngs(0)))
    head_graphdef, head_params = heads.policy_step_head(graphdef, params, seed=1)
    # The head starts at zero: give it weights so the test sees which hidden state it reads.
    head_params = jax.tree.map(lambda x: x + jnp.linspace(0.1, 1.0, x.size).reshape(x.shape),
                               head_params)
    logits = heads.policy_prm_logits(graphdef, head_graphdef)
    tokens_BT = jnp.arange(10, dtype=jnp.int32).reshape(2, 5)
    positions_BT = jnp.broadcast_to(jnp.arange(5), (2, 5))
    end_BU, mask_BU = jnp.array([[1, 4], [2, 0]]), jnp.array([[1.0, 1.0], [1.0, 0.0]])
    got = logits({"backbone": params, "head": head_params}, tokens_BT, positions_BT,
                 jnp.ones((2, 5), bool), end_BU, mask_BU)
    h_BTD = nnx.merge(graphdef, params).hidden(tokens_BT, positions_BT, jnp.ones((2, 5), bool))
    want = nnx.merge(head_graphdef, head_params)(h_BTD, end_BU, mask_BU)
    np.testing.assert_array_equal(got, want)
    self.assertNotEqual(float(got[0, 0]), float(got[0, 1]))
    self.assertEqual(float(got[1, 1]), 0.0)   # an absent step scores 0


if __name__ == "__main__":
  absltest.main()
