"""Branching rollouts: what a brancher sees and asks for, and the tree links of the result.

  def brancher(point: ForkPoint) -> list[Fork]:
    if point.kind == "sampled" and point.depth == 0:
      return [Fork(at=point.turn_start, n=3)]       # 3 more samples of this turn
    return []
  trajs, metrics = engine.run(params, tok, envs, seeds, brancher=brancher, ...)

`Engine.run` calls the brancher at three points of every episode (`KINDS`), on the engine's
thread while the episode's env is idle:

  sampled   a model turn has been sampled (its tokens are in the transcript), the env has not
            stepped on it yet;
  stepped   the env's reply has been appended and the episode goes on;
  finished  the episode ended (done, truncated or an env failure).

A `Fork(at, n)` starts n new episodes that keep the first `at` tokens of this transcript and
sample token `at` onwards themselves: `at` is the index of a sampled token (`loss_mask` 1),
or, at a "stepped" point, the transcript's length (the next turn's first token). A branch's
env is in the state the source env had when token `at` was sampled (after the env steps of
the turns before it): cloned from the source env when that is its current state (`clone()`),
replayed from the episode's seed and actions otherwise (envs/fork.py). A branch is an episode
like any other: it may fork in turn, and it ends on its own.

The prefix is not prefilled again: the branch's cache row is a copy of the first at - 1
cached tokens of a row that holds them (in place when the source's slot is free), so only
what follows is prefilled; with no such row left (the source's row was compacted away or
reused) the branch prefills its prefix, with the same result.

Sampling keys. A root episode e draws with fold_in(rng, e) (engine.py); the j-th branch made
from episode p (counting every Fork of p, in the order the brancher returned them) draws with
fold_in(fold_in(key(p), at), j). A branch's draws therefore depend only on its path from the
root, never on slots, env latency or completion order.
"""
import dataclasses
import functools

import jax
import numpy as np

from agentrl.rollout import agent_loop

KINDS = ("sampled", "stepped", "finished")


@dataclasses.dataclass(frozen=True)
class Fork:
  """n new branches that keep the first `at` tokens of the transcript (module doc); `token`:
  their token `at` is this id instead of a draw (LATR's forced alternative), its log-prob
  recorded as a sampled token's."""
  at: int
  n: int = 1
  token: int | None = None


@dataclasses.dataclass(frozen=True)
class ForkPoint:
  """An episode at one of the points a brancher is called (module doc)."""
  kind: str            # one of KINDS
  episode: int         # the row's index in this run (roots first; see `order`)
  root: int            # the root episode of its tree
  depth: int           # forks between the root and this episode (0: a root)
  turn: int            # the model turn just sampled ("sampled") or the turns done otherwise
  turn_start: int      # index of the first token of the current model turn ("sampled")
  trajectory: agent_loop.Trajectory   # the transcript so far (parent and fork_at as run-local)


def check_forks(point: ForkPoint, forks) -> list[Fork]:
  """The brancher's answer as a list of Forks; ValueError naming the bad one otherwise."""
  traj = point.trajectory
  out = []
  for fork in forks:
    if not isinstance(fork, Fork) or not isinstance(fork.at, (int, np.integer)) \
        or not isinstance(fork.n, (int, np.integer)) or fork.n < 1 \
        or not (fork.token is None or isinstance(fork.token, (int, np.integer))):
      raise ValueError(f"the brancher returned {fork!r} at a {point.kind!r} point of episode "
                       f"{point.episode}; return branching.Fork(at=<int>, n=<int >= 1>) items.")
    at_turn_start = point.kind == "stepped" and fork.at == len(traj.tokens)
    sampled = 0 <= fork.at < len(traj.tokens) and traj.loss_mask[fork.at] > 0
    if not (sampled or at_turn_start):
      raise ValueError(
          f"Fork(at={fork.at}) at a {point.kind!r} point of episode {point.episode}: `at` must "
          f"index a sampled token (loss_mask 1) of its {len(traj.tokens)} tokens, or, at a "
          f"'stepped' point, equal the transcript's length.")
    out.append(Fork(int(fork.at), int(fork.n), None if fork.token is None else int(fork.token)))
  return out


def env_steps_before(traj: agent_loop.Trajectory, at: int) -> int:
  """How many env steps the state at token `at` comes after: the turns completed before it."""
  return int(traj.turn[at]) if at < len(traj.tokens) else len(traj.turn_rewards)


def turn_start(traj: agent_loop.Trajectory, at: int) -> int:
  """Index of the first sampled token of the model turn that token `at` belongs to (`at`
  itself when the turn has not started)."""
  if at >= len(traj.tokens):
    return at
  same = (traj.turn[:at] == traj.turn[at]) & (traj.loss_mask[:at] > 0)
  first = at
  while first > 0 and same[first - 1]:
    first -= 1
  return first


@functools.partial(jax.jit, static_argnames="impl")
def branch_key_data(parent_key_data, at, j, *, impl):
  """The key data of the j-th branch of an episode made at token `at` (module doc); `impl` is
  the run's `jax.random.key_impl`."""
  key = jax.random.wrap_key_data(parent_key_data, impl=impl)
  return jax.random.key_data(jax.random.fold_in(jax.random.fold_in(key, at), j))


def order(paths: list[tuple]) -> list[int]:
  """The output order of a run's rows: the roots in the given order, then the branches by
  their paths (root, (at, j), ...), so the order never depends on scheduling."""
  return sorted(range(len(paths)), key=lambda i: (len(paths[i]) > 1, paths[i]))
