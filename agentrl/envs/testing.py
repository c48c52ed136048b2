"""Test helpers: envs that misbehave on purpose, importable by an isolated.IsolatedEnv worker.

`ToyEnv` echoes its actions; a few actions make it hang, crash or fail the way a game engine
can. `RawGameEnv` sends actions to a TextWorld game with no sanitizing, to reproduce the
engine's own hangs and crashes.
"""
import ctypes
import os
import time

from agentrl.envs import base


class ToyEnv:
  """reset(seed) -> "start <seed> in <pid>"; step(action) -> "echo <action>".

  Actions: "win" (reward 1, done), "hang" (sleeps forever), "spin" (a busy loop), "segfault"
  (reads address 0), "exit" (os._exit(139)), "raise" (ValueError), "print N" (writes N bytes
  to stderr, then echoes).
  """

  system_prompt = "Say win."

  def __init__(self, max_turns: int = 5, fail: bool = False):
    if fail:
      raise ValueError("ToyEnv was told to fail")
    self.max_turns = max_turns

  def reset(self, seed: int) -> str:
    if seed < 0:
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
      os._exit(139)  # pylint: disable=protected-access
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
