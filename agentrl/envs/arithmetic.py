"""Built-in arithmetic task, including reversed-digit addition for from-scratch tiny models.

Two prompt styles:

  compact   "123+456=" -> "9750" (reverse=True, fixed_width=True): operands zero-padded to
            `digits`, the result zero-padded to its maximal width and written least-significant
            digit first, then EOS. Every character is one token under a digit-splitting
            tokenizer, the answer has a fixed length, and reversal lets a causal model emit
            the carry-free low digit first (Lee et al. 2023, "Teaching Arithmetic to Small
            Transformers"; docs/offline.md §9: 3+3 digits is 13 tokens with EOS). Scored
            by exact match of the whole completion (whitespace stripped).
  instruct  "What is 123 + 456? ..." for chat models; the answer is read from
            <answer>...</answer> (else the last line) and compared as a number.

`make_problem(seed, ...)` is the pure generator that agentrl.data streams; `ArithmeticEnv` is
the same task as a one-step Env. The supervised side of the compact task (a character-level
tokenizer, gold sequences for teacher forcing, the SFT seed ranges) is at the end: the warm
start of the from-scratch runs (agentrl/harness/sft.py) and the reward-model experiment use it.
"""
import copy
import random

import numpy as np

from agentrl.envs import base
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.rewards import extract, verifiers

# Disjoint seed ranges: RL prompts come from [0, HELDOUT_START), the held-out test set from
# HELDOUT_START on, SFT data and its stopping (validation) set above both.
SFT_SEED_BASE = 2**31
VALID_SEED_BASE = 2**31 + 2**30

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

  @base.episode_reset
  def reset(self, seed: int) -> str:
    self._problem = make_problem(seed, **self._kwargs)
    return self._problem["prompt"]

  def clone(self) -> "ArithmeticEnv":
    """A copy in the same state (envs/base.py, "Forking"); it shares the episode's problem,
    which reset replaces and nothing changes."""
    return copy.copy(self)

  @base.episode_step
  def step(self, action: str) -> base.StepResult:
    reward, error = score(action, self._problem["answer"], style=self._kwargs["style"])
    return "", reward, True, base.make_info(reward=reward, success=reward == 1.0, error=error,
                                            target=self._problem["answer"])


# ---------------------------------------------------------------------------------------------
# Supervised data for the compact task.
# ---------------------------------------------------------------------------------------------
def problems(seed_base: int, n: int, digits: int) -> list[dict]:
  """The compact problems of seeds seed_base .. seed_base + n - 1."""
  return [make_problem(seed_base + i, digits=digits) for i in range(n)]


def build_tokenizer(digits: int) -> tokenizer_lib.Tokenizer:
  """A character-level sentencepiece vocabulary (digits, '+', '=', '-', specials)."""
  lines = [p["prompt"] + p["answer"] for p in problems(SFT_SEED_BASE, 500, digits)] + ["-"]
  return tokenizer_lib.train_sentencepiece(
      lines, 32, model_type="char", add_dummy_prefix=False, byte_fallback=False,
      user_defined_symbols=())


def gold_length(tok, digits: int) -> int:
  """Tokens of the longest gold sequence (BOS + prompt + answer + EOS) for `digits`."""
  p = make_problem(0, digits=digits)
  return 1 + len(tok.encode(p["prompt"])) + len(tok.encode(p["answer"])) + 1


def encode_gold(tok, batch_problems, length: int) -> dict[str, np.ndarray]:
  """[B, length] right-padded BOS + prompt + answer + EOS; loss_mask on answer and EOS."""
  B = len(batch_problems)
  tokens = np.full((B, length), tok.pad_id, np.int32)
  loss_mask = np.zeros((B, length), np.float32)
  input_mask = np.zeros((B, length), bool)
  for i, p in enumerate(batch_problems):
    prompt = tok.encode(p["prompt"], add_bos=True)
    ids = prompt + tok.encode(p["answer"]) + [tok.eos_id]
    if len(ids) > length:
      raise ValueError(f"problem {p['prompt']!r} needs {len(ids)} tokens > {length}")
    tokens[i, :len(ids)] = ids
    input_mask[i, :len(ids)] = True
    loss_mask[i, len(prompt):len(ids)] = 1.0
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), (B, length)).copy()
  return dict(tokens_BT=tokens, positions_BT=positions, input_mask_BT=input_mask,
              loss_mask_BT=loss_mask)
