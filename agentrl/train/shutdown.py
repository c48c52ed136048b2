"""Ctrl-C and SIGTERM: one orderly stop, then an exit that cannot crash (used by
agentrl.harness.cli).

`handle_signals(ckpt_dir)` (a context manager) turns SIGINT and SIGTERM into `Interrupted`, a
KeyboardInterrupt raised in the main thread. The code it unwinds stops what it started:
`loop.run` abandons the rollout being made in the background, finishes a checkpoint save in
flight (so the checkpoint the exit message names is complete) and closes the metrics files.
`exit_now(code)` then ends the process.

Why `os._exit`. A normal interpreter exit runs atexit handlers (jax's destroys the XLA client)
and C++ static destructors while work the interrupt left behind still runs: XLA compiles and
executes on its own thread pools, and the rollout thread and env worker threads may be inside
compiled code or env calls. A compile thread that touches the destroyed client segfaults
(rc 139 after the exit message). Nothing on disk needs that teardown: checkpoints are complete
or absent (orbax renames a finished temporary directory), and metrics lines are flushed as
they are written. So `exit_now` flushes the output, kills this process's child processes
(isolated env workers, verifier subprocesses), whose own atexit cleanup will not run, and
exits without tearing down.

A second signal while stopping exits at once; the checkpoints stay consistent, as after
SIGKILL. An Interrupted raised where Python swallows exceptions (a gc callback, `__del__`)
is raised again by `check()`, which the loop calls once per step. Inside `deferred()` (the
loop's checkpoint save) a signal is held back until the block ends, so a save is started
whole, and then finished, or not at all.
"""
from collections.abc import Iterator
import contextlib
import logging
import os
import signal
import sys
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_received: list[int] = []  # the signals received under handle_signals, in order
_deferring: list[None] = []  # one entry per open deferred() block


class Interrupted(KeyboardInterrupt):
  """SIGINT or SIGTERM, raised in the main thread; `exit_code` is 128 + the signal number."""

  def __init__(self, signum: int):
    super().__init__(signal.Signals(signum).name)
    self.signum = signum

  @property
  def exit_code(self) -> int:
    return 128 + self.signum


def describe(error: KeyboardInterrupt) -> tuple[str, int]:
  """(the signal's name, the conventional exit code) of an interrupt; plain Ctrl-C otherwise."""
  signum = getattr(error, "signum", signal.SIGINT)
  return signal.Signals(signum).name, 128 + signum


def check() -> None:
  """Raises Interrupted if a signal arrived whose exception was swallowed (main thread only)."""
  if _received and threading.current_thread() is threading.main_thread():
    raise Interrupted(_received[0])


@contextlib.contextmanager
def deferred() -> Iterator[None]:
  """Holds a signal back until the block ends, then raises its Interrupted."""
  _deferring.append(None)
  try:
    yield
  finally:
    _deferring.pop()
  check()


@contextlib.contextmanager
def handle_signals(ckpt_dir: str) -> Iterator[None]:
  """SIGINT and SIGTERM raise Interrupted in the main thread; a second one exits at once.

  Outside the main thread (where handlers cannot be set) this does nothing.
  """
  if threading.current_thread() is not threading.main_thread():
    yield
    return

  def on_signal(signum, frame):
    del frame
    if _received:  # the orderly stop is stuck, or its exception was swallowed
      _write_line(f"error: interrupted again ({signal.Signals(signum).name}); exiting at once. "
                  f"Checkpoints are written atomically: the same command resumes from the "
                  f"last complete one in {ckpt_dir}")
      exit_now(128 + signum)
    _received.append(signum)
    if not _deferring:
      raise Interrupted(signum)

  def unraisable(info):  # check() raises a swallowed Interrupted again: no traceback for it
    if not isinstance(info.exc_value, Interrupted):
      previous_hook(info)

  previous = {s: signal.signal(s, on_signal) for s in SIGNALS}
  previous_hook, sys.unraisablehook = sys.unraisablehook, unraisable
  try:
    yield
  finally:
    for s, handler in previous.items():
      signal.signal(s, handler)
    sys.unraisablehook = previous_hook
    _received.clear()


def _write_line(text: str) -> None:
  # os.write, not print: a signal can arrive while the main thread is inside a print.
  os.write(sys.stderr.fileno(), (text + "\n").encode(errors="replace"))


def _children() -> list[int]:
  """This process's child pids (Linux /proc; elsewhere none are found)."""
  me, pids = os.getpid(), []
  try:
    names = os.listdir("/proc")
  except OSError:
    return pids
  for name in names:
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat", "rb") as f:
        stat = f.read()
    except OSError:  # it exited meanwhile
      continue
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after its end.
    if int(stat[stat.rfind(b")") + 2:].split()[1]) == me:
      pids.append(int(name))
  return pids


def kill_children() -> None:
  """SIGKILLs every child process, and the process group of a child that leads its own."""
  for pid in _children():
    try:
      if os.getpgid(pid) == pid:  # an isolated env worker: it and everything it started
        os.killpg(pid, signal.SIGKILL)
      else:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
      pass


def exit_now(code: int) -> None:
  """Flushes the output, kills the child processes and exits with `code`, skipping the
  interpreter's teardown (module docstring)."""
  for stream in (sys.stdout, sys.stderr):
    try:
      stream.flush()
    except (OSError, ValueError, RuntimeError):  # closed, or a print the signal interrupted
      pass
  for handler in logging.getLogger().handlers:
    try:
      handler.flush()
    except (OSError, ValueError, RuntimeError):
      pass
  kill_children()
  os._exit(code)
