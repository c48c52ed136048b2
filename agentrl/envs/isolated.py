"""Runs an Env in a worker process, so that a hang or crash of its engine costs one episode.

  env = isolated.IsolatedEnv(functools.partial(textworld_env.TextWorldEnv, "coin_collector"))
  env = textworld_env.TextWorldEnv.isolated("coin_collector")       # the same

Game engines are native code (TextWorld's Z-machine interpreter, ALFWorld's planner). A bad
input can make them spin without returning to Python, where SIGALRM cannot interrupt them, or
kill the process with a segfault. IsolatedEnv builds the env with `make_env()` in a fresh
Python process (a subprocess, never a fork of the trainer and its jax threads) and forwards
reset/step to it over a socket:

  - a call that does not answer within timeout_s (reset: reset_timeout_s) kills the worker and
    everything it started and raises safe.EnvTimeout; a worker that dies raises safe.EnvCrash.
    SafeEnv, which the agent loop always applies, turns both into an error observation that
    ends the episode and counts them as env/env_timeouts and env/env_crashes. The next reset
    starts a fresh worker.
  - an exception raised by the env's reset/step is raised here with its type, message and the
    worker's traceback as a note, as in-process; the worker lives on.
  - the worker's stdout and stderr go to this process's stderr up to max_output_bytes per
    worker, then are dropped, so an engine stuck printing cannot fill the logs.
  - a worker exits when this process dies (its socket closes; a watchdog thread also checks
    its parent), and writes no core files.

Workers are reused: when an IsolatedEnv is closed or garbage-collected, its healthy worker is
kept (up to MAX_IDLE per make_env) for the next IsolatedEnv built from an equal make_env, so
the agent loop, which builds fresh envs for every rollout, starts processes only at first. This
relies on the Env contract: reset(seed) starts a new episode, whatever came before.
`shutdown()` kills the idle workers. POSIX only; one call at a time per IsolatedEnv.

Forking (envs/fork.py): an env in another process cannot be copied from here, so a fork of an
IsolatedEnv is replayed on `fresh()`, a new IsolatedEnv with a worker of its own; the worker
reports whether its env is `replayable` (envs/base.py, "Forking").

make_env must be picklable (a class, a module-level function or a functools.partial of one);
seeds, actions, results and exceptions cross the process boundary by pickle.
"""
import atexit
import collections
from multiprocessing import connection
import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from typing import Any, Callable
import weakref

from agentrl.envs import base
from agentrl.envs import safe
from agentrl.rewards import bounded

MAX_IDLE = 64  # idle workers kept per make_env
_WORKER_MAIN = ("import sys; from agentrl.envs import isolated; "
                "isolated.serve(int(sys.argv[1]), int(sys.argv[2]))")
_idle_lock = threading.Lock()
_idle: dict[bytes, list["_Worker"]] = collections.defaultdict(list)
_workers = weakref.WeakSet()  # every live worker, killed at exit


def _forward_output(stream, pid: int, limit: int) -> None:
  """Copies a worker's output to stderr until `limit` bytes, then drains it unread."""
  written = 0
  for chunk in iter(lambda: stream.read1(1 << 16), b""):
    if written >= limit:
      continue  # keep reading: a full pipe would block the worker
    text = chunk[:limit - written].decode(errors="replace")
    written += len(chunk)
    if written >= limit:
      text += (f"\n[agentrl.envs.isolated: env worker {pid} wrote more than {limit} bytes of "
               "output; the rest is dropped]\n")
    try:
      sys.stderr.write(text)
    except (OSError, ValueError):  # stderr closed or replaced by something broken
      pass
  stream.close()


class _Worker:
  """One worker process, the parent's end of its socket and its output forwarder."""

  def __init__(self, blueprint: bytes, *, start_timeout_s: float, max_output_bytes: int):
    parent_end, child_end = socket.socketpair()
    path = [os.path.abspath(p or os.curdir) for p in sys.path]  # as multiprocessing's spawn
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    with child_end:
      self.proc = subprocess.Popen(
          [sys.executable, "-c", _WORKER_MAIN, str(child_end.fileno()), str(os.getpid())],
          pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
          stderr=subprocess.STDOUT, env=env, start_new_session=True)  # Ctrl-C: parent only
    _workers.add(self)
    self.conn = connection.Connection(parent_end.detach())
    self._output = threading.Thread(target=_forward_output, daemon=True,
                                    args=(self.proc.stdout, self.proc.pid, max_output_bytes))
    self._output.start()
    self.busy = False
    try:
      self.system_prompt, self.max_turns, self.replayable = self._request(
          blueprint, "start", start_timeout_s)
    except BaseException:
      self.kill()
      raise

  @property
  def alive(self) -> bool:
    return self.proc.poll() is None and not self.conn.closed

  def call(self, method: str, arg: Any, timeout_s: float) -> Any:
    return self._request(pickle.dumps((method, arg)), method, timeout_s)

  def _request(self, message: bytes, method: str, timeout_s: float) -> Any:
    self.busy = True  # stays set if interrupted: a late reply must not reach the next caller
    try:
      self.conn.send_bytes(message)
      answered = self.conn.poll(timeout_s)
    except OSError:
      answered = True  # the worker is gone; recv below says so
    if not answered:
      self.kill()
      raise safe.EnvTimeout(f"env.{method} did not answer within {timeout_s:g} s; its worker "
                            "process was killed")
    try:
      status, value = self.conn.recv()
    except (EOFError, OSError):
      self.kill()
      raise safe.EnvCrash(f"the env worker process died during env.{method} "
                          f"({bounded.describe_exit(self.proc.returncode)})") from None
    self.busy = False
    if status == "error":
      raise value
    return value

  def kill(self) -> None:
    """Kills the worker's process group (the worker and what it started) and reaps it."""
    bounded.kill_group(self.proc)
    self.conn.close()
    self._output.join(timeout=5.0)


def _take_idle(blueprint: bytes) -> "_Worker | None":
  while True:
    with _idle_lock:
      if not _idle[blueprint]:
        return None
      worker = _idle[blueprint].pop()
    if worker.alive:
      return worker
    worker.kill()


def _release(blueprint: bytes, slot: list) -> None:
  """Returns the worker in `slot` to the idle pool if it is healthy, else kills it."""
  while slot:
    worker = slot.pop()
    if not worker.busy and worker.alive:
      with _idle_lock:
        if len(_idle[blueprint]) < MAX_IDLE:
          _idle[blueprint].append(worker)
          continue
    worker.kill()


def shutdown() -> None:
  """Kills every idle worker (workers in use stay with their IsolatedEnv)."""
  with _idle_lock:
    idle = [w for workers in _idle.values() for w in workers]
    _idle.clear()
  for worker in idle:
    worker.kill()


@atexit.register
def _kill_all() -> None:
  for worker in list(_workers):
    worker.kill()


class IsolatedEnv:
  """An Env whose `make_env()` instance lives in a worker process; see the module docstring.

  Args:
    make_env: picklable zero-argument callable returning the Env.
    timeout_s: time limit of one step, in seconds.
    reset_timeout_s: time limit of one reset (may generate a game on first use).
    start_timeout_s: time limit for starting a worker and building the env in it.
    max_output_bytes: output of one worker copied to stderr before the rest is dropped.
  """

  def __init__(self, make_env: Callable[[], base.Env], *, timeout_s: float = 10.0,
               reset_timeout_s: float = 300.0, start_timeout_s: float = 120.0,
               max_output_bytes: int = 1 << 16):
    if min(timeout_s, reset_timeout_s, start_timeout_s) <= 0:
      raise ValueError(f"time limits must be positive, got timeout_s={timeout_s}, "
                       f"reset_timeout_s={reset_timeout_s}, start_timeout_s={start_timeout_s}.")
    try:
      self._blueprint = pickle.dumps(make_env)
    except Exception as e:
      raise TypeError(f"make_env must be picklable (a class, a module-level function or a "
                      f"functools.partial of one), got {make_env!r}: {e}") from e
    self.make_env = make_env
    self.timeout_s, self.reset_timeout_s = timeout_s, reset_timeout_s
    self.start_timeout_s, self.max_output_bytes = start_timeout_s, max_output_bytes
    self._slot = []  # the current worker, if any; shared with the finalizer, never self
    self._finalizer = weakref.finalize(self, _release, self._blueprint, self._slot)
    self._finalizer.atexit = False  # at exit, _kill_all ends every worker
    worker = self._worker()  # a bad make_env fails here, as it would in-process
    self.system_prompt: str = worker.system_prompt
    self.max_turns: int = worker.max_turns
    self.replayable: bool = worker.replayable   # the env's own (envs/base.py, "Forking")

  def _worker(self) -> _Worker:
    if not self._finalizer.alive:
      raise RuntimeError("IsolatedEnv was closed.")
    if not self._slot:
      self._slot.append(_take_idle(self._blueprint) or _Worker(
          self._blueprint, start_timeout_s=self.start_timeout_s,
          max_output_bytes=self.max_output_bytes))
    return self._slot[0]

  def _call(self, method: str, arg: Any, timeout_s: float) -> Any:
    worker = self._worker()
    try:
      return worker.call(method, arg, timeout_s)
    except (safe.EnvTimeout, safe.EnvCrash):
      self._slot.clear()  # already killed; the next reset starts a fresh worker
      raise

  # The episode is tracked here, not only in the worker: a reused worker may hold another
  # env's unfinished episode, and after a timeout or a crash this episode is over.
  @base.episode_reset
  def reset(self, seed: int) -> str:
    return self._call("reset", seed, self.reset_timeout_s)

  @base.episode_step
  def step(self, action: str) -> base.StepResult:
    return self._call("step", action, self.timeout_s)

  def fresh(self) -> "IsolatedEnv":
    """A new IsolatedEnv of the same make_env and limits, with no episode, in a worker of its
    own (an idle one, else a new process): what envs/fork.py replays an episode on, since an
    env in another process cannot be copied from here."""
    return type(self)(self.make_env, timeout_s=self.timeout_s,
                      reset_timeout_s=self.reset_timeout_s,
                      start_timeout_s=self.start_timeout_s,
                      max_output_bytes=self.max_output_bytes)

  def close(self) -> None:
    """Hands the worker back for reuse; the env cannot be used afterwards."""
    self._finalizer()


# ------------------------------------------------------------------------- worker process


def _exit_with_parent(parent: int) -> None:
  while os.getppid() == parent:
    time.sleep(1.0)
  os.killpg(0, signal.SIGKILL)  # this worker and anything it started


def _portable(error: BaseException) -> BaseException:
  """`error` with the worker's traceback as a note, or a RuntimeError if it cannot be pickled."""
  note = "env worker traceback:\n" + "".join(traceback.format_exception(error))
  try:
    error.add_note(note)
    pickle.loads(pickle.dumps(error))
    return error
  except Exception:  # pylint: disable=broad-except
    plain = RuntimeError(f"{type(error).__name__}: {error}")
    plain.add_note(note)
    return plain


def _reply(conn: connection.Connection, status: str, value: Any) -> None:
  try:
    data = pickle.dumps((status, value))
  except Exception as e:  # pylint: disable=broad-except
    data = pickle.dumps(("error", RuntimeError(f"the env returned an object that cannot be "
                                               f"pickled ({type(e).__name__}: {e})")))
  conn.send_bytes(data)


def serve(fd: int, parent: int) -> None:
  """Worker main: build the env from the first message, then answer (method, arg) requests."""
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crashing engine leaves no core files
  threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
  conn = connection.Connection(fd)
  try:
    env = pickle.loads(conn.recv_bytes())()
    _reply(conn, "ok", (str(env.system_prompt), int(env.max_turns),
                        bool(getattr(env, "replayable", True))))
  except Exception as e:  # pylint: disable=broad-except
    _reply(conn, "error", _portable(e))
    return
  while True:
    try:
      method, arg = pickle.loads(conn.recv_bytes())
    except EOFError:
      return
    try:
      _reply(conn, "ok", getattr(env, method)(arg))
    except Exception as e:  # pylint: disable=broad-except
      _reply(conn, "error", _portable(e))
