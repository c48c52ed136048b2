"""Tests for agentrl.rewards.extract."""
import re
import time

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.rewards import extract
from agentrl.rewards import verifiers


class ExtractTest(parameterized.TestCase):

  @parameterized.parameters(
      ("raw", "  42 \n", "42"),
      ("tag", "<answer>1</answer> then <answer> 2 </answer>", "2"),
      ("tag", "no tags", None),
      ("last_line", "think\n\n  final 7  \n\n", "final 7"),
      ("last_line", "  \n ", None),
      ("tag_or_last_line", "x\n<answer>5</answer>\nbye", "5"),
      ("tag_or_last_line", "x\ny", "y"),
      ("boxed", r"so \boxed{\frac{1}{2}} and \boxed{x^{2}}", "x^{2}"),
      ("boxed", r"\boxed{unclosed", None),
      ("last_number", "costs 1,234 then -5.5 or 3/4", "3/4"),
      ("last_number", "total 1,234,567.", "1234567"),
      ("last_number", "none", None),
  )
  def test_modes(self, mode, text, want):
    self.assertEqual(extract.extract(text, mode), want)

  def test_unknown_mode_names_valid_modes(self):
    with self.assertRaisesRegex(ValueError, "tag_or_last_line"):
      extract.extract("x", "nope")

  def test_non_string_completion_is_rejected(self):
    with self.assertRaisesRegex(TypeError, "str"):
      extract.extract(None, "raw")


class HostileTextTest(absltest.TestCase):
  """Model output is adversarial: parsing must stay linear and bounded (issue: 20 s before)."""

  def _fast(self, fn, *args):
    start = time.perf_counter()
    result = fn(*args)
    self.assertLess(time.perf_counter() - start, 3.0)
    return result

  def test_many_unclosed_tags_are_linear(self):
    self.assertIsNone(self._fast(extract.tag, "<answer>" * 20000))
    self.assertEqual(self._fast(verifiers.numeric_match, "<answer>" * 20000, "42"), 0.0)
    text = "<answer>" * 20000 + "<answer>42</answer>"
    self.assertEqual(self._fast(verifiers.numeric_match, text, "42"), 1.0)

  def test_tag_spans_match_the_lazy_regex(self):
    for text in ("<a>1</a><a>2</a>", "<a><a>x</a></a>", "<a>x</a>y</a><a>z", "<a></a>",
                 "no tags", "<a>\n multi\nline </a> tail <a>last</a>"):
      want = [(m.start(), m.end(), m.group(1))
              for m in re.finditer(r"<a>(.*?)</a>", text, flags=re.DOTALL)]
      self.assertEqual(list(extract.tag_spans(text, "a")), want, text)

  def test_parsers_see_only_the_tail(self):
    head = "<answer>1</answer>" + "x" * extract.MAX_TEXT_CHARS
    self.assertIsNone(extract.tag(head))  # the early answer is beyond the cap
    self.assertEqual(extract.tag("x" * 10**6 + "<answer>7</answer>"), "7")
    self.assertEqual(len(extract.extract("y" * 10**6, "raw")), extract.MAX_TEXT_CHARS)
    self.assertEqual(self._fast(extract.last_number, "9" * 10**6)[:3], "999")


if __name__ == "__main__":
  absltest.main()
