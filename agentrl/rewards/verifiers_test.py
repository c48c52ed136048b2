"""Tests for agentrl.rewards.verifiers (math-verify from the main and from worker threads)."""
import fractions
import sys
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

  def test_worker_thread_uses_subprocess_and_does_not_raise(self):
    results = []

    def work():
      results.append((verifiers.math_equal(r"\boxed{0.5}", r"\frac{1}{2}"),
                      verifiers.math_equal(r"\boxed{3}", "4")))

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=120)
    self.assertEqual(results, [(1.0, 0.0)])

  def test_worker_that_misses_its_deadline_is_killed_and_restarted(self):
    worker = verifiers._Worker(command=[sys.executable, "-c", "import time; time.sleep(60)"])
    self.addCleanup(worker.close)
    start = time.monotonic()
    self.assertIsNone(worker("1", "1", timeout_s=1, startup_s=0.0))
    self.assertLess(time.monotonic() - start, 10.0)
    self.assertEqual(worker.restarts, 1)
    self.assertIsNone(worker("1", "1", timeout_s=1, startup_s=0.0))  # a fresh process again
    self.assertEqual(worker.restarts, 2)

  def test_real_worker_answers(self):
    worker = verifiers._Worker()
    self.addCleanup(worker.close)
    self.assertIs(worker("$2$", r"\boxed{2}", timeout_s=5, startup_s=60.0), True)
    self.assertIs(worker("$2$", r"\boxed{3}", timeout_s=5, startup_s=60.0), False)
    self.assertEqual(worker.restarts, 0)


if __name__ == "__main__":
  absltest.main()
