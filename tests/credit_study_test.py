"""scripts/credit_study.py: every task's method overrides are valid keys of its experiment.

The study passes `--config.<key>=<value>` overrides to an experiment binary; a typo there would
only show after the first run's SFT. Here each task's and method's overrides are applied to the
experiment's config (the task's preset) and validated against its schema, without running
anything. The textworld task's path runs end to end at smoke size: agent.py's preset trains the
warm start, spa_rl.py's reuses it, as the study shares it. The prm task's one PRM run is
trained once, before the runs, with the warm start the study shares (a stand-in runner).
"""
import functools
import importlib
import importlib.util
import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest

from agentrl import configs
from agentrl.envs import registry
from agentrl.envs import textworld_env
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.records import study

try:
  import textworld  # pylint: disable=g-import-not-at-top
except ImportError:
  textworld = None

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
    self.assertEqual(set(tasks), {"hidden_rule", "tool_use", "textworld", "branching", "replay",
                                 "replay_textworld", "prm"})
    for name, task in tasks.items():
      self.assertIn("grpo", task.methods, name)   # every task has the outcome-only baseline
      for method, (experiment, method_flags) in task.methods.items():
        module = importlib.import_module(study.experiment_module(experiment))
        config = module.get_config(task.preset or None)
        for override in (*task.flags, *method_flags,
                         *_load_script().prm_override(task, "/tmp/study", method)):
          _apply(config, override)
        rl_config.validate(config, module.SCHEMA)
        if experiment == "prm_rl":
          # A PRM method is given the study's PRM; the env-checked one needs none.
          uses_prm = config.reward.verifier == "prm"
          self.assertEqual(method in task.prm_methods, uses_prm, f"{name}/{method}")
          self.assertEqual(config.reward.prm, "/tmp/study/prm" if uses_prm else "", method)
          if not uses_prm:
            module.check_verifier(config)
        elif "credit" in config.loss:
          # A method is its credit, or a variant of it named <credit>_<variant>.
          self.assertTrue(method == config.loss.credit or
                          method.startswith(config.loss.credit + "_"), f"{name}/{method}")
          if hasattr(module, "check_credit"):
            module.check_credit(config)   # the env offers what the credit needs
        else:
          # A method is its experiment, or a variant of it named <experiment>_<variant>.
          self.assertTrue(method == experiment or method.startswith(experiment + "_"),
                          f"{name}/{method}")

  def test_textworld_presets_share_one_warm_start(self):
    # The study copies the first run's SFT policy into every other run, spa_rl's included: the
    # two presets must build the same task, model and tokenizer.
    agent = importlib.import_module("experiments.agents.agent")
    spa_rl = importlib.import_module("experiments.agents.spa_rl")
    for arg in ("preset=textworld,smoke", "textworld"):
      a, s = agent.get_config(arg).to_dict(), spa_rl.get_config(arg).to_dict()
      read = set(registry.COMMON) | set(registry.ENVS["textworld"].fields)   # the env's keys
      self.assertEqual({k: v for k, v in s["task"].items() if k in read},
                       {k: v for k, v in a["task"].items() if k in read}, arg)
      self.assertEqual(s["model"], a["model"], arg)
    # And the same SFT, rollouts and budget (smoke keeps each experiment's own).
    for key in ("sft", "eval", "optim", "total_steps"):
      self.assertEqual(s[key], a[key], key)
    shared = set(s["rollout"]) & set(a["rollout"])   # agent's own rollout keys aside
    self.assertEqual({k: s["rollout"][k] for k in shared}, {k: a["rollout"][k] for k in shared})

  def test_branching_presets_share_one_warm_start(self):
    # Every branching method's cpu preset builds agent.py's task, model and SFT, so the
    # study's one warm start is each run's.
    agent = importlib.import_module("experiments.agents.agent").get_config("cpu").to_dict()
    for method, (experiment, _) in _load_script().TASKS["branching"].methods.items():
      module = importlib.import_module(study.experiment_module(experiment))
      config = module.get_config("cpu").to_dict()
      for key in ("task", "model", "sft", "optim", "eval"):
        self.assertEqual(config[key], agent[key], f"{method}: {key}")

  def test_prm_task_overrides_and_presets_share_one_warm_start(self):
    task = _load_script().TASKS["prm"]
    prm = importlib.import_module("experiments.preference.prm")
    config = prm.get_config()
    for override in (*task.flags, *task.prm_flags):
      _apply(config, override)
    rl_config.validate(config, prm.SCHEMA)
    prm.check_labels(config)                  # the guess game checks its steps
    self.assertEqual(config.prm.labels, "checked")
    # The PRM run and every arm build agent.py's task, model and SFT: one warm start serves
    # them all, and prm_rl accepts the PRM (same config.model and task.name).
    agent = importlib.import_module("experiments.agents.agent").get_config("cpu")
    prm_rl = importlib.import_module("experiments.agents.prm_rl").get_config("cpu")
    for key in ("task", "model", "sft", "optim", "eval"):
      self.assertEqual(prm_rl[key].to_dict(), agent[key].to_dict(), key)
    for override in task.flags:
      _apply(agent, override)
    for key in ("task", "model", "sft"):
      self.assertEqual(config[key].to_dict(), agent[key].to_dict(), key)

  def test_prm_trained_once_from_the_shared_warm_start(self):
    script = _load_script()
    task, out = script.TASKS["prm"], tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, out)
    sources = script.warm_start_sources(task, out, 2)
    self.assertEqual(sources[:3], [os.path.join(out, "prm"), os.path.join(out, "grpo_seed0"),
                                   os.path.join(out, "grpo_seed1")])
    self.assertLen(sources, 1 + 2 * len(task.methods))
    # An arm that already trained the SFT policy: the PRM copies it.
    os.makedirs(os.path.join(out, "grpo_seed0", "warm_start", "1"))
    calls = []

    def fake_run(experiment, workdir, flags):
      calls.append((experiment, workdir, flags))
      self.assertTrue(os.path.isdir(os.path.join(workdir, "warm_start", "1")))
      with open(os.path.join(workdir, "summary.json"), "w") as f:
        f.write('{"held_out_step_accuracy": 0.9, "held_out_base_rate": 0.75, '
                '"held_out_auc": 0.95}')
      return {"wall_s": 1.0, "cpu_s": 1.0}

    with mock.patch.object(script.study, "run_experiment", fake_run):
      script.train_prm(task, out, sources)
      script.train_prm(task, out, sources)       # finished: reused, not trained again
    self.assertEqual(calls, [("prm", os.path.join(out, "prm"),
                              [*task.flags, "--config.prm.labels=checked"])])
    self.assertEqual(script.prm_line(out), "PRM (prm/, checked step labels): held-out step "
                     "accuracy 90.0% (base rate 75.0%), AUC 0.950")
    self.assertEqual(script.prm_override(task, out, "prm_min"),
                     [f"--config.reward.prm={os.path.join(out, 'prm')}"])
    self.assertEqual(script.prm_override(task, out, "first_error"), [])
    # Tasks without a PRM neither list nor train one.
    hidden = script.TASKS["hidden_rule"]
    self.assertNotIn(os.path.join(out, "prm"), script.warm_start_sources(hidden, out, 1))

  def test_runs_compared_at_an_equal_token_budget(self):
    script = _load_script()
    cheap = {"steps": [0, 10, 20], "success": [0.2, 0.4, 0.6], "tokens": [0.0, 1e5, 2e5],
             "train_seconds": 40.0}
    dear = {"steps": [0, 10, 20], "success": [0.2, 0.3, 0.5], "tokens": [0.0, 2e5, 4e5],
            "train_seconds": 60.0}
    # At 2e5 tokens: the cheap run's last point; the dear run's step-10 point.
    self.assertEqual(script.at_budget(cheap, 2e5), (0.6, (0.2 + 2 * 0.4 + 0.6) / 4))
    success, auc = script.at_budget(dear, 2e5)
    self.assertAlmostEqual(success, 0.3)
    self.assertAlmostEqual(auc, 0.25)
    # Between evaluations the success is interpolated: 1.5e5 tokens of the cheap run.
    self.assertAlmostEqual(script.at_budget(cheap, 1.5e5)[0], 0.5)
    text = script.token_table({"cheap": [cheap], "dear": [dear]})
    self.assertIn("At 0.20M sampled tokens", text)
    self.assertIn("| dear | 20.0 ± 0.0 | 30.0 ± 0.0 | 25.0 ± 0.0 | 50.0 ± 0.0 (0.40) | "
                  "3.0 ± 0.0 |", text)

  @absltest.skipIf(textworld is None, "textworld is not installed (pip install -e '.[envs]')")
  def test_textworld_path_end_to_end(self):
    agent = importlib.import_module("experiments.agents.agent")
    spa_rl = importlib.import_module("experiments.agents.spa_rl")
    root = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, root, ignore_errors=True)
    first, second = os.path.join(root, "grpo_seed0"), os.path.join(root, "spa_rl_seed0")
    config = agent.get_config("preset=textworld,smoke")
    config.task.game_pool = textworld_env.pool_dir()   # games cached across test runs
    trained = agent.train(config, first)
    self.assertEqual(trained["steps"], config.total_steps)
    self.assertGreater(trained["sft"]["steps"], 0)
    study.share_warm_start(second, [first])
    config = spa_rl.get_config("preset=textworld,smoke")
    config.task.game_pool = textworld_env.pool_dir()
    reused = spa_rl.train(config, second)
    self.assertEqual(reused["steps"], config.total_steps)
    self.assertEqual(reused["sft"], trained["sft"])   # restored, not trained again
    for run in (first, second):
      curves = study.read_curves(run)
      self.assertTrue(all(0.0 <= r["eval/success"] <= 1.0 for r in curves["evals"]), run)

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
