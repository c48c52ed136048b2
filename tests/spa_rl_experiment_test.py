# pylint: disable=invalid-name
"""experiments/agents/spa_rl.py: grounding from real env steps, the advantage step, the estimator.

The advantage step is checked against a float64 transcription of the docstring's formula on a
hand-built batch (contributions and grounding -> dense rewards -> centred (or z-scored) per
(prompt, turn index) -> returns -> tokens), and for the RL invariants: prompt and observation tokens get
exactly 0, a group of identical trajectories gets exactly 0, and so does a turn alone at its
turn index. The estimator is checked on a
tiny random decoder: it reads the hidden state at each turn's last policy token, its loss
sends no gradient into the policy, and update steps with zero advantages lower its loss while
the policy stays bit-identical. Estimator warm-up: with positive advantages, the warm-up updates
lower the estimator's loss and keep the policy's params and Adam state bit-identical; the first
update after it moves the policy exactly as an unwarmed run's first update would.
"""
import importlib
import types as pytypes

from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.credit import spa
from agentrl.envs import hidden_rule
from agentrl.models import heads
from agentrl.models import testing
from agentrl.models import transformer
from agentrl import types

spa_rl = importlib.import_module("experiments.agents.spa_rl")

# Rows 0, 1: prompt prompt | turn 0 (2 tokens) | obs | turn 1 (2 tokens) | pad.
# Row 2: prompt prompt | turn 0 (2 tokens) | obs | pad (the episode ended after one turn).
TURN = np.array([[-1, -1, 0, 0, 0, 1, 1, -1]] * 2 + [[-1, -1, 0, 0, 0, -1, -1, -1]], np.int32)
MASK = np.array([[0, 0, 1, 1, 0, 1, 1, 0]] * 2 + [[0, 0, 1, 1, 0, 0, 0, 0]], np.float32)
TURN_MASK = np.array([[1, 1], [1, 1], [1, 0]], np.float32)


def _batch(turn=TURN, mask=MASK, reward_B=None, tokens=None):
  B, T = turn.shape
  return types.Batch(
      tokens_BT=jnp.ones((B, T), jnp.int32) if tokens is None else jnp.asarray(tokens),
      positions_BT=jnp.tile(jnp.arange(T), (B, 1)), input_mask_BT=jnp.ones((B, T), bool),
      loss_mask_BT=jnp.asarray(mask), turn_BT=jnp.asarray(turn),
      reward_B=jnp.zeros(B) if reward_B is None else jnp.asarray(reward_B, jnp.float32))


def _config(group_size=3, turn_norm="reward", gamma=1.0, norm_by_std=False):
  config = spa_rl.get_config("smoke")
  config.rollout.group_size = group_size
  config.loss.update(turn_norm=turn_norm, gamma=gamma, norm_by_std=norm_by_std)
  return config


def _advantages(config, c_BU, g_BU, batch, turn_mask_BU=TURN_MASK):
  batch = batch.replace(aux={"contribution_BU": jnp.asarray(c_BU, jnp.float32),
                             "turn_mask_BU": jnp.asarray(turn_mask_BU) > 0})
  out, metrics = spa_rl.make_advantage_fn(config)(batch, {"grounded_BU": jnp.asarray(g_BU)})
  return np.asarray(out.adv_BT), metrics


def _centre(x, norm_by_std=False):
  """The entries of one (prompt, turn index) group minus their mean [/ (unbiased std + 1e-6)]."""
  x = np.asarray(x, np.float64)
  return (x - x.mean()) / (x.std(ddof=1) + 1e-6 if norm_by_std else 1.0)


class GroundingTest(absltest.TestCase):

  def test_the_env_rejecting_a_command_is_the_only_ungrounded_turn(self):
    env = hidden_rule.HiddenRuleEnv("guess", max_turns=4, style="compact")
    env.reset(1)
    infos = [env.step(a)[3] for a in ("hello", "guess 1", "guess 999")]  # unknown, ok, range
    traj = pytypes.SimpleNamespace(infos=infos)
    np.testing.assert_array_equal(spa_rl.grounding([traj], max_turns=4), [[0, 1, 0, 0]])


class AdvantageTest(absltest.TestCase):
  # One group of G = 3: contributions and grounding (row 2 has one turn, its last).
  C = [[0.2, 0.8], [0.1, -0.1], [0.4, 9.0]]
  G = [[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]
  # r = c + 0.5 g, the last turn always grounded; row 2's absent turn 1 is 0.
  R = np.array([[0.7, 1.3], [0.1, 0.4], [0.9, 0.0]])

  def _want_BT(self, adv_BU):
    want = np.zeros(TURN.shape)
    for b, u in zip(*np.nonzero(MASK)):
      want[b, u] = adv_BU[b, TURN[b, u]]
    return want

  def test_turn_norm_reward_hand_computed(self):
    # Default (centring only): turn index 0 over rows 0-2, mean 1.7 / 3; index 1 over rows 0
    # and 1, mean 0.85. A_u = (r_u - mean_u) + gamma (r_{u+1} - mean_{u+1}).
    gamma = 0.5
    adv_BU = np.array([[0.7 - 1.7 / 3 + gamma * 0.45, 0.45],
                       [0.1 - 1.7 / 3 - gamma * 0.45, -0.45], [0.9 - 1.7 / 3, 0.0]])
    adv_BT, metrics = _advantages(_config(gamma=gamma), self.C, self.G, _batch())
    np.testing.assert_allclose(adv_BT, self._want_BT(adv_BU), rtol=1e-5, atol=1e-6)
    # norm_by_std: the same with z-scores in place of the centred rewards.
    z0, z1 = _centre(self.R[:, 0], True), _centre(self.R[:2, 1], True)
    adv_BU = np.array([[z0[0] + gamma * z1[0], z1[0]], [z0[1] + gamma * z1[1], z1[1]],
                       [z0[2], 0.0]])
    adv_z_BT, _ = _advantages(_config(gamma=gamma, norm_by_std=True), self.C, self.G, _batch())
    np.testing.assert_allclose(adv_z_BT, self._want_BT(adv_BU), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(adv_BT[MASK == 0], 0.0)   # prompt, observation, padding
    np.testing.assert_allclose(metrics["spa/turn_reward_mean"], self.R.sum() / 5, rtol=1e-6)
    np.testing.assert_allclose(metrics["spa/grounded_frac"], 2 / 5, rtol=1e-6)  # raw g
    np.testing.assert_allclose(metrics["spa/contribution_mean"], 1.4 / 5, rtol=1e-6)

  def test_turn_norm_return_hand_computed(self):
    ret = np.array([[0.7 + 1.3, 1.3], [0.1 + 0.4, 0.4], [0.9, 0.0]])   # gamma = 1
    a0, a1 = _centre(ret[:, 0]), _centre(ret[:2, 1])
    adv_BU = np.array([[a0[0], a1[0]], [a0[1], a1[1]], [a0[2], 0.0]])
    adv_BT, _ = _advantages(_config(turn_norm="return"), self.C, self.G, _batch())
    np.testing.assert_allclose(adv_BT, self._want_BT(adv_BU), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(adv_BT[MASK == 0], 0.0)

  def test_identical_trajectories_get_zero(self):
    turn, mask = np.tile(TURN[:1], (3, 1)), np.tile(MASK[:1], (3, 1))
    for norm in spa_rl.TURN_NORMS:
      for std in (False, True):
        adv_BT, _ = _advantages(_config(turn_norm=norm, norm_by_std=std), [[0.3, -0.2]] * 3,
                                [[1.0, 0.0]] * 3, _batch(turn, mask),
                                turn_mask_BU=np.ones((3, 2)))
        np.testing.assert_array_equal(adv_BT, 0.0, err_msg=f"{norm}, {std}")

  def test_a_turn_alone_at_its_index_gets_zero(self):
    # Row 1 ended after turn 0, so row 0's turn 1 has no sibling: its own mean, advantage 0
    # (a z-score's "mean 0, std 1" rule would pay it its raw reward for living longer).
    for std in (False, True):
      adv_BT, _ = _advantages(_config(group_size=2, norm_by_std=std), [[0.0, 0.3], [0.2, 0.0]],
                              [[1.0, 1.0], [1.0, 0.0]], _batch(TURN[1:], MASK[1:]),
                              turn_mask_BU=TURN_MASK[1:])
      np.testing.assert_array_equal(adv_BT[0, TURN[0] == 1], 0.0)
      self.assertLess(adv_BT[0, 2], 0.0)   # turn 0: 0.5 against row 1's 0.7

  def test_grounding_alone_moves_only_the_rejected_turn_under_reward_norm(self):
    # Zero contributions (the fresh head) and every turn executed but row 1's turn 0: under
    # turn_norm=reward only turn 0's advantages differ from 0 (+-0.25; the 0.5 of the executed
    # turns cancels within each turn index), and row 1's is the negative one.
    adv_BT, _ = _advantages(_config(group_size=2, gamma=1.0), np.zeros((2, 2)),
                            [[1.0, 1.0], [0.0, 1.0]], _batch(TURN[:2], MASK[:2]),
                            turn_mask_BU=np.ones((2, 2)))
    np.testing.assert_array_equal(adv_BT[:, TURN[0] == 1], 0.0)
    np.testing.assert_allclose(adv_BT[:, 2], [0.25, -0.25], rtol=1e-6)


class EstimatorTest(absltest.TestCase):

  def setUp(self):
    super().setUp()
    cfg = transformer.Config.named("tiny", vocab=16, width=16, depth=1, heads=2, kv_heads=2,
                                   head_dim=8, mlp=32)
    self.policy_def, self.policy_params = testing.random_params(cfg)
    self.head_def, self.head_params = nnx.split(heads.ValueHead(cfg.width))
    tokens = np.random.default_rng(0).integers(1, 16, size=TURN.shape)
    self.batch = _batch(reward_B=[1.0, 0.0, 1.0], tokens=tokens)

  def _merge(self, params):
    return (nnx.merge(self.policy_def, params["policy"]),
            nnx.merge(self.head_def, params["progress"]))

  def test_reads_the_hidden_state_at_each_turns_last_policy_token(self):
    head = nnx.merge(self.head_def, self.head_params)
    head.w_D[...] = jnp.linspace(-1.0, 1.0, 16)
    policy = nnx.merge(self.policy_def, self.policy_params)
    c_BU, mask_BU = spa_rl.contributions(policy, head, self.batch, num_turns=2)
    b = self.batch
    value_BT = head(policy.hidden(b.tokens_BT, b.positions_BT, b.input_mask_BT))
    np.testing.assert_allclose(c_BU, [[value_BT[0, 3], value_BT[0, 6]],
                                      [value_BT[1, 3], value_BT[1, 6]], [value_BT[2, 3], 0.0]],
                               rtol=1e-5)
    np.testing.assert_array_equal(mask_BU, TURN_MASK > 0)

  def test_progress_loss_sends_no_gradient_to_the_policy(self):
    params = {"policy": self.policy_params, "progress": self.head_params}

    def loss(params):
      c_BU, mask_BU = spa_rl.contributions(*self._merge(params), self.batch, num_turns=2)
      return spa.progress_loss(c_BU, mask_BU, self.batch.reward_B)[0].mean()

    grads = jax.grad(loss)(params)
    for g in jax.tree.leaves(grads["policy"]):
      np.testing.assert_array_equal(g, 0.0)
    self.assertGreater(float(jnp.abs(grads["progress"]["w_D"][...]).sum()), 0.0)

  def test_updates_fit_the_estimator_and_leave_the_policy_alone_without_advantage(self):
    config = _config()
    config.task.max_turns = 2
    config.optim.warmup_steps = 0
    config.loss.estimator_lr = 0.05
    tx = spa_rl.make_optimizer(config)
    params = {"policy": self.policy_params, "progress": self.head_params}
    state = types.TrainState(step=jnp.zeros((), jnp.int32), params=params,
                             opt_state=tx.init(params))
    batch = self.batch.replace(adv_BT=jnp.zeros(TURN.shape), old_logp_BT=jnp.zeros(TURN.shape))
    step = jax.jit(spa_rl.make_update_step(config, (self.policy_def, self.head_def), tx))
    losses = []
    for _ in range(6):
      state, metrics = step(state, batch)
      losses.append(float(metrics["spa/progress_loss"]))
    self.assertAlmostEqual(losses[0], (1.0 + 0.0 + 1.0) / 3, places=5)  # c = 0: mean R^2
    self.assertLess(losses[-1], 0.5 * losses[0])
    self.assertEqual(float(metrics["grad_norm"]), 0.0)
    for new, old in zip(jax.tree.leaves(state.params["policy"]),
                        jax.tree.leaves(self.policy_params)):
      np.testing.assert_array_equal(new, old)

  def test_estimator_warmup_freezes_the_policy_then_lets_it_move(self):
    # Positive advantages on every policy token: the policy has a gradient throughout, but for
    # the first estimator_warmup_steps * minibatches updates only the estimator may learn.
    config = _config()
    config.task.max_turns = 2
    config.optim.warmup_steps = 0
    config.loss.update(estimator_lr=0.05, estimator_warmup_steps=2)
    config.updates.update(epochs=1, minibatches=2)   # 4 warm-up updates
    tx = spa_rl.make_optimizer(config)
    params = {"policy": self.policy_params, "progress": self.head_params}
    copy = lambda: jax.tree.map(jnp.copy, params)   # the update donates its state
    state = types.TrainState(step=jnp.zeros((), jnp.int32), params=copy(),
                             opt_state=tx.init(params))
    policy0 = jax.tree.map(np.asarray, params["policy"])
    opt0 = jax.tree.map(np.asarray, state.opt_state.inner_states["policy"])
    batch = self.batch.replace(adv_BT=jnp.asarray(MASK), old_logp_BT=jnp.zeros(TURN.shape))
    step = jax.jit(spa_rl.make_update_step(config, (self.policy_def, self.head_def), tx),
                   donate_argnames="state")
    losses = []
    for _ in range(4):
      state, metrics = step(state, batch)
      losses.append(float(metrics["spa/progress_loss"]))
      self.assertEqual(float(metrics["spa/estimator_warmup"]), 1.0)
      self.assertGreater(float(metrics["grad_norm"]), 0.0)   # computed, not applied
      for new, old in zip(jax.tree.leaves(state.params["policy"]), jax.tree.leaves(policy0)):
        np.testing.assert_array_equal(new, old)
      for new, old in zip(jax.tree.leaves(state.opt_state.inner_states["policy"]),
                          jax.tree.leaves(opt0)):   # Adam moments and count: untouched
        np.testing.assert_array_equal(new, old)
    self.assertEqual(int(state.step), 4)
    self.assertTrue(all(b < a for a, b in zip(losses, losses[1:])), losses)
    state, metrics = step(state, batch)   # warm-up over: the policy moves
    self.assertEqual(float(metrics["spa/estimator_warmup"]), 0.0)
    moved = [not np.array_equal(new, old) for new, old in
             zip(jax.tree.leaves(state.params["policy"]), jax.tree.leaves(policy0))]
    self.assertTrue(any(moved))
    # Its Adam starts fresh: the first policy update is the one an unwarmed run makes first.
    fresh = types.TrainState(step=jnp.zeros((), jnp.int32), params=copy(),
                             opt_state=tx.init(params))
    config.loss.estimator_warmup_steps = 0
    plain = jax.jit(spa_rl.make_update_step(config, (self.policy_def, self.head_def), tx))
    fresh, _ = plain(fresh, batch)
    for new, want in zip(jax.tree.leaves(state.params["policy"]),
                         jax.tree.leaves(fresh.params["policy"])):
      np.testing.assert_allclose(new, want, rtol=1e-6, atol=1e-7)


if __name__ == "__main__":
  absltest.main()
