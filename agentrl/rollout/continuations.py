"""Continuations of given token contexts through the rollout engine.

  trajs, metrics = continuations.sample_continuations(engine, params, tok, contexts,
                                                      rng=key, max_new_tokens=64)

Token in, token out: a context (a list of ids) becomes one single-turn episode of
`Engine.run` through a tokenizer view whose encode(str(i)) is the i-th context, so nothing is
decoded and re-encoded. Used by the rollout wrappers that restart from token contexts
(rollout/anytime.py, rollout/delethink.py).
"""
from typing import Sequence

import jax

from agentrl.envs import base
from agentrl.rollout import agent_loop


class _ContextTokenizer:
  """A tokenizer view whose encode(str(i)) is the i-th context's ids, so that `Engine.run`
  starts an episode from given ids; every other attribute is the tokenizer's."""

  def __init__(self, tok, contexts: Sequence[Sequence[int]]):
    self._tok, self._contexts = tok, contexts

  def encode(self, text: str, add_bos: bool = False) -> list[int]:
    del add_bos  # a context already starts with the prompt's BOS, if any
    return list(self._contexts[int(text)])

  def __getattr__(self, name):
    return getattr(self._tok, name)


class _ContextEnv:
  """One model turn from context `seed`; whoever asked for it scores the continuation."""
  system_prompt = ""
  max_turns = 1

  def reset(self, seed: int) -> str:
    return str(seed)

  def step(self, action: str) -> base.StepResult:
    del action
    return "", 0.0, True, base.make_info(reward=0.0)


def sample_continuations(engine, params, tok, contexts: Sequence[Sequence[int]], *,
                         rng: jax.Array, max_new_tokens: int,
                         greedy: bool | Sequence[bool] = False, **sample_kwargs
                         ) -> tuple[list[agent_loop.Trajectory], dict[str, float]]:
  """One sampled continuation of each context (token ids), in one `engine.run`.

  Token in, token out: the contexts are never decoded and re-encoded. Each trajectory's
  tokens are its context (loss_mask 0) followed by the sampled ids (loss_mask 1), stopping at
  EOS or an end-of-turn id of `tok`. Returns the engine's metrics too. `greedy` and
  `sample_kwargs` (temperature, top_k, top_p, logp_mode) are `Engine.run`'s. Used by the
  rollout wrappers that restart from token contexts (rollout/anytime.py, rollout/delethink.py).
  """
  if not contexts:
    return [], {}
  return engine.run(params, _ContextTokenizer(tok, contexts), [_ContextEnv() for _ in contexts],
                    list(range(len(contexts))), rng=rng, max_turns=1,
                    max_new_tokens=max_new_tokens,
                    max_len=max(map(len, contexts)) + max_new_tokens, greedy=greedy,
                    chat_template=False, **sample_kwargs)
