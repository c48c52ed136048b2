"""Tests for agentrl.envs.base and the registry, and that agentrl.envs never imports jax.

`ContractTest` runs the episode and seed contract of base.py on every registered env, each
built small; envs whose optional package is missing are skipped. TextWorld and ALFWorld run as
the registry builds them (isolated in a worker process), on one game cached in the game pool.
"""
import json
import os
import subprocess
import sys

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from agentrl.envs import base
from agentrl.envs import registry
from agentrl.envs import testing
from agentrl.envs import textworld_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIST_JAX = ("import json\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('jax', 'jaxlib'))))")


def _imported_jax_modules(imports: str) -> list[str]:
  out = subprocess.run([sys.executable, "-c", f"import sys\n{imports}\n{_LIST_JAX}"], cwd=ROOT,
                       capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))
  return json.loads(out.stdout.strip().splitlines()[-1])


_TAG = "<answer>{}</answer>"
_TARGET = lambda env, info: _TAG.format(info["target"])
# name -> (registry.make kwargs, an action that ends an episode, (env, last info) -> the
# correct action, or None).
CASES = {
    "arithmetic": ({}, "0", lambda env, info: info["target"]),
    "calculator": ({}, _TAG.format(0), _TARGET),
    "hidden_rule": ({"family": "transform", "max_turns": 2}, "answer 0",
                    lambda env, info: env.gold_action),
    "reasoning_gym": ({"name": "basic_arithmetic"}, _TAG.format("none"), _TARGET),
    "tool_use": ({}, _TAG.format("none"), _TARGET),
    "search": ({"corpus_size": 20}, _TAG.format("none"),
               lambda env, info: _TAG.format(info["answers"][0])),
    "textworld": ({"kind": "custom", "max_turns": 1, "world_size": 2, "nb_objects": 2,
                   "quest_length": 2}, "look", None),
    "alfworld": ({"max_turns": 1}, "look", None),
    "verbose_arithmetic": ({}, "0", lambda env, info: info["target"]),
    "thinker": ({"schedule": "never", "max_turns": 2}, "guess 1",
                lambda env, info: env.gold_action),
}


class ProtocolTest(absltest.TestCase):

  def test_builtins_satisfy_the_protocol(self):
    for name in ("arithmetic", "calculator", "hidden_rule"):
      env = registry.make(name)
      self.assertIsInstance(env, base.Env, name)
      self.assertIsInstance(env.system_prompt, str)
      self.assertGreaterEqual(env.max_turns, 1)
      obs = env.reset(0)
      self.assertIsInstance(obs, str)
      obs, reward, done, info = env.step("")
      self.assertIsInstance(obs, str)
      self.assertIsInstance(reward, float)
      self.assertIsInstance(done, bool)
      self.assertEqual(set(base.REQUIRED_INFO_KEYS) - set(info), set(), name)
      self.assertEqual(info["reward"], reward)
    self.assertNotIsInstance(object(), base.Env)

  def test_make_info(self):
    self.assertEqual(base.make_info(reward=1, success=1, extra="x"),
                     {"success": True, "error": "", "reward": 1.0, "extra": "x"})

  def test_registry_rejects_unknown_names(self):
    with self.assertRaisesRegex(ValueError, "hidden_rule"):
      registry.make("chess")
    self.assertIs(registry.ENVS["calculator"].build, type(registry.make("calculator")))

  def test_registry_passes_an_env_argument_called_name(self):
    try:
      env = registry.make("reasoning_gym", name="basic_arithmetic")
    except ImportError:
      self.skipTest("needs reasoning-gym (the envs extra)")
    self.assertIsInstance(env.reset(0), str)


class _FlakyEnv:
  """Counts its turns; reset(5) fails after changing its state, step("raise") raises."""

  system_prompt, max_turns = "", 3

  @base.episode_reset
  def reset(self, seed):
    self.turn = 0
    if seed == 5:
      raise OSError("game file vanished")
    return f"game {seed}"

  @base.episode_step
  def step(self, action):
    if action == "raise":
      raise RuntimeError("engine bug")
    self.turn += 1
    done = self.turn >= self.max_turns
    return "ok", 1.0, done, base.make_info(reward=1.0)


class SeedAndEpisodeTest(absltest.TestCase):

  def test_check_seed(self):
    self.assertEqual(base.check_seed(np.uint32(7)), 7)
    self.assertIs(type(base.check_seed(np.int64(7))), int)
    self.assertEqual(base.check_seed(base.SEED_LIMIT - 1), 2**32 - 1)
    for seed in testing.BAD_SEEDS:
      with self.assertRaisesRegex(ValueError, r"seed=.*use an int in \[0, 2\*\*32\)"):
        base.check_seed(seed)
    with self.assertRaisesRegex(ValueError, r"^seed='xxxx"):
      base.check_seed("x" * 10**6)  # the message stays one short line

  def test_decorated_env_keeps_the_contract(self):
    testing.assert_env_contract(self, _FlakyEnv(), action="go")

  def test_any_failed_reset_or_step_ends_the_episode(self):
    env = _FlakyEnv()
    env.reset(1)
    with self.assertRaisesRegex(OSError, "vanished"):
      env.reset(5)  # fails after changing state: game 1 must not go on
    testing.assert_no_episode(self, env, "go")
    env.reset(1)
    with self.assertRaisesRegex(RuntimeError, "engine bug"):
      env.step("raise")
    testing.assert_no_episode(self, env, "go")
    self.assertEqual(env.reset(2), "game 2")
    self.assertEqual(env.step("go")[:3], ("ok", 1.0, False))

  def test_outside_episode_is_what_safe_env_answers(self):
    obs, reward, done, info = base.outside_episode()
    self.assertEqual((obs, reward, done), (f"Error: {base.NO_EPISODE}", 0.0, True))
    self.assertEqual(info, base.make_info(reward=0.0, error=base.NO_EPISODE))


class ContractTest(parameterized.TestCase):

  def test_every_registered_env_has_a_case(self):
    self.assertEqual(set(CASES), set(registry.ENVS))

  @parameterized.named_parameters((name, name) for name in sorted(CASES))
  def test_contract(self, name):
    kwargs, action, answer = CASES[name]
    if name in ("textworld", "alfworld"):
      kwargs = {**kwargs, "pool": textworld_env.pool_dir()}  # games cached across runs
    try:
      env = registry.make(name, **kwargs)
    except ImportError as e:
      self.skipTest(f"{name} needs an optional package: {e}")
    if hasattr(env, "close"):
      self.addCleanup(env.close)
    testing.assert_env_contract(self, env, action=action, answer=answer)


class NoJaxTest(absltest.TestCase):

  def test_envs_package_does_not_import_jax(self):
    imports = ("from agentrl.envs import registry, safe, base\n"
               "from agentrl.envs import textworld_env, reasoning_gym_env\n"
               "registry.make('hidden_rule').reset(0)")
    self.assertEqual(_imported_jax_modules(imports), [])

  def test_the_check_detects_jax(self):
    self.assertIn("jax", _imported_jax_modules("import agentrl.types"))


if __name__ == "__main__":
  absltest.main()
