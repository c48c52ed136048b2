# pylint: disable=invalid-name
"""experiments/agents/spo_tree.py: its brancher's fork points, and its rollout and advantage
steps on a hand-made tree from a stand-in engine.

Golden tree (one prompt, roots 0 and 1, row 2 forked from row 0 at its first turn boundary):
prompt tokens 0-1, turn 1 sampled at 2-3, the env's reply at 4, turn 2 sampled at 5-6, the
reply at 7. Rewards 1, 0, 0: V(row 0's turn 2) = 1, V(row 2's turn 2) = 0, so V(row 0's turn
1) = 0.5, V(row 1) = 0 and V(prompt) = 0.25. Advantages: row 0's turn 1 +0.25 and turn 2
+0.5, row 1 -0.25, row 2's turn 2 -0.5; row 2's copy of turn 1 trains nothing.
"""
import importlib
import types as pytypes

from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from agentrl.rollout import agent_loop
from agentrl.rollout import branching
from agentrl import sharding

spo_tree = importlib.import_module("experiments.agents.spo_tree")

LOSS_MASK = np.array([0, 0, 1, 1, 0, 1, 1, 0], np.float32)
TURN = np.array([-1, -1, 0, 0, 0, 1, 1, 1], np.int32)
PROB = 0.5                     # every sampled token has p < 0.9 but row 1's token 3
GOLDEN = np.array([[0, 0, 0.25, 0.25, 0, 0.5, 0.5, 0],
                   [0, 0, -0.25, 0, 0, -0.25, -0.25, 0],
                   [0, 0, 0, 0, 0, -0.5, -0.5, 0]], np.float32)


def _traj(tokens, reward, parent=-1, fork_at=0, mask=LOSS_MASK):
  return agent_loop.Trajectory(
      tokens=np.asarray(tokens, np.int32), loss_mask=mask.copy(), turn=TURN.copy(),
      sampler_logp=np.where(mask > 0, np.log(PROB), 0.0).astype(np.float32),
      turn_rewards=[0.0, reward], reward=reward, done=True, truncated=False, prompt_len=2,
      parent=parent, fork_at=fork_at)


def _point(kind, traj, turn, turn_start=0):
  return branching.ForkPoint(kind=kind, episode=0, root=0, depth=0, turn=turn,
                             turn_start=turn_start, trajectory=traj)


class FakeEngine:
  """Returns the golden tree and records what the experiment asked for."""

  def run(self, params, tok, envs, seeds, **kwargs):
    del params, tok
    self.envs, self.seeds, self.kwargs = envs, seeds, kwargs
    return [_traj([1, 2, 3, 4, 5, 6, 7, 8], 1.0), _traj([1, 2, 9, 9, 5, 9, 9, 8], 0.0),
            _traj([1, 2, 3, 4, 5, 3, 3, 8], 0.0, parent=0, fork_at=5)], {
                "rollout/sampled_tokens": 10.0}


class SpoTreeExperimentTest(absltest.TestCase):

  def test_turn_brancher_forks_every_node_at_its_first_boundaries(self):
    tc = pytypes.SimpleNamespace(segment="turns", depth=2, branches=3, segment_tokens=2)
    brancher = spo_tree.make_brancher(tc)
    t = _traj(range(8), 0.0)
    self.assertEqual(brancher(_point("stepped", t, 2)), [branching.Fork(at=8, n=3)])
    self.assertEqual(brancher(_point("stepped", t, 3)), [])
    self.assertEqual(brancher(_point("sampled", t, 1)), [])
    self.assertEqual(brancher(_point("finished", t, 1)), [])
    self.assertEqual(spo_tree.rows_per_prompt(pytypes.SimpleNamespace(
        roots=6, branches=5, depth=2)), 216)   # the code's 6-6-6

  def test_token_boundaries_start_segments_of_the_episodes_own_tokens(self):
    tc = pytypes.SimpleNamespace(segment="tokens", depth=2, branches=1, segment_tokens=2)
    # Sampled tokens at 2, 3, 5, 6, 8, 9: segment 1 starts at the 3rd (5), segment 2 at the
    # 5th (8); a 7th would start segment 3, past the depth.
    mask = np.array([0, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1], np.float32)
    t = agent_loop.Trajectory(tokens=np.zeros(13, np.int32), loss_mask=mask,
                              turn=np.zeros(13, np.int32), sampler_logp=np.zeros(13, np.float32),
                              turn_rewards=[], reward=0.0, done=False, truncated=False,
                              prompt_len=2)
    self.assertEqual(spo_tree.token_boundaries(t, 0, tc), [5, 8])
    self.assertEqual(spo_tree.token_boundaries(t, 6, tc), [8])   # the current turn only
    branch = agent_loop.Trajectory(**{**t.__dict__, "parent": 0, "fork_at": 5})
    self.assertEqual(spo_tree.token_boundaries(branch, 0, tc), [8])
    self.assertEqual(spo_tree.make_brancher(tc)(_point("sampled", t, 0, turn_start=5)),
                     [branching.Fork(at=5, n=1), branching.Fork(at=8, n=1)])

  def test_rollout_and_advantages_on_the_golden_tree(self):
    config = spo_tree.get_config("smoke")
    config.rollout.update(prompts_per_step=1, max_len=8)
    config.spo.whiten = False
    engine = FakeEngine()
    data = pytypes.SimpleNamespace(take=lambda n: [{"seed": 7}] * n)
    make_env = lambda: pytypes.SimpleNamespace(max_turns=2)
    tok = pytypes.SimpleNamespace(pad_id=0)
    rollout_fn = spo_tree.make_rollout_fn(config, engine, tok, make_env, data,
                                          sharding.make_mesh(config.mesh))
    rollout = rollout_fn(None, None, 0)
    self.assertEqual(engine.seeds, [7, 7])
    self.assertEqual(engine.kwargs["max_branches"], 2)   # 2 roots x (1 + 1) leaves, less roots
    self.assertEqual(rollout.batch.tokens_BT.shape, (4, 8))  # padded to the full tree
    self.assertEqual(rollout.metrics["rollout/sampled_tokens"], 10.0)   # the engine's count
    self.assertEqual(rollout.metrics["tree/rows"], 3.0)
    self.assertEqual(rollout.metrics["tree/nodes_per_prompt"], 5.0)
    # Sampled tokens, each once on its owner row: 4 + 4 + 2, every segment's advantage != 0.
    self.assertEqual(rollout.metrics["tree/signal_frac"], 1.0)
    old_logp = np.where(np.asarray(rollout.batch.loss_mask_BT) > 0, np.log(PROB), 0.0)
    old_logp[1, 3] = np.log(0.95)                 # p >= 0.9: not trained
    batch = rollout.batch.replace(old_logp_BT=jnp.asarray(old_logp, jnp.float32))
    batch, metrics = spo_tree.make_advantage_fn(config)(batch, rollout.extras)
    golden = np.concatenate([GOLDEN, np.zeros((1, 8), np.float32)])  # the pad row trains nothing
    np.testing.assert_allclose(np.asarray(batch.adv_BT), golden, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(batch.loss_mask_BT), golden != 0)
    self.assertAlmostEqual(float(metrics["spo/lowprob_frac"]), 9 / 10, places=6)

  def test_equal_outcomes_train_nothing(self):
    config = spo_tree.get_config("smoke")
    config.rollout.update(prompts_per_step=1, max_len=8)
    engine = FakeEngine()
    real_run = engine.run

    def run(*args, **kwargs):
      trajs, metrics = real_run(*args, **kwargs)
      return [_traj(t.tokens, 1.0, t.parent, t.fork_at) for t in trajs], metrics

    engine.run = run
    rollout = spo_tree.make_rollout_fn(
        config, engine, pytypes.SimpleNamespace(pad_id=0),
        lambda: pytypes.SimpleNamespace(max_turns=2),
        pytypes.SimpleNamespace(take=lambda n: [{"seed": 7}] * n),
        sharding.make_mesh(config.mesh))(None, None, 0)
    self.assertEqual(rollout.metrics["tree/signal_frac"], 0.0)
    batch = rollout.batch.replace(old_logp_BT=jnp.full(rollout.batch.tokens_BT.shape, -1.0))
    batch, _ = spo_tree.make_advantage_fn(config)(batch, rollout.extras)
    self.assertEqual(float(jnp.abs(batch.loss_mask_BT).sum()), 0.0)
    self.assertEqual(float(jnp.abs(batch.adv_BT).sum()), 0.0)


if __name__ == "__main__":
  absltest.main()
