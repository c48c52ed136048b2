"""Tests for agentrl.envs.few_shot: demonstrated episodes as chat messages, and the wrapper."""
import pickle

from absl.testing import absltest

from agentrl import configs
from agentrl.data import generators
from agentrl.envs import arithmetic
from agentrl.envs import calculator
from agentrl.envs import few_shot
from agentrl.envs import registry
from agentrl.envs import testing


def make_calc():
  return calculator.CalculatorEnv(num_ops=1, max_operand=20, max_turns=3)


class ExamplesTest(absltest.TestCase):

  def test_messages_of_demonstrated_episodes(self):
    msgs = few_shot.examples(make_calc, 2)
    seed = few_shot.SEED_BASE
    problem = calculator.make_problem(seed, num_ops=1, max_operand=20)
    # Per episode: task, call, its result (with the tool results), answer; no reply after it.
    self.assertEqual([m["role"] for m in msgs], ["user", "assistant", "user", "assistant"] * 2)
    self.assertEqual(msgs[0]["content"], problem["prompt"])
    self.assertEqual(msgs[1]["content"], f"<calc>{problem['expression']}</calc>")
    self.assertEqual(msgs[2]["content"], f"<result>{problem['answer']}</result>")
    self.assertEqual(msgs[2]["tool_results"], [f"<result>{problem['answer']}</result>"])
    self.assertEqual(msgs[3]["content"], f"<answer>{problem['answer']}</answer>")
    self.assertEqual(msgs[4]["content"], calculator.make_problem(seed + 1, num_ops=1,
                                                                 max_operand=20)["prompt"])
    self.assertEqual(few_shot.examples(make_calc, 0), ())

  def test_seeds_are_outside_every_other_range(self):
    self.assertGreater(few_shot.SEED_BASE, arithmetic.VALID_SEED_BASE + 2**28)
    self.assertGreater(few_shot.SEED_BASE, generators.HELDOUT_START * 2)
    self.assertLess(few_shot.SEED_BASE + 8, 2**32)

  def test_env_without_demonstrations_is_refused(self):
    with self.assertRaisesRegex(ValueError, "no demonstration"):
      few_shot.examples(lambda: registry.make("arithmetic"), 1)


class WrapTest(absltest.TestCase):

  def test_wrapped_env_keeps_the_env_contract_and_attributes(self):
    make_env = few_shot.wrap(make_calc, 1)
    env = make_env()
    self.assertLen(env.examples, 4)
    self.assertEqual((env.max_turns, env.system_prompt), (3, make_calc().system_prompt))
    self.assertTrue(callable(env.demonstration))
    testing.assert_env_contract(self, env, action="1+1",
                                answer=lambda e, info: f"<answer>{info['target']}</answer>")
    self.assertIs(few_shot.wrap(make_calc, 0), make_calc)
    clone = pickle.loads(pickle.dumps(make_env))()     # isolated envs pickle the factory
    self.assertEqual(clone.examples, env.examples)

  def test_registry_key(self):
    tc = registry.task_config("calculator", max_turns=3, chat_template=True, few_shot=2)
    self.assertLen(registry.factory(tc)().examples, 8)
    self.assertFalse(hasattr(registry.factory({**tc, "few_shot": 0})(), "examples"))
    with self.assertRaisesRegex(configs.ConfigError, "chat_template"):
      registry.check({**tc, "chat_template": False})
    with self.assertRaisesRegex(configs.ConfigError, "needs an env with demonstrations"):
      registry.check(registry.task_config("arithmetic", chat_template=True, few_shot=1))
    with self.assertRaisesRegex(configs.ConfigError, "few_shot"):
      registry.check({**tc, "few_shot": -1})


if __name__ == "__main__":
  absltest.main()
