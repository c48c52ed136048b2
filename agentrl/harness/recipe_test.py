"""Tests for agentrl.harness.recipe: presets, validation, task and policy construction,
evaluation."""
import random
import re
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
from absl.testing import parameterized
import jax
import jax.numpy as jnp
import numpy as np

from agentrl import configs
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl import sharding


def _tmpdir(test) -> str:
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def _config(preset="cpu", smoke=False):
  c = rl_config.rl_config(preset, smoke=smoke)
  c.loss = dict(eps=0.2)
  return c


SCHEMA = {**rl_config.RL_SCHEMA, "loss.eps": configs.Key(float, min=0.0)}


class ConfigTest(parameterized.TestCase):

  @parameterized.parameters(("cpu", False), ("cpu", True), ("smollm2", False),
                            ("smollm2", True))
  def test_presets_validate(self, preset, smoke):
    rl_config.validate(_config(preset, smoke), SCHEMA)

  def test_pod_needs_a_model_path(self):
    config = _config("pod")
    with self.assertRaisesRegex(configs.ConfigError, r"config\.model\.path must be an HF"):
      rl_config.validate(config, SCHEMA)
    config.model.path = "/ckpt/Qwen3-8B"
    rl_config.validate(config, SCHEMA)
    self.assertEqual(dict(config.mesh), {"data": -1, "fsdp": 8, "tensor": 1})

  def test_unknown_preset_is_named(self):
    with self.assertRaisesRegex(configs.ConfigError, r"unknown preset 'gpu'"):
      rl_config.rl_config("gpu")

  @parameterized.named_parameters(
      ("minibatches", lambda c: c.updates.update(minibatches=3),
       r"config\.updates\.minibatches \(3\) must divide .* \(512\)"),
      ("max_len", lambda c: c.rollout.update(max_new_tokens=16),
       r"max_new_tokens \(16\) must be < config\.rollout\.max_len \(16\)"),
      ("scratch", lambda c: c.task.update(name="reasoning_gym"),
       r"config\.model\.init='scratch'"),
      ("lora_targets", lambda c: c.lora.update(rank=8, targets="q,mlp"),
       r"config\.lora: .*targets=\('q', 'mlp'\)"),
      ("lora_alpha", lambda c: c.lora.update(rank=8, alpha=0.0), r"config\.lora: .*alpha=0\.0"),
      ("decay", lambda c: c.optim.update(warmup_steps=5, decay_steps=5),
       r"config\.optim\.decay_steps \(5\) must exceed optim\.warmup_steps \(5\)"),
  )
  def test_cross_key_checks_name_the_keys(self, edit, pattern):
    config = _config()
    edit(config)
    with self.assertRaisesRegex(configs.ConfigError, pattern):
      rl_config.validate(config, SCHEMA)

  def test_optimizer_warms_up_then_decays_linearly_to_zero(self):
    # Adam's step for a constant gradient is the learning rate (its moments are exact).
    config = _config()
    config.optim.update(lr=0.1, clip_norm=1e9, warmup_steps=2, decay_steps=6)
    tx = recipe.make_optimizer(config.optim)
    params = {"w": jnp.zeros(())}
    state, steps = tx.init(params), []
    for _ in range(8):
      updates, state = tx.update({"w": jnp.ones(())}, state, params)
      steps.append(-float(updates["w"]))
    np.testing.assert_allclose(steps, [0, .05, .1, .075, .05, .025, 0, 0], atol=1e-6)

  def test_loop_options_turn_on_wandb_only_when_asked(self):
    config = _config()
    self.assertIsNone(recipe.loop_options(config)["wandb"])
    config.log.wandb_project = "p"
    wandb = recipe.loop_options(config)["wandb"]
    self.assertEqual(wandb["project"], "p")
    self.assertEqual(wandb["config"], config.to_dict())
    self.assertEqual(recipe.loop_options(config)["num_minibatches"], config.updates.minibatches)


  def test_default_runs_record_after_each_evaluation_and_run_the_alarms(self):
    for preset in rl_config.PRESETS:
      config = rl_config.rl_config(preset)
      options = recipe.loop_options(config)
      rec = options["trajectories"]
      self.assertEqual((rec.every, rec.prompts_per_step, rec.full_batch),
                       (config.eval.every, config.rollout.prompts_per_step, True), preset)
      self.assertIsNotNone(options["alarms"])
    config = rl_config.rl_config("cpu")
    config.log.trajectories_every, config.alarms.enabled = 5, False
    self.assertEqual(recipe.loop_options(config)["trajectories"].every, 5)
    self.assertIsNone(recipe.loop_options(config)["alarms"])
    config.alarms.update(enabled=True, divergence_window=2)
    with self.assertRaisesRegex(configs.ConfigError, "config.alarms: .*divergence_window=2"):
      recipe.loop_options(config)


  def test_a_replay_skips_the_sft_warm_start(self):
    config = _config()
    config.replay_batch = "/runs/x:5"
    params = {"w": jnp.ones(())}
    with mock.patch.object(recipe.sft, "warm_start") as sft_run:
      out, info = recipe.warm_start(config, "/nonexistent", None, None, params, None)
    sft_run.assert_not_called()
    self.assertIs(out, params)
    self.assertEqual(info, {})


class TaskAndPolicyTest(absltest.TestCase):

  def test_make_task_builds_each_task(self):
    make_env = recipe.make_task(_config().task)
    env = make_env()
    self.assertRegex(env.reset(recipe.EVAL_SEED_BASE), r"^\d{3}\+\d{3}=$")
    task = _config().task
    task.update(name="hidden_rule")
    task.family, task.max_turns = "guess", 3
    self.assertEqual(recipe.make_task(task)().max_turns, 3)
    task = _config().task
    task.update(name="chess")
    with self.assertRaisesRegex(configs.ConfigError, r"config\.task\.name must be one of"):
      recipe.make_task(task)

  def test_tool_use_task_and_its_scratch_tokenizer(self):
    task = _config().task
    task.update(name="tool_use")
    task.family, task.max_turns = "scale", 4
    env = recipe.make_task(task)()
    self.assertEqual((env.task, env.max_turns), ("scale", 4))
    tok = recipe.task_tokenizer(task)
    env.reset(9)
    texts = [env.reset(9)] + env.demonstration(9, random.Random(9), noise=1.0)
    texts += [env.step(action)[0] for action in texts[1:]]
    for text in texts:   # every demonstrated text round-trips exactly (no <unk>)
      self.assertEqual(tok.decode(tok.encode(text)), text)
    self.assertLess(len(tok.encode(texts[1])), len(texts[1]) // 2)

  def test_reasoning_gym_task_takes_generator_arguments_mode_and_system_prompt(self):
    task = _config().task
    task.update(name="reasoning_gym", rg_dataset="chain_sum", answer_mode="last_number",
                system_prompt="Answer briefly.",
                rg_config='{"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}')
    env = recipe.make_task(task)()
    question = env.reset(5)
    self.assertEqual(env.system_prompt, "Answer briefly.")
    self.assertTrue(all(len(t) == 1 for t in re.findall(r"\d+", question)), question)
    # last_number reads the answer out of a sentence; the default mode would not.
    self.assertEqual(env.step(f"It is {env.task.entry(5)['answer']}.")[1], 1.0)

  def test_bad_reasoning_gym_arguments_are_named(self):
    for rg_config, pattern in (("{max_digits: 2}", r"config\.task\.rg_config must be a JSON"),
                               ("[2]", r"config\.task\.rg_config must be a JSON object"),
                               ('{"max_digitz": 2}', r"does not fit the 'chain_sum' generator")):
      task = _config().task
      task.update(name="reasoning_gym", rg_dataset="chain_sum", rg_config=rg_config)
      with self.assertRaisesRegex(configs.ConfigError, pattern):
        recipe.make_task(task)

  def test_scratch_policy_for_both_scratch_tasks(self):
    config = _config(smoke=True)
    mesh = sharding.make_mesh(config.mesh)
    tok, graphdef, params = recipe.build_policy(config, mesh)
    self.assertEqual(params["embedding_VD"].get_value().shape[0], tok.vocab_size)
    del graphdef
    config.task.update(name="hidden_rule")
    config.task.family, config.task.max_turns = "guess", 2
    tok2 = recipe.task_tokenizer(config.task)
    self.assertGreater(tok2.vocab_size, tok.vocab_size)

  def test_model_config_passes_unroll_layers(self):
    mc = _config().model
    self.assertFalse(recipe.model_config(mc, 32).unroll_layers)
    mc.unroll_layers = True
    cfg = recipe.model_config(mc, 32)
    self.assertTrue(cfg.unroll_layers)
    self.assertEqual((cfg.vocab, cfg.width, cfg.depth), (32, mc.width, mc.depth))

  def test_lora_policy_and_its_reference(self):
    config = _config(smoke=True)
    config.lora.update(rank=4, targets="q, v")
    rl_config.validate(config, SCHEMA)
    _, _, params = recipe.build_policy(config, sharding.make_mesh(config.mesh))
    self.assertEqual(sorted(params["lora"].keys()), ["q_a_LDR", "q_b_LRHK", "v_a_LDR", "v_b_LRHK"])
    self.assertEqual(params["lora"]["q_a_LDR"].get_value().shape, (2, 64, 4))
    self.assertIsNone(recipe.reference_params(params))  # the score step uses the frozen base
    base = params["base"]
    copy = recipe.reference_params(base)  # no LoRA: a copy, since the update donates params
    for a, b in zip(jax.tree.leaves(copy), jax.tree.leaves(base)):
      self.assertIsNot(a, b)
      np.testing.assert_array_equal(a, b)


class HeldOutTest(absltest.TestCase):

  def test_held_out_success_of_an_untrained_policy_is_a_rate(self):
    config = _config(smoke=True)
    mesh = sharding.make_mesh(config.mesh)
    tok, graphdef, params = recipe.build_policy(config, mesh)
    engine = recipe.rollout_engine(config, graphdef, tok)
    rate = recipe.evaluator(config, engine, tok, recipe.make_task(config.task))(params)
    self.assertBetween(rate["success"], 0.0, 1.0)
    # A rate over num_problems greedy episodes: a multiple of 1 / num_problems.
    self.assertAlmostEqual(rate["success"] * config.eval.num_problems % 1, 0.0)


if __name__ == "__main__":
  absltest.main()
