# pylint: disable=invalid-name
"""experiments/distill/opd.py's advantage step and losses on hand-built batches.

The OPD reward is teacher minus student on policy tokens and exactly 0 elsewhere; a teacher
equal to the student teaches nothing; KEPO's gate drops whole rows; the outcome term is
GRPO's; and at ratio 1 the PPO form and the REINFORCE form give the same gradient.
"""
import importlib

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl.advantages import estimators
from agentrl.models import policy as policy_lib
from agentrl.models import testing
from agentrl.models import transformer
from agentrl import types

jax.config.update("jax_numpy_rank_promotion", "raise")

opd = importlib.import_module("experiments.distill.opd")

MASK = np.array([[0, 1, 1, 0], [0, 1, 1, 1], [0, 1, 0, 0], [0, 1, 1, 0]], np.float32)
OLD = np.array([[0, -1.0, -2.0, 5.0], [0, -0.5, -1.5, -1.0], [0, -3.0, 9.0, 9.0],
                [0, -1.0, -1.0, 7.0]], np.float32)
TEACHER = np.array([[0, -0.5, -3.0, 0.0], [0, -0.5, -1.0, -2.0], [0, -1.0, 0.0, 0.0],
                    [0, -2.0, -1.0, 0.0]], np.float32)
REWARD = [1.0, 0.0, 1.0, 1.0]


def _config(**loss):
  config = opd.get_config("smoke")
  config.rollout.group_size = 2
  config.loss.update(**loss)
  return config


def _batch(teacher=TEACHER, ref=None):
  B, T = MASK.shape
  return types.Batch(
      tokens_BT=jnp.ones((B, T), jnp.int32), positions_BT=jnp.tile(jnp.arange(T), (B, 1)),
      input_mask_BT=jnp.ones((B, T), bool), loss_mask_BT=jnp.asarray(MASK),
      reward_B=jnp.asarray(REWARD), old_logp_BT=jnp.asarray(OLD),
      ref_logp_BT=None if ref is None else jnp.asarray(ref),
      aux={"teacher_logp_BT": jnp.asarray(teacher)})


class AdvantageTest(parameterized.TestCase):

  def test_reward_is_teacher_minus_student_on_policy_tokens_only(self):
    batch, metrics = jax.jit(opd.make_advantage_fn(_config()))(_batch(), {})
    want = np.where(MASK > 0, TEACHER - OLD, 0.0)
    np.testing.assert_allclose(batch.adv_BT, want, rtol=1e-6)
    self.assertAlmostEqual(float(metrics["opd_reward"]), want.sum() / MASK.sum(), places=6)
    self.assertAlmostEqual(float(metrics["opd_teacher_kl"]), -want.sum() / MASK.sum(), places=6)

  def test_teacher_equal_to_student_gives_zero(self):
    batch, _ = opd.make_advantage_fn(_config())(_batch(teacher=OLD), {})
    np.testing.assert_array_equal(batch.adv_BT, 0.0)

  def test_exopd_reads_the_reference(self):
    ref = OLD - 1.0
    batch, _ = opd.make_advantage_fn(_config(lam=1.25))(_batch(ref=ref), {})
    want = np.where(MASK > 0, 1.25 * (TEACHER - ref) - (OLD - ref), 0.0)
    np.testing.assert_allclose(batch.adv_BT, want, rtol=1e-6)

  @parameterized.parameters(("success", [1, 0, 1, 1]), ("failure", [0, 1, 0, 0]))
  def test_kepo_gate_drops_whole_rows(self, keep, rows):
    batch, metrics = opd.make_advantage_fn(_config(gate=keep))(_batch(), {})
    kept = np.asarray(rows, np.float32)[:, None]
    np.testing.assert_array_equal(batch.loss_mask_BT, MASK * kept)
    np.testing.assert_allclose(batch.adv_BT, np.where(MASK * kept > 0, TEACHER - OLD, 0.0),
                               rtol=1e-6)
    self.assertAlmostEqual(float(metrics["gate_kept"]), np.mean(rows))

  def test_outcome_term_is_grpo(self):
    batch, _ = opd.make_advantage_fn(_config(outcome_coef=0.5))(_batch(), {})
    outcome_B = estimators.grpo(jnp.asarray(REWARD), group_size=2)
    want = np.where(MASK > 0, TEACHER - OLD + 0.5 * np.asarray(outcome_B)[:, None], 0.0)
    np.testing.assert_allclose(batch.adv_BT, want, rtol=1e-5, atol=1e-6)


class LossTest(absltest.TestCase):

  def test_ppo_and_reinforce_forms_agree_on_policy(self):
    cfg = transformer.Config.named("tiny", vocab=16, width=16, depth=1, heads=2, kv_heads=2,
                                   head_dim=8, mlp=32)
    graphdef, params = testing.random_params(cfg)
    tokens = jnp.asarray(np.random.default_rng(0).integers(1, 16, MASK.shape), jnp.int32)
    batch = _batch().replace(tokens_BT=tokens)
    old = policy_lib.token_logprobs(nnx.merge(graphdef, params), tokens, batch.positions_BT,
                                    batch.input_mask_BT, temperature=1.0, impl="xla")
    batch, _ = opd.make_advantage_fn(_config())(batch.replace(old_logp_BT=old), {})

    def param_step(form):  # one SGD step of lr 1: minus the gradient
      tx = optax.sgd(1.0)
      state = types.TrainState(step=jnp.int32(0), params=params, opt_state=tx.init(params))
      new_state, _ = jax.jit(opd.make_update_step(_config(form=form), graphdef, tx))(state,
                                                                                    batch)
      return jax.tree.map(lambda a, b: a - b, new_state.params, params)

    ppo, reinforce = param_step("ppo"), param_step("reinforce")
    for a, b in zip(jax.tree.leaves(ppo), jax.tree.leaves(reinforce)):
      np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)
    self.assertTrue(any(np.abs(np.asarray(x)).max() > 0 for x in jax.tree.leaves(ppo)))


if __name__ == "__main__":
  absltest.main()
