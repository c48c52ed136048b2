# pylint: disable=invalid-name
"""experiments/agents/matchtir.py: matched turn rewards from real env steps, and its advantage step.

Turn rewards are checked against hand-computed similarities on episodes played in the real
tool-use env ("scale" tasks: lookup the population, then multiply it). The advantage step is
checked for the RL invariants: prompt and tool-response tokens get exactly 0, a group of
identical trajectories gets exactly 0, and on single-turn episodes (the answer turn only)
MatchTIR's dual-level advantage is outcome GRPO.
"""
import importlib
import types as pytypes

from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.envs import tool_use
from agentrl import types

matchtir_exp = importlib.import_module("experiments.agents.matchtir")


def _play(seed, actions, max_turns=5):
  """A trajectory stand-in (infos, turn_rewards) of `actions` played in the real env."""
  env = tool_use.ToolUseEnv("scale", max_turns=max_turns)
  env.reset(seed)
  infos, rewards = [], []
  for action in actions:
    _, reward, done, info = env.step(action)
    infos.append(info)
    rewards.append(reward)
    if done:
      break
  return pytypes.SimpleNamespace(infos=infos, turn_rewards=rewards), env.gold_calls


def _call(name, **arguments):
  return tool_use.format_call({"name": name, "arguments": arguments})


class TurnRewardsTest(absltest.TestCase):

  def test_matched_similarities_and_the_answer_turn(self):
    env = tool_use.ToolUseEnv("scale")
    env.reset(3)
    lookup, calc = env.gold_calls
    town = lookup["arguments"]["entity"]
    # Turn 0: the gold lookup (similarity 1). Turn 1: the calculator with a wrong expression:
    # (1 + key overlap 1 + 0 matching values) / (2 + 1) = 2/3. Turn 2: the right answer (1).
    good, golds = _play(3, [_call("lookup", entity=town, attribute="population"),
                            _call("calculator", expression="1 + 1"),
                            f"<answer>{env.answer}</answer>"])
    # Turn 0: a wrong tool name (weekday) scores 0; turn 1: text without a call scores 0;
    # turn 2: the lookup with a wrong attribute, rejected by the env but still scored:
    # (1 + 1 + 1 matching value of 2) / (2 + 2) = 3/4. No answer: the turn limit ended it.
    bad, _ = _play(3, [_call("weekday", date="2020-01-01"), "hmm",
                       _call("lookup", entity=town, attribute="height")], max_turns=3)
    self.assertEqual(calc["name"], "calculator")
    reward_BU, mask_BU = matchtir_exp.turn_rewards(
        [good, bad], [golds, golds], max_turns=4, matching="kuhn_munkres",
        unmatched_penalty=0.0)
    np.testing.assert_allclose(reward_BU, [[1.0, 2 / 3, 1.0, 0.0], [0.0, 0.0, 0.75, 0.0]],
                               rtol=1e-6)
    np.testing.assert_array_equal(mask_BU, [[1, 1, 1, 0], [1, 1, 1, 0]])

  def test_every_call_of_a_turn_is_matched(self):
    env = tool_use.ToolUseEnv("scale")
    env.reset(3)
    town = env.gold_calls[0]["arguments"]["entity"]
    # One turn with the gold lookup (1) and a wrong calculator call (2/3, as above): the turn
    # scores their mean, 5/6; the answer turn scores the outcome.
    traj, golds = _play(3, [_call("lookup", entity=town, attribute="population")
                            + _call("calculator", expression="1 + 1"),
                            f"<answer>{env.answer}</answer>"])
    self.assertLen(traj.infos[0]["calls"], 2)
    reward_BU, _ = matchtir_exp.turn_rewards([traj], [golds], max_turns=3,
                                             matching="kuhn_munkres", unmatched_penalty=0.0)
    np.testing.assert_allclose(reward_BU, [[5 / 6, 1.0, 0.0]], rtol=1e-6)

  def test_a_wrong_answer_scores_zero_and_unmatched_calls_take_the_penalty(self):
    env = tool_use.ToolUseEnv("scale")
    env.reset(5)
    lookup = env.gold_calls[0]
    text = _call("lookup", **lookup["arguments"])
    # The gold lookup three times over, then a wrong answer.
    traj, golds = _play(5, [text, text, text, "<answer>0</answer>"])
    reward_BU, _ = matchtir_exp.turn_rewards([traj], [golds], max_turns=4,
                                             matching="kuhn_munkres", unmatched_penalty=-0.5)
    # One lookup takes the gold lookup (1); the calculator gold call has similarity 0 to a
    # lookup, and zero-similarity pairs are not matches, so the other two take the penalty.
    self.assertEqual(sorted(reward_BU[0, :3].tolist()), [-0.5, -0.5, 1.0])
    self.assertEqual(reward_BU[0, 3], 0.0)


# prompt prompt | turn 0 (2 tokens) | response | turn 1 (2 tokens) | pad
TURN = np.array([-1, -1, 0, 0, 0, 1, 1, -1], np.int32)
MASK = np.array([0, 0, 1, 1, 0, 1, 1, 0], np.float32)


def _batch(reward_B):
  B = len(reward_B)
  return types.Batch(
      tokens_BT=jnp.ones((B, 8), jnp.int32), positions_BT=jnp.tile(jnp.arange(8), (B, 1)),
      input_mask_BT=jnp.ones((B, 8), bool), loss_mask_BT=jnp.tile(jnp.asarray(MASK), (B, 1)),
      turn_BT=jnp.tile(jnp.asarray(TURN), (B, 1)), reward_B=jnp.asarray(reward_B, jnp.float32))


def _advantage_fn(credit="matchtir"):
  config = matchtir_exp.get_config("smoke")
  config.rollout.group_size = 2
  config.loss.credit = credit
  return matchtir_exp.make_advantage_fn(config)


class AdvantageTest(absltest.TestCase):

  def test_masked_tokens_and_identical_groups_get_zero(self):
    # Group 0: a good call then the right answer vs a poor call and a wrong one; group 1: equal.
    reward_BU = jnp.asarray([[1.0, 1.0], [0.5, 0.0], [0.5, 0.0], [0.5, 0.0]])
    out, metrics = _advantage_fn()(
        _batch([1.0, 0.0, 0.0, 0.0]),
        {"turn_reward_BU": reward_BU, "turn_mask_BU": jnp.ones((4, 2))})
    adv_BT = np.asarray(out.adv_BT)
    np.testing.assert_array_equal(adv_BT[:, MASK == 0], 0.0)
    np.testing.assert_array_equal(adv_BT[2:], 0.0)
    self.assertGreater(adv_BT[0, 2], adv_BT[1, 2])
    self.assertGreater(adv_BT[0, 5], adv_BT[1, 5])
    self.assertAlmostEqual(float(metrics["turn_reward_mean"]), 3.5 / 8.0, places=6)

  def test_single_turn_episodes_reduce_to_outcome_grpo(self):
    # Answer-only episodes: the turn reward is the outcome and there is one turn, so A_turn is
    # the group z-score of the outcome, A_traj too, and their mean is GRPO's advantage.
    turn = np.where(TURN == 1, -1, TURN).astype(np.int32)   # only turn 0 is a policy turn
    mask = np.where(TURN == 0, MASK, 0.0).astype(np.float32)
    reward_B = [1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    batch = _batch(reward_B).replace(turn_BT=jnp.tile(jnp.asarray(turn), (8, 1)),
                                     loss_mask_BT=jnp.tile(jnp.asarray(mask), (8, 1)))
    extras = {"turn_reward_BU": jnp.asarray(reward_B)[:, None] * jnp.asarray([[1.0, 0.0]]),
              "turn_mask_BU": jnp.asarray([[1.0, 0.0]] * 8)}
    got, _ = _advantage_fn()(batch, extras)
    want, _ = estimators.grpo_step(2)(batch, None)
    np.testing.assert_allclose(got.adv_BT, want.adv_BT, atol=1e-5)
    self.assertGreater(np.abs(np.asarray(want.adv_BT)).max(), 0.5)


if __name__ == "__main__":
  absltest.main()
