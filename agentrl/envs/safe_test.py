"""Tests for agentrl.envs.safe: every fault becomes an error observation and a counter."""
import math

from absl.testing import absltest

from agentrl.envs import base
from agentrl.envs import calculator
from agentrl.envs import safe


class ScriptedEnv:
  """Returns (or raises) whatever the test queues for each call."""

  system_prompt = "sys"
  max_turns = 3

  def __init__(self, results=(), reset_error=None):
    self.results = list(results)
    self.reset_error = reset_error

  def reset(self, seed):
    if self.reset_error:
      raise self.reset_error
    return f"start {seed}"

  def step(self, action):
    result = self.results.pop(0)
    if isinstance(result, Exception):
      raise result
    return result


def _ok(obs="fine", reward=0.0, done=False):
  return obs, reward, done, base.make_info(reward=reward)


class SafeEnvTest(absltest.TestCase):

  def test_env_exception_becomes_error_observation(self):
    env = safe.SafeEnv(ScriptedEnv([ValueError("kaboom")]))
    self.assertEqual(env.reset(1), "start 1")
    obs, reward, done, info = env.step("go")
    self.assertEqual((reward, done), (0.0, True))
    self.assertIn("kaboom", obs)
    self.assertIn("ValueError", info["error"])
    self.assertEqual(env.counters["env_errors"], 1)
    _, _, done, info = env.step("again")  # the episode is over
    self.assertTrue(done)
    self.assertEqual(env.counters["steps_after_done"], 1)

  def test_reset_exception(self):
    env = safe.SafeEnv(ScriptedEnv(reset_error=OSError("no game file")))
    obs = env.reset(0)
    self.assertTrue(obs.startswith("Error:"))
    self.assertIn("no game file", env.reset_error)
    _, reward, done, info = env.step("x")
    self.assertEqual((reward, done), (0.0, True))
    self.assertIn("no game file", info["error"])
    self.assertEqual((env.counters["env_errors"], env.counters["steps_after_done"]), (1, 1))

  def test_bad_results_are_repaired_and_counted(self):
    env = safe.SafeEnv(ScriptedEnv([None, (1, 2.0, False, {}), ("o", math.nan, False, {}),
                                    ("o", "abc", False, {"success": True})]), error_reward=-1)
    for want in ("bad_results", "bad_results", "nonfinite_rewards", "nonfinite_rewards"):
      env.reset(0)
      before = env.counters[want]
      obs, reward, _, info = env.step("x")
      self.assertEqual(env.counters[want], before + 1, want)
      self.assertEqual(reward, -1)
      self.assertTrue(info["error"])
      self.assertIsInstance(obs, str)
      self.assertEqual(set(base.REQUIRED_INFO_KEYS) - set(info), set())

  def test_missing_info_keys_are_filled(self):
    env = safe.SafeEnv(ScriptedEnv([("o", 1, False, {"extra": 3})]))
    env.reset(0)
    _, reward, _, info = env.step("x")
    self.assertEqual(info, {"extra": 3, "success": False, "error": "", "reward": 1.0,
                            "truncated": False})
    self.assertIsInstance(reward, float)

  def test_long_observation_is_truncated_and_flagged(self):
    env = safe.SafeEnv(ScriptedEnv([_ok("x" * 10_000), _ok("y" * 100)]), max_obs_chars=100)
    env.reset(0)
    obs, _, _, info = env.step("a")
    self.assertLen(obs, 100)
    self.assertTrue(obs.endswith(safe.TRUNCATION_MARK))
    self.assertTrue(info["truncated"])
    obs, _, _, info = env.step("b")  # exactly at the budget: untouched
    self.assertEqual((obs, info["truncated"]), ("y" * 100, False))
    self.assertEqual(env.counters["truncated_observations"], 1)

  def test_turn_limit_and_step_before_reset(self):
    env = safe.SafeEnv(ScriptedEnv([_ok()] * 3))
    _, _, done, _ = env.step("too early")
    self.assertTrue(done)
    self.assertEqual(env.counters["steps_after_done"], 1)
    env.reset(0)
    dones = [env.step("a")[2] for _ in range(3)]
    self.assertEqual(dones, [False, False, True])
    self.assertEqual(env.counters["turn_limit"], 1)
    self.assertEqual((env.system_prompt, env.max_turns), ("sys", 3))

  def test_empty_and_malicious_actions_on_a_real_env(self):
    env = safe.SafeEnv(calculator.CalculatorEnv())
    env.reset(0)
    obs, reward, done, info = env.step("")
    self.assertTrue(obs.startswith("<error>"))
    self.assertEqual((reward, done), (0.0, False))
    for action in ("<calc>__import__('os').system('echo pwned')</calc>", "<calc>2**10**10</calc>",
                   None):
      obs, _, _, info = env.step(action)
      self.assertTrue(obs.startswith("<error>"), action)
    self.assertEqual(env.counters["empty_actions"], 2)  # "" and None
    self.assertEqual(env.counters["invalid_actions"], 4)
    self.assertEqual(env.counters["env_errors"], 0)
    self.assertEqual(env.metrics()["env/invalid_actions"], 4.0)

  def test_safe_step_function(self):
    counters = safe.new_counters()
    obs, reward, done, info = safe.safe_step(ScriptedEnv([KeyError("k")]), "x",
                                             counters=counters, error_reward=-0.5)
    self.assertEqual((reward, done), (-0.5, True))
    self.assertIn("KeyError", info["error"])
    self.assertEqual(counters["env_errors"], 1)
    self.assertEqual(safe.safe_step(ScriptedEnv([_ok("fine")]), "x")[0], "fine")

  def test_timeouts_crashes_and_unsafe_actions_have_their_own_counters(self):
    refused = ("Error: refused", 0.0, False, base.make_info(reward=0.0, error="refused",
                                                            unsafe_action=True))
    env = safe.SafeEnv(ScriptedEnv([refused, safe.EnvTimeout("slow"), safe.EnvCrash("dead")]))
    env.reset(0)
    self.assertFalse(env.step("\x00")[2])
    for want in ("EnvTimeout: slow", "EnvCrash: dead"):
      env.reset(0)
      obs, _, done, _ = env.step("x")
      self.assertTrue(done)
      self.assertIn(want, obs)
    self.assertEqual({k: v for k, v in env.counters.items() if v},
                     {"steps": 3, "resets": 3, "unsafe_actions": 1, "invalid_actions": 1,
                      "env_timeouts": 1, "env_crashes": 1})
    self.assertEqual(env.metrics()["env/unsafe_actions"], 1.0)
    env = safe.SafeEnv(ScriptedEnv(reset_error=safe.EnvTimeout("slow reset")))
    self.assertIn("slow reset", env.reset(0))
    self.assertEqual({k: v for k, v in env.counters.items() if v},
                     {"resets": 1, "env_timeouts": 1})
    self.assertContainsSubset({"unsafe_actions", "env_timeouts", "env_crashes"}, safe.COUNTERS)

  def test_truncate_validation(self):
    with self.assertRaisesRegex(ValueError, "max_obs_chars"):
      safe.SafeEnv(ScriptedEnv(), max_obs_chars=5)


if __name__ == "__main__":
  absltest.main()
