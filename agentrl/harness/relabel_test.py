"""Tests for agentrl.harness.relabel: completion text, answers, label accuracy, the relabelled
rollout."""
from absl.testing import absltest
import jax
import numpy as np

from agentrl.envs import arithmetic
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.harness import relabel
from agentrl.rollout import agent_loop
from agentrl import sharding


def _traj(tok, prompt: str, answer: str, *, stop: bool = True, reward: float = 0.0,
          target: str = "") -> agent_loop.Trajectory:
  """A single-turn trajectory: BOS + prompt (turn -1), then the sampled answer (turn 0)."""
  prompt_ids = tok.encode(prompt, add_bos=True)
  answer_ids = tok.encode(answer) + ([tok.eos_id] if stop else [])
  n_p, n_a = len(prompt_ids), len(answer_ids)
  return agent_loop.Trajectory(
      tokens=np.asarray(prompt_ids + answer_ids, np.int32),
      loss_mask=np.asarray([0.0] * n_p + [1.0] * n_a, np.float32),
      turn=np.asarray([-1] * n_p + [0] * n_a, np.int32),
      sampler_logp=np.asarray([0.0] * n_p + [-0.5] * n_a, np.float32),
      turn_rewards=[reward], reward=reward, done=True, truncated=not stop, prompt_len=n_p,
      infos=[{"success": reward == 1.0, "error": "", "reward": reward, "target": target}])


class _FakeEngine:
  """Returns the given trajectories in order, whatever it is asked to sample."""

  def __init__(self, trajs):
    self.trajs = trajs

  def run(self, params, tok, envs, seeds, **kwargs):
    del params, tok, kwargs
    assert len(envs) == len(seeds) == len(self.trajs)
    return list(self.trajs), {}


class _Data:

  def take(self, n):
    return [{"seed": i} for i in range(n)]


class RelabelTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tok = arithmetic.build_tokenizer(3)

  def test_completion_text_is_the_sampled_turn_without_its_stop_token(self):
    self.assertEqual(relabel.completion_text(_traj(self.tok, "123+456=", "9750"), self.tok),
                     "9750")
    cut = _traj(self.tok, "123+456=", "97501", stop=False)  # hit the budget: nothing to drop
    self.assertEqual(relabel.completion_text(cut, self.tok), "97501")
    empty = _traj(self.tok, "123+456=", "", stop=False)
    self.assertEqual(relabel.completion_text(empty, self.tok), "")

  def test_final_answer(self):
    self.assertEqual(relabel.final_answer(" 9750 ", "arithmetic"), "9750")
    self.assertIsNone(relabel.final_answer("  ", "arithmetic"))
    self.assertEqual(relabel.final_answer("so\n<answer> 42 </answer>", "reasoning_gym"), "42")
    self.assertEqual(relabel.final_answer("work\n17", "reasoning_gym"), "17")

  def test_majority_accuracy_golden(self):
    # Group 1: majority "a" is correct; group 2: majority "d" is wrong; group 3: no answer.
    answers = ["a", "a", "b", "c", "d", "d", None, None, None]
    success = [True, True, False, False, False, False, False, False, False]
    self.assertAlmostEqual(relabel.majority_accuracy(answers, success, group_size=3), 1 / 3)
    # A tie goes to the first cluster, as the majority-vote reward does.
    self.assertEqual(relabel.majority_accuracy(["x", "y"], [False, True], group_size=2), 0.0)
    self.assertEqual(relabel.majority_accuracy(["y", "x"], [True, False], group_size=2), 1.0)

  def test_group_rollout_fn_replaces_rewards_and_ships_extras(self):
    config = rl_config.rl_config("cpu", smoke=True)  # 2 prompts x G = 2
    trajs = [_traj(self.tok, "123+456=", a, reward=r) for a, r in
             (("9750", 1.0), ("9751", 0.0), ("1110", 0.0), ("1111", 0.0))]
    mesh = sharding.make_mesh(config.mesh)
    seen = []

    def relabel_fn(rows):
      seen.append([relabel.completion_text(t, self.tok) for t in rows])
      return relabel.Labels(reward_B=[0.0, 1.0, 1.0, 1.0],
                            extras={"answer_id_B": np.arange(4, dtype=np.int32)},
                            metrics={"custom": 3.0})

    rollout_fn = relabel.group_rollout_fn(config, _FakeEngine(trajs), self.tok,
                                          lambda: None, _Data(), mesh, relabel_fn)
    out = rollout_fn(None, jax.random.key(0), 1)
    self.assertEqual(seen, [["9750", "9751", "1110", "1111"]])
    np.testing.assert_array_equal(np.asarray(out.batch.reward_B), [0.0, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(np.asarray(out.extras["answer_id_B"]), [0, 1, 2, 3])
    self.assertEqual(out.metrics["reward"], 0.75)
    self.assertEqual(out.metrics["rollout/reward_mean"], 0.75)
    self.assertEqual(out.metrics["verifier_reward"], 0.25)
    self.assertEqual(out.metrics["success"], 0.25)  # still the env's verdict
    self.assertEqual(out.metrics["custom"], 3.0)
    self.assertEqual([len(t.tokens) for t in trajs], [14] * 4)
    self.assertEqual(out.batch.tokens_BT.shape[1], 16)  # the smallest bucket that holds them
    np.testing.assert_array_equal(out.lengths_B, [14] * 4)

    def keep_rewards(rows):
      del rows
      return relabel.Labels()

    out = relabel.group_rollout_fn(config, _FakeEngine(trajs), self.tok, lambda: None,
                                   _Data(), mesh, keep_rewards)(None, jax.random.key(0), 1)
    np.testing.assert_array_equal(np.asarray(out.batch.reward_B), [1.0, 0.0, 0.0, 0.0])
    self.assertNotIn("verifier_reward", out.metrics)
    self.assertEqual(out.extras, {})

    short = relabel.group_rollout_fn(config, _FakeEngine(trajs), self.tok, lambda: None,
                                     _Data(), mesh,
                                     lambda rows: relabel.Labels(reward_B=[1.0]))
    with self.assertRaisesRegex(ValueError, "1 rewards for 4 trajectories"):
      short(None, jax.random.key(0), 1)


if __name__ == "__main__":
  absltest.main()
