"""Forking an env mid-episode, for branching rollouts: n envs in the state of one.

  fork.check(env)                                   # "clone" | "replay", or NotForkable
  branch = fork.fork_env(env, seed=seed, actions=actions)   # a new env in env's state
  branch.step(next_action)                          # as env.step(next_action) would answer

`env` was reset with `seed` and has since been stepped with `actions` (every action of its
episode, in order). The fork is a new, independent env object in env's state (envs/base.py,
"Forking"): stepped with the same actions, env and the fork give the same observations,
rewards, done and infos, and stepping one never changes the other. The fork is made by

  clone   the innermost env's `clone()`: a copy of its state (seed and actions are not read);
  replay  a new innermost env (`fresh()`, else a `clone()`) reset with `seed` and stepped with
          `actions`; it may take long (a TextWorld replay starts its game, an IsolatedEnv's
          starts a worker process), so run it where an env call may block.

and the wrappers around it (SafeEnv, BudgetEnv, FewShotEnv: anything with `env` and
`rewrap`) are copied around the fork with their own state, so a SafeEnv's turn count, done
flag and counters carry over; a replay then runs through them, so their episode state is that
of the replayed prefix (a fork may go back to any earlier point: `actions` need not be all of
the episode's) and their counters also count the replayed steps (read counters as deltas,
as `agent_loop.env_metrics` does). `fork_env` picks clone when the env has it, else replay; an env
with neither (no clone() and no fresh(), or replayable = False without clone()) is refused by
`check` and `fork_env` with NotForkable, a ValueError naming its class and what to give it.

A fork of an env that was never reset (seed=None, no actions) has no episode open; a fork of
a finished episode is finished (its steps return `base.outside_episode()`, or SafeEnv's error
result). A replay whose reset or step raises, or whose episode ends before its last action
(the actions are not one episode of this seed, or the env is not deterministic), raises
ReplayError naming the action.
"""
from collections.abc import Sequence
from typing import Any

CLONE, REPLAY = "clone", "replay"
MODES = (CLONE, REPLAY)


class NotForkable(ValueError):
  """The env can neither copy its state nor be replayed (module docstring)."""


class ReplayError(RuntimeError):
  """Replaying an episode's actions on a new env failed or ended the episode early."""


def layers(env: Any) -> tuple[list[Any], Any]:
  """(the wrappers around the innermost env, outermost first; the innermost env)."""
  wrappers = []
  while callable(getattr(env, "rewrap", None)) and hasattr(env, "env"):
    wrappers.append(env)
    env = env.env
  return wrappers, env


def _callable(env: Any, name: str) -> bool:
  return callable(getattr(env, name, None))


def _replayable(env: Any) -> bool:
  """No layer of `env` says it is not deterministic in (seed, actions)."""
  wrappers, core = layers(env)
  return all(bool(getattr(e, "replayable", True)) for e in (*wrappers, core))


def modes(env: Any) -> tuple[str, ...]:
  """The ways `env` can be forked, preferred first: a subset of MODES, in that order."""
  core = layers(env)[1]
  clone = _callable(core, "clone")
  replay = _replayable(env) and (clone or _callable(core, "fresh"))
  return tuple(m for m, ok in ((CLONE, clone), (REPLAY, replay)) if ok)


def mode(env: Any) -> str:
  """How `fork_env` forks `env`: "clone", "replay", or "" when it cannot."""
  return next(iter(modes(env)), "")


def can_fork(env: Any) -> bool:
  return bool(modes(env))


def _name(env: Any) -> str:
  """"SafeEnv(BudgetEnv(MyEnv))": the classes from the outermost to the innermost env."""
  wrappers, core = layers(env)
  return "".join(f"{type(w).__name__}(" for w in wrappers) + type(core).__name__ + (
      ")" * len(wrappers))


def check(env: Any, how: str | None = None) -> str:
  """The mode `fork_env(env, how=how)` uses; NotForkable, one line saying what to add, if
  there is none (`how`: None for the preferred mode, or one of MODES)."""
  if how is not None and how not in MODES:
    raise ValueError(f"how={how!r} must be None or one of {MODES}.")
  available = modes(env)
  if how in available or (how is None and available):
    return how or available[0]
  core, name = type(layers(env)[1]).__name__, _name(env)
  if how == CLONE and available:
    raise NotForkable(f"{name} cannot be forked by clone: {core} has no clone(); fork it by "
                      "replay (how=None or 'replay').")
  if how == REPLAY and available:
    raise NotForkable(f"{name} cannot be forked by replay: it is not replayable (replayable = "
                      "False); fork it by clone (how=None or 'clone').")
  if not _replayable(env):
    raise NotForkable(f"{name} cannot be forked for branching: it is not replayable "
                      f"(replayable = False) and {core} has no clone(); give it "
                      "clone() -> a new env in the same state (envs/base.py, \"Forking\").")
  raise NotForkable(f"{name} cannot be forked for branching: give {core} "
                    "clone() (a new env in the same state) or fresh() (a new env with no "
                    "episode, replayed from the seed and actions); envs/base.py, \"Forking\".")


def _replay(env: Any, name: str, seed: int | None, actions: Sequence[str]) -> Any:
  """`env` (a new env, no episode) reset with `seed` and stepped with `actions`."""
  if seed is None:
    return env
  where = f"replaying {name}'s episode of seed {seed}"
  try:
    env.reset(seed)
  except Exception as e:  # pylint: disable=broad-except
    raise ReplayError(f"{where}: reset raised {type(e).__name__}: {e}") from e
  if getattr(env, "reset_error", ""):   # a SafeEnv's reset reports instead of raising
    raise ReplayError(f"{where}: reset failed: {env.reset_error}")
  for i, action in enumerate(actions):
    try:
      done = env.step(action)[2]
    except Exception as e:  # pylint: disable=broad-except
      raise ReplayError(f"{where}: action {i} of {len(actions)} raised "
                        f"{type(e).__name__}: {e}") from e
    if done and i < len(actions) - 1:
      raise ReplayError(f"{where}: the episode ended at action {i} of {len(actions)}; the "
                        "actions are not one episode of this seed, or the env is not "
                        "deterministic in (seed, actions).")
  return env


def fork_env(env: Any, *, seed: int | None, actions: Sequence[str] = (),
             how: str | None = None) -> Any:
  """A new env in `env`'s state (module docstring); may block (a replay).

  Args:
    env: the env to fork, wrapped or not; not in use by another thread during the call.
    seed: the seed of env's last reset; None if it was never reset.
    actions: the actions env was stepped with since that reset, in order: all of them for
      a clone (which does not read them), or the first k for a replay to the state after k
      steps.
    how: None (clone if the env has it, else replay) or one of MODES.
  """
  if seed is None and actions:
    raise ValueError(f"seed=None means env was never reset, so it has no actions; got "
                     f"{len(actions)}.")
  how = check(env, how)
  wrappers, core = layers(env)
  if how == CLONE:
    branch = core.clone()
  else:
    branch = core.fresh() if _callable(core, "fresh") else core.clone()
  for wrapper in reversed(wrappers):
    branch = wrapper.rewrap(branch)
  if how == CLONE:
    return branch
  # The replay runs through the wrappers, so their episode state (a SafeEnv's turn count and
  # done flag, a budget) is the replayed prefix's, not the source's now: a fork may go back
  # to any earlier point of the episode.
  return _replay(branch, type(core).__name__, seed, list(actions))
