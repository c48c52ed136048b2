"""Tests for agentrl.rewards.verifiers (math-verify in bounded workers; hostile numbers)."""
import fractions
import threading
import time

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.rewards import verifiers


class ExactAndNumericTest(parameterized.TestCase):

  def test_exact_match(self):
    self.assertEqual(verifiers.exact_match(" 975 ", "975"), 1.0)
    self.assertEqual(verifiers.exact_match("9750", "975"), 0.0)
    self.assertEqual(verifiers.exact_match("New  York", "new york", ignore_case=True), 1.0)
    self.assertEqual(verifiers.exact_match("New York", "new york"), 0.0)
    self.assertEqual(verifiers.exact_match("no tag", "x", mode="tag"), 0.0)

  @parameterized.parameters(
      ("42", fractions.Fraction(42)), ("1,234", fractions.Fraction(1234)),
      ("$12.", fractions.Fraction(12)), ("3/4", fractions.Fraction(3, 4)),
      ("-0.5", fractions.Fraction(-1, 2)), ("50%", fractions.Fraction(1, 2)),
      ("1e3", 1000.0), ("abc", None), ("1/0", None), ("", None), (True, None),
      ("inf", None), (7, fractions.Fraction(7)))
  def test_parse_number(self, text, want):
    self.assertEqual(verifiers.parse_number(text), want)

  @parameterized.parameters(
      ("<answer>1,234</answer>", 1234, 1.0),
      ("so the answer is 42.", "42", 1.0),
      ("<answer>3/4</answer>", "0.75", 1.0),
      ("<answer>0.3333333</answer>", "1/3", 1.0),
      ("<answer>41</answer>", "42", 0.0),
      ("<answer>forty-two</answer>", "42", 0.0),
      ("", "42", 0.0),
  )
  def test_numeric_match(self, completion, target, want):
    self.assertEqual(verifiers.numeric_match(completion, target), want)

  def test_numeric_tolerances(self):
    self.assertEqual(verifiers.numeric_match("100.4", "100", abs_tol=0.0, rel_tol=0.01), 1.0)
    self.assertEqual(verifiers.numeric_match("102", "100", abs_tol=0.0, rel_tol=0.01), 0.0)

  def test_numeric_target_must_be_a_number(self):
    with self.assertRaisesRegex(ValueError, "'abc'"):
      verifiers.numeric_match("1", "abc")


class MathEqualTest(absltest.TestCase):

  def test_main_thread(self):
    self.assertEqual(verifiers.math_equal(r"thus \boxed{\frac{1}{2}}", "0.5"), 1.0)
    self.assertEqual(verifiers.math_equal(r"$\sqrt{2}/2$", r"\frac{\sqrt{2}}{2}"), 1.0)
    self.assertEqual(verifiers.math_equal("#### 18", "18"), 1.0)
    self.assertEqual(verifiers.math_equal(r"\boxed{41}", "42"), 0.0)
    self.assertEqual(verifiers.math_equal("   ", "42"), 0.0)
    self.assertEqual(verifiers.math_equal(r"\boxed{\frac{", "42"), 0.0)

  def test_worker_thread_does_not_raise(self):
    results = []

    def work():
      results.append((verifiers.math_equal(r"\boxed{0.5}", r"\frac{1}{2}"),
                      verifiers.math_equal(r"\boxed{3}", "4")))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=120)
    self.assertEqual(results, [(1.0, 0.0)])

  def test_many_threads_at_once(self):
    results = [None] * 6

    def work(i):
      results[i] = verifiers.math_equal(rf"\boxed{{{i}}}", str(i % 3))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(6)]
    for thread in threads:
      thread.start()
    for thread in threads:
      thread.join(timeout=120)
    self.assertEqual(results, [1.0, 1.0, 1.0, 0.0, 0.0, 0.0])

  def test_huge_powers_score_zero_quickly(self):
    start = time.monotonic()
    for answer in (r"\boxed{10^{10^{10}}}", r"\boxed{10**10**10}", r"\boxed{(10^{8})!}"):
      self.assertEqual(verifiers.math_equal(answer, "1", timeout_s=1), 0.0, answer)
    self.assertLess(time.monotonic() - start, 60.0)


class HostileNumbersTest(parameterized.TestCase):
  """The in-process parsers stay cheap: they read at most 200 characters of a number."""

  @parameterized.parameters("9" * 100000, "9" * 199, "1e999999999", "1/" + "9" * 197,
                            "10**10**10", "0." + "0" * 196 + "1", "1," * 32000, "1e309")
  def test_never_raises_and_stays_fast(self, text):
    start = time.monotonic()
    for target in ("42", "1e3", "1/3", 0.5):
      self.assertEqual(verifiers.numeric_match(f"<answer>{text}</answer>", target), 0.0)
      self.assertEqual(verifiers.numeric_match(text, target, mode="last_number"), 0.0)
      self.assertEqual(verifiers.exact_match(text, target), 0.0)
    self.assertLess(time.monotonic() - start, 1.0)


if __name__ == "__main__":
  absltest.main()
