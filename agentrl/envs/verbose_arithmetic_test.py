"""Tests for agentrl.envs.verbose_arithmetic: filler is ignored, lengths vary and are measurable."""
import random

from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from agentrl.envs import arithmetic
from agentrl.envs import testing
from agentrl.envs import verbose_arithmetic as verbose


class ScoreTest(absltest.TestCase):

  def test_filler_around_the_answer_is_ignored(self):
    for text in ("9750", ">9750", "...>9750", "9750...", "..>9750..", " .>9750. \n"):
      self.assertEqual(verbose.score(text, "9750"), (1.0, ""), text)

  def test_the_answer_itself_must_match_exactly(self):
    for text in ("..>9751..", ".9.750", "97.50", ">>9750", "9750>", "..>975", "x9750"):
      self.assertEqual(verbose.score(text, "9750")[0], 0.0, text)
    self.assertEqual(verbose.score("...>..", "9750"), (0.0, "no answer digits after the filler"))
    self.assertEqual(verbose.score("  ", "9750"), (0.0, "empty completion"))

  def test_env_scores_like_the_compact_task_once_filler_is_stripped(self):
    env = verbose.VerboseArithmeticEnv()
    for seed in range(20):
      prompt = env.reset(seed)
      gold = arithmetic.make_problem(seed)
      self.assertEqual(prompt, gold["prompt"])
      _, reward, done, info = env.step("...>" + gold["answer"] + "..")
      self.assertEqual((reward, done, info["success"], info["target"]),
                       (1.0, True, True, gold["answer"]))

  def test_episode_and_seed_contract(self):
    testing.assert_env_contract(self, verbose.VerboseArithmeticEnv(budget_prompts=0.5),
                                action=".", answer=lambda env, info: info["target"])


class DemonstrationTest(absltest.TestCase):

  def test_demonstrations_are_correct_with_varied_filler(self):
    env = verbose.VerboseArithmeticEnv()
    pre, post = set(), set()
    for seed in range(200):
      (text,) = env.demonstration(seed, random.Random(seed))
      env.reset(seed)
      self.assertEqual(env.step(text)[1], 1.0, text)
      head, tail = text.split(verbose.THINK_END)
      pre.add(len(head))
      post.add(len(tail) - 4)
      self.assertEqual(set(head), {verbose.FILLER} if head else set())
    # Every filler count of the documented ranges occurs: lengths vary.
    self.assertEqual(pre, set(range(verbose.MAX_PRE_FILLER + 1)))
    self.assertEqual(post, set(range(verbose.MAX_POST_FILLER + 1)))
    with self.assertRaisesRegex(ValueError, "no noise"):
      env.demonstration(0, random.Random(0), noise=0.5)

  def test_length_is_measurable_in_tokens(self):
    # Character-level vocabulary: a response of k + m filler tokens is k + m + 6 tokens with
    # ">" and EOS (3 digits), so the longest demonstration is response_tokens(3) = 15.
    tok = verbose.build_tokenizer(3)
    for text, expected in (("9750", 4), ("...>9750..", 10), ("." * 6 + ">9750...", 14)):
      self.assertLen(tok.encode(text), expected)
      self.assertEqual(tok.decode(tok.encode(text)), text)
    self.assertEqual(verbose.response_tokens(3), 15)
    self.assertNotEqual(verbose.single_id(tok, verbose.FILLER),
                        verbose.single_id(tok, verbose.THINK_END))
    self.assertEqual(tok.decode(tok.encode(verbose.BUDGET_TEMPLATE.format(budget=12))), "[12]")
    with self.assertRaisesRegex(ValueError, "must be one token"):
      verbose.single_id(tok, "12")

  def test_training_set_is_finite(self):
    self.assertEqual(verbose.VerboseArithmeticEnv().train_size, verbose.TRAIN_SIZE)
    with self.assertRaisesRegex(ValueError, "train_size"):
      verbose.VerboseArithmeticEnv(train_size=0)
    with self.assertRaisesRegex(ValueError, "digits"):
      verbose.VerboseArithmeticEnv(digits=0)

  def test_budget_prompts_for_sft(self):
    plain, mixed = verbose.VerboseArithmeticEnv(), verbose.VerboseArithmeticEnv(budget_prompts=0.5)
    budgets = []
    for seed in range(400):
      prompt = plain.reset(seed)
      self.assertNotIn("[", prompt)
      text = mixed.reset(seed)
      self.assertEqual(mixed.reset(seed), text)            # a function of the seed
      if text != prompt:
        self.assertTrue(text.startswith(prompt) and text.endswith("]"))
        budgets.append(int(text[len(prompt) + 1:-1]))
      # The budget changes the prompt, never the answer the env expects.
      mixed.reset(seed)
      self.assertEqual(mixed.step(plain.demonstration(seed, random.Random(0))[0])[1], 1.0)
    self.assertBetween(len(budgets), 150, 250)
    self.assertEqual((min(budgets), max(budgets)), (1, 30))
    with self.assertRaisesRegex(ValueError, "budget_prompts"):
      verbose.VerboseArithmeticEnv(budget_prompts=1.5)


class TrailingFillerTest(absltest.TestCase):

  def test_marks_filler_after_the_last_answer_token(self):
    # Ids: 1 = filler, 2 = ">", 3 = EOS, 5-9 digits, 0 = pad. Rows: prompt (mask 0) + response.
    tokens = np.asarray([[7, 8, 1, 1, 2, 5, 6, 1, 1, 3, 0],     # "..>56.." EOS
                         [7, 8, 2, 5, 6, 3, 0, 0, 0, 0, 0],     # ">56" EOS: nothing trailing
                         [7, 8, 1, 1, 1, 3, 0, 0, 0, 0, 0],     # filler only: no answer
                         [7, 1, 1, 5, 1, 6, 1, 3, 0, 0, 0]])    # ".5.6." : the last dot only
    mask = np.asarray([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0],
                       [0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0],
                       [0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0],
                       [0, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]], np.float32)
    marked = verbose.trailing_filler(jnp.asarray(tokens), jnp.asarray(mask), filler_id=1,
                                     stop_ids=(3,))
    expected = np.zeros_like(mask, bool)
    expected[0, 7:9] = True
    expected[3, 6] = True
    np.testing.assert_array_equal(np.asarray(marked), expected)
    # A prompt token equal to the filler id is never marked (mask 0).
    tokens[1, 1] = 1
    marked = verbose.trailing_filler(jnp.asarray(tokens), jnp.asarray(mask), filler_id=1,
                                     stop_ids=(3,))
    self.assertFalse(np.asarray(marked)[1].any())


if __name__ == "__main__":
  absltest.main()
