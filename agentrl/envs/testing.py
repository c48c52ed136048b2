"""Test helpers: the env contract's checks, and envs that misbehave on purpose.

`assert_env_contract` checks the episode and seed contract of `agentrl.envs.base` on any env
(base_test.py runs it on every registered env, each env's test on its own).
`ToyEnv` echoes its actions; a few actions make it hang, crash or fail the way a game engine
can. `RawGameEnv` sends actions to a TextWorld game with no sanitizing, to reproduce the
engine's own hangs and crashes. Both are importable by an isolated.IsolatedEnv worker.
"""
from collections.abc import Callable
import ctypes
import os
import time

import numpy as np

from agentrl.envs import base

# Seeds every env must refuse with ValueError: negative (not an alias of a positive seed), out
# of range, None (not "random"), and the types that would silently alias an int seed.
BAD_SEEDS = (-1, -7, base.SEED_LIMIT, None, "3", 3.0, True, np.float64(3.0))
HANG_SEED = 999_999_999  # ToyEnv.reset sleeps on it


def assert_no_episode(test, env, action: str) -> None:
  """`env.step(action)` outside an episode: the error result (reward 0, done), no raise."""
  obs, reward, done, info = env.step(action)
  test.assertEqual((reward, done, info[base.REWARD]), (0.0, True, 0.0), (obs, info))
  test.assertTrue(info[base.ERROR], info)
  test.assertFalse(info[base.SUCCESS], info)
  test.assertIsInstance(obs, str)


def _play(env, seed: int, action: str) -> base.Info:
  """Plays `action` from reset(seed) until done (at most max_turns); the last info."""
  env.reset(seed)
  for _ in range(env.max_turns):
    _, _, done, info = env.step(action)
    if done:
      return info
  raise AssertionError(f"{type(env).__name__} not done after max_turns={env.max_turns}")


def assert_env_contract(test, env, *, action: str,
                        answer: Callable[[base.Env, base.Info], str] | None = None,
                        seed: int = 0) -> None:
  """Asserts the episode and seed contract of agentrl/envs/base.py on `env`.

  Args:
    test: the running unittest.TestCase.
    env: the env, fresh (never reset).
    action: an action the env accepts; played from reset until the episode ends.
    answer: (env, info of that episode's last step) -> the correct final action. It must pay
      a positive reward from reset(seed), and nothing once the episode is over.
    seed: a seed whose episode `action` ends within env.max_turns.
  """
  assert_no_episode(test, env, action)  # before any reset
  for bad in BAD_SEEDS:
    with test.assertRaisesRegex(ValueError, "seed", msg=repr(bad)):
      env.reset(bad)
  assert_no_episode(test, env, action)  # failed resets open no episode
  first = env.reset(seed)
  test.assertEqual(env.reset(np.int64(seed)), first)  # numpy integers are seeds
  info = _play(env, seed, action)
  correct = action if answer is None else answer(env, info)
  assert_no_episode(test, env, correct)  # after done, even the correct answer pays nothing
  assert_no_episode(test, env, correct)
  if answer is not None:
    env.reset(seed)
    test.assertGreater(env.step(correct)[1], 0.0, "answer() must be the correct action")
  env.reset(seed)  # an open episode ...
  with test.assertRaisesRegex(ValueError, "seed"):
    env.reset(-1)
  assert_no_episode(test, env, correct)  # ... is closed by a failed reset


class ToyEnv:
  """reset(seed) -> "start <seed> in <pid>"; step(action) -> "echo <action>".

  reset(HANG_SEED) sleeps forever. Actions: "win" (reward 1, done), "hang" (sleeps forever),
  "spin" (a busy loop), "segfault" (reads address 0), "exit" (os._exit(139)), "raise"
  (ValueError), "print N" (writes N bytes to stderr, then echoes). It keeps no episode and
  takes any seed, so a wrapper that keeps the contract (IsolatedEnv, BudgetEnv) is tested on
  its own.
  """

  system_prompt = "Say win."

  def __init__(self, max_turns: int = 5, fail: bool = False):
    if fail:
      raise ValueError("ToyEnv was told to fail")
    self.max_turns = max_turns

  def reset(self, seed: int) -> str:
    if seed == HANG_SEED:
      time.sleep(3600)
    return f"start {seed} in {os.getpid()}"

  def step(self, action: str) -> base.StepResult:
    if action == "hang":
      time.sleep(3600)
    elif action == "spin":
      while True:
        pass
    elif action == "segfault":
      ctypes.string_at(0)
    elif action == "exit":
      os._exit(139)  # the standard library's exit without cleanup: a worker that just dies
    elif action == "raise":
      raise ValueError("toy failure")
    elif action.startswith("print "):
      os.write(2, b"x" * int(action.split()[1]))
    win = action == "win"
    return f"echo {action}", float(win), win, base.make_info(reward=float(win), success=win)


class RawGameEnv:
  """A TextWorld game (.z8) that receives every action verbatim: no parsing, no sanitizing."""

  system_prompt = ""
  max_turns = 10

  def __init__(self, game_file: str):
    self.game_file = game_file
    self._game = None

  def reset(self, seed: int) -> str:
    del seed
    import textworld  # pylint: disable=g-import-not-at-top
    self._game = self._game or textworld.start(self.game_file)
    return self._game.reset().feedback

  def step(self, action: str) -> base.StepResult:
    state, score, done = self._game.step(action)
    del score
    return state.feedback, 0.0, bool(done), base.make_info(reward=0.0)
