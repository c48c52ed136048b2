"""Outcome verifiers: exact match, numeric tolerance, math equivalence (math-verify).

Signature shared by every reward function in agentrl.rewards:

  fn(completion: str, target, **hyperparameters) -> float

`completion` is the decoded model text (special tokens removed); `target` is the gold answer
(a string or number here; reasoning-gym entries for `envs.reasoning_gym_env`). The result is
a float (1.0 / 0.0 for these verifiers). A completion with no extractable answer scores 0.0;
bad completions never raise. The answer is reduced first by `agentrl.rewards.extract` (`mode`).

Hostile answers. exact_match and numeric_match are pure Python on bounded input (the last
extract.MAX_TEXT_CHARS characters; parse_number reads at most 200 characters, so no Fraction or
float it builds is large). math_equal runs sympy on model text, which can compute for ever
holding the GIL (`10**10**10`), so it always runs in `agentrl.rewards.bounded`'s worker
processes, bounded in time and memory; there, in the worker's main thread, math-verify's own
`signal.alarm` timeouts (which raise ValueError outside the main thread, docs/offline.md §4)
also work. math-verify parses plain-text answers with sympy's `parse_expr`, which ends in
Python's `eval`; in those workers it evaluates only an allow-list of expressions
(`agentrl.rewards.untrusted`), so model text never runs as Python.
"""
import fractions
import math
import re

from agentrl.rewards import bounded
from agentrl.rewards import extract as extract_lib

_NUM_RE = re.compile(r"[-+]?(\d+(\.\d*)?|\.\d+)([eE][-+]?\d+)?(/\d+)?")


def _normalize(text: str, ignore_case: bool) -> str:
  text = " ".join(text.split())
  return text.casefold() if ignore_case else text


def exact_match(completion: str, target, *, mode: str = "raw",
                ignore_case: bool = False) -> float:
  """1.0 iff the extracted answer equals str(target) up to whitespace (and case if asked)."""
  answer = extract_lib.extract(completion, mode)
  if answer is None:
    return 0.0
  return float(_normalize(answer, ignore_case) == _normalize(str(target), ignore_case))


def parse_number(text) -> fractions.Fraction | float | None:
  """Exact Fraction for ints, decimals and a/b; float for scientific notation; else None.

  Accepts "1,234", "$12", "3/4", "-0.5", "50%" (= 1/2) and a trailing period.
  """
  if isinstance(text, bool):
    return None
  if isinstance(text, int):
    return fractions.Fraction(text)
  if isinstance(text, float):
    return text if math.isfinite(text) else None
  if not isinstance(text, str):
    return None
  s = text.strip().strip("$").rstrip(".").replace(",", "").replace(" ", "")
  percent = s.endswith("%")
  s = s.rstrip("%")
  if len(s) > 200 or not _NUM_RE.fullmatch(s):
    return None
  try:
    value = float(s) if ("e" in s or "E" in s) else fractions.Fraction(s)
  except (ValueError, ZeroDivisionError, OverflowError):
    return None
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value / 100 if percent else value


def numeric_match(completion: str, target, *, mode: str = "tag_or_last_line",
                  rel_tol: float = 0.0, abs_tol: float = 1e-6) -> float:
  """1.0 iff the extracted number equals target within tolerance (math.isclose semantics).

  If the extracted candidate is not a bare number ("so the answer is 42."), its last number
  literal is used.
  """
  want = parse_number(target)
  if want is None:
    raise ValueError(f"numeric_match target {target!r} is not a number; use exact_match or "
                     "math_equal for non-numeric answers.")
  answer = extract_lib.extract(completion, mode)
  if answer is None:
    return 0.0
  got = parse_number(answer)
  if got is None:
    got = parse_number(extract_lib.last_number(answer) or "")
  if got is None:
    return 0.0
  if isinstance(got, fractions.Fraction) and isinstance(want, fractions.Fraction):
    return float(abs(got - want) <= abs_tol or abs(got - want) <= rel_tol * abs(want))
  return float(math.isclose(float(got), float(want), rel_tol=rel_tol, abs_tol=abs_tol))


# ---------------------------------------------------------------------------------------------
# math-verify
# ---------------------------------------------------------------------------------------------


def _gold_text(target) -> str:
  text = str(target).strip()
  # math-verify's LaTeX extractor anchors on $...$ or \boxed; a bare gold like "\frac{1}{2}"
  # would otherwise fall through to the plain-expression parser.
  return text if ("$" in text or "\\boxed" in text) else f"${text}$"


def _verify(gold: str, pred: str, timeout_s: int | None) -> bool:
  """math-verify parse + verify; timeout_s=None disables its signal-based timeouts."""
  import math_verify  # pylint: disable=g-import-not-at-top
  gold_parsed = math_verify.parse(gold, parsing_timeout=timeout_s)
  pred_parsed = math_verify.parse(pred, parsing_timeout=timeout_s)
  if not gold_parsed or not pred_parsed:
    return False
  return bool(math_verify.verify(gold_parsed, pred_parsed, timeout_seconds=timeout_s))


def _import_math_verify() -> None:
  """Worker setup: math-verify and sympy take seconds to import, outside the call's limit."""
  import logging  # pylint: disable=g-import-not-at-top
  import math_verify  # pylint: disable=g-import-not-at-top,unused-import
  logging.getLogger("math_verify").setLevel(logging.ERROR)


def math_equal(completion: str, target, *, timeout_s: int = 5, max_chars: int = 4096) -> float:
  """1.0 iff math-verify judges the completion's answer equal to target, else 0.0.

  math-verify extracts the answer itself (\\boxed{} first, then the last LaTeX or plain
  expression) from the last `max_chars` characters. Runs in `bounded`'s worker processes:
  running out of time (timeout_s, plus a second of slack) or memory, or a verifier error, scores
  0.0. Safe to call from any thread.
  """
  if not isinstance(completion, str):
    raise TypeError(f"completion must be str, got {type(completion).__name__}")
  pred = completion[-max_chars:]
  if not pred.strip():
    return 0.0
  timeout_s = max(1, math.ceil(timeout_s))
  try:  # math-verify's own timeouts end most slow cases in the worker; bounded ends the rest
    return float(bounded.call(_verify, _gold_text(target), pred, timeout_s,
                              timeout_s=timeout_s + 1, setup=_import_math_verify) is True)
  except Exception:  # pylint: disable=broad-except
    return 0.0  # a limit exceeded, or math-verify raised on malformed LaTeX
