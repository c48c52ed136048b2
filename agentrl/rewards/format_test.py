"""Tests for agentrl.rewards.format."""
import time

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.rewards import extract
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

  def test_sees_only_the_tail(self):
    self.assertEqual(fmt.regex("<answer>1</answer>" + " " * extract.MAX_TEXT_CHARS,
                               pattern="<answer>"), 0.0)
    self.assertEqual(fmt.regex("x" * 10**6 + " <b>1</b> ", pattern=r"<b>\d</b>"), 1.0)

  def test_hostile_megabyte_is_bounded(self):
    hostile = "<think>" * 150_000  # ~1 MB: ~1 min uncapped, as ".*" is retried at every tag
    start = time.perf_counter()
    self.assertEqual(fmt.regex(hostile, pattern="<think>.*</think>"), 0.0)
    self.assertEqual(fmt.regex(hostile + "<think>a</think>", pattern="<think>.*</think>"), 1.0)
    self.assertEqual(fmt.tags(hostile + "<answer>1</answer>"), 0.0)
    self.assertEqual(fmt.tags(hostile + "a</think><answer>1</answer>", exactly_once=False), 1.0)
    self.assertLess(time.perf_counter() - start, 3.0)

  def test_non_empty(self):
    self.assertEqual(fmt.non_empty(" \n"), 0.0)
    self.assertEqual(fmt.non_empty("x"), 1.0)


if __name__ == "__main__":
  absltest.main()
