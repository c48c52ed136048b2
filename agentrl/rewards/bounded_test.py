"""Tests for agentrl.rewards.bounded: time and memory limits that do not need the GIL."""
import functools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

from absl.testing import absltest

from agentrl.rewards import bounded


def _pool(test, **kwargs) -> bounded.Pool:
  pool = bounded.Pool(**kwargs)
  test.addCleanup(pool.close)
  return pool


def _gone(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(") ")[1].startswith("Z")  # a zombie has stopped computing
  except FileNotFoundError:
    return True


class BoundedTest(absltest.TestCase):

  def test_timeout_holds_on_a_computation_that_never_releases_the_gil(self):
    pool = _pool(self, max_workers=1)
    self.assertEqual(pool.call(abs, -3), 3)  # the worker is started outside the measurement
    ticks, stop = [0], threading.Event()

    def count():
      while not stop.is_set():
        ticks[0] += 1

    counter = threading.Thread(target=count)
    counter.start()
    self.addCleanup(stop.set)
    start = time.monotonic()
    with self.assertRaisesRegex(bounded.Timeout, "timed out after 1 s"):
      pool.call(pow, 10, 10**10, timeout_s=1.0)  # one C-level power: minutes, holding the GIL
    elapsed = time.monotonic() - start
    before = ticks[0]
    time.sleep(0.05)
    stop.set()
    counter.join()
    self.assertBetween(elapsed, 1.0, 3.0)
    self.assertGreater(before, 1000)  # this process's other thread ran while the call waited
    self.assertEqual(pool.call(abs, -4), 4)  # a fresh worker answers
    self.assertEqual(pool.started, 2)

  def test_memory_limit_holds(self):
    pool = _pool(self, max_workers=1, memory_bytes=1 << 30)
    start = time.monotonic()
    with self.assertRaisesRegex(bounded.OutOfMemory, "memory limit"):
      pool.call(bytearray, 8 << 30)
    self.assertLess(time.monotonic() - start, 10.0)
    self.assertEqual(pool.call(len, b"ok"), 2)
    self.assertEqual(pool.started, 2)  # the worker that ran out was replaced

  def test_errors_are_raised_and_the_worker_lives_on(self):
    pool = _pool(self, max_workers=1)
    with self.assertRaisesRegex(ValueError, "invalid literal"):
      pool.call(int, "x")
    self.assertEqual(pool.call(int, "12"), 12)
    self.assertEqual(pool.started, 1)

  def test_pool_survives_killed_workers(self):
    pool = _pool(self, max_workers=1)
    self.assertEqual(pool.call(abs, -1), 1)
    idle = pool._idle[0].proc
    os.kill(idle.pid, signal.SIGKILL)  # dies while idle
    idle.wait()
    self.assertEqual(pool.call(abs, -2), 2)
    pid = pool._idle[0].proc.pid
    threading.Timer(0.3, os.kill, (pid, signal.SIGKILL)).start()  # dies during a call
    with self.assertRaisesRegex(bounded.WorkerDied, "SIGKILL"):
      pool.call(time.sleep, 30, timeout_s=30)
    self.assertEqual(pool.call(abs, -3), 3)
    self.assertEqual(pool.started, 3)

  def test_calls_from_many_threads_run_side_by_side(self):
    pool = _pool(self, max_workers=4)

    def burst(seconds):
      threads = [threading.Thread(target=pool.call, args=(time.sleep, seconds))
                 for _ in range(4)]
      start = time.monotonic()
      for thread in threads:
        thread.start()
      for thread in threads:
        thread.join()
      return time.monotonic() - start

    burst(0.0)  # starts the workers
    self.assertLess(burst(0.5), 1.5)  # one worker would take 2 s
    self.assertEqual(pool.started, 4)

  def test_setup_runs_once_per_worker_outside_the_time_limit(self):
    pool = _pool(self, max_workers=1)
    slow_setup = functools.partial(time.sleep, 1.5)
    self.assertEqual(pool.call(abs, -1, timeout_s=0.5, setup=slow_setup), 1)
    start = time.monotonic()
    self.assertEqual(pool.call(abs, -2, timeout_s=0.5, setup=slow_setup), 2)
    self.assertLess(time.monotonic() - start, 0.5)

  def test_worker_stops_computing_when_its_parent_dies(self):
    script = textwrap.dedent("""
        import os, sys, threading, time
        from agentrl.rewards import bounded
        pool = bounded.Pool(max_workers=1)
        pool.call(abs, 1)
        print(pool._idle[0].proc.pid, flush=True)
        threading.Thread(target=pool.call, args=(pow, 10, 10**10), kwargs={"timeout_s": 0.5},
                         daemon=True).start()
        time.sleep(0.2)
        os._exit(0)  # the parent dies mid-call and cannot kill its worker
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    pid = int(out.split()[0])
    self.addCleanup(lambda: _gone(pid) or os.kill(pid, signal.SIGKILL))
    deadline = time.monotonic() + 30
    while not _gone(pid) and time.monotonic() < deadline:
      time.sleep(0.2)
    self.assertTrue(_gone(pid))  # the CPU-time backstop ended it

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "max_workers"):
      bounded.Pool(max_workers=-1)
    with self.assertRaisesRegex(ValueError, "timeout_s"):
      bounded.call(abs, 1, timeout_s=0)


if __name__ == "__main__":
  absltest.main()
