"""Tests for agentrl.envs.textworld_env (one tiny generated game; skipped without textworld)."""
import functools
import io
import os
import random
import shutil
import sys
import tempfile
import time
from unittest import mock

from absl.testing import absltest

from agentrl.data import generators
from agentrl.envs import arithmetic
from agentrl.envs import isolated
from agentrl.envs import safe
from agentrl.envs import testing
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

  def test_unsafe_commands(self):
    for command, reason in [("\x00", r"'\x00'"), ("take coin\x00", r"'\x00'"), ("\\q", r"'\\'"),
                            ("take \\x coin", r"'\\'"), ("go\x1bnorth", r"'\x1b'"),
                            ("take caf\u00e9", "'\u00e9'"), ("\ud800", r"'\ud800'"),
                            ("x" * 129, "longer than 128"), ("save", "'save' is an interpreter"),
                            ("script on", "'script'"), ("q", "'q'"), ("restore", "'restore'")]:
      self.assertIn(reason, textworld_env.unsafe_command(command), repr(command))
    for command in ("take coin", "go north", "put key 1 in box", "x" * 128, "saved", "quit-ish"):
      self.assertEqual(textworld_env.unsafe_command(command), "", command)

  def test_split_objective_and_compact_reply(self):
    first = textworld_env.clean_observation(RAW)
    self.assertEqual(textworld_env.split_objective(first),
                     ("Welcome! Take the coin.",
                      "-= Attic =-\nYou arrive in an attic.\n\nThere is an exit to the north."))
    self.assertEqual(textworld_env.split_objective("You can't go that way."),
                     ("", "You can't go that way."))
    self.assertEqual(textworld_env.compact_reply(first), "Attic")
    self.assertEqual(textworld_env.compact_reply(textworld_env.clean_observation(END)),
                     "You pick up the coin.")
    self.assertEqual(textworld_env.compact_reply("\n\n"), "")

  def test_game_seed_keeps_the_pools_apart(self):
    held, sft, valid = (generators.HELDOUT_START, arithmetic.SFT_SEED_BASE,
                        arithmetic.VALID_SEED_BASE)
    game = functools.partial(textworld_env.game_seed, pool_size=10, heldout_pool_size=3)
    # Training and SFT seeds: the training pool, seed % pool_size.
    self.assertEqual([game(s) for s in (0, 9, 10, 23, held - 1)], [0, 9, 0, 3, 3])
    self.assertEqual([game(sft + k) for k in range(3)], [sft % 10, (sft + 1) % 10,
                                                          (sft + 2) % 10])
    # Held-out and validation seeds: the first 3 seeds of their own range.
    self.assertEqual([game(held + i) for i in (0, 2, 3, 7)], [held, held + 2, held, held + 1])
    self.assertEqual([game(valid + i) for i in (0, 4)], [valid, valid + 1])
    # No pools: every seed is its own game.
    self.assertEqual([textworld_env.game_seed(s) for s in (5, held + 9, sft + 1, valid + 2)],
                     [5, held + 9, sft + 1, valid + 2])
    self.assertEqual(textworld_env.game_seed(held + 7, 10), held + 7)
    seeds = textworld_env.pool_seeds(10, 3)
    self.assertEqual(seeds, [*range(10), held, held + 1, held + 2, valid, valid + 1, valid + 2])
    image = {game(s) for s in [*range(50), *range(held, held + 50), *range(sft, sft + 50),
                               *range(valid, valid + 50)]}
    self.assertEqual(image, set(seeds))

  def test_bad_arguments_are_named(self):
    with self.assertRaisesRegex(ValueError, "coin_collector"):
      textworld_env.TextWorldEnv("zork")
    with self.assertRaisesRegex(ValueError, "level"):
      textworld_env.TextWorldEnv("coin_collector", levle=3)
    with self.assertRaisesRegex(FileNotFoundError, "nope.z8"):
      textworld_env.TextWorldEnv(game_files=["/nope.z8"])
    with self.assertRaisesRegex(ValueError, "observation='short'"):
      textworld_env.TextWorldEnv(observation="short")
    with self.assertRaisesRegex(ValueError, "heldout_pool_size >= 1"):
      textworld_env.TextWorldEnv(heldout_pool_size=0)
    with self.assertRaisesRegex(ValueError, "make_pool needs"):
      textworld_env.TextWorldEnv(pool_size=4).make_pool()


@absltest.skipIf(textworld is None, "textworld is not installed (pip install -e '.[envs]')")
class TextWorldEnvTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = tempfile.mkdtemp()
    cls.settings = dict(world_size=2, nb_objects=2, quest_length=2)
    cls.env = textworld_env.TextWorldEnv("custom", pool=cls.pool, **cls.settings)
    cls.first_obs = cls.env.reset(0)  # generates the one game of this test class
    cls.game = cls.env.game_file(0)

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
      # Every walkthrough command shortens the winning sequence (the last one wins).
      self.assertEqual((info["intermediate_reward"], info["progress"]), (1, 1.0))
    self.assertTrue(done)
    self.assertTrue(info["success"])
    self.assertAlmostEqual(sum(rewards), 1.0)

  def test_progress_is_the_positive_intermediate_reward(self):
    # Each admissible first command, from a fresh episode. In this game the walkthrough's first
    # command shortens the winning sequence (1), "go north" or "close display" lengthen it (-1),
    # look and examine leave it (0); progress is 1.0 for 1 only.
    self.env.reset(0)
    seen = {}
    for command in list(self.env._state["admissible_commands"]):
      self.env.reset(0)
      _, _, _, info = self.env.step(command)
      seen[info["intermediate_reward"]] = seen.get(info["intermediate_reward"], set()) | {
          info["progress"]}
    self.assertEqual(seen, {-1: {0.0}, 0: {0.0}, 1: {1.0}})

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

  def test_episode_and_seed_contract(self):
    # After a failed reset(-1), step() played on in the previous episode's game.
    env = textworld_env.TextWorldEnv(game_files=[self.game], max_turns=2)
    self.addCleanup(env.close)
    testing.assert_env_contract(self, env, action="look")

  def test_invalid_and_empty_commands_and_turn_limit(self):
    env = safe.SafeEnv(textworld_env.TextWorldEnv(
        game_files=[self.env.game_file(0)], max_turns=3))
    env.reset(0)
    obs, reward, done, info = env.step("xyzzy")
    self.assertEqual((reward, done, info["progress"]), (0.0, False, 0.0))
    self.assertIn("not an admissible command", info["error"])
    self.assertNotIn(">", obs.splitlines()[0])
    obs, reward, done, info = env.step("   ")
    self.assertTrue(obs.startswith("Error: empty command"))
    self.assertEqual(info["progress"], 0.0)
    self.assertFalse(done)
    _, _, done, info = env.step("look")
    self.assertTrue(done)
    self.assertFalse(info["success"])
    self.assertEqual(env.counters["invalid_actions"], 2)
    self.assertEqual(env.counters["empty_actions"], 1)
    self.assertEqual(env.counters["env_errors"], 0)

  def test_engine_breaking_actions_are_refused(self):
    # Reaching the game engine, NUL and "\q" spin forever and "take coin\x00" segfaults; run
    # isolated so that a regression fails this test rather than hanging the test run.
    env = safe.SafeEnv(textworld_env.TextWorldEnv.isolated(game_files=[self.game], timeout_s=5.0))
    self.addCleanup(env.env.close)
    env.reset(0)
    for action in ("\x00", "take coin\x00", "\\q", "<action>\\help</action>", "save"):
      start = time.monotonic()
      obs, reward, done, info = env.step(action)
      self.assertLess(time.monotonic() - start, 2.0)
      self.assertTrue(obs.startswith("Error: "), obs)
      self.assertEqual((reward, done, info[safe.UNSAFE_ACTION]), (0.0, False, True))
    self.assertEqual({k: env.counters[k] for k in ("unsafe_actions", "invalid_actions",
                                                   "env_timeouts", "env_crashes")},
                     {"unsafe_actions": 5, "invalid_actions": 5, "env_timeouts": 0,
                      "env_crashes": 0})
    _, _, done, info = env.step("look")
    self.assertEqual((done, info["error"], info[safe.UNSAFE_ACTION]), (False, "", False))

  def test_engine_hang_and_crash_cost_one_episode_when_isolated(self):
    # testing.RawGameEnv sends actions to the engine verbatim, as before the sanitizer.
    env = safe.SafeEnv(isolated.IsolatedEnv(functools.partial(testing.RawGameEnv, self.game),
                                            timeout_s=1.0, max_output_bytes=2000))
    self.addCleanup(isolated.shutdown)
    with mock.patch.object(sys, "stderr", io.StringIO()) as stderr:
      for action, counter in (("\x00", "env_timeouts"), ("take coin\x00", "env_crashes"),
                              ("\\q", "env_timeouts")):
        env.reset(0)
        before = env.counters[counter]
        start = time.monotonic()
        obs, reward, done, _ = env.step(action)
        self.assertLess(time.monotonic() - start, 5.0)
        self.assertEqual((reward, done), (0.0, True))
        self.assertEqual(env.counters[counter], before + 1, obs)
      self.assertIn("-=", env.reset(0))
      obs, _, done, info = env.step("look")
      self.assertEqual((done, info["error"]), (False, ""))
    self.assertEqual((env.counters["env_timeouts"], env.counters["env_crashes"]), (2, 1))
    self.assertIn("DUMB-FROTZ: unknown command", stderr.getvalue())  # "\q" wrote, capped:
    self.assertLess(len(stderr.getvalue()), 2200)

  def test_compact_observation_without_objective(self):
    env = textworld_env.TextWorldEnv(game_files=[self.game], observation="compact",
                                     objective=False)
    self.addCleanup(env.close)
    obs = env.reset(0)
    room, commands = obs.split("\n")
    self.assertEqual(room, textworld_env.compact_reply(self.first_obs))
    listed = commands.split(", ")
    self.assertEqual(listed, [c for c in env._state["admissible_commands"]
                              if c not in ("look", "inventory")])
    obs, _, _, info = env.step("inventory")   # still accepted, not listed
    self.assertEqual((info["error"], obs.split("\n")[1]), ("", commands))
    with_objective = textworld_env.TextWorldEnv(game_files=[self.game], observation="compact")
    self.addCleanup(with_objective.close)
    objective, _ = textworld_env.split_objective(self.first_obs.split("\nValid commands: ")[0])
    self.assertNotEmpty(objective)
    self.assertEqual(with_objective.reset(0), f"{objective}\n\n{room}\n{commands}")
    full = textworld_env.TextWorldEnv(game_files=[self.game], objective=False)
    self.addCleanup(full.close)
    self.assertEqual(full.reset(0), self.first_obs[self.first_obs.index("-= "):])

  def test_demonstration_walks_the_walkthrough_and_recovers_from_detours(self):
    plan = list(self.env._games[self.game].reset()["policy_commands"])
    self.env.reset(0)
    self.env.step("look")   # an episode in progress, which demonstrations leave alone
    self.assertEqual(self.env.demonstration(0, random.Random(0)), plan)
    detoured = self.env.demonstration(0, random.Random(3), noise=0.5)
    self.assertEqual(detoured, self.env.demonstration(0, random.Random(3), noise=0.5))
    self.assertNotEqual(detoured, plan)
    _, _, _, info = self.env.step(plan[0])   # the open episode went on where it was
    self.assertEqual(info["error"], "")
    for actions in (plan, detoured):
      env = textworld_env.TextWorldEnv(game_files=[self.game])
      self.addCleanup(env.close)
      env.reset(0)
      results = [env.step(a) for a in actions]
      self.assertTrue(results[-1][2] and results[-1][3]["success"], actions)
      self.assertFalse(any(done for _, _, done, _ in results[:-1]))
    with self.assertRaisesRegex(ValueError, "noise"):
      self.env.demonstration(0, random.Random(0), noise=1.5)

  def test_make_pool_generates_every_game_once(self):
    env = textworld_env.TextWorldEnv("custom", pool=self.pool, pool_size=1, heldout_pool_size=1,
                                     **self.settings)
    calls = []
    with mock.patch.object(textworld_env, "make_game",
                           side_effect=lambda kind, seed, **kw: f"{kind}-{seed}") as make:
      paths = env.make_pool(log=lambda done, total: calls.append((done, total)))
    self.assertEqual(paths, [f"custom-{s}" for s in textworld_env.pool_seeds(1, 1)])
    self.assertEqual(calls, [(1, 3), (2, 3), (3, 3)])
    self.assertEqual(make.call_args.kwargs, {"pool": self.pool, **self.settings})

  def test_isolated_matches_in_process(self):
    local = textworld_env.TextWorldEnv(game_files=[self.game])
    remote = textworld_env.TextWorldEnv.isolated(game_files=[self.game])
    self.addCleanup(local.close)
    self.addCleanup(remote.close)
    self.assertEqual((remote.system_prompt, remote.max_turns),
                     (local.system_prompt, local.max_turns))
    self.assertEqual(remote.reset(0), local.reset(0))
    plan = list(local._state["policy_commands"])
    results = []
    for command in ["xyzzy", "look", ""] + plan:
      results.append(local.step(command))
      self.assertEqual(remote.step(command), results[-1], command)
    self.assertTrue(results[-1][2])
    self.assertAlmostEqual(sum(r[1] for r in results), 1.0)
    self.assertEqual(remote.demonstration(0, random.Random(5), noise=0.5),
                     local.demonstration(0, random.Random(5), noise=0.5))


class MissingPackageTest(absltest.TestCase):

  def test_error_names_the_install_command(self):
    pool = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, pool)
    with mock.patch.dict(sys.modules, {"textworld": None}):
      with self.assertRaisesRegex(ImportError, r"pip install -e '\.\[envs\]'"):
        textworld_env.make_game("custom", 12345, pool=pool)


if __name__ == "__main__":
  absltest.main()
