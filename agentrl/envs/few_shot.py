"""Few-shot demonstrations: solved episodes shown before the task, as earlier chat turns.

A small instruction-tuned model rarely writes a tool call it has only been told about; shown
a solved episode in the conversation, it copies the format (docs/usage.md §6 has the survey).
`wrap` gives every env of a factory the same demonstrations:

  make_env = few_shot.wrap(registry.factory(config.task), shots=2)
  env = make_env()
  env.examples        # ({"role": "user", "content": task}, {"role": "assistant", ...}, ...)

`examples(make_env, shots)` runs the env's scripted expert (`env.demonstration(seed, rng)`,
noise 0) on the episodes of seeds SEED_BASE, SEED_BASE + 1, ... (a range that no training,
held-out, SFT or validation seed reaches) and records each as messages: the task (user), each
action (assistant) and each reply (user; with "tool_results" when the env's info gave them, so
the renderer can put them in the template's tool role). The reply to the last action is left
out: the demonstrated episode ends with the expert's answer. The rollout renders
`env.examples` between the system message and the task (agentrl/rollout/agent_loop.py
`Renderer.prompt`); they are prompt tokens (loss mask 0).
"""
import copy
import functools
import random
from typing import Any, Callable

from agentrl.envs import base

SEED_BASE = 2**31 + 2**30 + 2**29


def examples(make_env: Callable[[], Any], shots: int) -> tuple[dict, ...]:
  """The chat messages of `shots` demonstrated episodes (module docstring)."""
  if shots < 0:
    raise ValueError(f"shots must be >= 0, got {shots}.")
  messages = []
  for seed in range(SEED_BASE, SEED_BASE + shots):
    env = make_env()
    if not callable(getattr(env, "demonstration", None)):
      raise ValueError(f"{type(env).__name__} has no demonstration(seed, rng) to show as "
                       "few-shot examples; use shots=0.")
    messages.append({"role": "user", "content": env.reset(seed)})
    actions = env.demonstration(seed, random.Random(seed), noise=0.0)
    for i, action in enumerate(actions):
      messages.append({"role": "assistant", "content": action})
      obs, _, done, info = env.step(action)
      if done or i == len(actions) - 1:
        break
      reply = {"role": "user", "content": obs}
      if info.get("tool_results"):
        reply["tool_results"] = list(info["tool_results"])
      messages.append(reply)
    close = getattr(env, "close", None)
    if callable(close):
      close()
  return tuple(messages)


class FewShotEnv:
  """`env` with `examples` (chat messages shown before each task); the rest is env's."""

  def __init__(self, env: Any, examples_: tuple[dict, ...]):
    self.env, self.examples = env, tuple(examples_)

  @property
  def system_prompt(self) -> str:
    return self.env.system_prompt

  @property
  def max_turns(self) -> int:
    return self.env.max_turns

  @base.episode_reset
  def reset(self, seed: int) -> str:
    return self.env.reset(seed)

  @base.episode_step
  def step(self, action: str) -> base.StepResult:
    return self.env.step(action)

  def rewrap(self, env: Any) -> "FewShotEnv":
    """This FewShotEnv (its examples, its episode) around `env`, a fork of its env
    (envs/base.py, "Forking")."""
    other = copy.copy(self)
    other.env = env
    return other

  def __getattr__(self, name: str):
    # Everything else (demonstration, gold_action, close, ...) is the wrapped env's.
    if name == "env":   # not set yet (unpickling): no recursion through self.env
      raise AttributeError(name)
    return getattr(self.env, name)


def _build(make_env: Callable[[], Any], examples_: tuple[dict, ...]) -> FewShotEnv:
  return FewShotEnv(make_env(), examples_)


def wrap(make_env: Callable[[], Any], shots: int) -> Callable[[], Any]:
  """make_env itself for shots=0, else a factory of FewShotEnv with `shots` examples, built
  once here."""
  if shots == 0:
    return make_env
  return functools.partial(_build, make_env, examples(make_env, shots))
