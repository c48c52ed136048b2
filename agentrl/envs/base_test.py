"""Tests for agentrl.envs.base and the registry, and that agentrl.envs never imports jax."""
import json
import os
import subprocess
import sys

from absl.testing import absltest

from agentrl.envs import base
from agentrl.envs import registry

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_LIST_JAX = ("import json\n"
             "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
             "('jax', 'jaxlib'))))")


def _imported_jax_modules(imports: str) -> list[str]:
  out = subprocess.run([sys.executable, "-c", f"import sys\n{imports}\n{_LIST_JAX}"], cwd=ROOT,
                       capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONPATH=ROOT))
  return json.loads(out.stdout.strip().splitlines()[-1])


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
    self.assertIs(registry.ENVS["calculator"], type(registry.make("calculator")))

  def test_registry_passes_an_env_argument_called_name(self):
    try:
      env = registry.make("reasoning_gym", name="basic_arithmetic")
    except ImportError:
      self.skipTest("needs reasoning-gym (the envs extra)")
    self.assertIsInstance(env.reset(0), str)


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
