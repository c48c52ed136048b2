"""Env calls off the decode thread: worker threads, per-call timeouts, abandoned hung calls.

  workers = EnvWorkers(8, timeout_s=300.0)
  workers.submit(Call(slot, "step", env.step, action_text))
  for call in workers.collect(block=True):   # call.result is None when it timed out
    ...
  workers.close()
"""
import queue
import threading
import time


class Call:
  """One env call (reset or step) for a slot; `started` is set by the worker that runs it."""

  def __init__(self, slot: int, kind: str, fn, arg):
    self.slot, self.kind, self.fn, self.arg = slot, kind, fn, arg
    self.started, self.result = None, None


class EnvWorkers:
  """`n` daemon threads running env calls from a queue; a call that outlives the timeout is
  abandoned (its thread is replaced, never joined) and its late result is ignored.

  Queues instead of an executor: a single-turn batch makes a thousand sub-millisecond env calls
  per rollout, where the executor's per-call futures cost more than the calls."""

  def __init__(self, n: int, timeout_s: float | None):
    self.timeout_s, self.todo, self.done = timeout_s, queue.SimpleQueue(), queue.SimpleQueue()
    self.in_flight, self.threads = set(), []
    for _ in range(n):
      self._spawn()

  def _spawn(self):
    thread = threading.Thread(target=self._work, daemon=True)
    thread.start()
    self.threads.append(thread)

  def _work(self):
    while (call := self.todo.get()) is not None:
      call.started = time.monotonic()
      call.result = call.fn(call.arg)     # SafeEnv's reset/step never raise
      self.done.put(call)

  def submit(self, call: Call) -> None:
    self.in_flight.add(call)
    self.todo.put(call)

  def busy(self) -> set[int]:
    return {c.slot for c in self.in_flight}

  def collect(self, block: bool, max_wait_s: float | None = None) -> list[Call]:
    """Calls finished (result set) or timed out (result None) since the last collect; with
    `block`, waits for one (at most max_wait_s, when given)."""
    wait_s = self._wait_s() if block else None
    if block and max_wait_s is not None:
      wait_s = max_wait_s if wait_s is None else min(wait_s, max_wait_s)
    out = []
    while True:
      try:
        call = self.done.get(block=block and not out, timeout=wait_s)
      except queue.Empty:
        break
      if call in self.in_flight:
        self.in_flight.discard(call)
        out.append(call)
    now = time.monotonic()
    for call in list(self.in_flight):
      if self.timeout_s is not None and call.started and now - call.started >= self.timeout_s:
        self.in_flight.discard(call)   # a late result finds it gone and is dropped
        out.append(Call(call.slot, call.kind, None, None))
        self._spawn()                  # its thread is stuck: keep n working
    return out

  def _wait_s(self):
    started = [c.started for c in self.in_flight if c.started]
    if self.timeout_s is None or not started:
      return 0.05 if self.in_flight and self.timeout_s is not None else None
    return max(0.0, min(started) + self.timeout_s - time.monotonic())

  def close(self):
    for _ in self.threads:
      self.todo.put(None)
