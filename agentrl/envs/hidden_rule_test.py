"""Tests for agentrl.envs.hidden_rule: each family is solvable through interaction."""
import math
import random
import re
import time

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.envs import hidden_rule
from agentrl.envs import testing


def _solve_transform(env, intro):
  target = int(re.search(r"What is f\((\d+)\)", intro).group(1))
  f = [int(env.step(f"query {x}")[0].split("=")[1]) for x in (0, 1, 2)]
  b = f[0]
  if f[2] - b == 2 * (f[1] - b):     # linear: f(2) - f(0) = 2 a
    value = (f[1] - b) * target + b
  else:                               # quadratic: f(1) - f(0) = a
    value = (f[1] - b) * target * target + b
  return env.step(f"Let me answer.\nanswer {value}")


def _solve_guess(env, intro):
  del intro
  lo, hi = 1, 100
  while True:
    mid = (lo + hi) // 2
    obs, reward, done, info = env.step(f"<action>guess {mid}</action>")
    if done:
      return obs, reward, done, info
    lo, hi = (mid + 1, hi) if "higher" in obs else (lo, mid - 1)


def _solve_cipher(env, intro):
  secret = re.search(r"secret word '(\w+)'", intro).group(1)
  key = {}
  for chunk in ("abc", "def", "gh"):
    encoded = env.step(f"encode {chunk}")[0].split("= ")[1]
    key.update(zip(encoded, chunk))
  return env.step("answer " + "".join(key[c] for c in secret))


SOLVERS = {"transform": _solve_transform, "guess": _solve_guess, "cipher": _solve_cipher}


class HiddenRuleTest(parameterized.TestCase):

  @parameterized.parameters(*SOLVERS)
  def test_solvable_through_interaction(self, family):
    env = hidden_rule.HiddenRuleEnv(family, max_turns=8)
    for seed in range(10):
      intro = env.reset(seed)
      _, reward, done, info = SOLVERS[family](env, intro)
      self.assertEqual((reward, done, info["success"]), (1.0, True, True), (family, seed))

  @parameterized.parameters(*hidden_rule.FAMILIES)
  def test_gold_answer_scores_one_and_wrong_scores_zero(self, family):
    env = hidden_rule.HiddenRuleEnv(family)
    verb = "guess" if family == "guess" else "answer"
    env.reset(1)
    _, reward, done, info = env.step(f"{verb} {env.answer}")
    self.assertEqual((reward, done, info["success"]), (1.0, True, True))
    env.reset(1)
    wrong = "0" if family != "cipher" else "zzzz"
    obs, reward, done, info = env.step(f"answer {wrong}" if family != "guess" else "guess 0")
    self.assertEqual((reward, info["success"]), (0.0, False))
    if family == "guess":  # 0 is out of range: an error observation, the game goes on
      self.assertFalse(done)
      self.assertIn("outside", info["error"])
    else:
      self.assertTrue(done)
      self.assertIn(f"The answer was {env.answer}", obs)

  def test_category_feedback_and_candidate_guard(self):
    env = hidden_rule.HiddenRuleEnv("category")
    intro = env.reset(4)
    candidates = [int(x) for x in re.search(r"Exactly one of \[(.*?)\]", intro).group(1)
                  .split(",")]
    self.assertIn(int(env.answer), candidates)
    obs, _, done, info = env.step(f"test {candidates[0]}")
    self.assertIn("may not be tested", info["error"])
    self.assertFalse(done)
    probe = next(x for x in range(1, 61) if x not in candidates)
    obs, reward, done, info = env.step(f"test {probe}")
    self.assertRegex(obs, rf"^{probe} (follows|does not follow) the rule\.$")
    self.assertEqual((reward, done, info["error"]), (0.0, False, ""))

  @parameterized.parameters(*hidden_rule.FAMILIES)
  def test_episode_and_seed_contract(self, family):
    # A step after done raised RuntimeError; reset(-7) played seed 7's game.
    testing.assert_env_contract(self, hidden_rule.HiddenRuleEnv(family, max_turns=2),
                                action="dance", answer=lambda env, info: env.gold_action)

  def test_deterministic_per_seed(self):
    env = hidden_rule.HiddenRuleEnv()
    self.assertEqual(env.reset(11), env.reset(11))
    self.assertGreater(len({(env.reset(s), env.answer) for s in range(20)}), 15)
    families = set()
    for seed in range(40):
      intro = env.reset(seed)
      families.add(next(f for f, word in (("transform", "secret function"),
                                          ("guess", "thinking of"), ("cipher", "cipher"),
                                          ("category", "secret rule")) if word in intro))
    self.assertEqual(families, set(hidden_rule.FAMILIES))

  def test_invalid_commands_are_error_observations(self):
    env = hidden_rule.HiddenRuleEnv("transform", max_turns=3, invalid_penalty=-0.1)
    for action in ("", "dance", "query banana", "query 99999999", "__import__('os')"):
      env.reset(0)
      obs, reward, done, info = env.step(action)
      self.assertTrue(obs.startswith("Error:"), action)
      self.assertEqual((reward, done), (-0.1, False))
      self.assertTrue(info["error"])
    env.reset(0)
    env.step("dance")
    env.step("dance")
    obs, _, done, info = env.step("dance")
    self.assertTrue(done)  # the third turn of max_turns=3 ends the episode
    self.assertFalse(info["success"])
    self.assertIn("Out of turns", obs)

  @parameterized.parameters(
      ("answer 12", ("answer", "12")), ("Answer: 12.", ("answer", "12")),
      ("think...\n`query -5`", ("query", "-5")), ("<action>encode abc</action> bye", (
          "encode", "abc")), ("", None), ("12", None))
  def test_parse_command(self, text, want):
    self.assertEqual(hidden_rule.parse_command(text), want)

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "family"):
      hidden_rule.HiddenRuleEnv("riddles")
    with self.assertRaisesRegex(ValueError, "max_turns"):
      hidden_rule.HiddenRuleEnv(max_turns=1)


def _play(env, seed, actions):
  """Steps env from reset(seed) through `actions`; returns the observations and the last info."""
  env.reset(seed)
  observations, info = [], {}
  for action in actions:
    obs, _, done, info = env.step(action)
    observations.append(obs)
    if done:
      break
  return observations, info


class DemonstrationTest(parameterized.TestCase):

  @parameterized.parameters(*hidden_rule.FAMILIES)
  def test_noiseless_expert_solves_every_episode(self, family):
    # Binary search needs at most 7 guesses for 100 numbers (2**7 - 1 >= 100); the other
    # families explore for three turns (two in category), then answer.
    env = hidden_rule.HiddenRuleEnv(family, max_turns=7 if family == "guess" else 4)
    for seed in range(300):
      actions = env.demonstration(seed, random.Random(0))
      _, info = _play(env, seed, actions)
      self.assertTrue(info["success"], (family, seed, actions))
      self.assertEqual(actions, env.demonstration(seed, random.Random(1)))  # no noise drawn

  def test_guess_expert_is_binary_search(self):
    env = hidden_rule.HiddenRuleEnv("guess", max_turns=7)
    seed = next(s for s in range(2000) if env.reset(s) and env.answer == "37")
    self.assertEqual(env.demonstration(seed, random.Random(0)),
                     ["guess 50", "guess 25", "guess 37"])
    self.assertEqual(env.gold_action, "guess 37")

  def test_noisy_guesses_stay_consistent_with_the_feedback(self):
    env = hidden_rule.HiddenRuleEnv("guess", max_turns=7)
    scripts = set()
    for seed in range(200):
      actions = env.demonstration(seed, random.Random(seed), noise=0.5)
      self.assertEqual(actions, env.demonstration(seed, random.Random(seed), noise=0.5))
      scripts.add((env.reset(seed) and env.answer, tuple(actions)))
      secret, lo, hi = int(env.answer), 1, 100
      for action in actions:
        x = int(action.split()[1])
        self.assertBetween(x, lo, hi)   # a number the feedback so far has not ruled out
        lo, hi = (x + 1, hi) if secret > x else (lo, x - 1)
      self.assertLessEqual(len(actions), 7)
    # Noise makes the scripts of a secret differ: more distinct scripts than secrets.
    self.assertGreater(len(scripts), len({secret for secret, _ in scripts}))
    with self.assertRaisesRegex(ValueError, "noise"):
      env.demonstration(0, random.Random(0), noise=1.5)

  def test_demonstration_leaves_the_episode_alone(self):
    env = hidden_rule.HiddenRuleEnv("guess", max_turns=7)
    env.reset(3)
    env.step("guess 50")
    env.demonstration(4, random.Random(0))
    obs, _, _, _ = env.step("guess 25")
    self.assertIn("25 is", obs)


class CompactStyleTest(parameterized.TestCase):

  @parameterized.parameters(*hidden_rule.FAMILIES)
  def test_same_game_shorter_texts(self, family):
    full = hidden_rule.HiddenRuleEnv(family, max_turns=7)
    compact = hidden_rule.HiddenRuleEnv(family, max_turns=7, style="compact")
    for seed in range(20):
      intro_full, intro_compact = full.reset(seed), compact.reset(seed)
      self.assertEqual(full.answer, compact.answer)
      self.assertLess(len(intro_compact), len(intro_full) / 2)
      self.assertTrue(intro_compact.endswith("(7 turns)"))
      actions = full.demonstration(seed, random.Random(0))
      self.assertEqual(actions, compact.demonstration(seed, random.Random(0)))
      (obs_full, info_full), (obs_compact, info_compact) = (
          _play(env, seed, actions) for env in (full, compact))
      self.assertEqual(info_full["success"], info_compact["success"])
      for a, b in zip(obs_full[:-1], obs_compact[:-1]):
        self.assertLessEqual(len(b), len(a))

  def test_compact_feedback(self):
    env = hidden_rule.HiddenRuleEnv("guess", max_turns=7, style="compact")
    seed = next(s for s in range(2000) if env.reset(s) and env.answer == "37")
    self.assertEqual(env.reset(seed), "number 1-100? guess X: higher/lower (7 turns)")
    self.assertEqual([env.step(a)[0] for a in ("guess 50", "guess 25", "guess 37")],
                     ["lower", "higher", "correct"])
    env.reset(seed)
    obs, reward, done, info = env.step("dance")
    self.assertEqual((obs, reward, done), ("invalid", 0.0, False))
    self.assertIn("unknown command", info["error"])    # the reason stays in the info
    env = hidden_rule.HiddenRuleEnv("transform", style="compact")
    env.reset(0)
    self.assertRegex(env.step("query 1")[0], r"^f\(1\)=-?\d+$")
    with self.assertRaisesRegex(ValueError, "style"):
      hidden_rule.HiddenRuleEnv(style="terse")

  def test_closeness_reward_grades_failures_only(self):
    env = hidden_rule.HiddenRuleEnv("guess", max_turns=2, style="compact",
                                    closeness_reward=0.5)
    seed = next(s for s in range(2000) if env.reset(s) and env.answer == "37")
    env.reset(seed)  # 50 -> lower (1-49), 25 -> higher (26-49): 24 numbers left open
    self.assertEqual(env.step("guess 50")[1], 0.0)   # not shaped before the end
    obs, reward, done, info = env.step("guess 25")
    self.assertTrue(done)
    self.assertFalse(info["success"])
    self.assertAlmostEqual(reward, 0.5 * (1 - math.log(24) / math.log(100)))
    env.reset(seed)  # two invalid turns leave all 100 numbers open: nothing earned
    env.step("dance")
    self.assertEqual(env.step("dance")[1], 0.0)
    env.reset(seed)
    env.step("guess 50")
    self.assertEqual(env.step("guess 37")[1:3], (1.0, True))   # a solve is unshaped
    transform = hidden_rule.HiddenRuleEnv("transform", max_turns=2, closeness_reward=0.5)
    transform.reset(0)
    transform.step("query 1")
    self.assertEqual(transform.step("answer 99999")[1], 0.0)   # no graded progress there
    for bad in (-0.1, 1.0):
      with self.assertRaisesRegex(ValueError, "closeness_reward"):
        hidden_rule.HiddenRuleEnv("guess", closeness_reward=bad)


class CheckedStepTest(parameterized.TestCase):

  def _episode(self, actions, *, max_turns=8, answer="37"):
    """The step_ok of each turn of a compact `guess` episode with secret `answer`."""
    env = hidden_rule.HiddenRuleEnv("guess", max_turns=max_turns, style="compact")
    env.reset(next(s for s in range(2000) if env.reset(s) and env.answer == answer))
    checked = []
    for action in actions:
      *_, done, info = env.step(action)
      checked.append(info["step_ok"])
      if done:
        break
    return checked, done

  def test_guess_steps_checked_by_hand(self):
    # 50 -> lower (1-49 open); 60 was ruled out: a mistake; 25 -> higher (26-49); 25 again and
    # 10 are ruled out; "dance" and 101 are invalid; 30 is open (-> higher, 31-49); 37 wins.
    actions = ["guess 50", "guess 60", "guess 25", "guess 25", "guess 10", "dance",
               "guess 101", "guess 30"]
    checked, done = self._episode(actions, max_turns=10)
    self.assertEqual(checked, [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0])
    self.assertFalse(done)
    # The range's edges are open, the winning guess is correct, a mistake does not narrow.
    self.assertEqual(self._episode(["guess 50", "guess 99", "guess 49", "guess 1", "guess 37"]),
                     ([1.0, 0.0, 1.0, 1.0, 1.0], True))
    # On the last turn too: an out-of-range guess, an invalid one.
    self.assertEqual(self._episode(["guess 50", "guess 70"], max_turns=2), ([1.0, 0.0], True))
    self.assertEqual(self._episode(["guess 50", "hm"], max_turns=2), ([1.0, 0.0], True))

  def test_expert_steps_are_all_correct(self):
    env = hidden_rule.HiddenRuleEnv("guess", max_turns=7)
    for seed in range(50):
      env.reset(seed)
      for action in env.demonstration(seed, random.Random(seed), noise=0.5):
        *_, info = env.step(action)
        self.assertEqual(info["step_ok"], 1.0, (seed, action))

  def test_clone_keeps_the_check(self):
    env = hidden_rule.HiddenRuleEnv("guess", style="compact")
    env.reset(next(s for s in range(2000) if env.reset(s) and env.answer == "37"))
    env.step("guess 50")
    other = env.clone()
    self.assertEqual(other.step("guess 60")[3]["step_ok"], 0.0)
    self.assertEqual(env.step("guess 40")[3]["step_ok"], 1.0)

  @parameterized.parameters("transform", "cipher", "category")
  def test_absent_in_the_unchecked_families(self, family):
    self.assertNotIn(family, hidden_rule.CHECKED_FAMILIES)
    env = hidden_rule.HiddenRuleEnv(family, max_turns=3)
    env.reset(0)
    infos = [env.step("dance")[3], env.step(env.gold_action)[3]]
    self.assertTrue(infos[1]["success"])
    self.assertTrue(all("step_ok" not in info for info in infos))


class HostileActionTest(absltest.TestCase):

  def test_trailing_punctuation_is_parsed_in_linear_time(self):
    text = "guess 5" + " ." * 30_000 + "x"  # took ~3 s with the lazy regex at 40K characters
    start = time.perf_counter()
    self.assertEqual(hidden_rule.parse_command(text), ("guess", "5" + " ." * 30_000 + "x"))
    self.assertEqual(hidden_rule.parse_command("`guess: 12.`"), ("guess", "12"))
    self.assertLess(time.perf_counter() - start, 1.0)

  def test_megabyte_of_unclosed_tags_is_parsed_quickly(self):
    start = time.perf_counter()  # '<action>' * 20000 alone took ~10 s with the lazy regex
    self.assertIsNone(hidden_rule.parse_command("<action>" * 125_000))
    self.assertEqual(hidden_rule.parse_command("<action>" * 125_000 + "\nguess 7"),
                     ("guess", "7"))
    self.assertEqual(hidden_rule.parse_command("x" * 10**6 + "<action>guess 8</action>"),
                     ("guess", "8"))
    self.assertLess(time.perf_counter() - start, 3.0)


if __name__ == "__main__":
  absltest.main()
