"""Rollouts made by agent programs written against the OpenAI chat API.

An agent program is a module with

  async def agent(client, task) -> float     # plays one episode, returns its reward
  def make_task(task_config, seed) -> dict   # the JSON-able task of one training/eval seed

`client` is an `openai.AsyncOpenAI` pointed at the local server (agentrl/serve/app.py) and bound
to one session (its X-Session-Id header), so every request of the episode continues one engine
episode: the engine keeps its KV cache, and the recorded trajectory is the exact token sequence
sampled and fed back (agentrl/serve/sessions.py). `rollout` runs one step's episodes:

  runner = programs.AgentRunner(server.url, api_key=key)      # one child process per run
  out = programs.rollout(engine, params, tok, hub, runner, program.agent, tasks, rng=key,
                         max_turns=8, max_new_tokens=32, max_len=512, temperature=1.0)

It opens one session per task, starts every program on the runner's event loop (in its own
process, spawned: the program's module must be importable there), runs the engine over the
sessions (continuous batching across programs), and ends each session with its program's
reward (`hub.finish`). A program that raises (a bad request, a network error, its own bug)
drops its episode: `Outcome.dropped` says why, and the experiment trains nothing on it. A
program still running `timeout_s` after the engine finished is ended and dropped.
"""
import concurrent.futures
import dataclasses
import importlib
import inspect
import json
import logging
import os
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from agentrl import configs
from agentrl.rollout import agent_loop
from agentrl.serve import program_process
from agentrl.serve import sessions


def load_program(name: str) -> Any:
  """The agent program module `name` (config.agent.module), checked: an async `agent(client,
  task)` and a `make_task(task_config, seed)`. ConfigError naming what is missing."""
  try:
    module = importlib.import_module(name)
  except ImportError as e:
    raise configs.ConfigError(f"config.agent.module={name!r} cannot be imported ({e}); give "
                              "a module path on sys.path, e.g. "
                              "agentrl.serve.env_agent") from None
  agent, make_task = getattr(module, "agent", None), getattr(module, "make_task", None)
  if not inspect.iscoroutinefunction(agent):
    raise configs.ConfigError(f"config.agent.module={name!r} has no `async def agent(client, "
                              "task) -> float`")
  if not callable(make_task):
    raise configs.ConfigError(f"config.agent.module={name!r} has no `make_task(task_config, "
                              "seed) -> dict`")
  return module


@dataclasses.dataclass
class Outcome:
  """What one program run ended with."""
  reward: float = 0.0
  dropped: str = ""       # why its episode is not trained on ("" when it finished)
  seconds: float = 0.0


def program_name(agent: Callable) -> tuple[str, str]:
  """(module, qualified name) by which the runner's process imports `agent`; ValueError for a
  function it cannot import (a lambda, a nested function, one defined in __main__)."""
  module, name = getattr(agent, "__module__", None), getattr(agent, "__qualname__", "")
  if not module or module == "__main__" or "<" in name:
    raise ValueError(f"agent program {name or agent!r} of module {module!r} cannot be imported "
                     "by the runner's process: define `async def agent` at the top level of an "
                     "importable module (config.agent.module).")
  return module, name


def task_json(task: Any) -> str:
  """`task` as the JSON it travels to the runner's process in; ValueError if it has no such
  form."""
  try:
    return json.dumps(task)
  except (TypeError, ValueError) as e:
    raise ValueError(f"an agent program's task is not JSON ({e}): make_task must return plain "
                     "dicts, lists, strings and numbers.") from None


class AgentRunner:
  """Agent programs on asyncio event loops in child processes, each with one
  `openai.AsyncOpenAI` (agentrl/serve/program_process.py).

  The programs' Python (their own code, the `openai` client, HTTP) then neither shares the GIL
  with the server and the engine's scheduler nor can stall them: a program stuck in a loop
  that never yields is still ended at its rollout's timeout (`cancel`), and one that crashes
  its process (or exits it) drops the episodes that process ran; the next `start` makes a new
  one. A program is named by its module and function (`program_name`) and imported there,
  with the parent's sys.path; tasks travel as JSON. `processes` > 1 deals the episodes of a
  `start` out in turn, for machines where one core cannot keep up with the programs' clients
  (docs/performance.md). Close the runner (or use it as a context manager) to end them.
  """

  def __init__(self, base_url: str, *, api_key: str = "", timeout_s: float = 600.0,
               processes: int = 1):
    if processes < 1:
      raise ValueError(f"processes must be >= 1, got {processes}.")
    self._command = [sys.executable, "-m", "agentrl.serve.program_process", base_url,
                     sessions.HEADER, str(float(timeout_s))]
    self._env = {**os.environ, program_process.API_KEY_ENV: api_key,
                 "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    self._lock = threading.Lock()
    # session id -> (future, start time, hub, index of the process running it)
    self._futures: dict[str, tuple[concurrent.futures.Future, float, Any, int]] = {}
    self._procs: list[tuple[subprocess.Popen, threading.Thread] | None] = [None] * processes

  def _process(self, k: int) -> subprocess.Popen:
    """Process k, started anew if it is not running."""
    if self._procs[k] is not None and self._procs[k][0].poll() is None:
      return self._procs[k][0]
    self._end(k, kill=True)
    process = subprocess.Popen(self._command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               env=self._env, text=True, bufsize=1)
    reader = threading.Thread(target=self._read, args=(process, k),
                              name=f"agent-program-results-{k}", daemon=True)
    reader.start()
    self._procs[k] = process, reader
    return process

  def start(self, agent: Callable, jobs: Sequence[tuple[str, dict]],
            hub: sessions.SessionHub) -> list[concurrent.futures.Future]:
    """Starts agent(client, task) for each (session id, task); each future gives an Outcome.
    The program's return value finishes its session with that reward; an exception drops it."""
    module, name = program_name(agent)
    lines = [task_json({"session": sid, "module": module, "name": name, "task": task})
             for sid, task in jobs]
    futures, n = [], len(self._procs)
    with self._lock:
      for j, (session_id, _) in enumerate(jobs):
        future = concurrent.futures.Future()
        self._futures[session_id] = (future, time.perf_counter(), hub, j % n)
        futures.append(future)
    for k in range(min(n, len(lines))):
      process = self._process(k)
      try:
        process.stdin.write("".join(line + "\n" for line in lines[k::n]))
        process.stdin.flush()
      except OSError:
        pass   # the process died: its reader drops these programs
    return futures

  def cancel(self, session_ids: Sequence[str], why: str) -> None:
    """Ends these sessions' programs: their futures end now, dropped for `why`. Their processes
    are ended with them, since a program that never yields cannot be cancelled inside one;
    any other program such a process was running is dropped too, and the next `start` makes
    a new one."""
    with self._lock:
      ks = {self._futures[sid][3] for sid in session_ids if sid in self._futures}
    for session_id in session_ids:
      self._resolve(session_id, None, why)
    for k in ks:
      self._end(k, kill=True)

  def _resolve(self, session_id: str, reward: float | None, why: str) -> None:
    """Ends a session's future (first call wins) and its session: finish or drop."""
    with self._lock:
      future, start, hub, _ = self._futures.pop(session_id, (None, 0.0, None, 0))
    if future is None:
      return   # cancelled before its program's answer came
    seconds = time.perf_counter() - start
    if not why and not np.isfinite(reward):
      why = f"the program returned reward {reward}"
    if why:
      hub.drop(session_id, why)
      future.set_result(Outcome(dropped=why, seconds=seconds))
    else:
      hub.finish(session_id, reward)
      future.set_result(Outcome(reward=reward, seconds=seconds))

  def _read(self, process: subprocess.Popen, k: int) -> None:
    """Process k's reader thread: program outcomes as they come; once the process has ended,
    every program it was running is dropped."""
    for line in process.stdout:
      session_id, reward, why = json.loads(line)
      self._resolve(session_id, reward, why)
    code = process.wait()
    with self._lock:
      lost = [sid for sid, entry in self._futures.items() if entry[3] == k]
    for session_id in lost:
      self._resolve(session_id, None, f"the agent-program process exited with code {code}")

  def close(self) -> None:
    for k in range(len(self._procs)):
      self._end(k, kill=False)

  def _end(self, k: int, *, kill: bool) -> None:
    if self._procs[k] is None:
      return
    process, reader = self._procs[k]
    if not kill:
      try:
        process.stdin.close()   # EOF: the process cancels what still runs and ends
        process.wait(timeout=30)
      except (OSError, subprocess.TimeoutExpired):
        pass
    if process.poll() is None:
      process.kill()
      process.wait(timeout=10)
    reader.join(timeout=10)
    self._procs[k] = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


@dataclasses.dataclass
class ProgramRollout:
  trajectories: list[agent_loop.Trajectory]   # one per task, in order
  outcomes: list[Outcome]                      # the programs' rewards, or why dropped
  metrics: dict[str, float]                    # the engine's rollout/* and serve/* counters


def rollout(engine, params, tok, hub: sessions.SessionHub, runner: AgentRunner,
            agent: Callable, tasks: Sequence[dict], *, rng, max_turns: int,
            max_new_tokens: int, max_len: int, temperature: float, chat_template: bool,
            greedy: bool = False, timeout_s: float = 120.0,
            gather_s: float = sessions.GATHER_S) -> ProgramRollout:
  """One episode of `agent` per task, through the server, sampled by `params` (module doc).

  A session whose program neither finished nor raised by the time the engine ended it (its
  turn or length budget) keeps the reward the program returns within `timeout_s`; programs
  still running after that are cancelled and their episodes dropped. `gather_s`: Engine.run's.
  """
  program_name(agent)   # refused before any session opens
  task_json(list(tasks))
  before = hub.stats
  envs = hub.open(len(tasks))
  futures = runner.start(agent, [(env.session_id, task) for env, task in zip(envs, tasks)], hub)
  try:
    trajs, metrics = engine.run(params, tok, envs, list(range(len(tasks))), rng=rng,
                                max_turns=max_turns, max_new_tokens=max_new_tokens,
                                max_len=max_len, temperature=temperature,
                                chat_template=chat_template, greedy=greedy, watch=hub.watch,
                                gather_s=gather_s)
  finally:
    _, pending = concurrent.futures.wait(futures, timeout=timeout_s)
    runner.cancel([env.session_id for env, future in zip(envs, futures) if future in pending],
                  f"the program did not end within {timeout_s:g}s")
    hub.close_all()
  outcomes = []
  for env, future in zip(envs, futures):
    outcome = future.result()
    if not outcome.dropped and env.dropped:
      outcome.dropped = env.dropped  # e.g. the client waited too long between requests
    outcomes.append(outcome)
  dropped = [o.dropped for o in outcomes if o.dropped]
  if dropped:
    logging.warning("%d of %d agent-program episodes dropped (they train nothing); the first: %s",
                    len(dropped), len(outcomes), dropped[0])
  after = hub.stats
  metrics.update({k: after[k] - before.get(k, 0.0) for k in after})
  metrics["serve/program_errors"] = float(sum(bool(o.dropped) for o in outcomes))
  metrics["serve/program_seconds"] = float(np.mean([o.seconds for o in outcomes]))
  return ProgramRollout(trajectories=trajs, outcomes=outcomes, metrics=metrics)
