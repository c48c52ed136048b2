"""Runs verifiers of model text in worker processes, bounded in time and memory.

  value = bounded.call(fn, *args, timeout_s=5.0)            # fn(*args) in a worker process
  value = bounded.call(fn, *args, timeout_s=5.0, setup=s)   # s() first, once per worker

A verifier handed model text can compute for ever without returning to the interpreter: sympy
evaluating `10**10**10` is one C-level big-integer power that holds the GIL, so neither
`signal.alarm` nor a thread-based timeout can stop it, and every other thread of the trainer
stops with it. `call` runs `fn(*args)` in a persistent worker process instead (a fresh
`python -c` process, never a fork of the trainer and its jax threads) and waits for the answer
with the GIL released:

  - no answer within timeout_s: the worker (and what it started) is killed and `Timeout` is
    raised; the next call starts a fresh worker.
  - the worker's address space is limited to memory_bytes (RLIMIT_AS): an allocation beyond it
    fails in the worker, which is replaced, and `OutOfMemory` is raised.
  - `fn` raising is re-raised here with its type and message; the worker lives on. A worker
    that dies (a crash in native code) raises `WorkerDied`.
  - a worker whose parent died stops at its next message, or after its CPU-time backstop
    (RLIMIT_CPU, re-armed to timeout_s plus slack before each call) if it is computing.

`setup` (e.g. importing sympy, building a dataset) runs once per worker and setup value, under
start_timeout_s rather than timeout_s, so a fresh worker does not time out a fast verifier.
Workers form a pool that grows on demand up to max_workers, so calls from many env threads run
side by side; a thread that finds every worker busy waits for one. fn, setup, args and the
result cross the process boundary by pickle (module-level functions or functools.partial of
them). POSIX only.

The limits bound time and memory, not what fn does. A pool for verifiers of model text is made
with `untrusted=True` (the shared pool behind `call` is): its workers run
`agentrl.rewards.untrusted`'s guards, so that sympy's parser and the `eval` of scorer packages
evaluate only an allow-list of expressions, and an audit hook refuses file writes, processes,
signals and sockets during each call (setups run unguarded). A refused action raises `Refused`
here, whatever fn returned, and its worker is replaced. Such a pool's replies are unpickled
accepting only plain data and builtin exceptions, so not even a subverted worker can run code in
this process through its reply; fn's results must be plain (numbers, strings, containers of
them), and fn's errors come back as builtin exceptions with their message.
"""
import atexit
import builtins
import contextlib
import io
import math
from multiprocessing import connection
import os
import pickle
import resource
import signal
import socket
import subprocess
import sys
import threading
from typing import Any, Callable

DEFAULT_TIMEOUT_S = 5.0
DEFAULT_MEMORY_BYTES = 2 << 30
_CPU_SLACK_S = 1  # the in-worker CPU backstop fires this long after the parent's deadline
_ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}
_WORKER_MAIN = ("import sys; from agentrl.rewards import bounded; "
                "bounded.serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == 'untrusted')")


class LimitExceeded(Exception):
  """A bounded call ran past its time or memory limit; its worker was replaced."""


class Timeout(LimitExceeded, TimeoutError):
  """The call did not answer within its time limit."""


class OutOfMemory(LimitExceeded, MemoryError):
  """The call tried to use more memory than the worker's limit."""


class WorkerDied(RuntimeError):
  """The worker process died during the call (e.g. a crash in native code)."""


class Refused(RuntimeError):
  """An untrusted call did what its pool refuses (see the module docstring); worker replaced."""


class _PlainUnpickler(pickle.Unpickler):
  """Accepts plain data and builtin exceptions only: an untrusted worker's reply."""

  def find_class(self, module, name):
    value = getattr(builtins, name, None) if module == "builtins" else None
    if isinstance(value, type) and issubclass(value, BaseException):
      return value
    raise pickle.UnpicklingError(f"{module}.{name} is not allowed in an untrusted reply")


class _Worker:
  """One worker process and the parent's end of its socket."""

  def __init__(self, memory_bytes: int, untrusted: bool):
    parent_end, child_end = socket.socketpair()
    path = [os.path.abspath(p or os.curdir) for p in sys.path]  # as multiprocessing's spawn
    # One thread per worker: numeric libraries' thread pools would also spend the CPU-time
    # backstop faster than the wall clock.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), **_ONE_THREAD)
    with child_end:
      self.proc = subprocess.Popen(
          [sys.executable, "-c", _WORKER_MAIN, str(child_end.fileno()), str(memory_bytes),
           "untrusted" if untrusted else "trusted"],
          pass_fds=(child_end.fileno(),), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
          stderr=subprocess.DEVNULL, env=env, start_new_session=True)  # Ctrl-C: parent only
    self.conn = connection.Connection(parent_end.detach())
    self.untrusted = untrusted
    self.setups = set()  # pickled setup callables already run in this worker

  def _reply(self) -> tuple[str, Any]:
    data = self.conn.recv_bytes()
    if not self.untrusted:
      return pickle.loads(data)
    try:
      return _PlainUnpickler(io.BytesIO(data)).load()
    except Exception as e:  # pylint: disable=broad-except
      return "refused", f"its reply was not plain data ({type(e).__name__}: {e})"

  def request(self, message: tuple, timeout_s: float) -> Any:
    try:
      self.conn.send_bytes(pickle.dumps(message))
      answered = self.conn.poll(timeout_s)  # waits with the GIL released
    except OSError:
      answered = True  # the worker is gone; recv below says so
    if not answered:
      self.kill()
      raise Timeout(f"timed out after {timeout_s:g} s (its worker process was killed)")
    try:
      status, value = self._reply()
    except (EOFError, OSError):
      self.kill()
      raise WorkerDied(f"the worker process died ({describe_exit(self.proc.returncode)})"
                       ) from None
    if status == "memory":
      self.kill()  # a failed allocation may have left its state half-built
      raise OutOfMemory(f"used more than its memory limit ({value})")
    if status == "refused":
      self.kill()  # it may have been changed by what it refused
      raise Refused(f"refused {value}")
    if status == "error":
      raise value
    return value

  def kill(self) -> None:
    kill_group(self.proc)
    self.conn.close()

  @property
  def alive(self) -> bool:
    return not self.conn.closed and self.proc.poll() is None


def kill_group(proc: subprocess.Popen) -> None:
  """Kills a worker started with start_new_session=True, and what it started, and reaps it."""
  if proc.returncode is None:
    try:
      os.killpg(proc.pid, signal.SIGKILL)  # before wait(): the pid cannot be reused yet
    except (ProcessLookupError, PermissionError):
      pass
    proc.wait()


def describe_exit(code: int | None) -> str:
  """How a worker process ended, from its Popen.returncode."""
  if code is not None and code < 0:
    return f"killed by {signal.Signals(-code).name}"
  return f"exit code {code}"


class Pool:
  """Worker processes for bounded calls; see the module docstring.

  Args:
    max_workers: most workers at once (calls in flight); more callers wait for a free one.
    memory_bytes: address-space limit of each worker (RLIMIT_AS).
    start_timeout_s: time limit of a `setup` call (and of starting the worker).
    untrusted: guard each call as one on model text (see the module docstring).
  """

  def __init__(self, *, max_workers: int | None = None,
               memory_bytes: int = DEFAULT_MEMORY_BYTES, start_timeout_s: float = 120.0,
               untrusted: bool = False):
    self.max_workers = max_workers or max(4, os.cpu_count() or 1)
    if self.max_workers < 1 or memory_bytes < 1 or start_timeout_s <= 0:
      raise ValueError(f"need max_workers, memory_bytes and start_timeout_s > 0; got "
                       f"{max_workers}, {memory_bytes}, {start_timeout_s}.")
    self.memory_bytes, self.start_timeout_s = memory_bytes, start_timeout_s
    self.untrusted = untrusted
    self._free = threading.Condition()
    self._idle: list[_Worker] = []
    self._live = 0
    self.started = 0  # workers started so far (restarts included)

  def _take(self) -> _Worker:
    with self._free:
      while not self._idle and self._live >= self.max_workers:
        self._free.wait()
      while self._idle:
        worker = self._idle.pop()
        if worker.alive:
          return worker
        worker.kill()  # died while idle
        self._live -= 1
      self._live += 1
      self.started += 1
    worker = None
    try:
      worker = _Worker(self.memory_bytes, self.untrusted)
      # Waits for the interpreter to start, so that it never counts against a call's limit.
      worker.request((int, (), self.start_timeout_s, True), self.start_timeout_s)
      return worker
    except BaseException:
      if worker is not None:
        worker.kill()
      self._give_back(None)
      raise

  def _give_back(self, worker: _Worker | None) -> None:
    with self._free:
      if worker is not None and worker.alive:
        self._idle.append(worker)
      else:
        self._live -= 1
      self._free.notify()

  def call(self, fn: Callable[..., Any], *args, timeout_s: float = DEFAULT_TIMEOUT_S,
           setup: Callable[[], Any] | None = None) -> Any:
    """fn(*args) in a worker, after setup() if this worker has not run it yet."""
    if not timeout_s > 0:
      raise ValueError(f"timeout_s must be positive, got {timeout_s}.")
    worker = self._take()
    try:
      if setup is not None:
        key = pickle.dumps(setup)
        if key not in worker.setups:
          worker.request((setup, (), self.start_timeout_s, True), self.start_timeout_s)
          worker.setups.add(key)
      return worker.request((fn, args, timeout_s, False), timeout_s)
    finally:
      self._give_back(worker)

  def close(self) -> None:
    """Kills the idle workers (one in use returns to the pool when its call ends)."""
    with self._free:
      idle, self._idle = self._idle, []
      self._live -= len(idle)
    for worker in idle:
      worker.kill()


_POOL = Pool(untrusted=True)
atexit.register(_POOL.close)


def call(fn: Callable[..., Any], *args, timeout_s: float = DEFAULT_TIMEOUT_S,
         setup: Callable[[], Any] | None = None) -> Any:
  """fn(*args) in the shared pool's untrusted worker processes (see the module docstring)."""
  return _POOL.call(fn, *args, timeout_s=timeout_s, setup=setup)


# ------------------------------------------------------------------------- worker process


def _arm_cpu_backstop(timeout_s: float) -> None:
  """Ends this process (SIGXCPU) once it has used timeout_s more CPU, plus slack."""
  usage = resource.getrusage(resource.RUSAGE_SELF)
  limit = math.ceil(usage.ru_utime + usage.ru_stime + timeout_s) + _CPU_SLACK_S
  resource.setrlimit(resource.RLIMIT_CPU, (limit, resource.RLIM_INFINITY))


def _portable(error: BaseException) -> BaseException:
  try:
    pickle.loads(pickle.dumps(error))
    return error
  except Exception:  # pylint: disable=broad-except
    return RuntimeError(f"{type(error).__name__}: {error}")


def serve(fd: int, memory_bytes: int, untrusted: bool = False) -> None:
  """Worker main: answer (fn, args, timeout_s, trusted) requests until the socket closes."""
  resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
  conn = connection.Connection(fd)
  guard, portable = contextlib.nullcontext, _portable
  if untrusted:
    from agentrl.rewards import untrusted as untrusted_lib  # pylint: disable=g-import-not-at-top
    untrusted_lib.install()
    guard, portable = untrusted_lib.guard, untrusted_lib.plain_exception
  while True:
    try:
      message = conn.recv_bytes()
    except (EOFError, OSError):
      return  # the parent closed the socket or died
    try:
      fn, args, timeout_s, trusted = pickle.loads(message)  # may import fn's module
      _arm_cpu_backstop(timeout_s)
      with contextlib.nullcontext() if trusted else guard():
        reply = ("ok", fn(*args))
    except MemoryError as e:
      reply = ("memory", f"{memory_bytes / (1 << 30):g} GiB")
    except Exception as e:  # pylint: disable=broad-except
      reply = ("error", portable(e))
    refusal = untrusted and untrusted_lib.take_refusal()
    if refusal:
      reply = ("refused", refusal)  # even if fn caught the PermissionError and returned
    resource.setrlimit(resource.RLIMIT_CPU, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    try:
      data = pickle.dumps(reply)
    except Exception as e:  # pylint: disable=broad-except
      data = pickle.dumps(("error", RuntimeError(f"the result cannot be pickled ({e})")))
    try:
      conn.send_bytes(data)
    except OSError:
      return
