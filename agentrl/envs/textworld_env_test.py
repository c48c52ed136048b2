"""Tests for agentrl.envs.textworld_env (one tiny generated game; skipped without textworld)."""
import os
import shutil
import sys
import tempfile
import time
from unittest import mock

from absl.testing import absltest

from agentrl.envs import safe
from agentrl.envs import textworld_env

try:
  import textworld  # pylint: disable=g-import-not-at-top
except ImportError:
  textworld = None

RAW = ("\n\n\n                    ________  ________  __    __  ________        \n"
       "                   |        \\|        \\|  \\  |  \\|        \\       \n"
       "                      | $$   | $$  \\     >$$  $$    | $$          \n\n"
       "Welcome! Take the coin.\n\n-= Attic =-\nYou arrive in an attic.\n\n\n\n"
       "There is an exit to the north.\n\n>                                  -= Attic =-0/1")
END = ("\nYou pick up the coin.\n\n\n\nYour score has just gone up by one point.\n\n\n"
       "                 *** The End ***\n\nYou scored 1 out of a possible 1, in 3 turns.\n\n\n"
       "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?\n"
       ">                                  -= Scullery =-0/2")


class CleanObservationTest(absltest.TestCase):

  def test_strips_inform7_residue(self):
    self.assertEqual(textworld_env.clean_observation(RAW),
                     "Welcome! Take the coin.\n\n-= Attic =-\nYou arrive in an attic.\n\n"
                     "There is an exit to the north.")
    self.assertEqual(textworld_env.clean_observation(END),
                     "You pick up the coin.\n\nYour score has just gone up by one point.\n\n"
                     "You scored 1 out of a possible 1, in 3 turns.")

  def test_parse_command(self):
    self.assertEqual(textworld_env.parse_command("I should go.\n`Go  North`."), "go north")
    self.assertEqual(textworld_env.parse_command("<action>take coin</action>\nok"), "take coin")
    self.assertEqual(textworld_env.parse_command(" \n"), "")

  def test_bad_arguments_are_named(self):
    with self.assertRaisesRegex(ValueError, "coin_collector"):
      textworld_env.TextWorldEnv("zork")
    with self.assertRaisesRegex(ValueError, "level"):
      textworld_env.TextWorldEnv("coin_collector", levle=3)
    with self.assertRaisesRegex(FileNotFoundError, "nope.z8"):
      textworld_env.TextWorldEnv(game_files=["/nope.z8"])


@absltest.skipIf(textworld is None, "textworld is not installed (pip install -e '.[envs]')")
class TextWorldEnvTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = tempfile.mkdtemp()
    cls.settings = dict(world_size=2, nb_objects=2, quest_length=2)
    cls.env = textworld_env.TextWorldEnv("custom", pool=cls.pool, **cls.settings)
    cls.first_obs = cls.env.reset(0)  # generates the one game of this test class

  @classmethod
  def tearDownClass(cls):
    cls.env.close()
    shutil.rmtree(cls.pool, ignore_errors=True)
    super().tearDownClass()

  def test_observation_is_clean_and_lists_commands(self):
    self.assertNotIn("$$", self.first_obs)
    self.assertFalse(any(line.startswith(">") for line in self.first_obs.splitlines()))
    self.assertIn("\nValid commands: ", self.first_obs)

  def test_walkthrough_wins_with_return_one(self):
    self.env.reset(0)
    plan = list(self.env._state["policy_commands"])
    self.assertNotEmpty(plan)
    rewards, info, done = [], {}, False
    for command in plan:
      self.assertFalse(done)
      _, reward, done, info = self.env.step(f"<action>{command}</action>")
      rewards.append(reward)
      self.assertEqual(info["error"], "")
      self.assertIn("admissible_commands", info)
    self.assertTrue(done)
    self.assertTrue(info["success"])
    self.assertAlmostEqual(sum(rewards), 1.0)

  def test_reset_is_deterministic_and_game_is_cached(self):
    self.assertEqual(self.env.reset(0), self.first_obs)
    path = textworld_env.make_game("custom", 0, pool=self.pool, **self.settings)
    mtime = os.path.getmtime(path)
    start = time.monotonic()
    self.assertEqual(textworld_env.make_game("custom", 0, pool=self.pool, **self.settings), path)
    self.assertLess(time.monotonic() - start, 0.5)
    self.assertEqual(os.path.getmtime(path), mtime)
    self.assertEqual(sorted(os.listdir(self.pool)),
                     sorted([os.path.basename(path), os.path.basename(path)[:-3] + ".json"]))

  def test_invalid_and_empty_commands_and_turn_limit(self):
    env = safe.SafeEnv(textworld_env.TextWorldEnv(
        game_files=[self.env.game_file(0)], max_turns=3))
    env.reset(0)
    obs, reward, done, info = env.step("xyzzy")
    self.assertEqual((reward, done), (0.0, False))
    self.assertIn("not an admissible command", info["error"])
    self.assertNotIn(">", obs.splitlines()[0])
    obs, reward, done, info = env.step("   ")
    self.assertTrue(obs.startswith("Error: empty command"))
    self.assertFalse(done)
    _, _, done, info = env.step("look")
    self.assertTrue(done)
    self.assertFalse(info["success"])
    self.assertEqual(env.counters["invalid_actions"], 2)
    self.assertEqual(env.counters["empty_actions"], 1)
    self.assertEqual(env.counters["env_errors"], 0)


class MissingPackageTest(absltest.TestCase):

  def test_error_names_the_install_command(self):
    pool = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, pool)
    with mock.patch.dict(sys.modules, {"textworld": None}):
      with self.assertRaisesRegex(ImportError, r"pip install -e '\.\[envs\]'"):
        textworld_env.make_game("custom", 12345, pool=pool)


if __name__ == "__main__":
  absltest.main()
