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
import asyncio
import concurrent.futures
import dataclasses
import functools
import importlib
import inspect
import logging
import multiprocessing
import queue
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from agentrl import configs
from agentrl.rollout import agent_loop
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


class AgentRunner:
  """Agent programs on an asyncio event loop in a child process, with one `openai.AsyncOpenAI`.

  The programs' Python (their own code, the `openai` client, HTTP) then neither shares the GIL
  with the server and the engine's scheduler nor can stall them: a program stuck in a loop
  that never yields is still ended at its rollout's timeout (`cancel`), and one that crashes
  the process (or exits it) drops its episodes; the next `start` makes a new process. A
  program is named by its module and function (`program_name`) and imported there; the task
  dicts travel pickled. Close the runner (or use it as a context manager) to end the process.
  """

  def __init__(self, base_url: str, *, api_key: str = "", timeout_s: float = 600.0):
    self._args = (base_url, api_key or "unused", float(timeout_s))
    self._ctx = multiprocessing.get_context("spawn")   # fork would copy XLA's threads' locks
    self._lock = threading.Lock()
    self._futures: dict[str, tuple[concurrent.futures.Future, float, Any]] = {}
    self._process = self._reader = None

  def _spawn(self) -> None:
    self._jobs, self._results = self._ctx.Queue(), self._ctx.Queue()
    self._process = self._ctx.Process(target=_child_main, name="agent-programs", daemon=True,
                                      args=(*self._args, self._jobs, self._results))
    self._process.start()
    self._reader = threading.Thread(target=self._read, args=(self._process, self._results),
                                    name="agent-program-results", daemon=True)
    self._reader.start()

  def start(self, agent: Callable, jobs: Sequence[tuple[str, dict]],
            hub: sessions.SessionHub) -> list[concurrent.futures.Future]:
    """Starts agent(client, task) for each (session id, task); each future gives an Outcome.
    The program's return value finishes its session with that reward; an exception drops it."""
    module, name = program_name(agent)
    if self._process is None or not self._process.is_alive():
      self._spawn()
    futures = []
    with self._lock:
      for session_id, _ in jobs:
        future = concurrent.futures.Future()
        self._futures[session_id] = (future, time.perf_counter(), hub)
        futures.append(future)
    self._jobs.put([(sid, module, name, task) for sid, task in jobs])
    return futures

  def cancel(self, session_ids: Sequence[str], why: str) -> None:
    """Ends these sessions' programs: their futures end now, dropped for `why`. The process is
    ended with them, since a program that never yields cannot be cancelled inside it; any
    other program it was running is dropped too, and the next `start` makes a new one."""
    if not session_ids:
      return
    for session_id in session_ids:
      self._resolve(session_id, None, why)
    self._end_process(kill=True)

  def _resolve(self, session_id: str, reward: float | None, why: str) -> None:
    """Ends a session's future (first call wins) and its session: finish or drop."""
    with self._lock:
      future, start, hub = self._futures.pop(session_id, (None, 0.0, None))
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

  def _read(self, process, results) -> None:
    """The parent's reader thread: program outcomes as they come; when the process dies, every
    program it was running is dropped."""
    while True:
      try:
        session_id, reward, why = results.get(timeout=0.5)
      except queue.Empty:
        if process.is_alive():
          continue
        with self._lock:
          lost = list(self._futures)
        for session_id in lost:
          self._resolve(session_id, None, "the agent-program process exited with code "
                        f"{process.exitcode}")
        return
      if session_id is None:   # the process ended its loop (close)
        return
      self._resolve(session_id, reward, why)

  def close(self) -> None:
    self._end_process(kill=False)

  def _end_process(self, *, kill: bool) -> None:
    process = self._process
    if process is None:
      return
    if process.is_alive() and not kill:
      self._jobs.put(None)
      process.join(timeout=30)
    if process.is_alive():
      process.kill()
      process.join(timeout=10)
    if self._reader is not None:
      self._reader.join(timeout=10)
    self._process = self._reader = None

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    self.close()


def _child_main(base_url: str, api_key: str, timeout_s: float, jobs, results) -> None:
  """The runner's process: runs each [(session id, module, name, task)] job as asyncio tasks
  and ends at None; each program's (session id, reward, "" or why it is dropped) goes to
  `results`."""
  for name in ("httpx", "httpx2", "openai"):  # one INFO line per request otherwise
    logging.getLogger(name).setLevel(logging.WARNING)
  # pylint: disable-next=g-import-not-at-top
  import openai  # the `serve` extra; only agent-program runs need it

  async def one(client, session_id: str, agent: Callable, task: dict) -> None:
    try:
      reward, why = float(await agent(client.with_options(
          default_headers={sessions.HEADER: session_id}), task)), ""
    except asyncio.CancelledError:
      reward, why = 0.0, "the program was cancelled"
    except Exception as e:  # pylint: disable=broad-except
      reward, why = 0.0, f"the program raised {type(e).__name__}: {str(e)[:200]}"
    results.put((session_id, reward, why))

  async def main() -> None:
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0,
                                timeout=timeout_s)
    loop, running = asyncio.get_running_loop(), {}
    while (items := await loop.run_in_executor(None, jobs.get)) is not None:
      for session_id, module, name, task in items:
        try:
          agent = functools.reduce(getattr, name.split("."), importlib.import_module(module))
        except Exception as e:  # pylint: disable=broad-except
          why = (f"agent program {module}.{name} cannot be imported in the runner's process: "
                 f"{type(e).__name__}: {e}")
          results.put((session_id, 0.0, why))
          continue
        running[session_id] = job = asyncio.create_task(one(client, session_id, agent, task))
        job.add_done_callback(lambda _, sid=session_id: running.pop(sid, None))
    for job in list(running.values()):
      job.cancel()
    await asyncio.gather(*running.values(), return_exceptions=True)
    await client.close()
    results.put((None, 0.0, ""))

  asyncio.run(main())


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
  program_name(agent)   # before any session opens
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
