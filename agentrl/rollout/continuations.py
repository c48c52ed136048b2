"""Continuations of given token contexts through the rollout engine.

  trajs, metrics = continuations.sample_continuations(engine, params, tok, contexts,
                                                      rng=key, max_new_tokens=64)
  groups = continuations.replay_then_rollout(engine, params, tok, make_env, seeds, actions,
                                             group_size=8, rng=key, max_turns=7, ...)

Token in, token out: a context (a list of ids) becomes one single-turn episode of
`Engine.run` through a tokenizer view whose encode(str(i)) is the i-th context, so nothing is
decoded and re-encoded. Used by the rollout wrappers that restart from token contexts
(rollout/anytime.py, rollout/delethink.py).

`replay_then_rollout` plays given actions (an expert's first turns: TCOD-b2f,
experiments/distill/opd_agent.py) on each episode, then lets the policy play the rest of it:
the replayed turns are rendered by `agent_loop.scripted`, so they lay out as a rollout that
sampled them would, and enter the episode as its prompt (loss_mask 0, turn -1).
"""
from typing import Any, Callable, Sequence

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


class _ReplayTokenizer:
  """A tokenizer view that encodes a registered key as its replayed prefix ids (and renders a
  chat prompt whose last message is a key as the key itself); any other text as `tok`."""

  def __init__(self, tok):
    self._tok, self.prefixes = tok, {}

  def encode(self, text: str, **kwargs) -> list[int]:
    if text in self.prefixes:
      return list(self.prefixes[text])
    return self._tok.encode(text, **kwargs)

  def apply_chat_template(self, messages, **kwargs):
    if messages and messages[-1]["content"] in self.prefixes:
      return messages[-1]["content"]
    return self._tok.apply_chat_template(messages, **kwargs)

  def __getattr__(self, name):
    return getattr(self._tok, name)


class _ReplayEnv:
  """`env` whose reset(seed) replays `actions` and answers with a key the tokenizer view
  encodes as the replayed transcript (prompt, actions, replies, the last reply included)."""
  system_prompt = ""   # rendered inside the replayed prefix already
  examples = ()

  def __init__(self, env, actions, tok, view: _ReplayTokenizer, key: str, **render):
    self.env, self.actions, self.tok, self.view = env, actions, tok, view
    self.key, self.render, self.prefix = key, render, None

  @property
  def max_turns(self) -> int:
    return getattr(self.env, "max_turns", 1)

  def reset(self, seed) -> str:
    self.prefix = agent_loop.scripted(self.tok, self.env, seed, self.actions, observe_last=True,
                                      **self.render)
    if self.prefix.done:
      raise ValueError(f"the {len(self.actions)} replayed actions ended the episode of seed "
                       f"{seed}; replay fewer so that the policy has a turn to play")
    self.view.prefixes[self.key] = self.prefix.tokens
    return self.key

  def step(self, action: str):
    return self.env.step(action)

  def __getattr__(self, name):
    return getattr(self.env, name)


def replay_then_rollout(engine, params, tok, make_env: Callable[[], Any], seeds: Sequence[Any],
                        actions: Sequence[Sequence[str]], *, group_size: int,
                        chat_template: bool, system_prompt: str | None = None,
                        **run_kwargs) -> agent_loop.GroupRollout:
  """G rollouts per seed (rows [i*G, (i+1)*G) share seeds[i]), each starting after
  `actions[i]` were played on its episode (none: a plain rollout).

  Token in, token out: the replayed prefix (`agent_loop.scripted(..., observe_last=True)`) is
  the row's prompt (loss_mask 0, turn -1), followed by the policy's turns (turn 0 on) exactly
  as `Engine.run` samples them. Each trajectory's turn_rewards and infos start with the
  replayed turns', so its reward and success are the whole episode's. run_kwargs go to
  `Engine.run` (rng, max_turns, max_new_tokens, max_len, temperature, ...); the env's own turn
  limit counts the replayed turns. Metric: rollout/replayed_turns_mean.
  """
  if len(actions) != len(seeds):
    raise ValueError(f"got {len(actions)} action lists for {len(seeds)} seeds; pass one each.")
  view = _ReplayTokenizer(tok)
  row_seeds = [s for s in seeds for _ in range(group_size)]
  envs = [_ReplayEnv(make_env(), list(actions[i // group_size]), tok, view, f"\x00replay{i}\x00",
                     chat_template=chat_template, system_prompt=system_prompt)
          for i in range(len(row_seeds))]
  trajs, metrics = engine.run(params, view, envs, row_seeds, chat_template=chat_template,
                              system_prompt=system_prompt, **run_kwargs)
  for traj, env in zip(trajs, envs):
    if env.prefix is not None:   # None: the reset failed (counted in env/env_errors)
      traj.turn_rewards = list(env.prefix.turn_rewards) + traj.turn_rewards
      traj.infos = list(env.prefix.infos) + traj.infos
      traj.reward = float(sum(traj.turn_rewards))
  metrics.update(agent_loop.summarize(trajs))
  metrics["rollout/replayed_turns_mean"] = float(
      sum(len(actions[i // group_size]) for i in range(len(trajs))) / max(len(trajs), 1))
  return agent_loop.GroupRollout(trajs, None, metrics)
