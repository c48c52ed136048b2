"""Tests for agentrl.rewards.format."""
from absl.testing import absltest
from absl.testing import parameterized

from agentrl.rewards import format as fmt

GOOD = "<think>a</think> <answer>1</answer>"


class TagsTest(parameterized.TestCase):

  @parameterized.parameters(
      (GOOD, {}, 1.0),
      ("<answer>1</answer><think>a</think>", {}, 0.0),
      ("<answer>1</answer><think>a</think>", {"ordered": False}, 1.0),
      ("<think>a</think>", {}, 0.0),
      ("<think>a</think><answer>1</answer><answer>2</answer>", {}, 0.0),
      ("<think>a</think><answer>1</answer><answer>2</answer>", {"exactly_once": False}, 1.0),
      ("<think>a</think><answer>1</answer><answer>", {}, 0.0),
      ("hi " + GOOD, {"strict_ends": True}, 0.0),
      ("\n" + GOOD + "\n", {"strict_ends": True}, 1.0),
      ("<answer>x</answer>", {"names": ("answer",)}, 1.0),
  )
  def test_tags(self, text, kwargs, want):
    self.assertEqual(fmt.tags(text, None, **kwargs), want)

  def test_needs_a_tag_name(self):
    with self.assertRaisesRegex(ValueError, "names"):
      fmt.tags(GOOD, names=())


class RegexTest(absltest.TestCase):

  def test_search_and_fullmatch(self):
    self.assertEqual(fmt.regex("result: 12", pattern=r"\d+"), 1.0)
    self.assertEqual(fmt.regex("result: 12", pattern=r"\d+", fullmatch=True), 0.0)
    self.assertEqual(fmt.regex(" 12 ", pattern=r"\d+", fullmatch=True), 1.0)

  def test_non_empty(self):
    self.assertEqual(fmt.non_empty(" \n"), 0.0)
    self.assertEqual(fmt.non_empty("x"), 1.0)


if __name__ == "__main__":
  absltest.main()
