"""Outcome verifiers: exact match, numeric tolerance, math equivalence (math-verify).

Signature shared by every reward function in agentrl.rewards:

  fn(completion: str, target, **hyperparameters) -> float

`completion` is the decoded model text (special tokens removed); `target` is the gold answer
(a string or number here; reasoning-gym entries for `envs.reasoning_gym_env`). The result is
a float (1.0 / 0.0 for these verifiers). A completion with no extractable answer scores 0.0;
bad completions never raise. The answer is reduced first by `agentrl.rewards.extract` (`mode`).

math-verify (Kydlicek et al., HF 2025) uses `signal.alarm` for its timeouts, which raises
ValueError outside the main thread (docs/offline.md §4). `math_equal` therefore calls it
directly only in the main thread; from any other thread it hands the pair to a persistent
worker subprocess (whose main thread runs the same signal-based timeouts) and kills and
restarts that worker if it does not answer in time.
"""
import atexit
import fractions
import json
import math
import os
import re
import select
import subprocess
import sys
import threading

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


def serve() -> None:
  """Verifier worker loop over stdin/stdout JSON lines: {gold, pred, timeout} -> {result}."""
  import logging  # pylint: disable=g-import-not-at-top
  logging.getLogger("math_verify").setLevel(logging.ERROR)
  for line in sys.stdin:
    request = json.loads(line)
    try:
      reply = {"result": _verify(request["gold"], request["pred"], request["timeout"])}
    except Exception as e:  # pylint: disable=broad-except
      reply = {"error": f"{type(e).__name__}: {e}"}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()


class _Worker:
  """One persistent verifier subprocess; killed and restarted when it misses a deadline.

  A plain `python -c` subprocess rather than multiprocessing: spawn/forkserver children
  re-import the caller's __main__ module, which re-runs unguarded scripts.
  """

  def __init__(self, command=None):
    self._command = command or [sys.executable, "-c",
                                "from agentrl.rewards.verifiers import serve; serve()"]
    self._lock = threading.Lock()
    self._proc = None
    self.restarts = 0

  def _start(self):
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))
    self._proc = subprocess.Popen(
        self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL, env=env, text=True, bufsize=1)

  def close(self):
    if self._proc is not None:
      self._proc.kill()
      self._proc.wait()
      self._proc.stdin.close()
      self._proc.stdout.close()
    self._proc = None

  def _kill(self):
    self.close()
    self.restarts += 1

  def __call__(self, gold: str, pred: str, timeout_s: int, startup_s: float):
    with self._lock:
      fresh = self._proc is None or self._proc.poll() is not None
      if fresh:
        self._start()
      try:
        self._proc.stdin.write(json.dumps({"gold": gold, "pred": pred, "timeout": timeout_s})
                               + "\n")
        self._proc.stdin.flush()
        # The first call also waits for the child to import sympy and math-verify.
        ready, _, _ = select.select([self._proc.stdout], [], [],
                                    timeout_s + (startup_s if fresh else 1.0))
        line = self._proc.stdout.readline() if ready else ""
      except OSError:
        line = ""
      if not line:
        self._kill()
        return None
      try:
        return json.loads(line).get("result")
      except (ValueError, AttributeError):
        return None


_WORKER = _Worker()
atexit.register(_WORKER.close)


def math_equal(completion: str, target, *, timeout_s: int = 5, max_chars: int = 4096,
               startup_s: float = 60.0) -> float:
  """1.0 iff math-verify judges the completion's answer equal to target, else 0.0.

  math-verify extracts the answer itself (\\boxed{} first, then the last LaTeX or plain
  expression). Only the last `max_chars` characters are parsed, so a runaway completion cannot
  make sympy slow. A timeout or a verifier error scores 0.0. Safe to call from any thread.
  """
  if not isinstance(completion, str):
    raise TypeError(f"completion must be str, got {type(completion).__name__}")
  pred = completion[-max_chars:]
  if not pred.strip():
    return 0.0
  gold = _gold_text(target)
  if threading.current_thread() is threading.main_thread():
    try:
      return float(_verify(gold, pred, max(1, math.ceil(timeout_s))))
    except Exception:  # pylint: disable=broad-except
      return 0.0  # math-verify raises on some malformed LaTeX despite raise_on_error=False
  result = _WORKER(gold, pred, max(1, math.ceil(timeout_s)), startup_s)
  return 1.0 if result is True else 0.0
