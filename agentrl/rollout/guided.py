# pylint: disable=invalid-name
"""Guided sampling, original-context training (docs/algorithms.md §17): some rows of each group
are sampled under a modified first prompt (a hint, demonstrations, the gold answer, a purified
instruction) and stored under the ORIGINAL prompt, their sampled tokens spliced after it.

  rollout = guided.guided_rollout(engine, params, tok, make_env, seeds, rewrite=add_demos,
                                  num_guided=2, rng=key, group_size=8, max_turns=1,
                                  max_new_tokens=6, max_len=64, temperature=1.0,
                                  chat_template=False)

Rows [i*G, (i+1)*G) share seeds[i]: the first G − k are sampled under the original prompt, the
last k under `rewrite`'s. Every row's tokens start with the original prompt, so the score step
computes the trainer's log-probs under the original context; a guided row's `sampler_logp`
stays the sampler's, under the guided one (the behaviour policy of its importance weight,
agentrl/losses/guided.py). `extras["guided_B"]` flags the guided rows.
"""
from collections.abc import Callable, Sequence
import dataclasses
from typing import Any

import jax
import numpy as np

from agentrl.rollout import agent_loop
from agentrl.rollout import collect
from agentrl.rollout import pack as pack_lib


class GuidedEnv:
  """`env` whose first observation is `rewrite(obs, seed)` (few-shot `examples` replaced when
  given); steps, rewards and every other attribute are env's."""

  def __init__(self, env: Any, rewrite: Callable[[str, Any], str], examples=None):
    self.env, self.rewrite = env, rewrite
    self.examples = tuple(getattr(env, "examples", ()) if examples is None else examples)

  def reset(self, seed):
    return self.rewrite(self.env.reset(seed), seed)

  def step(self, action):
    return self.env.step(action)

  def __getattr__(self, name):
    return getattr(self.env, name)


def solved_example(make_env: Callable[[], Any], seed, answer_prefix: str = "") -> str:
  """seed's first observation, `answer_prefix`, then its gold answer (the env's
  `info["target"]`, which the single-turn envs report on every step): one demonstration."""
  env = make_env()
  obs = env.reset(seed)
  info = env.step("")[3]
  close = getattr(env, "close", None)
  if callable(close):
    close()
  if "target" not in info:
    raise ValueError(f"{type(env).__name__} reports no info['target'] (its gold answer), so "
                     "its tasks cannot be shown solved; use a single-turn task that does.")
  return obs + answer_prefix + str(info["target"])


def demonstration_rewrite(make_env: Callable[[], Any], *, shots: int, seed_base: int,
                          sep: str = "", answer_prefix: str = "",
                          gold: bool = False) -> Callable[[str, Any], str]:
  """rewrite(obs, seed) for `GuidedEnv`: `shots` solved tasks of seeds seed_base, seed_base +
  1, ... (ICPO's demonstrations from the training data, D in x̃ = [D; q]; `solved_example`
  with `answer_prefix`), each followed by `sep`, then the task; with `gold` the task itself
  solved comes last before it (the gold answer as privileged context, the teacher's view of
  OPSD and KEPO)."""
  if shots < 0 or (shots == 0 and not gold):
    raise ValueError(f"shots must be >= 1 (or >= 0 with gold=True); got {shots}.")
  demos = "".join(solved_example(make_env, seed_base + j, answer_prefix) + sep
                  for j in range(shots))

  def rewrite(obs: str, seed) -> str:
    return demos + (solved_example(make_env, seed, answer_prefix) + sep if gold else "") + obs

  return rewrite


def original_prompt(make_env: Callable[[], Any], seed, tok, *, chat_template: bool,
                    system_prompt: str | None = None) -> list[int]:
  """Ids of seed's first prompt as an unguided row renders it (`agent_loop.Renderer.prompt`)."""
  env = make_env()
  render = agent_loop.Renderer(tok, chat_template=chat_template, system_prompt=system_prompt)
  ids = render.prompt(env.reset(seed), env.system_prompt, getattr(env, "examples", ()))
  close = getattr(env, "close", None)
  if callable(close):
    close()
  return ids


def reprompt(traj: agent_loop.Trajectory, prompt_ids: Sequence[int]) -> agent_loop.Trajectory:
  """`traj` with its first prompt (its `prompt_len` ids) replaced by `prompt_ids`.

  Everything after the first prompt (sampled turns, observations) is copied unchanged with its
  loss mask, turn index and sampler log-probs; the new prompt has loss mask 0, turn −1 and
  log-prob 0, as a prompt has. Recorded alternatives are spliced the same way (zeros on the
  prompt). Branches (`parent` ≥ 0) are refused: their shared prefix would no longer match.
  """
  if traj.parent >= 0 or traj.fork_at:
    raise ValueError("reprompt needs a root trajectory (parent -1, fork_at 0); guided rows "
                     "cannot be branched.")
  n, p = len(prompt_ids), traj.prompt_len

  def splice(x, fill):
    head = np.full((n,) + x.shape[1:], fill, x.dtype)
    return np.concatenate([head, x[p:]])

  alt = alt_logp = None
  if traj.alternatives is not None:
    alt, alt_logp = splice(traj.alternatives, 0), splice(traj.alternative_logp, 0.0)
  return dataclasses.replace(
      traj, tokens=np.concatenate([np.asarray(prompt_ids, traj.tokens.dtype), traj.tokens[p:]]),
      loss_mask=splice(traj.loss_mask, 0.0), turn=splice(traj.turn, -1),
      sampler_logp=splice(traj.sampler_logp, 0.0), prompt_len=n, alternatives=alt,
      alternative_logp=alt_logp)


def group_layout(plain: Sequence[Any], guided: Sequence[Any], num_prompts: int) -> list[Any]:
  """Per prompt i: its plain rows, then its guided rows (each list holds P equal blocks)."""
  if len(plain) % num_prompts or len(guided) % num_prompts:
    raise ValueError(f"{len(plain)} plain and {len(guided)} guided rows do not split into "
                     f"{num_prompts} prompts.")
  a, b = len(plain) // num_prompts, len(guided) // num_prompts
  out = []
  for i in range(num_prompts):
    out += list(plain[i * a:(i + 1) * a]) + list(guided[i * b:(i + 1) * b])
  return out


def guided_rollout(engine, params, tok, make_env: Callable[[], Any], seeds: Sequence[Any], *,
                   rewrite: Callable[[str, Any], str], num_guided: int, rng: jax.Array,
                   group_size: int, max_turns: int, max_new_tokens: int, max_len: int,
                   temperature: float, chat_template: bool, examples=None,
                   system_prompt: str | None = None, min_len: int = 16, per_octave: int = 1,
                   sharding=None, **sample_kwargs) -> collect.Rollout:
  """G rows per seed, the last `num_guided` sampled under `GuidedEnv(env, rewrite, examples)`
  and stored under the original prompt (`reprompt`); one engine run, packed like
  `collect.env_rollout`. Extras: `guided_B` (f32, 1 on guided rows). Host metrics add
  rollout/guided_reward and rollout/plain_reward (mean reward of each kind; 0 with none)."""
  if not 0 <= num_guided <= group_size:
    raise ValueError(f"num_guided must be in [0, group_size={group_size}], got {num_guided}.")
  plain_n, P = group_size - num_guided, len(seeds)
  row_seeds = [s for s in seeds for _ in range(plain_n)]
  guided_seeds = [s for s in seeds for _ in range(num_guided)]
  envs = ([make_env() for _ in row_seeds]
          + [GuidedEnv(make_env(), rewrite, examples) for _ in guided_seeds])
  trajs, metrics = engine.run(params, tok, envs, row_seeds + guided_seeds, rng=rng,
                              max_turns=max_turns, max_new_tokens=max_new_tokens,
                              max_len=max_len, temperature=temperature,
                              chat_template=chat_template, system_prompt=system_prompt,
                              **sample_kwargs)
  prompts = {i: original_prompt(make_env, s, tok, chat_template=chat_template,
                                system_prompt=system_prompt) for i, s in enumerate(seeds)}
  plain = trajs[:len(row_seeds)]
  guided = [reprompt(t, prompts[j // max(num_guided, 1)])
            for j, t in enumerate(trajs[len(row_seeds):])]
  rows = group_layout(plain, guided, P)
  flags = group_layout([0.0] * len(plain), [1.0] * len(guided), P)
  batch = pack_lib.pack(rows, max_len=max_len, pad_id=tok.pad_id, min_len=min_len,
                        per_octave=per_octave, sharding=sharding)
  host = {**metrics, **agent_loop.summarize(rows), **collect.rollout_metrics(rows),
          **collect.batch_metrics(rows, batch),
          "rollout/guided_reward": float(np.mean([t.reward for t in guided])) if guided else 0.0,
          "rollout/plain_reward": float(np.mean([t.reward for t in plain])) if plain else 0.0}
  extras = {"guided_B": jax.device_put(np.asarray(flags, np.float32), sharding)}
  return collect.Rollout(batch=batch, metrics=host, extras=extras,
                         lengths_B=collect.row_lengths(rows, batch), trajectories=rows,
                         tokenizer=tok)
