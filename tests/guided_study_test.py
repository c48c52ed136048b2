"""scripts/guided_study.py: its overrides validate and give GRPO and ICPO equal budgets.

The study passes `--config.<key>=<value>` overrides to each experiment binary at one preset;
here they are applied to the experiment's config and validated against its schema, and the two
methods' configs, overrides applied, must agree on every key but the method's own (`loss`,
`guide`): the same model, LoRA, task, optimizer, rollout sizes, steps and evaluation. The table
is checked on hand-made runs.
"""
import functools
import importlib
import importlib.util
import os
from unittest import mock

from absl import flags
from absl.testing import absltest

from agentrl import configs
from agentrl.harness import rl_config
from agentrl.records import study

_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                       "guided_study.py")


@functools.cache
def _load_script():
  # Once per process. The script's flags (--out, --seeds, --steps) go to a FlagValues of their
  # own: scripts/credit_study.py, loaded by its test in the same process, defines the same names
  # on the global one.
  spec = importlib.util.spec_from_file_location("guided_study", _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  own = flags.FlagValues()
  defines = {name: functools.partial(getattr(flags, name), flag_values=own)
             for name in ("DEFINE_string", "DEFINE_integer", "DEFINE_enum", "DEFINE_list")}
  with mock.patch.multiple(flags, **defines):
    spec.loader.exec_module(module)
  return module


def _config(experiment: str, preset: str, overrides):
  """(module, the experiment's config at `preset` with the `--config.a.b=value` overrides)."""
  module = importlib.import_module(study.experiment_module(experiment))
  config = module.get_config(preset)
  for override in overrides:
    key, value = override.removeprefix("--config.").split("=", 1)
    parent, _, leaf = key.rpartition(".")
    node = configs.get(config, parent) if parent else config
    node[leaf] = configs.parse_value(key, value, configs.get(config, key))
  return module, config


class GuidedStudyTest(absltest.TestCase):

  def test_overrides_validate_and_budgets_are_equal(self):
    presets = _load_script().PRESETS
    self.assertEqual(set(presets), {"smollm2", "smoke"})
    for preset, methods in presets.items():
      self.assertEqual(set(methods), {"grpo", "icpo"}, preset)
      built = {}
      for method, (experiment, overrides) in methods.items():
        module, config = _config(experiment, preset, overrides)
        rl_config.validate(config, module.SCHEMA)
        if hasattr(module, "check"):
          module.check(config)
        built[method] = config.to_dict()
      grpo, icpo = built["grpo"], built["icpo"]
      self.assertEqual(set(icpo) - set(grpo), {"guide"}, preset)
      for key in set(grpo) - {"loss"}:
        self.assertEqual(grpo[key], icpo[key], f"{preset}: {key}")
      self.assertGreaterEqual(icpo["guide"]["num_guided"], 1, preset)

  def test_default_steps_are_the_presets(self):
    script = _load_script()
    for experiment in ("grpo", "icpo"):
      _, config = _config(experiment, "smollm2", [])
      self.assertEqual(config.total_steps, script.PRESET_STEPS, experiment)

  def test_smollm2_guided_prompt_fits_the_transcript(self):
    # 3 demonstrations of ~29 tokens + the 41-token chat prompt = 127 tokens (rendered with
    # the SmolLM2 tokenizer); the answer budget must fit after it.
    _, config = _config("icpo", "smollm2", [])
    self.assertGreaterEqual(config.rollout.max_len, 127 + config.rollout.max_new_tokens)

  def test_table(self):
    script = _load_script()
    grpo = {"steps": [0, 5, 10], "success": [0.4, 0.6, 0.8], "auc": 0.6, "reward": 0.5,
            "plain_reward": 0.5, "guided_reward": None, "train_seconds": 300.0}
    icpo = [{"steps": [0, 5, 10], "success": [0.4, s, 0.9], "auc": a, "reward": 0.5,
             "plain_reward": 0.4, "guided_reward": g, "train_seconds": t}
            for s, a, g, t in ((0.7, 0.675, 0.7, 320.0), (0.5, 0.575, 0.9, 340.0))]
    text = script.table({"grpo": [grpo, grpo], "icpo": icpo})
    self.assertIn("| method | step 0 | step 5 | step 10 | AUC | sampled reward: all rows | "
                  "plain rows | guided rows | RL time (s) |\n|---|" + "---:|" * 8, text)
    self.assertIn("| grpo | 40.0 ± 0.0 | 60.0 ± 0.0 | 80.0 ± 0.0 | 60.0 ± 0.0 | 50.0 ± 0.0 | "
                  "50.0 ± 0.0 | — | 300 ± 0 |", text)
    # step 5: mean 60, sample std of (70, 50) = 14.1; guided (70, 90): 80 ± 14.1.
    self.assertIn("| icpo | 40.0 ± 0.0 | 60.0 ± 14.1 | 90.0 ± 0.0 | 62.5 ± 7.1 | 50.0 ± 0.0 | "
                  "40.0 ± 0.0 | 80.0 ± 14.1 | 330 ± 14 |", text)


if __name__ == "__main__":
  absltest.main()
