"""scripts/credit_study.py: every task's method overrides are valid keys of its experiment.

The study passes `--config.<key>=<value>` overrides to an experiment binary; a typo there would
only show after the first run's SFT. Here each task's and method's overrides are applied to the
experiment's `cpu` config and validated against its schema, without running anything.
"""
import functools
import importlib
import importlib.util
import os
import shutil
import tempfile

from absl.testing import absltest

from agentrl import configs
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.records import study

_SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                       "credit_study.py")


@functools.cache
def _load_script():
  # Once per process: the script defines its absl flags when it is executed.
  spec = importlib.util.spec_from_file_location("credit_study", _SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _apply(config, override: str):
  """Sets one `--config.a.b=value` on `config`, typed like the value it replaces."""
  key, value = override.removeprefix("--config.").split("=", 1)
  parent, _, leaf = key.rpartition(".")
  node = configs.get(config, parent) if parent else config
  convert = configs.parse_value
  node[leaf] = convert(key, value, configs.get(config, key))


class CreditStudyTest(absltest.TestCase):

  def test_every_method_override_validates(self):
    tasks = _load_script().TASKS
    self.assertEqual(set(tasks), {"hidden_rule", "tool_use"})
    for task, (experiment, methods, task_flags, _) in tasks.items():
      module = importlib.import_module(study.experiment_module(experiment))
      self.assertIn("grpo", methods, task)   # every task has the outcome-only baseline
      for method, method_flags in methods.items():
        config = module.get_config()
        for override in (*task_flags, *method_flags):
          _apply(config, override)
        rl_config.validate(config, module.SCHEMA)
        self.assertEqual(config.loss.credit, "grpo" if method == "grpo" else
                         method.removesuffix("_ot"), f"{task}/{method}")

  def test_an_out_dir_holds_one_task(self):
    script = _load_script()
    out = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, out)
    script.claim_out_dir(out, "tool_use")
    script.claim_out_dir(out, "tool_use")          # resuming the same study is fine
    with self.assertRaisesRegex(script.app.UsageError, "holds a --task=tool_use study"):
      script.claim_out_dir(out, "hidden_rule")

  def test_a_bad_override_is_caught(self):
    module = importlib.import_module("experiments.agents.matchtir")
    config = module.get_config()
    _apply(config, "--config.loss.matching=hungarian")
    with self.assertRaisesRegex(Exception, "loss.matching"):
      rl_config.validate(config, module.SCHEMA)


if __name__ == "__main__":
  absltest.main()
