"""Smoke runs of every experiment's `smoke` preset, plus the real-scale presets by eval_shape.

Each experiments/<family>/<name>.py must run `train(get_config("smoke"), workdir)` on CPU in
seconds and leave the same artifacts behind (config.json, metrics.jsonl, TensorBoard events,
summary.json, curves.png, checkpoints, W&B logs when asked), and `experiments.eval` must read
its run (docs/style.md C11.5, docs/architecture.md §4), so a fork gets coverage for free. All
experiments share the suite's persistent XLA compilation cache (conftest.py), so programs they
have in common (model init, sampler, scoring) compile once.
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import atexit  # pylint: disable=g-import-not-at-top,wrong-import-position
import functools
import importlib  # pylint: disable=g-import-not-at-top,wrong-import-position
import json
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import types

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from agentrl import checkpoint
from agentrl import configs
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import schedules
from agentrl.models import hf
from agentrl.models import presets
from agentrl.models import transformer
from agentrl.records import compare
from agentrl.records import metrics
from agentrl.records import rundir
from agentrl.records import study
from agentrl.records import trajectories
from agentrl import sharding

# Experiments whose smoke run goes through agentrl.train.loop (metrics.jsonl per RL step).
RL_EXPERIMENTS = ("grpo", "dr_grpo", "dapo", "gspo", "ctpo", "holder_po", "rloo", "remax",
                  "reinforce_pp", "gmpo", "cispo", "ppo", "r2vpo", "agent", "reward_model",
                  "hapo", "copo", "d3s", "etr", "riskpo", "arm", "fapo", "delta", "ttrl", "empo",
                  "kto", "hapo_length", "brpo", "hbpo", "decs", "eapo", "tppo", "delethink",
                  "g2rl", "mssr", "opd", "ttexplore", "matchtir", "spo_chain", "oprl", "spa_rl",
                  "tree_rl", "spo_tree", "latr", "r3l", "openai_agent",
                  "icpo", "arpo", "spear", "prm_rl", "opd_agent", "lens")


def documented_metrics() -> tuple[dict[str, set[str]], tuple[str, ...], set[str]]:
  """The metrics glossary (docs/metrics.md): {exact name: experiments that log it}, `prefix/*`
  patterns, and the names logged only under a non-default setting.

  Its last column is "every RL experiment", optionally "but `a`, `b`", or the experiments
  named in backticks (none named: no shipped experiment logs the key); "(only with ...)" after
  the names marks a key their default (smoke) runs do not log.
  """
  section = (pathlib.Path(__file__).resolve().parents[1] / "docs" / "metrics.md").read_text()
  exact, prefixes, optional = {}, [], set()
  for line in section.splitlines():
    if not line.startswith("| `"):
      continue
    cells = re.split(r"(?<!\\)\|", line)  # a `\|` inside a cell is not a column break
    named = set(re.findall(r"`([^`]+)`", cells[3]))
    every = cells[3].strip().startswith("every RL experiment")
    for key in re.findall(r"`([^`]+)`", cells[1]):
      if key.endswith("*"):
        prefixes.append(key[:-1])
      else:
        exact[key] = set(RL_EXPERIMENTS) - named if every else named
        if "(only with " in cells[3]:
          optional.add(key)
  return exact, tuple(prefixes), optional


def _tmpdir(test) -> str:
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


_EVALUATED = set()   # (task name, checkpoint layout) whose run experiments.eval has read


def _layout(workdir: str, step: int) -> tuple[str, ...]:
  """The key paths of the train state a run saved at `step` (its checkpoint layout)."""
  manager = ocp.CheckpointManager(
      os.path.join(workdir, "ckpt"),
      options=ocp.CheckpointManagerOptions(read_only=True, create=False),
      item_handlers={"state": ocp.PyTreeCheckpointHandler(),
                     "meta": ocp.JsonCheckpointHandler()})
  try:
    tree = manager.item_metadata(step)["state"]
  finally:
    manager.close()
  tree = getattr(tree, "tree", tree)
  return tuple(sorted(jax.tree_util.keystr(path)
                      for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]))


@functools.cache
def _grpo_smoke_run(seed: int) -> str:
  """A finished GRPO smoke run's workdir, trained once per process for the tests that only
  read a run (evaluation, comparison); removed at exit."""
  root = tempfile.mkdtemp()
  atexit.register(shutil.rmtree, root, ignore_errors=True)
  grpo = importlib.import_module("experiments.policy.grpo")
  config = grpo.get_config("smoke")
  config.seed = seed
  workdir = os.path.join(root, f"grpo_seed{seed}")
  grpo.train(config, workdir)
  return workdir


@functools.cache
def _agent_smoke_run() -> str:
  """A finished experiments.agents.agent smoke run's workdir (opd_agent's teacher), removed at
  exit."""
  root = tempfile.mkdtemp()
  atexit.register(shutil.rmtree, root, ignore_errors=True)
  agent = importlib.import_module("experiments.agents.agent")
  agent.train(agent.get_config("smoke"), root)
  return root


@functools.cache
def _prm_smoke_run() -> str:
  """A finished experiments.preference.prm smoke run's workdir (its PRM), removed at exit."""
  root = tempfile.mkdtemp()
  atexit.register(shutil.rmtree, root, ignore_errors=True)
  prm = importlib.import_module("experiments.preference.prm")
  prm.train(prm.get_config("smoke"), root)
  return root


def _fake_wandb():
  """A stand-in `wandb` module that records init kwargs and logged steps (W&B is optional)."""
  calls = {"init": [], "log": [], "finish": 0}

  class Run:

    def log(self, scalars, step):
      calls["log"].append((step, dict(scalars)))

    def finish(self):
      calls["finish"] += 1

  def init(**kwargs):
    calls["init"].append(kwargs)
    return Run()

  return types.SimpleNamespace(init=init), calls


class SmokeTest(parameterized.TestCase):

  @parameterized.named_parameters(*[(name, name) for name in RL_EXPERIMENTS])
  def test_rl_experiment_smoke_preset(self, name):
    module = importlib.import_module(study.experiment_module(name))
    workdir = _tmpdir(self)
    config = module.get_config("smoke")
    config.log.wandb_project = "agentrl-smoke"
    if name == "opd":  # the student distils a finished GRPO smoke run
      config.teacher.run_dir = _grpo_smoke_run(0)
    if name == "opd_agent":  # the student distils a finished agent smoke run
      config.teacher.run_dir = _agent_smoke_run()
    if name == "prm_rl":  # its PRM is a finished PRM smoke run's
      config.reward.prm = _prm_smoke_run()
    wandb, calls = _fake_wandb()
    # Only the "wandb" entry is swapped: mock.patch.dict(sys.modules) would also drop every
    # module first imported during the run, and protobuf cannot register those twice.
    previous = sys.modules.get("wandb")
    sys.modules["wandb"] = wandb
    try:
      module.train(config, workdir)
    finally:
      if previous is None:
        del sys.modules["wandb"]
      else:
        sys.modules["wandb"] = previous
    records = metrics.read_jsonl(os.path.join(workdir, metrics.JSONL))
    # Step 0 is the baseline evaluation; steps 1..total_steps are the RL steps.
    self.assertEqual([r["step"] for r in records], list(range(0, config.total_steps + 1)))
    self.assertIn("eval/success", records[0])
    baseline, records = records[0], records[1:]
    # One name, one meaning: docs/metrics.md's table lists every metric this run logs, and
    # its "logged by" column names this experiment exactly for the keys the run logs.
    exact, prefixes, optional = documented_metrics()
    logged = {k for r in records + [baseline] for k in r if k != "step"}
    missing = sorted(k for k in logged if k not in exact and not k.startswith(prefixes))
    self.assertEmpty(missing, f"{name} logs metrics docs/metrics.md's table lacks")
    claimed = {k for k, experiments in exact.items()
               if name in experiments and k not in optional}
    self.assertEmpty(sorted(claimed - logged),
                     f"docs/metrics.md's table says {name} logs these; it does not")
    self.assertEmpty(sorted(logged & exact.keys() - claimed),
                     f"{name} logs these; add it to their rows' 'logged by' in docs/metrics.md")
    for key in ("reward", "loss", "grad_norm", "entropy", "skipped", "time/update"):
      self.assertIn(key, records[-1], f"{name} does not log {key}")
    if name == "holder_po":  # p's schedule spans the run's total_steps, read at run time
      lc = config.loss
      expected = [float(schedules.holder_p(s, schedule=lc.p_schedule, p_const=lc.p_const,
                                           p_min=lc.p_min, p_max=lc.p_max,
                                           schedule_steps=config.total_steps))
                  for s in range(config.total_steps)]
      np.testing.assert_allclose([r["holder_p"] for r in records], expected, rtol=1e-6)
    self.assertTrue(os.listdir(os.path.join(workdir, "tb")))
    self.assertIn(str(config.total_steps), os.listdir(os.path.join(workdir, "ckpt")))
    # A smoke run records its first step (rl_config's smoke preset): rows with their text.
    self.assertEqual(trajectories.steps(workdir), [1], name)
    _, rows = trajectories.read_step(workdir, 1)
    self.assertTrue(rows and rows[0]["pieces"] is not None, f"{name} records no text")
    with open(os.path.join(workdir, "summary.json")) as f:
      summary = json.load(f)
    for key in ("success_before", "success_after", "steps", "seconds"):
      self.assertIn(key, summary)
    self.assertEqual(summary["success_before"], baseline["eval/success"])
    self.assertTrue(os.path.exists(os.path.join(workdir, "curves.png")))
    # W&B: one run in the configured project, every step logged, closed at the end.
    self.assertEqual([c["project"] for c in calls["init"]], ["agentrl-smoke"], name)
    self.assertEqual([step for step, _ in calls["log"]], [0] + [r["step"] for r in records],
                     name)
    self.assertEqual(calls["finish"], 1, name)
    # The run's config.json is the config it ran, and experiments.eval can read the run.
    self.assertEqual(json.loads(rundir.read_config(workdir).to_json()),
                     json.loads(config.to_json()))
    # experiments.eval reads what a run saved: checked once per checkpoint layout and task
    # (a critic, a LoRA model, extra state each make their own layout), not for every run.
    kind = (config.task.name, _layout(workdir, config.total_steps))
    if kind not in _EVALUATED:
      _EVALUATED.add(kind)
      evaluation = importlib.import_module("experiments.eval")
      eval_config = evaluation.get_config("smoke")
      eval_config.run_dir = workdir
      result = evaluation.train(eval_config, _tmpdir(self))
      self.assertEqual(result["step"], str(config.total_steps), name)
      for key in ("greedy_success", "pass@1", "pass@2"):
        self.assertBetween(result[key], 0.0, 1.0)

  def test_compare_runs_of_two_smoke_runs(self):
    # The second run is a copy of the first whose config says seed 1: comparing reads only
    # the files, so a copy costs no training run.
    first = _grpo_smoke_run(0)
    dirs = [first, os.path.join(_tmpdir(self), "grpo_seed1")]
    shutil.copytree(first, dirs[1], ignore=shutil.ignore_patterns("LOCK", "ckpt", "tb"))
    config = rundir.read_config(dirs[1])
    config.seed = 1
    rundir.atomic_write(os.path.join(dirs[1], "config.json"), config.to_json(indent=2))
    out = os.path.join(_tmpdir(self), "compare.png")
    text, drawn = compare.compare(dirs, out)
    with open(out, "rb") as f:
      self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")
    self.assertEqual(drawn[0], "eval/success")
    lines = text.splitlines()
    for seed, workdir in enumerate(dirs):
      with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
      evals = [(r["step"], r["eval/success"])
               for r in metrics.read_jsonl(os.path.join(workdir, metrics.JSONL))
               if "eval/success" in r]
      peak = max(evals, key=lambda e: e[1])
      row = next(l for l in lines if l.startswith(f"grpo_seed{seed} ")).split()
      self.assertEqual(row[1:7], ["GRPO", str(summary["steps"]),
                                  f"{summary['success_before']:.1%}",
                                  f"{summary['success_after']:.1%}", f"{peak[1]:.1%}",
                                  f"@{peak[0]}"])
      self.assertEqual(row[8], f"{summary['seconds']['train']:.0f}s")
    self.assertIn("config differences:", text)
    diff = text.split("config differences:\n", 1)[1].splitlines()[2:]
    self.assertEqual([l.split()[0] for l in diff], ["seed"])  # only the seed was changed
    # The script prints the same table.
    proc = subprocess.run([sys.executable, "scripts/compare_runs.py", *dirs, f"--out={out}"],
                          cwd=pathlib.Path(__file__).resolve().parents[1], capture_output=True,
                          text=True, check=True)
    self.assertIn(text, proc.stdout)

  # The loop's replay equality (agentrl/train/loop_test.py), the replay's warm start
  # (recipe_test) and summary (rundir_test) are tested cheaply; this runs them together.
  @pytest.mark.slow
  def test_replay_of_a_smoke_run_step_equals_its_update(self):
    grpo = importlib.import_module("experiments.policy.grpo")
    run, config = _tmpdir(self), grpo.get_config("smoke")
    config.log.trajectories_every = 1   # step 2 recorded, step 1's checkpoint its start
    grpo.train(config, run)
    config = grpo.get_config("smoke")
    config.replay_batch = f"{run}:2"
    summary = grpo.train(config, _tmpdir(self))
    logged = next(r for r in metrics.read_jsonl(os.path.join(run, metrics.JSONL))
                  if r["step"] == 2)
    self.assertEqual((summary["replay"], summary["step"]), (f"{run}:2", 2))
    for key in ("loss", "grad_norm", "clipfrac"):
      self.assertEqual(summary["update"][key], logged[key], key)
    self.assertEqual(summary["update"]["replay/param_max_abs_diff"], 0.0)

  def test_sft_smoke_preset(self):
    sft = importlib.import_module("experiments.distill.sft")
    workdir = _tmpdir(self)
    summary = sft.train(sft.get_config("smoke"), workdir)
    self.assertEqual(summary["steps"], 2)
    self.assertTrue(os.listdir(os.path.join(workdir, "ckpt")))

  def test_prm_smoke_preset(self):
    # Not an RL loop: MC-labelled steps, the PRM's steps, then its held-out figures.
    prm = importlib.import_module("experiments.preference.prm")
    workdir, config = _prm_smoke_run(), prm.get_config("smoke")   # prm_rl's PRM too
    with open(os.path.join(workdir, "summary.json")) as f:
      summary = json.load(f)
    for key in ("held_out_step_accuracy", "held_out_auc", "held_out_base_rate", "train_loss"):
      self.assertBetween(summary[key], 0.0, 1.0 if key != "train_loss" else 10.0, key)
    self.assertGreater(summary["eval_labelled_steps"], 0)
    records = metrics.read_jsonl(os.path.join(workdir, metrics.JSONL))
    self.assertEqual([r["step"] for r in records], list(range(config.prm.steps + 1)))
    logged = {k for r in records for k in r if k != "step"}
    exact, _, optional = documented_metrics()
    claimed = {k for k, experiments in exact.items() if "prm" in experiments}
    self.assertEqual(sorted(logged), sorted(claimed - optional), "docs/metrics.md's prm rows")
    ckpt = checkpoint.Checkpointer(os.path.join(workdir, "prm"), save_every=1, keep=1)
    self.assertEqual(ckpt.latest_step(), config.prm.steps)
    ckpt.close()

  def test_grpo_with_lora_saves_adapters_and_exports_merged(self):
    # The adapters' math (step 0 = base, merged = adapter forward, frozen base, resume) is
    # tested in agentrl/models/lora_test.py; here, that the shared blocks carry it end to end.
    grpo, evaluation = (importlib.import_module(study.experiment_module(n))
                        for n in ("grpo", "eval"))
    config = grpo.get_config("smoke")
    config.lora.rank = 4
    run_dir = _tmpdir(self)
    grpo.train(config, run_dir)
    records = metrics.read_jsonl(os.path.join(run_dir, metrics.JSONL))
    self.assertEqual([r["step"] for r in records], [0, 1, 2])
    # Checkpoints hold the adapters (and their optimizer state), not the frozen base ...
    with self.assertRaisesRegex(KeyError, "state.params.base"):
      checkpoint.read_subtree(os.path.join(run_dir, "ckpt"), ("state", "params", "base"), {},
                              step=2)
    # ... which evaluation reads onto the SFT base, exporting W + (alpha / rank) A B.
    export_dir = os.path.join(_tmpdir(self), "hf")
    eval_config = evaluation.get_config("smoke")
    eval_config.run_dir, eval_config.export_hf = run_dir, export_dir
    result = evaluation.train(eval_config, _tmpdir(self))
    self.assertEqual(result["step"], "2")
    _, exported = hf.load(export_dir, dtype="float32")  # a plain Transformer's weights
    self.assertEqual(sorted(nnx.to_pure_dict(exported)),
                     ["embedding_VD", "final_norm_D", "layers"])


  def test_eval_smoke_preset(self):
    evaluation = importlib.import_module("experiments.eval")
    run_dir = _grpo_smoke_run(seed=0)  # the smoke preset's own seed
    for step, expected in (("latest", "2"), ("warm_start", "warm_start"), ("1", "1")):
      config = evaluation.get_config("smoke")
      config.run_dir, config.step = run_dir, step
      workdir = _tmpdir(self)
      result = evaluation.train(config, workdir)
      self.assertEqual(result["step"], expected)
      for key in ("greedy_success", "pass@1", "pass@2"):
        self.assertBetween(result[key], 0.0, 1.0)
      name = evaluation.result_name(run_dir, expected)  # one file per checkpoint and run
      self.assertEqual(os.listdir(workdir), [name])
      self.assertTrue(name.startswith(f"eval_{os.path.basename(run_dir)}-"), name)
    config = evaluation.get_config("smoke")
    config.run_dir, config.step = run_dir, "5"
    with self.assertRaisesRegex(configs.ConfigError,
                                r"config\.step='5' was not kept: .* has steps \[1, 2\]"):
      evaluation.train(config, _tmpdir(self))
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


  def test_eval_with_a_prm_smoke_run(self):
    # The PRM smoke run is also the evaluated run (its SFT warm start): same model and task.
    evaluation = importlib.import_module("experiments.eval")
    prm_dir = _prm_smoke_run()
    config = evaluation.get_config("smoke")
    config.run_dir, config.step, config.prm = prm_dir, "warm_start", prm_dir
    workdir = _tmpdir(self)
    result = evaluation.train(config, workdir)
    self.assertEqual((result["prm"], result["prm_agg"]), (prm_dir, "min"))
    self.assertNotIn("vote", result)   # the hidden-rule game's final command is its answer
    for k in (1, 2):
      for key in (f"prm_best@{k}", f"prm_vote@{k}", f"majority@{k}"):
        self.assertBetween(result[key], 0.0, 1.0, key)
    # One sample: its own answer is the vote, whatever its weight, and a vote can only be
    # right where that sample succeeded.
    self.assertEqual(result["prm_vote@1"], result["majority@1"])
    self.assertLessEqual(result["majority@1"], result["prm_best@1"])
    with open(os.path.join(workdir, evaluation.result_name(prm_dir, "warm_start"))) as f:
      self.assertEqual(json.load(f)["prm_best@2"], result["prm_best@2"])
    # Errors before anything is built: no PRM there, another model, another task.
    config.prm = os.path.join(_tmpdir(self), "nothing")
    with self.assertRaisesRegex(configs.ConfigError, r"config\.prm='.*nothing' has no prm/"):
      evaluation.train(config, _tmpdir(self))
    config.prm = prm_dir
    for key, value, named in (("model", ("width", 128), r"model\.width 64 \(PRM\) vs 128"),
                              ("task", ("name", "arithmetic"),
                               r"task\.name 'hidden_rule' \(PRM\) vs 'arithmetic'"),
                              ("task", ("family", "mixed"), r"task \(its scratch tokenizer\)")):
      other = rundir.read_config(prm_dir)
      other[key][value[0]] = value[1]
      config.run_dir = _tmpdir(self)
      rundir.atomic_write(os.path.join(config.run_dir, "config.json"), other.to_json())
      with self.assertRaisesRegex(configs.ConfigError,
                                  r"config\.prm=.* was trained with another model or tokenizer "
                                  rf"than {config.run_dir}: {named}"):
        evaluation.train(config, _tmpdir(self))


class RealScaleTest(parameterized.TestCase):

  def test_grpo_pod_preset_shapes_and_shardings(self):
    grpo = importlib.import_module("experiments.policy.grpo")
    config = grpo.get_config("pod")
    self.assertEqual(dict(config.mesh), {"data": -1, "fsdp": 8, "tensor": 1})
    mesh = sharding.make_mesh(config.mesh)
    self.assertEqual(dict(mesh.shape), {"data": 1, "fsdp": 8, "tensor": 1})
    cfg = transformer.Config.named(config.model.variant, dtype=config.model.dtype)
    tx = recipe.make_optimizer(config.optim)
    abstract, shardings = sharding.abstract_train_state(
        lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0)), tx, mesh, config.sharding_rules)
    n_params = sum(x.size for x in jax.tree.leaves(abstract.params))
    self.assertEqual(n_params, presets.PUBLISHED_PARAMS["qwen3-8b"])
    # Adam keeps two float32 moments per parameter, sharded like the parameter.
    n_opt = sum(x.size for x in jax.tree.leaves(abstract.opt_state))
    self.assertBetween(n_opt - 2 * n_params, 1, 4)  # + Adam's and the schedule's step counts
    embed_spec = shardings.params["embedding_VD"].spec
    self.assertEqual(tuple(embed_spec), ("tensor", "fsdp"))
    self.assertIsInstance(tx, optax.GradientTransformation)

  def test_agent_pod_preset_validates(self):
    agent = importlib.import_module("experiments.agents.agent")
    config = agent.get_config("pod")
    self.assertEqual(dict(config.mesh), {"data": -1, "fsdp": 8, "tensor": 1})
    self.assertEqual((config.model.variant, config.task.name), ("qwen3-8b", "hidden_rule"))
    with self.assertRaisesRegex(configs.ConfigError, "config.model.path must be"):
      rl_config.validate(config, agent.SCHEMA)
    config.model.path = "/ckpt/Qwen3-8B"
    rl_config.validate(config, agent.SCHEMA)
    # The default is the CPU main job; SmolLM2 stays selectable by name.
    self.assertEqual(agent.get_config().model.init, "scratch")
    smollm2 = agent.get_config("smollm2")
    self.assertEqual((smollm2.model.init, smollm2.task.name, smollm2.task.few_shot),
                     ("gguf", "calculator", 1))
    self.assertGreater(smollm2.lora.rank, 0)
    rl_config.validate(smollm2, agent.SCHEMA)
    with self.assertRaisesRegex(configs.ConfigError, "unknown agent preset 'gpu'"):
      agent.get_config("preset=gpu")

  def test_reward_model_has_no_pod_preset(self):
    # Its reward model and preference pairs are built on the arithmetic task's tokenizer.
    rm = importlib.import_module("experiments.preference.reward_model")
    with self.assertRaisesRegex(configs.ConfigError, "unknown reward_model preset 'pod'"):
      rm.get_config("pod")

  def test_fapo_has_no_pod_preset(self):
    # Its flaw detector is a rule of the arithmetic task's answer format.
    fapo = importlib.import_module("experiments.shaping.fapo")
    for preset in ("pod", "smollm2"):
      with self.assertRaisesRegex(configs.ConfigError, f"unknown fapo preset '{preset}'"):
        fapo.get_config(preset)

  @parameterized.parameters(("hapo_length",), ("brpo",), ("decs",), ("mssr",))
  def test_verbose_task_methods_reject_reasoning_gym_presets(self, name):
    # HAPO's history and MSSR's posterior need repeated prompts, BRPO a thinking format, DECS
    # the filler detector: all are the verbose arithmetic task's.
    module = importlib.import_module(study.experiment_module(name))
    for preset in ("pod", "smollm2"):
      with self.assertRaisesRegex(configs.ConfigError, f"^unknown {name} preset '{preset}'"):
        module.get_config(preset)

  @parameterized.parameters(*[(name,) for name in RL_EXPERIMENTS
                              if name not in ("grpo", "agent", "reward_model", "fapo",
                                              "hapo_length", "brpo", "decs", "mssr")])
  def test_family_pod_presets_validate(self, name):
    # Every RL binary takes rl_config.rl_config's presets; each must accept the pod preset under
    # its own schema (its real-scale run fails up front otherwise, not after loading 8B).
    module = importlib.import_module(study.experiment_module(name))
    config = module.get_config("pod")
    self.assertEqual(dict(config.mesh), {"data": -1, "fsdp": 8, "tensor": 1})
    self.assertEqual(config.model.variant, "qwen3-8b")
    with self.assertRaisesRegex(configs.ConfigError, "config.model.path must be"):
      rl_config.validate(config, module.SCHEMA)  # the checkpoint path is the user's to give
    config.model.path = "/ckpt/Qwen3-8B"
    rl_config.validate(config, module.SCHEMA)


if __name__ == "__main__":
  absltest.main()
