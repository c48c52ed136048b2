"""Tests for agentrl.envs.alfworld_env (skipped unless alfworld and textworld[pddl] import)."""
import os
import shutil
import tempfile

from absl.testing import absltest

from agentrl.envs import alfworld_env
from agentrl.envs import testing

try:
  alfworld_env.import_alfworld()
  _MISSING = None
except ImportError as e:
  _MISSING = str(e)


@absltest.skipIf(_MISSING is not None, f"{_MISSING}")
class AlfWorldEnvTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.pool = tempfile.mkdtemp()
    cls.env = alfworld_env.AlfWorldEnv(pool=cls.pool, max_turns=30, policy_commands=True)
    cls.first_obs = cls.env.reset(0)  # generates and plans the one game of this test class

  @classmethod
  def tearDownClass(cls):
    cls.env.close()
    shutil.rmtree(cls.pool, ignore_errors=True)
    super().tearDownClass()

  def test_problem_generation_is_deterministic(self):
    a, b = alfworld_env.make_problem(3), alfworld_env.make_problem(3)
    self.assertEqual(a, b)
    self.assertNotEqual(a["pddl_problem"], alfworld_env.make_problem(4)["pddl_problem"])
    self.assertIn(a["task_type"], alfworld_env.TASK_TYPES)
    self.assertIn(f"Your task is to: {a['task']}.", a["grammar"])
    kinds = {alfworld_env.make_problem(s, max_receptacles=6)["task_type"] for s in range(12)}
    self.assertGreater(len(kinds), 2)

  def test_planner_walkthrough_wins(self):
    self.assertIn("Your task is to: ", self.first_obs)
    self.assertIn("Valid commands: go to ", self.first_obs)
    self.env.reset(0)
    plan = list(self.env._state["policy_commands"])
    self.assertNotEmpty(plan)
    total, info = 0.0, {}
    for command in plan:
      _, reward, done, info = self.env.step(command)
      total += reward
    self.assertTrue(done)
    self.assertTrue(info["success"])
    self.assertEqual(total, 1.0)

  def test_invalid_command_and_real_loader(self):
    # The $ALFWORLD_DATA layout (<task>/<trial>/game.tw-pddl), here holding a generated game.
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root)
    os.makedirs(os.path.join(root, "pick", "trial_0"))
    shutil.copy(self.env.game_file(0), os.path.join(root, "pick", "trial_0", "game.tw-pddl"))
    games = alfworld_env.find_games(root)
    self.assertLen(games, 1)
    env = alfworld_env.AlfWorldEnv(game_files=games, max_turns=2)
    self.assertEqual(env.reset(7), self.first_obs)
    obs, reward, done, info = env.step("fly to the moon")
    self.assertEqual((obs.split("\n")[0], reward, done), ("Nothing happens.", 0.0, False))
    self.assertIn("not an admissible command", info["error"])
    self.assertTrue(env.step("look")[2])  # max_turns=2
    with self.assertRaisesRegex(FileNotFoundError, "ALFWORLD_DATA"):
      alfworld_env.find_games(os.path.join(root, "pick", "trial_0", "empty"))

  def test_isolated_matches_in_process_and_refuses_unsafe_commands(self):
    remote = alfworld_env.AlfWorldEnv.isolated(pool=self.pool, max_turns=30,
                                               policy_commands=True)
    self.addCleanup(remote.close)
    self.assertEqual((remote.system_prompt, remote.max_turns), (alfworld_env.SYSTEM_PROMPT, 30))
    self.assertEqual(remote.reset(0), self.first_obs)
    self.env.reset(0)
    for command in ["look", self.env._state["policy_commands"][0]]:
      self.assertEqual(remote.step(command), self.env.step(command))
    obs, reward, done, info = remote.step("take apple\x00")
    self.assertEqual((reward, done, info["unsafe_action"]), (0.0, False, True))
    self.assertIn("'\\x00'", obs)

  def test_episode_and_seed_contract(self):
    env = alfworld_env.AlfWorldEnv(game_files=[self.env.game_file(0)], max_turns=2)
    self.addCleanup(env.close)
    testing.assert_env_contract(self, env, action="look")

  def test_bad_task_type(self):
    with self.assertRaisesRegex(ValueError, "pick_and_place_simple"):
      alfworld_env.make_problem(0, task_types=("juggle",))


if __name__ == "__main__":
  absltest.main()
