"""Built-in arithmetic task, including reversed-digit addition for from-scratch tiny models.

Two prompt styles:

  compact   "123+456=" -> "9750" (reverse=True, fixed_width=True): operands zero-padded to
            `digits`, the result zero-padded to its maximal width and written least-significant
            digit first, then EOS. Every character is one token under a digit-splitting
            tokenizer, the answer has a fixed length, and reversal lets a causal model emit
            the carry-free low digit first (Lee et al. 2023, "Teaching Arithmetic to Small
            Transformers"; offline_resources.md §9: 3+3 digits is 13 tokens with EOS). Scored
            by exact match of the whole completion (whitespace stripped).
  instruct  "What is 123 + 456? ..." for chat models; the answer is read from
            <answer>...</answer> (else the last line) and compared as a number.

`make_problem(seed, ...)` is the pure generator that agentrl.data streams; `ArithmeticEnv` is
the same task as a one-step Env.
"""
import random

from agentrl.envs import base
from agentrl.rewards import extract, verifiers

OPS = ("+", "-", "*")
STYLES = ("compact", "instruct")
INSTRUCT_SYSTEM = ("Solve the arithmetic problem. Put only the final number inside "
                   "<answer></answer>.")


def _result_width(op: str, digits: int) -> int:
  return {"+": digits + 1, "-": digits, "*": 2 * digits}[op]


def _check(digits: int, ops, style: str) -> None:
  if not 1 <= digits <= 18:
    raise ValueError(f"digits={digits} must be in [1, 18].")
  if not ops or any(op not in OPS for op in ops):
    raise ValueError(f"ops={ops!r} must be a non-empty subset of {OPS}.")
  if style not in STYLES:
    raise ValueError(f"style={style!r} must be one of {STYLES}.")


def make_problem(seed: int, *, digits: int = 3, ops=("+",), reverse: bool = True,
                 fixed_width: bool = True, style: str = "compact") -> dict:
  """{"prompt", "answer", "seed"}: a deterministic function of its arguments."""
  _check(digits, ops, style)
  rng = random.Random(seed)
  op = ops[rng.randrange(len(ops))]
  a, b = rng.randrange(10**digits), rng.randrange(10**digits)
  value = {"+": a + b, "-": a - b, "*": a * b}[op]
  if style == "instruct":
    return {"prompt": f"What is {a} {op} {b}? Put the final number inside <answer></answer>.",
            "answer": str(value), "seed": seed}
  sign, body = ("-" if value < 0 else ""), str(abs(value))
  if fixed_width:
    a_text, b_text = f"{a:0{digits}d}", f"{b:0{digits}d}"
    body = body.zfill(_result_width(op, digits))
  else:
    a_text, b_text = str(a), str(b)
  if reverse:
    body = body[::-1]
  return {"prompt": f"{a_text}{op}{b_text}=", "answer": sign + body, "seed": seed}


def score(completion: str, answer: str, *, style: str = "compact") -> tuple[float, str]:
  """(reward in {0, 1}, error message or "") for one completion."""
  if not completion.strip():
    return 0.0, "empty completion"
  if style == "compact":
    return verifiers.exact_match(completion, answer), ""
  if extract.extract(completion, "tag_or_last_line") is None:
    return 0.0, "no answer found; put the final number inside <answer></answer>"
  return verifiers.numeric_match(completion, answer), ""


class ArithmeticEnv:
  """One-step Env over `make_problem`: reset(seed) -> prompt, step(completion) -> reward."""

  max_turns = 1

  def __init__(self, *, digits: int = 3, ops=("+",), reverse: bool = True,
               fixed_width: bool = True, style: str = "compact"):
    _check(digits, tuple(ops), style)
    self._kwargs = dict(digits=digits, ops=tuple(ops), reverse=reverse,
                        fixed_width=fixed_width, style=style)
    self.system_prompt = INSTRUCT_SYSTEM if style == "instruct" else ""
    self._problem = None

  def reset(self, seed: int) -> str:
    self._problem = make_problem(seed, **self._kwargs)
    return self._problem["prompt"]

  def step(self, action: str) -> base.StepResult:
    if self._problem is None:
      raise RuntimeError("ArithmeticEnv.step() called before reset(seed).")
    reward, error = score(action, self._problem["answer"], style=self._kwargs["style"])
    return "", reward, True, base.make_info(reward=reward, success=reward == 1.0, error=error,
                                            target=self._problem["answer"])
