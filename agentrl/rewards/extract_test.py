"""Tests for agentrl.rewards.extract."""
from absl.testing import absltest
from absl.testing import parameterized

from agentrl.rewards import extract


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


if __name__ == "__main__":
  absltest.main()
