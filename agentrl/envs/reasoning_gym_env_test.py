"""Tests for agentrl.envs.reasoning_gym_env (skipped if reasoning-gym is not installed)."""
import sys
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.envs import reasoning_gym_env

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


class MissingPackageTest(absltest.TestCase):

  def test_error_names_the_install_command(self):
    with mock.patch.dict(sys.modules, {"reasoning_gym": None}):
      with self.assertRaisesRegex(ImportError, r"pip install -e '\.\[envs\]'"):
        reasoning_gym_env.ReasoningGymEnv("chain_sum")


if __name__ == "__main__":
  absltest.main()
