"""Tests for agentrl.envs.reasoning_gym_env (skipped if reasoning-gym is not installed)."""
import os
import shutil
import subprocess
import sys
import tempfile
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


# Scorers that run the answer as Python: sympy's parse_expr (which ends in `eval`) or `eval`.
_SYMPY_SCORERS = ("simple_integration", "intermediate_integration", "polynomial_multiplication",
                  "puzzle24", "countdown")
_EVAL_SCORERS = ("string_insertion", "spiral_matrix", "binary_matrix", "n_queens")


def _exploits(path: str, victim: int) -> dict[str, str]:
  """Answers that, run as Python, create `path` or kill process `victim`."""
  built = "+".join(f"chr({ord(c)})" for c in f"open({path!r}, 'w')")
  return {
      "open": f"open({path!r}, 'w')",
      "system": f"__import__('os').system('touch {path}')",
      "kill": f"__import__('os').kill({victim}, 9)",
      "attribute_chain": ("().__class__.__bases__[0].__subclasses__()[-1].__init__.__globals__"
                          f"['__builtins__']['open']({path!r}, 'w')"),
      "comprehension": ("[c for c in ().__class__.__bases__[0].__subclasses__() if c.__name__ =="
                        " '_wrap_close'][0].__init__.__globals__['system']"
                        f"('touch {path}')"),
      "string_building": f"sympify({built})",
  }


@absltest.skipIf(reasoning_gym is None, _SKIP)
class AnswersAreNeverRunTest(parameterized.TestCase):

  @parameterized.parameters(*_SYMPY_SCORERS, *_EVAL_SCORERS)
  def test_code_in_an_answer_scores_zero_and_does_nothing(self, name):
    victim = subprocess.Popen(["sleep", "60"])
    self.addCleanup(victim.wait)
    self.addCleanup(victim.kill)
    task = reasoning_gym_env.ReasoningGymTask(name)
    entry = task.entry(0)
    tmp = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, tmp)
    for kind, answer in _exploits(os.path.join(tmp, "pwned"), victim.pid).items():
      score, _, info = task.score(answer, entry)
      self.assertLessEqual(score, 0.01, kind)  # the scorer's floor for a rejected answer
      self.assertNotIn(safe.VERIFY_TIMEOUT, info)
      self.assertEqual(os.listdir(tmp), [], kind)
      self.assertIsNone(victim.poll(), kind)

  @parameterized.parameters(*_SYMPY_SCORERS)
  def test_gold_answers_of_sympy_scorers_still_score_one(self, name):
    task = reasoning_gym_env.ReasoningGymTask(name)
    for seed in (0, 1, 7, 2000):
      entry = task.entry(seed)
      self.assertEqual(task.score(entry["answer"], entry), (1.0, "", {}), (seed, entry["answer"]))

  def test_python_list_answers_still_get_partial_credit(self):
    task = reasoning_gym_env.ReasoningGymTask("binary_matrix")
    entry = task.entry(0)
    rows = [[int(x) for x in row.split()] for row in entry["answer"].splitlines()]
    self.assertEqual(task.score(entry["answer"], entry)[0], 1.0)
    self.assertEqual(task.score(repr(rows), entry)[0], 0.1)  # the scorer's `eval` of a list


class MissingPackageTest(absltest.TestCase):

  def test_error_names_the_install_command(self):
    with mock.patch.dict(sys.modules, {"reasoning_gym": None}):
      with self.assertRaisesRegex(ImportError, r"pip install -e '\.\[envs\]'"):
        reasoning_gym_env.ReasoningGymEnv("chain_sum")


if __name__ == "__main__":
  absltest.main()
