"""Tests for agentrl.envs.thinker: thoughts use no game turn, demonstrations state the ideal
belief, and one thought per trajectory keeps its loss mask."""
import random

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from agentrl.envs import hidden_rule
from agentrl.envs import testing
from agentrl.envs import thinker


def _secret(seed: int) -> int:
  env = hidden_rule.HiddenRuleEnv("guess", style="compact")
  env.reset(seed)
  return int(env.answer)


def _seed_with_secret_above(value: int) -> int:
  return next(s for s in range(1000) if _secret(s) > value)


class HiddenRuleBeliefTest(absltest.TestCase):

  def test_guess_belief_is_the_open_range(self):
    seed = next(s for s in range(1000) if 51 <= _secret(s) <= 74)
    for style, texts in (("compact", ("1-100", "51-100", "51-74")),
                         ("full", ("The secret number is between 1 and 100.",
                                   "The secret number is between 51 and 100.",
                                   "The secret number is between 51 and 74."))):
      env = hidden_rule.HiddenRuleEnv("guess", style=style)
      env.reset(seed)
      self.assertEqual(env.belief, texts[0])
      env.step("guess 50")
      self.assertEqual(env.belief, texts[1])
      env.step("guess 75")
      self.assertEqual(env.belief, texts[2])
      env.step("guess 10")      # a guess below the open range changes nothing
      self.assertEqual(env.belief, texts[2])
      env.reset(seed)           # a new episode starts from the whole range
      self.assertEqual(env.belief, texts[0])

  def test_families_without_a_belief_say_so(self):
    env = hidden_rule.HiddenRuleEnv("transform")
    env.reset(0)
    with self.assertRaisesRegex(ValueError, "family='guess'"):
      _ = env.belief


class ThinkerEnvTest(parameterized.TestCase):

  def test_a_thought_uses_no_game_turn_and_is_answered_with_the_act_cue(self):
    seed = _seed_with_secret_above(60)
    env = thinker.ThinkerEnv(max_turns=3, schedule="every", first=1)
    self.assertEqual(env.max_turns, 5)            # 3 game turns + 2 thoughts
    obs = env.reset(seed)
    self.assertFalse(obs.endswith(thinker.THINK_CUE["compact"]))   # first=1: no thought yet
    obs, reward, done, info = env.step("guess 50")
    self.assertEqual(obs, "higher think")
    self.assertEqual((reward, done, info["thought"]), (0.0, False, False))
    obs, reward, done, info = env.step(" 51-100 ")
    self.assertEqual(obs, "act")
    self.assertEqual((reward, done, info["thought"], info["thought_correct"], info["success"]),
                     (0.0, False, True, True, False))
    self.assertEqual(env.game._turn, 1)          # pylint: disable=protected-access
    _, _, _, info = env.step("guess 60")
    _, _, _, info = env.step("1-60")              # a wrong thought is still only a thought
    self.assertEqual((info["thought"], info["thought_correct"]), (True, False))
    obs, _, done, info = env.step(f"guess {_secret(seed)}")
    self.assertTrue(done and info["success"])

  def test_the_game_turn_limit_ends_the_episode(self):
    env = thinker.ThinkerEnv(max_turns=2, schedule="every", first=1)
    seed = next(s for s in range(1000) if _secret(s) not in (1, 2))
    env.reset(seed)
    env.step("guess 1")
    env.step("2-100")
    _, reward, done, info = env.step("guess 2")
    self.assertTrue(done)
    self.assertEqual((reward, info["success"]), (0.0, False))

  def test_once_draws_one_turn_per_seed(self):
    env = thinker.ThinkerEnv(max_turns=7, schedule="once", first=2)
    turns = [env.think_turns(seed) for seed in range(200)]
    self.assertTrue(all(len(t) == 1 and 2 <= min(t) < 7 for t in turns))
    self.assertEqual(turns, [env.think_turns(seed) for seed in range(200)])
    self.assertEqual(set().union(*turns), set(range(2, 7)))
    self.assertEqual(env.max_turns, 8)

  def test_never_is_the_plain_game(self):
    plain = hidden_rule.HiddenRuleEnv("guess", max_turns=7, style="compact")
    env = thinker.ThinkerEnv(max_turns=7, schedule="never")
    self.assertEqual(env.max_turns, 7)
    for seed in range(5):
      self.assertEqual(env.reset(seed), plain.reset(seed))
      for action in plain.demonstration(seed, random.Random(seed)):
        got, want = env.step(action), plain.step(action)
        self.assertEqual(got[:3], want[:3])
        if want[2]:
          break

  @parameterized.parameters("every", "once")
  def test_demonstrations_state_the_belief_and_solve(self, schedule):
    env = thinker.ThinkerEnv(max_turns=7, schedule=schedule, first=1)
    for seed in range(20):
      actions = env.demonstration(seed, random.Random(seed))
      env.reset(seed)
      infos = [env.step(a)[3] for a in actions]
      thoughts = [i for i in infos if i["thought"]]
      self.assertTrue(all(i["thought_correct"] for i in thoughts))
      self.assertTrue(infos[-1]["success"])
      commands = sum(not i["thought"] for i in infos)
      expected = (commands - 1 if schedule == "every"
                  else int(min(env.think_turns(seed)) < commands))
      self.assertLen(thoughts, expected)

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "BELIEF|guess"):
      thinker.ThinkerEnv("cipher")
    with self.assertRaisesRegex(ValueError, "schedule"):
      thinker.ThinkerEnv(schedule="sometimes")
    with self.assertRaisesRegex(ValueError, "first"):
      thinker.ThinkerEnv(max_turns=3, first=3)

  @parameterized.parameters(*thinker.SCHEDULES)
  def test_episode_and_seed_contract(self, schedule):
    env = thinker.ThinkerEnv(max_turns=2, first=1, schedule=schedule)
    testing.assert_env_contract(self, env, action="guess 0",
                                answer=lambda env, info: env.gold_action)


class KeepOneThoughtTest(absltest.TestCase):
  # Prompt (-1), turn 0 (a command + its observation), turn 1 (a thought + the act cue),
  # turn 2 (a command), turn 3 (a thought).
  TURN_T = np.array([-1, -1, 0, 0, 0, 1, 1, 1, 2, 2, 3, 3], np.int32)
  MASK_T = np.array([0, 0, 1, 1, 0, 1, 1, 0, 1, 1, 1, 1], np.float32)
  INFOS = [{"thought": False}, {"thought": True}, {"thought": False}, {"thought": True}]

  def test_keeps_exactly_one_thoughts_sampled_tokens(self):
    kept_turns = set()
    for seed in range(40):
      mask, kept = thinker.keep_one_thought(self.TURN_T, self.MASK_T, self.INFOS,
                                            np.random.default_rng(seed))
      kept_turns.add(kept)
      np.testing.assert_array_equal(mask, self.MASK_T * (self.TURN_T == kept))
      self.assertEqual(mask.dtype, np.float32)
    self.assertEqual(kept_turns, {1, 3})     # both thoughts get drawn

  def test_keeps_the_given_turn_or_nothing(self):
    rng = np.random.default_rng(0)
    mask, kept = thinker.keep_one_thought(self.TURN_T, self.MASK_T, self.INFOS, rng, at=3)
    self.assertEqual(kept, 3)
    np.testing.assert_array_equal(mask, self.MASK_T * (self.TURN_T == 3))
    for at in (2, -1):   # a command turn, and "no shared turn"
      mask, kept = thinker.keep_one_thought(self.TURN_T, self.MASK_T, self.INFOS, rng, at=at)
      self.assertEqual(kept, -1)
      np.testing.assert_array_equal(mask, 0.0)

  def test_shared_thought_turn_needs_two_rows(self):
    a = [{"thought": False}, {"thought": True}, {"thought": False}, {"thought": True}]
    b = [{"thought": False}, {"thought": True}]            # ended early: one thought
    c = [{"thought": False}]                               # solved at once: none
    draws = {thinker.shared_thought_turn([a, b, c], np.random.default_rng(s)) for s in range(20)}
    self.assertEqual(draws, {1})                           # turn 3 has one row only
    draws = {thinker.shared_thought_turn([a, a, b], np.random.default_rng(s)) for s in range(40)}
    self.assertEqual(draws, {1, 3})
    self.assertEqual(thinker.shared_thought_turn([a, c], np.random.default_rng(0)), -1)

  def test_without_a_thought_nothing_is_trained(self):
    infos = [{"thought": False}] * 4
    mask, kept = thinker.keep_one_thought(self.TURN_T, self.MASK_T, infos,
                                          np.random.default_rng(0))
    self.assertEqual(kept, -1)
    np.testing.assert_array_equal(mask, np.zeros_like(self.MASK_T))
    self.assertEqual(thinker.thought_turns(self.INFOS), [1, 3])


if __name__ == "__main__":
  absltest.main()
