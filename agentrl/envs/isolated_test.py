"""Tests for agentrl.envs.isolated: a hung or crashed env costs one episode and is counted."""
import functools
import gc
import io
import os
import subprocess
import sys
import time
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.envs import base
from agentrl.envs import isolated
from agentrl.envs import safe
from agentrl.envs import testing

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _pid(obs: str) -> int:
  return int(obs.rsplit(" ", 1)[1])  # ToyEnv.reset: "start <seed> in <pid>"


def _exists(pid: int) -> bool:
  """Whether process `pid` is running (a zombie that nobody reaped yet counts as gone)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"
  except FileNotFoundError:
    return False


class IsolatedEnvTest(parameterized.TestCase):

  def tearDown(self):
    isolated.shutdown()
    super().tearDown()

  def test_forwards_the_env_protocol(self):
    env = isolated.IsolatedEnv(functools.partial(testing.ToyEnv, max_turns=7))
    self.addCleanup(env.close)
    self.assertIsInstance(env, base.Env)
    self.assertEqual((env.system_prompt, env.max_turns), ("Say win.", 7))
    obs = env.reset(3)
    self.assertTrue(obs.startswith("start 3 in "))
    self.assertNotEqual(_pid(obs), os.getpid())
    self.assertEqual(env.step("win"), ("echo win", 1.0, True, base.make_info(reward=1.0,
                                                                             success=True)))

  @parameterized.parameters("hang", "spin")
  def test_hung_step_is_killed_and_the_next_reset_works(self, action):
    env = safe.SafeEnv(isolated.IsolatedEnv(testing.ToyEnv, timeout_s=0.5))
    pid = _pid(env.reset(0))
    start = time.monotonic()
    obs, reward, done, info = env.step(action)
    self.assertLess(time.monotonic() - start, 3.0)
    self.assertEqual((reward, done), (0.0, True))
    self.assertIn("did not answer within 0.5 s", obs)
    self.assertIn("EnvTimeout", info["error"])
    self.assertFalse(_exists(pid))
    self.assertEqual((env.counters["env_timeouts"], env.counters["env_errors"]), (1, 0))
    new_pid = _pid(env.reset(1))
    self.assertNotEqual(new_pid, pid)
    self.assertEqual(env.step("win")[1:3], (1.0, True))

  @parameterized.parameters(("segfault", "killed by SIGSEGV"), ("exit", "exit code 139"))
  def test_crash_costs_one_episode_and_is_counted(self, action, message):
    env = safe.SafeEnv(isolated.IsolatedEnv(testing.ToyEnv))
    pid = _pid(env.reset(0))
    obs, reward, done, info = env.step(action)
    self.assertEqual((reward, done), (0.0, True))
    self.assertIn(message, obs)
    self.assertIn("EnvCrash", info["error"])
    self.assertEqual(env.step("win")[2], True)  # the episode stays over
    self.assertEqual((env.counters["env_crashes"], env.counters["steps_after_done"]), (1, 1))
    self.assertNotEqual(_pid(env.reset(1)), pid)
    self.assertEqual(env.step("win")[1], 1.0)
    self.assertEqual(env.counters["env_crashes"], 1)

  def test_hung_reset_is_an_error_observation(self):
    env = safe.SafeEnv(isolated.IsolatedEnv(testing.ToyEnv, reset_timeout_s=0.5))
    self.assertIn("did not answer", env.reset(testing.HANG_SEED))  # ToyEnv.reset sleeps
    self.assertTrue(env.step("win")[2])
    self.assertEqual((env.counters["env_timeouts"], env.counters["steps_after_done"]), (1, 1))
    self.assertTrue(env.reset(2).startswith("start 2"))

  def test_episode_and_seed_contract(self):
    # ToyEnv pays "win" whenever it comes and takes any seed; IsolatedEnv keeps the contract.
    env = isolated.IsolatedEnv(testing.ToyEnv)
    self.addCleanup(env.close)
    testing.assert_env_contract(self, env, action="win", answer=lambda env, info: "win")

  def test_env_exception_is_raised_and_the_worker_survives(self):
    env = isolated.IsolatedEnv(testing.ToyEnv)
    pid = _pid(env.reset(0))
    with self.assertRaisesRegex(ValueError, "toy failure") as cm:
      env.step("raise")
    self.assertIn("in step", "".join(cm.exception.__notes__))  # the worker's traceback
    self.assertEqual(_pid(env.reset(0)), pid)
    safe_env = safe.SafeEnv(env)
    safe_env.reset(0)
    safe_env.step("raise")
    self.assertEqual(safe_env.counters["env_errors"], 1)

  def test_bad_make_env_fails_at_construction(self):
    with self.assertRaisesRegex(TypeError, "picklable"):
      isolated.IsolatedEnv(lambda: testing.ToyEnv())
    with self.assertRaisesRegex(ValueError, "told to fail"):
      isolated.IsolatedEnv(functools.partial(testing.ToyEnv, fail=True))
    with self.assertRaisesRegex(ValueError, "positive"):
      isolated.IsolatedEnv(testing.ToyEnv, timeout_s=0)

  def test_workers_are_reused_after_close_and_garbage_collection(self):
    # An env of an earlier test, freed by the cycle collector in mid-test, would hand its
    # ToyEnv worker to the pool and be reused instead: collect now, then drop the idle ones.
    gc.collect()
    isolated.shutdown()
    env = isolated.IsolatedEnv(testing.ToyEnv)
    pid = _pid(env.reset(0))
    env.close()
    with self.assertRaisesRegex(RuntimeError, "closed"):
      env.reset(0)
    env = isolated.IsolatedEnv(testing.ToyEnv)
    testing.assert_no_episode(self, env, "win")  # the reused worker's env is mid-episode
    self.assertEqual(_pid(env.reset(0)), pid)
    del env  # garbage-collected: the worker goes back to the pool
    other = isolated.IsolatedEnv(functools.partial(testing.ToyEnv, max_turns=2))
    self.assertNotEqual(_pid(other.reset(0)), pid)  # a different make_env gets its own
    self.assertEqual(_pid(isolated.IsolatedEnv(testing.ToyEnv).reset(0)), pid)
    other.close()
    isolated.shutdown()
    self.assertFalse(_exists(pid))

  def test_worker_output_is_capped(self):
    env = isolated.IsolatedEnv(testing.ToyEnv, max_output_bytes=1000)
    env.reset(0)
    with mock.patch.object(sys, "stderr", io.StringIO()) as stderr:
      self.assertEqual(env.step("print 300000")[0], "echo print 300000")
      env.close()
      isolated.shutdown()  # kills the worker and waits for its output
    self.assertEqual(stderr.getvalue().count("x"), 1000)
    self.assertIn("the rest is dropped", stderr.getvalue())

  def test_worker_dies_with_its_parent(self):
    script = ("from agentrl.envs import isolated, testing\n"
              "env = isolated.IsolatedEnv(testing.ToyEnv)\n"
              "print(env.reset(0), flush=True)\n"
              "env.step('hang')\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE,
                              text=True, env=dict(os.environ, PYTHONPATH=ROOT))
    pid = _pid(parent.stdout.readline())
    self.assertTrue(_exists(pid))
    parent.kill()
    parent.wait()
    parent.stdout.close()
    deadline = time.monotonic() + 5.0
    while _exists(pid) and time.monotonic() < deadline:
      time.sleep(0.1)
    self.assertFalse(_exists(pid))


if __name__ == "__main__":
  absltest.main()
