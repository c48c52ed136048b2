"""The env table: every row builds with its defaults, and its derived names and checks agree."""
import importlib.util

from absl.testing import absltest
from absl.testing import parameterized

from agentrl import configs
from agentrl.envs import registry
from agentrl.harness import recipe
from agentrl.harness import rl_config

# The optional package each engine- or library-backed env needs.
PACKAGES = {"reasoning_gym": "reasoning_gym", "search": "rank_bm25", "textworld": "textworld",
            "alfworld": "alfworld"}


class RegistryTest(parameterized.TestCase):

  @parameterized.named_parameters((name, name) for name in registry.NAMES)
  def test_every_row_builds_with_its_defaults(self, name):
    package = PACKAGES.get(name)
    if package and importlib.util.find_spec(package) is None:
      self.skipTest(f"{name} needs the {package} package (pip install -e '.[envs]')")
    tc = registry.task_config(name)
    env = recipe.make_task(tc)()
    try:
      self.assertIsInstance(env.reset(0), str)
      want = tc["max_turns"] if name != "thinker" else tc["max_turns"] * 2 - 1
      self.assertEqual(env.max_turns, want)
    finally:
      if hasattr(env, "close"):
        env.close()

  def test_derived_names_agree(self):
    self.assertEqual(rl_config.TASKS, registry.NAMES)
    self.assertEqual(rl_config.RL_SCHEMA["task.name"].choices, registry.SINGLE_TURN)
    self.assertEqual(registry.SINGLE_TURN, ("arithmetic", "verbose_arithmetic", "reasoning_gym"))
    task_keys = {k[len("task."):] for k in rl_config.RL_SCHEMA if k.startswith("task.")}
    self.assertEqual(task_keys, set(rl_config.rl_config().task))

  def test_fields_fill_constructor_arguments(self):
    kwargs = registry.constructor_kwargs(dict(name="tool_use", family="weekday", max_turns=3,
                                              digits=4))   # digits: another env's, unread
    self.assertEqual(kwargs, {"task": "weekday", "max_turns": 3})   # tool_format "": its own
    rg = registry.constructor_kwargs(dict(name="reasoning_gym", rg_config='{"max_digits": 2}'))
    self.assertEqual((rg["name"], rg["max_digits"], rg["system_prompt"]),
                     ("basic_arithmetic", 2, None))

  def test_bad_name_key_or_value_is_one_config_error(self):
    with self.assertRaisesRegex(configs.ConfigError,
                                r"task\.name must be one of \('arithmetic'.*got 'chess'"):
      registry.factory(dict(name="chess"))
    with self.assertRaisesRegex(configs.ConfigError,
                                r"config\.task\.colour is not a key .*'digits'"):
      registry.factory(dict(name="arithmetic", colour="red"))
    with self.assertRaisesRegex(configs.ConfigError,
                                r"config\.task\.family must be one of .*task\.name='thinker'"):
      registry.factory(dict(name="thinker", family="cipher"))
    with self.assertRaisesRegex(configs.ConfigError, r"config\.task\.top_k is not a key"):
      registry.task_config("arithmetic", top_k=2)
    with self.assertRaisesRegex(configs.ConfigError, r"config\.task \(task\.name='thinker'\)"):
      recipe.make_task(registry.task_config("thinker", max_turns=3, first=3))

  def test_reasoning_gym_generator_arguments_are_checked_up_front(self):
    if importlib.util.find_spec("reasoning_gym") is None:
      self.skipTest("needs reasoning_gym")
    with self.assertRaisesRegex(configs.ConfigError, r"rg_config does not fit"):
      registry.factory(dict(name="reasoning_gym", rg_config='{"no_such_argument": 1}'))
    with self.assertRaisesRegex(configs.ConfigError, r"rg_config must be a JSON object"):
      registry.factory(dict(name="reasoning_gym", rg_config="[1]"))

  def test_textworld_keys_become_constructor_arguments(self):
    kwargs = registry.constructor_kwargs(registry.task_config(
        "textworld", **registry.TEXTWORLD_STUDY))
    self.assertEqual(kwargs, {"kind": "coin_collector", "level": 15, "max_turns": 20,
                              "pool_size": 200, "heldout_pool_size": 64, "pool": None,
                              "observation": "compact", "objective": False})
    defaults = registry.constructor_kwargs(registry.task_config("textworld"))
    self.assertEqual((defaults["pool_size"], defaults["heldout_pool_size"], "level" in defaults),
                     (None, None, False))
    for bad in ("[1]", "{level: 3}"):
      with self.assertRaisesRegex(configs.ConfigError, r"task\.game_settings must be a JSON"):
        registry.constructor_kwargs(registry.task_config("textworld", game_settings=bad))
    self.assertEqual(registry.ENVS["textworld"].parse_action("go east\n<action>Take coin</action>"),
                     ("take", "coin"))
    self.assertIsNone(registry.ENVS["textworld"].parse_action("  "))

  def test_tool_format_is_a_checked_key_with_each_env_its_own_default(self):
    union = registry.task_config("hidden_rule", names=registry.NAMES)
    self.assertEqual(union["tool_format"], "")
    for name, want in (("calculator", "tags"), ("search", "tags"), ("tool_use", "hermes")):
      if name in PACKAGES and importlib.util.find_spec(PACKAGES[name]) is None:
        continue
      self.assertEqual(registry.factory({**union, "name": name})().tools.fmt, want, name)
      env = registry.factory({**union, "name": name, "tool_format": "hermes"})()
      self.assertEqual(env.tools.fmt, "hermes", name)
      self.assertIn("<tool_call>", env.system_prompt, name)
    self.assertEqual(registry.constructor_kwargs(dict(name="calculator", tool_format="tags")),
                     {"num_ops": 3, "max_operand": 999, "max_turns": 4, "tool_format": "tags"})
    with self.assertRaisesRegex(configs.ConfigError,
                                r"config\.task\.tool_format must be one of \('', 'hermes', "
                                r"'tags'\).*got 'json' \(for task\.name='tool_use'\)"):
      registry.factory(dict(name="tool_use", tool_format="json"))
    with self.assertRaisesRegex(configs.ConfigError, r"config\.task\.tool_format is not a key"):
      registry.task_config("arithmetic", tool_format="tags")

  def test_a_shared_key_accepts_what_any_env_does(self):
    family = registry.schema(("hidden_rule", "tool_use"))["task.family"]
    self.assertIn("cipher", family.choices)
    self.assertIn("weekday", family.choices)


if __name__ == "__main__":
  absltest.main()
