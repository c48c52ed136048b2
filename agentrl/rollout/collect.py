# pylint: disable=invalid-name
"""From trajectories to what the loop trains on: a packed device Batch and the step's host
metrics (`Rollout`, the return value of every `loop.run` rollout_fn).

  rollout = collect.env_rollout(engine, params, tok, make_env, seeds, rng=key, group_size=8,
                                max_turns=1, max_new_tokens=6, max_len=16, temperature=1.0,
                                chat_template=False)

`env_rollout` runs G episodes per seed through `agent_loop.rollout_groups` and packs them; the
metric helpers are shared by the rollouts that collect trajectories their own way (relabelled
rewards, dynamic sampling, chunked traces).
"""
from collections.abc import Callable, Sequence
import dataclasses
from typing import Any

import jax
import numpy as np

from agentrl.rollout import agent_loop
from agentrl.rollout import branching
from agentrl.rollout import pack as pack_lib
from agentrl import types


@dataclasses.dataclass
class Rollout:
  """What one rollout hands to the device side."""
  batch: types.Batch                       # device arrays; rows [i*G, (i+1)*G) share a prompt
  metrics: dict[str, float]                # host scalars: reward, success, lengths, env counters
  extras: dict[str, Any] = dataclasses.field(default_factory=dict)  # e.g. greedy_reward_B
  lengths_B: np.ndarray | None = None      # host: real tokens per row (length-sorted updates)
  # For the trajectory records (agentrl/records/trajectories.py): the host trajectories, one
  # per batch row in order (their turn rewards, infos, branches), and the tokenizer whose
  # decode gives each token's text. Records of a rollout without them hold ids and numbers.
  trajectories: Sequence[agent_loop.Trajectory] | None = None
  tokenizer: Any = None


def trajectory_success(traj: agent_loop.Trajectory) -> bool:
  """Whether any env step of the trajectory reported success (envs/base.py info contract)."""
  return any(bool(info.get("success")) for info in traj.infos)


# A model turn is repetitive when more than half of its 4-grams repeat an earlier one of the
# turn [INF]. Only turns of at least 2n tokens are judged: a shorter one (a guess, a command)
# has too few n-grams for the rate to mean anything.
REPETITION_N = 4
REPETITION_THRESHOLD = 0.5


def repeated_ngram_rate(ids: np.ndarray, n: int) -> float:
  """rep-n = 1 - distinct n-grams / total n-grams of a token sequence (0 with no n-gram)."""
  ids = np.asarray(ids)
  if len(ids) < n:
    return 0.0
  grams = np.lib.stride_tricks.sliding_window_view(ids, n)
  return 1.0 - len(np.unique(grams, axis=0)) / len(grams)


def repetitive_turn_fraction(turns: Sequence[np.ndarray], *, n: int = REPETITION_N,
                             threshold: float = REPETITION_THRESHOLD) -> float:
  """Fraction of the turns of at least 2n tokens whose rep-n exceeds `threshold` (0 with none)."""
  rates = [repeated_ngram_rate(ids, n) for ids in turns if len(ids) >= 2 * n]
  return float(np.mean([rate > threshold for rate in rates])) if rates else 0.0


def own_turns(traj: agent_loop.Trajectory) -> list[np.ndarray]:
  """The sampled ids of each model turn the trajectory sampled itself: a branch's turns with a
  sampled token at or after fork_at, each whole (the turn it forked inside included)."""
  sampled = traj.loss_mask > 0
  turns = np.unique(traj.turn[traj.fork_at:][sampled[traj.fork_at:]])
  return [traj.tokens[sampled & (traj.turn == u)] for u in turns]


def own_infos(traj: agent_loop.Trajectory) -> list[dict]:
  """The env infos of the steps the trajectory took itself (a branch shares the steps its
  parent completed before fork_at)."""
  return traj.infos[branching.env_steps_before(traj, traj.fork_at) if traj.fork_at else 0:]


def rollout_metrics(trajs: Sequence[agent_loop.Trajectory]) -> dict[str, float]:
  """The host metrics every rollout logs: mean reward, success rate, sampled tokens, the
  fraction of repetitive model turns (`repetitive_turn_fraction`) and the fraction of env steps
  that reported an error (info["error"] non-empty: the complement of `episode_metrics`'
  valid_turns; 0 with no env step). Tokens, turns and env steps are each a branch's own: the
  prefix it shares with its parent was sampled and stepped once, by the parent."""
  infos = [info for t in trajs for info in own_infos(t)]
  return {"reward": float(np.mean([t.reward for t in trajs])),
          "success": float(np.mean([trajectory_success(t) for t in trajs])),
          "rollout/sampled_tokens": float(sum(t.loss_mask[t.fork_at:].sum() for t in trajs)),
          "rollout/repetition": repetitive_turn_fraction([u for t in trajs for u in own_turns(t)]),
          "rollout/invalid_turns": float(np.mean([bool(info.get("error")) for info in infos]))
                                   if infos else 0.0}


def episode_metrics(trajs: Sequence[agent_loop.Trajectory]) -> dict[str, float]:
  """Success, model turns per episode, and the fraction of model turns the env accepted
  (info["error"] empty: a well-formed tool call, command or answer) of a set of episodes."""
  infos = [info for t in trajs for info in t.infos]
  return {"success": float(np.mean([trajectory_success(t) for t in trajs])),
          "turns": float(np.mean([len(t.turn_rewards) for t in trajs])),
          "valid_turns": float(np.mean([not info.get("error") for info in infos]))
                         if infos else 0.0}


def batch_metrics(trajs: Sequence[agent_loop.Trajectory], batch: types.Batch) -> dict[str, float]:
  """Real (non-padding) tokens of the packed batch of `trajs`, and the padding fraction."""
  B, T = batch.tokens_BT.shape
  real = float(row_lengths(trajs, batch).sum())
  return {"rollout/batch_tokens": real, "rollout/pad_frac": 1.0 - real / (B * T)}


def row_lengths(trajs: Sequence[agent_loop.Trajectory], batch: types.Batch) -> np.ndarray:
  """Host [B] real (non-padding) tokens of each packed row: `Rollout.lengths_B`."""
  return np.asarray([min(len(t.tokens), batch.tokens_BT.shape[1]) for t in trajs], np.int32)


def env_rollout(engine, params, tok, make_env: Callable[[], Any], seeds: Sequence[Any], *,
                rng: jax.Array, group_size: int, max_turns: int, max_new_tokens: int,
                max_len: int, temperature: float, chat_template: bool,
                greedy_baseline: bool = False, min_len: int = 16, per_octave: int = 1,
                sharding=None,
                **sample_kwargs) -> Rollout:
  """G rollouts per seed through `agent_loop.rollout_groups`, packed into a device Batch.

  Rewards are the envs' (sum of per-turn rewards). With `greedy_baseline` the extras hold
  `greedy_reward_B` (one greedy rollout per prompt, repeated over its group) for ReMax.
  """
  groups = agent_loop.rollout_groups(
      engine, params, tok, make_env, seeds, group_size=group_size,
      greedy_baseline=greedy_baseline, rng=rng, max_turns=max_turns,
      max_new_tokens=max_new_tokens, max_len=max_len, temperature=temperature,
      chat_template=chat_template, **sample_kwargs)
  trajs = groups.trajectories
  batch = pack_lib.pack(trajs, max_len=max_len, pad_id=tok.pad_id, min_len=min_len,
                        per_octave=per_octave, sharding=sharding)
  host = {**groups.metrics, **rollout_metrics(trajs), **batch_metrics(trajs, batch)}
  extras = {}
  if greedy_baseline:
    greedy_B = np.repeat([t.reward for t in groups.baseline], group_size).astype(np.float32)
    extras["greedy_reward_B"] = jax.device_put(greedy_B, sharding)
  return Rollout(batch=batch, metrics=host, extras=extras, lengths_B=row_lengths(trajs, batch),
                 trajectories=trajs, tokenizer=tok)
