"""Tests for agentrl.envs.budget: HBPO's group layout and budget sentence."""
from absl.testing import absltest

from agentrl.envs import base
from agentrl.envs import budget
from agentrl.envs import safe
from agentrl.envs import testing


class EchoEnv:
  """Pays "answer" whenever it comes, and takes any seed: BudgetEnv keeps the contract."""

  system_prompt = "Solve it."
  max_turns = 1

  def reset(self, seed):
    return f"What is {seed} + 1?"

  def step(self, action):
    ok = action.strip() == "answer"
    return "", float(ok), True, base.make_info(reward=float(ok), success=ok)


class BudgetTest(absltest.TestCase):

  def test_row_budgets_follow_the_official_layout(self):
    # vllm_rollout_spmd-hierarchical.py: two prefills per budget, n / 8 samples each.
    self.assertEqual(budget.row_budgets(16), [512] * 4 + [1024] * 4 + [2048] * 4 + [2560] * 4)
    self.assertEqual(budget.row_budgets(2, (100, 200)), [100, 200])
    with self.assertRaisesRegex(ValueError, "multiple"):
      budget.row_budgets(6)

  def test_budget_sentence_and_pass_through(self):
    env = budget.BudgetEnv(EchoEnv(), 1024)
    self.assertEqual(env.reset(3), "What is 3 + 1?<think> I will answer the question with "
                                   "1024 tokens")
    self.assertEqual(env.step("answer")[1], 1.0)
    self.assertEqual((env.system_prompt, env.max_turns), ("Solve it.", 1))
    wrapped = safe.SafeEnv(budget.BudgetEnv(EchoEnv(), 512, sep="\n", template="Budget: {budget}"))
    self.assertEqual(wrapped.reset(1), "What is 1 + 1?\nBudget: 512")
    self.assertTrue(wrapped.step("answer")[2])
    with self.assertRaisesRegex(ValueError, "budget"):
      budget.BudgetEnv(EchoEnv(), 0)

  def test_episode_and_seed_contract(self):
    testing.assert_env_contract(self, budget.BudgetEnv(EchoEnv(), 512), action="x",
                                answer=lambda env, info: "answer")


if __name__ == "__main__":
  absltest.main()
