"""Tests for agentrl.envs.reasoning_gym_env (skipped if reasoning-gym is not installed)."""
import sys
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.envs import reasoning_gym_env
from agentrl.envs import safe
from agentrl.envs import testing

try:
  import reasoning_gym  # pylint: disable=g-import-not-at-top
except ImportError:
  reasoning_gym = None

_SKIP = "reasoning-gym is not installed (pip install -e '.[envs]')"


@absltest.skipIf(reasoning_gym is None, _SKIP)
class ReasoningGymEnvTest(parameterized.TestCase):

  @parameterized.parameters("chain_sum", "countdown", "basic_arithmetic", "number_sorting")
  def test_gold_answers_score_one(self, name):
    env = reasoning_gym_env.ReasoningGymEnv(name)
    self.assertEqual(env.max_turns, 1)
    self.assertIn("<answer>", env.system_prompt)
    for seed in (0, 1, 2000):
      env.reset(seed)
      gold = env.task.entry(seed)["answer"]
      _, reward, done, info = env.step(f"Reasoning...\n<answer>{gold}</answer>")
      self.assertEqual((reward, done, info["success"], info["error"]), (1.0, True, True, ""))

  def test_episode_and_seed_contract(self):
    # After done, the gold answer paid 1.0 again; reset(-7) indexed block -1 of the dataset.
    testing.assert_env_contract(self, reasoning_gym_env.ReasoningGymEnv("chain_sum"),
                                action="<answer>none</answer>",
                                answer=lambda env, info: f"<answer>{info['target']}</answer>")

  def test_same_question_as_reasoning_gym_itself(self):
    dataset = reasoning_gym.create_dataset("chain_sum", size=3000, seed=0)
    task = reasoning_gym_env.ReasoningGymTask("chain_sum")
    for seed in (5, 1023, 1024, 2999):  # across block boundaries
      self.assertEqual(task.entry(seed)["question"], dataset[seed]["question"])
      self.assertEqual(task.entry(seed)["answer"], dataset[seed]["answer"])

  def test_deterministic_per_seed(self):
    a = reasoning_gym_env.ReasoningGymEnv("chain_sum")
    b = reasoning_gym_env.ReasoningGymEnv("chain_sum")
    self.assertEqual(a.reset(42), b.reset(42))
    self.assertGreater(len({a.reset(s) for s in range(10)}), 8)
    shifted = reasoning_gym_env.ReasoningGymEnv("chain_sum", seed_offset=1)
    self.assertEqual(shifted.reset(0), a.reset(1))

  def test_answer_extraction(self):
    env = reasoning_gym_env.ReasoningGymEnv("chain_sum")
    env.reset(3)
    gold = env.task.entry(3)["answer"]
    self.assertEqual(env.step(f"thinking\n{gold}")[1], 1.0)  # last-line fallback
    env.reset(3)
    _, reward, _, info = env.step("")
    self.assertEqual(reward, 0.0)
    self.assertIn("no answer", info["error"])
    strict = reasoning_gym_env.ReasoningGymEnv("chain_sum", answer_mode="tag")
    strict.reset(3)
    self.assertEqual(strict.step(f"thinking\n{gold}")[1], 0.0)

  def test_task_make_problem_and_reward_fn(self):
    task = reasoning_gym_env.ReasoningGymTask("basic_arithmetic")
    problem = task.make_problem(7)
    self.assertEqual(set(problem), {"prompt", "answer", "seed", "entry"})
    self.assertEqual(task.reward(f"<answer>{problem['answer']}</answer>", problem["entry"]), 1.0)
    self.assertEqual(task.reward("<answer>nonsense</answer>", problem["entry"]), 0.0)

  def test_unknown_dataset_and_bad_config(self):
    with self.assertRaisesRegex(ValueError, "countdown"):
      reasoning_gym_env.ReasoningGymEnv("no_such_task")
    with self.assertRaises(Exception):
      reasoning_gym_env.ReasoningGymEnv("chain_sum", no_such_option=3)


@absltest.skipIf(reasoning_gym is None, _SKIP)
class HostileAnswerTest(parameterized.TestCase):

  @parameterized.parameters("simple_integration", "polynomial_multiplication")
  def test_answer_that_never_finishes_scores_zero_and_is_counted(self, name):
    # sympy evaluated 10**10**10 for ever holding the GIL: no thread timeout could stop it.
    env = safe.SafeEnv(reasoning_gym_env.ReasoningGymEnv(name, verify_timeout_s=1.0))
    env.reset(0)
    env.step(f"<answer>{env.env.task.entry(0)['answer']}</answer>")  # starts a worker
    env.reset(0)
    start = time.monotonic()
    _, reward, done, info = env.step("<answer>10**10**10</answer>")
    self.assertLess(time.monotonic() - start, 10.0)
    self.assertEqual((reward, done, info["success"]), (0.0, True, False))
    self.assertIn("verification", info["error"])
    self.assertEqual(env.counters["verify_timeouts"], 1)
    self.assertEqual(env.metrics()["env/verify_timeouts"], 1.0)
    env.reset(0)  # and the next answer is scored by a fresh worker
    gold = env.env.task.entry(0)["answer"]
    self.assertEqual(env.step(f"<answer>{gold}</answer>")[1], 1.0)

  def test_reward_fn_is_bounded_too(self):
    task = reasoning_gym_env.ReasoningGymTask("polynomial_multiplication", verify_timeout_s=1.0)
    self.assertEqual(task.reward("<answer>10**10**10</answer>", task.entry(3)), 0.0)


class MissingPackageTest(absltest.TestCase):

  def test_error_names_the_install_command(self):
    with mock.patch.dict(sys.modules, {"reasoning_gym": None}):
      with self.assertRaisesRegex(ImportError, r"pip install -e '\.\[envs\]'"):
        reasoning_gym_env.ReasoningGymEnv("chain_sum")


if __name__ == "__main__":
  absltest.main()
