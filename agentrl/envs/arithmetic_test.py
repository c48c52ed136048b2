"""Tests for agentrl.envs.arithmetic."""
import re

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.data import generators
from agentrl.envs import arithmetic
from agentrl.envs import testing


def _operands(prompt):
  a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)=", prompt).groups()
  return int(a), op, int(b)


class MakeProblemTest(parameterized.TestCase):

  def test_reversed_addition_format(self):
    for seed in range(50):
      p = arithmetic.make_problem(seed)
      self.assertRegex(p["prompt"], r"^\d{3}\+\d{3}=$")
      self.assertRegex(p["answer"], r"^\d{4}$")
      a, _, b = _operands(p["prompt"])
      self.assertEqual(int(p["answer"][::-1]), a + b)
      # 13 tokens with EOS under a digit-level tokenizer (docs/offline.md §9).
      self.assertLen(p["prompt"] + p["answer"], 12)

  def test_unpadded_reversal_matches_the_issue_example(self):
    p = arithmetic.make_problem(3, fixed_width=False)
    a, _, b = _operands(p["prompt"])
    self.assertEqual(p["answer"], str(a + b)[::-1])
    self.assertEqual(str(123 + 456)[::-1], "975")

  @parameterized.parameters(("-",), ("*",))
  def test_other_ops(self, op):
    for seed in range(30):
      p = arithmetic.make_problem(seed, ops=(op,), digits=2)
      a, _, b = _operands(p["prompt"])
      value = a - b if op == "-" else a * b
      sign = "-" if value < 0 else ""
      self.assertEqual(p["answer"], sign + str(abs(value)).zfill(2 if op == "-" else 4)[::-1])

  def test_deterministic_per_seed_and_varied_across_seeds(self):
    self.assertEqual(arithmetic.make_problem(7), arithmetic.make_problem(7))
    self.assertGreater(len({arithmetic.make_problem(s)["prompt"] for s in range(20)}), 15)

  def test_bad_arguments_are_named(self):
    with self.assertRaisesRegex(ValueError, "digits"):
      arithmetic.make_problem(0, digits=0)
    with self.assertRaisesRegex(ValueError, "ops"):
      arithmetic.make_problem(0, ops=("/",))
    with self.assertRaisesRegex(ValueError, "style"):
      arithmetic.ArithmeticEnv(style="chat")


class ArithmeticEnvTest(absltest.TestCase):

  def test_gold_answer_scores_one(self):
    env = arithmetic.ArithmeticEnv()
    self.assertEqual(env.max_turns, 1)
    for seed in range(10):
      prompt = env.reset(seed)
      self.assertEqual(prompt, arithmetic.make_problem(seed)["prompt"])
      obs, reward, done, info = env.step(arithmetic.make_problem(seed)["answer"])
      self.assertEqual((obs, reward, done, info["success"], info["error"]), ("", 1.0, True,
                                                                              True, ""))

  def test_wrong_and_empty_answers(self):
    env = arithmetic.ArithmeticEnv()
    env.reset(0)
    answer = arithmetic.make_problem(0)["answer"]
    _, reward, done, info = env.step(answer[::-1] + "1")
    self.assertEqual((reward, done, info["success"]), (0.0, True, False))
    env.reset(0)
    _, reward, _, info = env.step("  ")
    self.assertEqual(reward, 0.0)
    self.assertIn("empty", info["error"])

  def test_instruct_style(self):
    env = arithmetic.ArithmeticEnv(style="instruct", ops=("*",))
    self.assertIn("<answer>", env.system_prompt)
    prompt = env.reset(1)
    a, b = map(int, re.findall(r"\d+", prompt)[:2])
    self.assertEqual(env.step(f"I think <answer>{a * b}</answer>")[1], 1.0)
    env.reset(1)
    self.assertEqual(env.step(f"<answer>{a * b + 1}</answer>")[1], 0.0)

  def test_episode_and_seed_contract(self):
    # The correct answer repeated after done paid 1.0 again; reset(-7) played seed 7's problem.
    for style in arithmetic.STYLES:
      testing.assert_env_contract(self, arithmetic.ArithmeticEnv(style=style), action="0",
                                  answer=lambda env, info: info["target"])


class SupervisedDataTest(absltest.TestCase):

  def test_gold_encoding_round_trips_and_masks_the_answer(self):
    tok = arithmetic.build_tokenizer(3)
    problems = arithmetic.problems(arithmetic.SFT_SEED_BASE, 3, 3)
    length = arithmetic.gold_length(tok, 3)
    self.assertEqual(length, 1 + 8 + 4 + 1)  # BOS, "123+456=", 4 reversed digits, EOS
    enc = arithmetic.encode_gold(tok, problems, length + 2)
    for i, p in enumerate(problems):
      ids = enc["tokens_BT"][i][enc["input_mask_BT"][i]].tolist()
      self.assertEqual(ids[0], tok.bos_id)
      self.assertEqual(ids[-1], tok.eos_id)
      self.assertEqual(tok.decode(ids[1:-1]), p["prompt"] + p["answer"])
      answer_ids = enc["tokens_BT"][i][enc["loss_mask_BT"][i] > 0].tolist()
      self.assertEqual(answer_ids, tok.encode(p["answer"]) + [tok.eos_id])
    with self.assertRaisesRegex(ValueError, "needs 14 tokens > 10"):
      arithmetic.encode_gold(tok, problems, 10)

  def test_seed_ranges_are_disjoint(self):
    self.assertLess(generators.HELDOUT_START + 10**6, arithmetic.SFT_SEED_BASE)
    self.assertLess(arithmetic.SFT_SEED_BASE + 10**8, arithmetic.VALID_SEED_BASE)


if __name__ == "__main__":
  absltest.main()
