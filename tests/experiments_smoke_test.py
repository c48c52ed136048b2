"""Smoke runs of every experiment's `smoke` preset, plus the real-scale presets by eval_shape.

Each experiments/<name>.py must run `train(get_config("smoke"), workdir)` on CPU in seconds
and leave metrics, TensorBoard events and a checkpoint behind (style.md C11.5), so a fork gets
coverage for free. All experiments run in this one process and share a persistent XLA
compilation cache, so programs they have in common (model init, sampler, scoring) compile once.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import atexit  # pylint: disable=g-import-not-at-top,wrong-import-position
import importlib  # pylint: disable=g-import-not-at-top,wrong-import-position
import json
import shutil
import tempfile

from absl.testing import absltest
from absl.testing import parameterized
import jax
import optax

from agentrl import configs
from agentrl import metrics
from agentrl import sharding
from agentrl.models import presets
from agentrl.models import transformer

# Experiments whose smoke run goes through agentrl.loop (metrics.jsonl per RL step).
RL_EXPERIMENTS = ("grpo", "dr_grpo", "dapo", "gspo", "ctpo", "holder_po", "rloo", "remax",
                  "reinforce_pp", "gmpo", "cispo", "ppo", "r2vpo", "agent", "reward_model")
_CACHE = tempfile.mkdtemp(prefix="agentrl_xla_cache_")
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
jax.config.update("jax_compilation_cache_dir", _CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def _tmpdir(test) -> str:
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


class SmokeTest(parameterized.TestCase):

  @parameterized.parameters(*[(name,) for name in RL_EXPERIMENTS])
  def test_rl_experiment_smoke_preset(self, name):
    module = importlib.import_module(f"experiments.{name}")
    workdir = _tmpdir(self)
    config = module.get_config("smoke")
    module.train(config, workdir)
    records = metrics.read_jsonl(os.path.join(workdir, metrics.JSONL))
    self.assertEqual([r["step"] for r in records], list(range(1, config.total_steps + 1)))
    for key in ("reward", "loss", "grad_norm", "entropy", "skipped", "time/update"):
      self.assertIn(key, records[-1], f"{name} does not log {key}")
    self.assertTrue(os.listdir(os.path.join(workdir, "tb")))
    self.assertIn(str(config.total_steps), os.listdir(os.path.join(workdir, "ckpt")))
    with open(os.path.join(workdir, "summary.json")) as f:
      summary = json.load(f)
    for key in ("success_before", "success_after", "steps", "wall_seconds"):
      self.assertIn(key, summary)
    self.assertTrue(os.path.exists(os.path.join(workdir, "curves.png")))

  def test_sft_smoke_preset(self):
    sft = importlib.import_module("experiments.sft")
    workdir = _tmpdir(self)
    summary = sft.train(sft.get_config("smoke"), workdir)
    self.assertEqual(summary["steps"], 2)
    self.assertTrue(os.listdir(os.path.join(workdir, "ckpt")))


  def test_eval_smoke_preset(self):
    grpo = importlib.import_module("experiments.grpo")
    evaluation = importlib.import_module("experiments.eval")
    run_dir = _tmpdir(self)
    grpo.train(grpo.get_config("smoke"), run_dir)
    for step, expected in (("latest", "2"), ("warm_start", "warm_start"), ("1", "1")):
      config = evaluation.get_config("smoke")
      config.run_dir, config.step = run_dir, step
      workdir = _tmpdir(self)
      result = evaluation.train(config, workdir)
      self.assertEqual(result["step"], expected)
      for key in ("greedy_success", "pass@1", "pass@2"):
        self.assertBetween(result[key], 0.0, 1.0)
      self.assertTrue(os.path.exists(os.path.join(workdir, "eval.json")))
    # Checkpoint -> HF directory -> evaluated from that directory: the same numbers.
    export_dir = os.path.join(_tmpdir(self), "hf")
    config = evaluation.get_config("smoke")
    config.run_dir, config.export_hf = run_dir, export_dir
    native = evaluation.train(config, _tmpdir(self))
    for name in ("config.json", "model.safetensors", "tokenizer.model"):
      self.assertTrue(os.path.exists(os.path.join(export_dir, name)), name)
    config = evaluation.get_config("smoke")
    config.run_dir, config.model_path = run_dir, export_dir
    exported = evaluation.train(config, _tmpdir(self))
    self.assertEqual(exported["step"], f"hf:{export_dir}")
    for key in ("greedy_success", "pass@1", "pass@2"):
      self.assertEqual(exported[key], native[key], key)


class RealScaleTest(parameterized.TestCase):

  def test_grpo_pod_preset_shapes_and_shardings(self):
    grpo = importlib.import_module("experiments.grpo")
    config = grpo.get_config("pod")
    self.assertEqual(dict(config.mesh), {"data": -1, "fsdp": 8, "tensor": 1})
    mesh = sharding.make_mesh(config.mesh)
    self.assertEqual(dict(mesh.shape), {"data": 1, "fsdp": 8, "tensor": 1})
    cfg = transformer.Config.named(config.model.variant, dtype=config.model.dtype)
    tx = grpo.make_optimizer(config.optim)
    abstract, shardings = grpo.abstract_train_state(config, mesh, cfg, tx)
    n_params = sum(x.size for x in jax.tree.leaves(abstract.params))
    self.assertEqual(n_params, presets.PUBLISHED_PARAMS["qwen3-8b"])
    # Adam keeps two float32 moments per parameter, sharded like the parameter.
    n_opt = sum(x.size for x in jax.tree.leaves(abstract.opt_state))
    self.assertBetween(n_opt - 2 * n_params, 1, 4)  # + Adam's and the schedule's step counts
    embed_spec = shardings.params["embedding_VD"].spec
    self.assertEqual(tuple(embed_spec), ("tensor", "fsdp"))
    self.assertIsInstance(tx, optax.GradientTransformation)

  def test_agent_pod_preset_validates(self):
    agent = importlib.import_module("experiments.agent")
    config = agent.get_config("pod")
    self.assertEqual(dict(config.mesh), {"data": -1, "fsdp": 8, "tensor": 1})
    self.assertEqual((config.model.variant, config.task.name), ("qwen3-8b", "hidden_rule"))
    with self.assertRaisesRegex(configs.ConfigError, "config.model.path must be"):
      agent.validate(config)
    config.model.path = "/ckpt/Qwen3-8B"
    agent.validate(config)
    with self.assertRaisesRegex(configs.ConfigError, "unknown agent preset 'cpu'"):
      agent.get_config("preset=cpu")

  @parameterized.parameters(*[(name,) for name in RL_EXPERIMENTS if name not in ("grpo", "agent")])
  def test_family_pod_presets_validate(self, name):
    # The GRPO-family binaries take grpo's presets; each must accept the pod preset under its
    # own loss schema (its real-scale run fails up front otherwise, not after loading 8B).
    grpo = importlib.import_module("experiments.grpo")
    module = importlib.import_module(f"experiments.{name}")
    config = module.get_config("pod")
    self.assertEqual(dict(config.mesh), {"data": -1, "fsdp": 8, "tensor": 1})
    self.assertEqual(config.model.variant, "qwen3-8b")
    schema = getattr(module, "LOSS_SCHEMA", None) or getattr(module, "RM_SCHEMA")
    with self.assertRaisesRegex(configs.ConfigError, "config.model.path must be"):
      grpo.validate(config, schema)  # the checkpoint path is the user's to give
    config.model.path = "/ckpt/Qwen3-8B"
    grpo.validate(config, schema)


if __name__ == "__main__":
  absltest.main()
