# pylint: disable=invalid-name
"""experiments/agents/oprl.py: its advantage step on hand-built batches, and one update step of a
tiny model.

The per-token advantage is GRPO's outcome z-score plus alpha times the turn's implicit step
reward z-scored over the group's turns, on the turn's policy tokens and exactly 0 elsewhere;
pi_phi == pi_old gives outcome GRPO; the update step's DPO step raises the preferred
trajectory's implicit reward before the step rewards are read, and never moves the policy.
"""
import importlib

from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.models import policy as policy_lib
from agentrl.models import testing
from agentrl.models import transformer
from agentrl import types

jax.config.update("jax_numpy_rank_promotion", "raise")

oprl_exp = importlib.import_module("experiments.agents.oprl")

# One prompt, G = 2. Row 0: prompt, turn 0 (2 policy tokens), its observation, turn 1 (1
# token). Row 1: prompt, turn 0 (3 policy tokens), padding.
TURN = np.array([[-1, 0, 0, 0, 1], [-1, 0, 0, 0, -1]], np.int32)
MASK = np.array([[0, 1, 1, 0, 1], [0, 1, 1, 1, 0]], np.float32)
OLD = np.array([[0.0, -1.0, -2.0, -0.5, -1.5], [0.0, -0.7, -1.1, -2.0, 0.0]], np.float32)
# log pi_phi - log pi_old per token: turn sums 0.4, -0.2 (row 0) and -0.2 (row 1); the
# prompt, observation and padding differences are large and must not count.
DIFF = np.array([[7.0, 0.3, 0.1, 9.0, -0.2], [-3.0, 0.0, 0.2, -0.4, 5.0]], np.float32)


def _config(beta=0.5, alpha=0.5, max_turns=2, step_norm="group"):
  config = oprl_exp.get_config("smoke")
  config.rollout.group_size = 2
  config.task.max_turns = max_turns
  config.loss.update(beta=beta, alpha=alpha, step_norm=step_norm)
  return config


def _batch(turn=TURN, mask=MASK, old=OLD, reward=(1.0, 0.0)):
  B, T = mask.shape
  return types.Batch(
      tokens_BT=jnp.ones((B, T), jnp.int32), positions_BT=jnp.tile(jnp.arange(T), (B, 1)),
      input_mask_BT=jnp.ones((B, T), bool), loss_mask_BT=jnp.asarray(mask),
      turn_BT=jnp.asarray(turn), reward_B=jnp.asarray(reward, jnp.float32),
      old_logp_BT=jnp.asarray(old))


class AdvantageTest(absltest.TestCase):

  def test_golden_per_token_advantages(self):
    step = jax.jit(oprl_exp.make_advantage_step(_config()))
    batch, metrics = step(_batch(), jnp.asarray(OLD + DIFF))
    # Step rewards beta * turn sums: 0.2, -0.1 (row 0), -0.1 (row 1); over the group's three
    # turns mean 0 and unbiased std sqrt(0.03). Outcome GRPO: +-0.5 / sqrt(0.5).
    a = 0.5 / (np.sqrt(0.5) + 1e-6)
    z = lambda r: r / (np.sqrt(0.03) + 1e-6)
    want = [[0.0, a + 0.5 * z(0.2), a + 0.5 * z(0.2), 0.0, a + 0.5 * z(-0.1)],
            [0.0, -a + 0.5 * z(-0.1), -a + 0.5 * z(-0.1), -a + 0.5 * z(-0.1), 0.0]]
    np.testing.assert_allclose(batch.adv_BT, want, rtol=1e-5, atol=1e-6)
    # Prompt, observation and padding tokens: exactly 0, whatever pi_phi says there.
    np.testing.assert_array_equal(np.asarray(batch.adv_BT)[MASK == 0], 0.0)
    self.assertAlmostEqual(float(metrics["step_reward_mean"]), 0.0, places=6)
    self.assertAlmostEqual(float(metrics["adv_abs_mean"]), np.abs(want).sum() / MASK.sum(),
                           places=5)

  def test_prm_equal_to_rollout_policy_is_outcome_grpo(self):
    batch, metrics = oprl_exp.make_advantage_step(_config())(_batch(), jnp.asarray(OLD))
    grpo_B = estimators.grpo(jnp.array([1.0, 0.0]), group_size=2)
    np.testing.assert_array_equal(metrics["step_reward_mean"], 0.0)
    np.testing.assert_allclose(batch.adv_BT, np.where(MASK > 0, np.asarray(grpo_B)[:, None], 0.0),
                               rtol=1e-6)

  def test_identical_trajectories(self):
    # A group of identical one-turn trajectories: equal outcomes and equal step rewards, so
    # every advantage is exactly 0 however far pi_phi is from pi_old.
    turn, mask = np.array([[-1, 0, 0]] * 3, np.int32), np.array([[0, 1, 1]] * 3, np.float32)
    old = np.array([[0.0, -1.0, -2.0]] * 3, np.float32)
    config = _config(max_turns=1)
    config.rollout.group_size = 3
    batch, _ = oprl_exp.make_advantage_step(config)(
        _batch(turn, mask, old, reward=(1.0, 1.0, 1.0)), jnp.asarray(old + 0.3))
    np.testing.assert_array_equal(batch.adv_BT, 0.0)
    # With several turns the outcome term is still 0; step_norm="turn" (the default) z-scores
    # each turn index on its own, so identical rows get exactly 0 there too. "group" pools the
    # group's turns [INF]: they sum to 0 but need not vanish (pi_phi may rank turn 0 above
    # turn 1 of the same trajectory).
    turn2 = np.array([TURN[0]] * 2)
    mask2, old2 = np.array([MASK[0]] * 2), np.array([OLD[0]] * 2)
    args = (_batch(turn2, mask2, old2, reward=(0.0, 0.0)), jnp.asarray(old2 + DIFF[0]))
    self.assertEqual(oprl_exp.get_config().loss.step_norm, "turn")
    batch, _ = oprl_exp.make_advantage_step(_config(step_norm="turn"))(*args)
    np.testing.assert_array_equal(batch.adv_BT, 0.0)
    batch, _ = oprl_exp.make_advantage_step(_config(step_norm="group"))(*args)
    adv = np.asarray(batch.adv_BT)
    np.testing.assert_array_equal(adv[0], adv[1])
    self.assertAlmostEqual(float(adv[0, 1] + adv[0, 4]), 0.0, places=5)


class UpdateStepTest(absltest.TestCase):

  def test_dpo_step_raises_the_preferred_reward_and_leaves_the_policy(self):
    cfg = transformer.Config.named("tiny", vocab=16, width=16, depth=1, heads=2, kv_heads=2,
                                   head_dim=8, mlp=32)
    graphdef, params = testing.random_params(cfg)
    config = _config(beta=0.5)
    config.optim.lr = 0.0        # the policy may not move: only pi_phi's step could move it
    config.loss.prm_lr = 3e-2
    config.updates.minibatches = 2
    txs = oprl_exp.make_optimizers(config)
    batch = _batch().replace(tokens_BT=jnp.asarray(
        np.random.default_rng(0).integers(1, 16, MASK.shape), jnp.int32))

    def logp(p):
      return policy_lib.token_logprobs(nnx.merge(graphdef, p), batch.tokens_BT,
                                       batch.positions_BT, batch.input_mask_BT,
                                       temperature=config.rollout.temperature, impl="xla")

    old = logp(params)
    batch = batch.replace(old_logp_BT=old)
    prm = jax.tree.map(jnp.copy, params)
    state = types.TrainState(
        step=jnp.int32(0), params={"policy": params, "prm": prm},
        opt_state={"policy": txs["policy"].init(params), "prm": txs["prm"].init(prm)})
    new, metrics = jax.jit(oprl_exp.make_update_step(config, graphdef, txs))(state, batch)

    self.assertEqual(float(metrics["prm_pairs"]), 1.0)
    self.assertGreater(float(metrics["prm_grad_norm"]), 0.0)
    for a, b in zip(jax.tree.leaves(new.params["policy"]), jax.tree.leaves(params)):
      np.testing.assert_array_equal(a, b)
    self.assertEqual(int(new.step), 2)  # two policy minibatches
    # Implicit trajectory rewards beta (log pi_phi - log pi_old) were 0 before the step.
    reward = 0.5 * ((logp(new.params["prm"]) - old) * MASK).sum(1)
    self.assertGreater(float(reward[0]), 0.0)              # the preferred (R = 1) trajectory
    self.assertGreater(float(reward[0] - reward[1]), 0.0)  # and the DPO margin
    # The advantages read the updated pi_phi: its step rewards are no longer 0.
    self.assertGreater(abs(float(metrics["step_reward_mean"])), 1e-4)


if __name__ == "__main__":
  absltest.main()
