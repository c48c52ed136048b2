"""Rollouts made by agent programs written against the OpenAI chat API.

An agent program is a module with

  async def agent(client, task) -> float     # plays one episode, returns its reward
  def make_task(task_config, seed) -> dict   # the JSON-able task of one training/eval seed

`client` is an `openai.AsyncOpenAI` pointed at the local server (agentrl/serve/app.py) and bound
to one session (its X-Session-Id header), so every request of the episode continues one engine
episode: the engine keeps its KV cache, and the recorded trajectory is the exact token sequence
sampled and fed back (agentrl/serve/sessions.py). `rollout` runs one step's episodes:

  runner = programs.AgentRunner(server.url, api_key=key)      # one event loop thread per run
  out = programs.rollout(engine, params, tok, hub, runner, program.agent, tasks, rng=key,
                         max_turns=8, max_new_tokens=32, max_len=512, temperature=1.0)

It opens one session per task, starts every program on the runner's event loop, runs the
engine over the sessions (continuous batching across programs), and ends each session with its
program's reward (`hub.finish`). A program that raises (a bad request, a network error, its
own bug) drops its episode: `Outcome.dropped` says why, and the experiment trains nothing on
it. A program still running `timeout_s` after the engine finished is cancelled and dropped.
"""
import asyncio
import concurrent.futures
import dataclasses
import importlib
import inspect
import logging
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


class AgentRunner:
  """An asyncio event loop on its own thread, with one `openai.AsyncOpenAI` for the server.

  The engine runs on the caller's thread and the server on its own, so programs, sampling and
  HTTP all go on at once. Close it (or use it as a context manager) to stop the thread.
  """

  def __init__(self, base_url: str, *, api_key: str = "", timeout_s: float = 600.0):
    # pylint: disable-next=g-import-not-at-top
    import openai  # the `serve` extra; only agent-program runs need it
    for name in ("httpx", "openai"):  # one INFO line per request otherwise
      logging.getLogger(name).setLevel(logging.WARNING)
    self.loop = asyncio.new_event_loop()
    self._thread = threading.Thread(target=self.loop.run_forever, name="agent-programs",
                                    daemon=True)
    self._thread.start()

    async def make_client():
      return openai.AsyncOpenAI(base_url=base_url, api_key=api_key or "unused", max_retries=0,
                                timeout=timeout_s)

    self.client = asyncio.run_coroutine_threadsafe(make_client(), self.loop).result()

  def client_for(self, session_id: str):
    """A client whose requests all carry the session's id."""
    return self.client.with_options(default_headers={sessions.HEADER: session_id})

  def start(self, agent: Callable, jobs: Sequence[tuple[str, dict]],
            hub: sessions.SessionHub) -> list[concurrent.futures.Future]:
    """Starts agent(client, task) for each (session id, task); each future gives an Outcome.
    The program's return value finishes its session with that reward; an exception drops it."""

    async def one(session_id: str, task: dict) -> Outcome:
      start = time.perf_counter()
      try:
        reward = float(await agent(self.client_for(session_id), task))
      except asyncio.CancelledError:
        hub.drop(session_id, "the program was cancelled")
        return Outcome(dropped="cancelled", seconds=time.perf_counter() - start)
      except Exception as e:  # pylint: disable=broad-except
        why = f"the program raised {type(e).__name__}: {str(e)[:200]}"
        hub.drop(session_id, why)
        return Outcome(dropped=why, seconds=time.perf_counter() - start)
      if not np.isfinite(reward):
        hub.drop(session_id, f"the program returned reward {reward}")
        return Outcome(dropped=f"non-finite reward {reward}", seconds=time.perf_counter() - start)
      hub.finish(session_id, reward)
      return Outcome(reward=reward, seconds=time.perf_counter() - start)

    return [asyncio.run_coroutine_threadsafe(one(sid, task), self.loop) for sid, task in jobs]

  def close(self) -> None:
    async def shut():
      await self.client.close()

    if self._thread.is_alive():
      asyncio.run_coroutine_threadsafe(shut(), self.loop).result(timeout=30)
      self.loop.call_soon_threadsafe(self.loop.stop)
      self._thread.join(timeout=30)

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
            greedy: bool = False, timeout_s: float = 120.0) -> ProgramRollout:
  """One episode of `agent` per task, through the server, sampled by `params` (module doc).

  A session whose program neither finished nor raised by the time the engine ended it (its
  turn or length budget) keeps the reward the program returns within `timeout_s`; programs
  still running after that are cancelled and their episodes dropped.
  """
  before = hub.stats
  envs = hub.open(len(tasks))
  futures = runner.start(agent, [(env.session_id, task) for env, task in zip(envs, tasks)], hub)
  try:
    trajs, metrics = engine.run(params, tok, envs, list(range(len(tasks))), rng=rng,
                                max_turns=max_turns, max_new_tokens=max_new_tokens,
                                max_len=max_len, temperature=temperature,
                                chat_template=chat_template, greedy=greedy, watch=hub.watch)
  finally:
    done, pending = concurrent.futures.wait(futures, timeout=timeout_s)
    for future in pending:
      future.cancel()
    hub.close_all()
  outcomes = []
  for env, future in zip(envs, futures):
    if future in done and not future.cancelled():
      outcome = future.result()
    else:
      outcome = Outcome(dropped=f"the program did not end within {timeout_s:.0f}s")
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
