"""Tests for agentrl.train.shutdown: signals as one exception, a second one exits, children die."""
import os
import signal
import subprocess
import sys
import textwrap
import time

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.train import shutdown

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A stand-in for a trainer: two children (one leading its own session, as isolated env
# workers do), then a signal to itself under handle_signals; prints the children's pids.
_SCRIPT = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    from agentrl.train import shutdown
    kids = [subprocess.Popen(["sleep", "60"], start_new_session=new) for new in (True, False)]
    print(*[k.pid for k in kids], flush=True)
    with shutdown.handle_signals("/w/ckpt"):
      try:
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
        time.sleep(10)
      except KeyboardInterrupt as e:
        name, code = shutdown.describe(e)
        print(f"stopping after {name}", flush=True)
        if sys.argv[2] == "again":
          os.kill(os.getpid(), signal.SIGINT)
          time.sleep(10)
        shutdown.exit_now(code)
""")


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(") ")[1][0] != "Z"  # a zombie is dead, awaiting its reaper
  except FileNotFoundError:
    return False


class ShutdownTest(parameterized.TestCase):

  @parameterized.parameters(("SIGINT", "once", 130), ("SIGTERM", "once", 143),
                            ("SIGTERM", "again", 130))
  def test_signal_stops_exits_with_its_code_and_kills_children(self, name, times, code):
    out = subprocess.run([sys.executable, "-c", _SCRIPT, name, times], cwd=ROOT,
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=ROOT))
    self.assertEqual(out.returncode, code, out.stderr)
    lines = out.stdout.splitlines()
    self.assertEqual(lines[1], f"stopping after {name}")
    if times == "again":  # the second signal exits at once, naming the checkpoint directory
      self.assertRegex(out.stderr, r"^error: interrupted again \(SIGINT\); exiting at once\. "
                                   r"Checkpoints are written atomically: .* in /w/ckpt\n$")
    if sys.platform.startswith("linux"):
      deadline = time.monotonic() + 5.0
      pids = [int(p) for p in lines[0].split()]
      while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
      self.assertEqual([p for p in pids if _alive(p)], [])

  def test_a_swallowed_interrupt_is_raised_again_by_check(self):
    shutdown.check()  # nothing received: a no-op
    before = signal.getsignal(signal.SIGTERM)
    with shutdown.handle_signals("/w/ckpt"):
      try:  # as in a gc callback or __del__, where Python drops the exception
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
      except KeyboardInterrupt:
        pass
      with self.assertRaises(shutdown.Interrupted) as raised:
        shutdown.check()
      self.assertEqual(raised.exception.exit_code, 143)
    shutdown.check()  # handlers and state are restored on exit
    self.assertIs(signal.getsignal(signal.SIGTERM), before)

  def test_deferred_holds_a_signal_until_the_block_ends(self):
    done = []
    with shutdown.handle_signals("/w/ckpt"):
      with self.assertRaises(shutdown.Interrupted):
        with shutdown.deferred():
          os.kill(os.getpid(), signal.SIGINT)
          time.sleep(0.2)  # a handler that raised would cut this block short
          done.append(True)
    self.assertEqual(done, [True])
    with shutdown.deferred():  # without handle_signals it changes nothing
      done.append(True)


if __name__ == "__main__":
  absltest.main()
