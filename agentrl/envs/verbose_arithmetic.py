# pylint: disable=invalid-name
"""Verbose-answer reversed addition: the compact task with filler the reward ignores.

The efficiency experiments (experiments/efficiency/hapo_length.py, brpo.py, hbpo.py, decs.py,
eapo.py, tppo.py, delethink.py) need a task whose responses vary in length without changing their
correctness, so that a length-aware objective has something to shorten. A response is

  "." * k + ">" + answer + "." * m        e.g. "123+456=" -> "...>9750.."  (then EOS)

  "."     FILLER: carries nothing;
  ">"     THINK_END: closes the "thinking" (the leading filler), as </think> does;
  answer  the compact task's reversed, zero-padded sum (`arithmetic.make_problem`).

`score` strips surrounding whitespace, the leading filler, one THINK_END and the trailing
filler, and exact-matches the rest against the answer: "9750", ">9750" and "..>9750..." are
correct, ".9.750" and "..>9751" are not. The SFT demonstrations (`VerboseArithmeticEnv.
demonstration`) draw k uniformly from [0, MAX_PRE_FILLER] and m from [0, MAX_POST_FILLER],
so the warm-started policy's responses span 6..15 tokens (3 digits) and the shortest correct
response, "9750" + EOS, is 5.

How the methods read this format (docs/algorithms.md §12.8; each experiment says more):
  BRPO    thinking = the leading filler through THINK_END; summary = what follows it.
  DECS    redundant tokens = the trailing filler of a correct response (`trailing_filler`):
          the tokens after the one that completes the answer.
  others  length = the response's sampled tokens (EOS included).

Training set: `TRAIN_SIZE` problems (seeds [0, TRAIN_SIZE)), revisited every epoch
(`recipe.prompt_stream` reads `train_size`), because HAPO's per-prompt history needs prompts
that repeat. Held-out, SFT and validation seeds are the compact task's.

Budget prompts: HBPO states a token budget after the prompt, "123+456=[12]". A pretrained model
can read such an instruction; a scratch model has never seen "[", "]" there, so the SFT data
(`recipe.warm_start`) builds its env with `budget_prompts=0.5`: half of the demonstrations'
prompts end with a random budget that the demonstration ignores. The warm-started policy can
read the format without having learnt to obey it; RL and evaluation prompts have no budget.
"""
import copy
import random

import jax
import jax.numpy as jnp

from agentrl.envs import arithmetic
from agentrl.envs import base
from agentrl.models import tokenizer as tokenizer_lib

FILLER = "."
THINK_END = ">"
MAX_PRE_FILLER = 6
MAX_POST_FILLER = 3
TRAIN_SIZE = 256
# Budget prompts (envs/budget.py, HBPO) are written "[b]": the tokenizer knows the brackets.
BUDGET_TEMPLATE = "[{budget}]"


def response_tokens(digits: int) -> int:
  """Sampled tokens of the longest demonstration: fillers, THINK_END, answer and EOS."""
  return MAX_PRE_FILLER + 1 + (digits + 1) + MAX_POST_FILLER + 1


def core(completion: str) -> str:
  """The completion without whitespace, leading filler, one THINK_END and trailing filler."""
  text = completion.strip().lstrip(FILLER)
  if text.startswith(THINK_END):
    text = text[len(THINK_END):]
  return text.rstrip(FILLER)


def score(completion: str, answer: str) -> tuple[float, str]:
  """(reward in {0, 1}, error message or "") of one completion."""
  if not completion.strip():
    return 0.0, "empty completion"
  text = core(completion)
  if not text:
    return 0.0, "no answer digits after the filler"
  return float(text == answer), ""


def demonstration_text(answer: str, rng: random.Random) -> str:
  """One demonstration of `answer` with k ~ U[0, MAX_PRE_FILLER], m ~ U[0, MAX_POST_FILLER]."""
  pre, post = rng.randint(0, MAX_PRE_FILLER), rng.randint(0, MAX_POST_FILLER)
  return FILLER * pre + THINK_END + answer + FILLER * post


class VerboseArithmeticEnv:
  """One-step Env: reset(seed) -> "123+456=", step(completion) -> `score`."""

  max_turns = 1
  system_prompt = ""

  def __init__(self, *, digits: int = 3, train_size: int = TRAIN_SIZE,
               budget_prompts: float = 0.0):
    arithmetic.make_problem(0, digits=digits)  # names a bad digits value
    if train_size < 1 or not 0.0 <= budget_prompts <= 1.0:
      raise ValueError(f"need train_size >= 1 and budget_prompts in [0, 1], got {train_size} "
                       f"and {budget_prompts}.")
    self.digits, self.train_size, self.budget_prompts = digits, train_size, budget_prompts
    self._problem = None

  @base.episode_reset
  def reset(self, seed: int) -> str:
    """The problem's prompt; with probability `budget_prompts` (drawn from the seed) followed
    by a budget "[b]", b uniform in [1, 2 * response_tokens(digits)]."""
    self._problem = arithmetic.make_problem(seed, digits=self.digits)
    rng = random.Random(f"budget-{seed}")
    if rng.random() < self.budget_prompts:
      budget = rng.randint(1, 2 * response_tokens(self.digits))
      return self._problem["prompt"] + BUDGET_TEMPLATE.format(budget=budget)
    return self._problem["prompt"]

  def clone(self) -> "VerboseArithmeticEnv":
    """A copy in the same state (envs/base.py, "Forking"); it shares the episode's problem,
    which reset replaces and nothing changes."""
    return copy.copy(self)

  @base.episode_step
  def step(self, action: str) -> base.StepResult:
    reward, error = score(action, self._problem["answer"])
    return "", reward, True, base.make_info(reward=reward, success=reward == 1.0, error=error,
                                            target=self._problem["answer"])

  def demonstration(self, seed: int, rng: random.Random, *, noise: float = 0.0) -> list[str]:
    """The SFT demonstration of `seed`: its answer with `rng`-drawn filler (one action).

    The variety is in the filler; every demonstration is correct, so `noise` must be 0.
    """
    if noise:
      raise ValueError(f"VerboseArithmeticEnv demonstrations take no noise, got {noise}.")
    return [demonstration_text(arithmetic.make_problem(seed, digits=self.digits)["answer"],
                               rng)]


def build_tokenizer(digits: int) -> tokenizer_lib.Tokenizer:
  """A character-level vocabulary of the compact task plus FILLER, THINK_END and brackets."""
  rng = random.Random(0)
  lines = [p["prompt"] + demonstration_text(p["answer"], rng)
           for p in arithmetic.problems(arithmetic.SFT_SEED_BASE, 500, digits)]
  lines += ["-", BUDGET_TEMPLATE.format(budget=1234567890)]
  return tokenizer_lib.train_sentencepiece(
      lines, 32, model_type="char", add_dummy_prefix=False, byte_fallback=False,
      user_defined_symbols=())


def single_id(tok, text: str) -> int:
  """The one token id of `text` (FILLER, THINK_END); ValueError if it is not one token."""
  ids = tok.encode(text)
  if len(ids) != 1:
    raise ValueError(f"{text!r} must be one token of this tokenizer, got ids {ids}.")
  return int(ids[0])


def trailing_filler(tokens_BT: jax.Array, loss_mask_BT: jax.Array, *, filler_id: int,
                    stop_ids) -> jax.Array:
  """Bool [B, T]: sampled FILLER tokens after the row's last sampled content token.

  Content is any sampled token that is neither FILLER nor a stop id, so in "..>9750..<EOS>"
  the last content token is "0" and the two dots after it are marked; a row with no content
  token marks nothing. DECS reads these as the redundant tokens (experiments/efficiency/decs.py).
  """
  sampled_BT = loss_mask_BT > 0
  filler_BT = tokens_BT == filler_id
  stop_BT = jnp.isin(tokens_BT, jnp.asarray(stop_ids, jnp.int32))
  content_BT = sampled_BT & ~filler_BT & ~stop_BT
  t_1T = jnp.arange(tokens_BT.shape[1])[None]
  last_B1 = jnp.max(jnp.where(content_BT, t_1T, -1), axis=1, keepdims=True)
  return sampled_BT & filler_BT & (t_1T > last_B1) & (last_B1 >= 0)
