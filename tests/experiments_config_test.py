"""Bad experiment configs fail up front with a message naming the key (docs/architecture.md §6).

Every check here runs before any model is built, so the whole file takes about a second.
"""
import importlib

from absl.testing import absltest
from absl.testing import parameterized
import numpy as np

from agentrl import configs
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.records import study
from agentrl.rollout import agent_loop

RL_EXPERIMENTS = ("grpo", "dr_grpo", "dapo", "gspo", "ctpo", "holder_po", "rloo", "remax",
                  "reinforce_pp", "gmpo", "cispo", "ppo", "r2vpo", "agent", "reward_model",
                  "hapo", "copo", "d3s", "etr", "riskpo", "arm", "fapo", "delta", "ttrl", "empo",
                  "kto", "hapo_length", "brpo", "hbpo", "decs", "eapo", "tppo", "delethink",
                  "g2rl", "mssr", "opd", "ttexplore", "matchtir", "spo_chain", "oprl", "spa_rl",
                  "tree_rl", "spo_tree", "latr", "r3l", "openai_agent",
                  "icpo", "arpo", "spear", "prm_rl", "opd_agent", "lens")


def _module(name):
  return importlib.import_module(study.experiment_module(name))


class PresetTest(parameterized.TestCase):

  @parameterized.parameters(*[(name,) for name in RL_EXPERIMENTS])
  def test_default_and_smoke_presets_validate(self, name):
    module = _module(name)
    for arg in (None, "smoke"):
      rl_config.validate(module.get_config(arg), module.SCHEMA)
    config = module.get_config()
    config.loss.unknown_knob = 1.0
    with self.assertRaisesRegex(configs.ConfigError, r"config\.loss\.unknown_knob is not a key"):
      rl_config.validate(config, module.SCHEMA)

  @parameterized.parameters(*[(name,) for name in RL_EXPERIMENTS])
  def test_every_key_the_file_sets_is_in_its_schema(self, name):
    # The other half of "every key it reads is validated": nothing set that nothing reads.
    module = _module(name)
    for arg in (None, "smoke"):
      config = module.get_config(arg)
      leaves = {path for path, _ in configs.leaves(config)}
      covered = {path for path in leaves
                 if any(path == key or path.startswith(key + ".") for key in module.SCHEMA)}
      self.assertEqual(leaves - covered, set(), name)
      missing = [key for key in module.SCHEMA
                 if not any(path == key or path.startswith(key + ".") for path in leaves)]
      self.assertEqual(missing, [], f"{name}: schema keys its config never sets")

  def test_agent_task_is_validated(self):
    agent = _module("agent")
    config = agent.get_config()
    config.task.family = "chess"
    with self.assertRaisesRegex(configs.ConfigError, r"config\.task\.family must be one of"):
      rl_config.validate(config, agent.SCHEMA)

  def test_grpo_presets(self):
    grpo = _module("grpo")
    rl_config.validate(grpo.get_config("smollm2"), grpo.SCHEMA)
    rl_config.validate(grpo.get_config("preset=smollm2,smoke"), grpo.SCHEMA)
    with self.assertRaisesRegex(configs.ConfigError, r"config\.model\.path must be an HF"):
      rl_config.validate(grpo.get_config("pod"), grpo.SCHEMA)  # the path is the user's to give
    pod = grpo.get_config("pod")
    pod.model.path = "/ckpt/Qwen3-8B"
    rl_config.validate(pod, grpo.SCHEMA)
    with self.assertRaisesRegex(configs.ConfigError, r"unknown preset 'gpu'"):
      grpo.get_config("gpu")
    with self.assertRaisesRegex(configs.ConfigError, r"unknown config arg 'smok'"):
      grpo.get_config("preset=cpu,smok")

  def test_openai_agent_calculator_preset_is_the_agent_smollm2_run(self):
    # The example program's preset trains agent.py's smollm2 task at its scale, so the two
    # runs compare step for step; only the program and the server's tool format are its own.
    oa, agent = _module("openai_agent"), _module("agent")
    config, smollm2 = oa.get_config("calculator"), agent.get_config("smollm2")
    for key in ("model", "task", "lora", "optim", "rollout", "updates", "eval", "total_steps"):
      self.assertEqual(config[key], smollm2[key], key)
    self.assertEqual((config.agent.module, config.agent.tool_format, config.loss.agg),
                     ("agentrl.serve.calculator_agent", "tags", smollm2.loss.agg))
    for arg in ("calculator", "preset=calculator,smoke"):
      config = oa.get_config(arg)
      rl_config.validate(config, oa.SCHEMA)
      unread = [p for p, _ in configs.leaves(config)
                if not any(p == k or p.startswith(k + ".") for k in oa.SCHEMA)]
      self.assertEqual(unread, [], arg)
    with self.assertRaisesRegex(configs.ConfigError, "unknown openai_agent preset 'smollm2'; "
                                "use cpu \\(default\\), calculator"):
      oa.get_config("smollm2")


class BadValueTest(parameterized.TestCase):

  @parameterized.named_parameters(
      ("group_size", "rollout.group_size", 1,
       r"^config\.rollout\.group_size must be >= 2 for a group baseline, got 1$"),
      ("lr_type", "optim.lr", "fast", r"config\.optim\.lr must be float, got str"),
      ("agg", "loss.agg", "mean", r"config\.loss\.agg must be one of"),
      ("temperature", "rollout.temperature", 0.0, r"config\.rollout\.temperature must be >="),
      ("minibatches", "updates.minibatches", 3,
       r"config\.updates\.minibatches \(3\) must divide .* \(512\)"),
      ("length", "rollout.max_new_tokens", 16,
       r"config\.rollout\.max_new_tokens \(16\) must be < config\.rollout\.max_len \(16\)"),
      ("task", "task.name", "chess", r"config\.task\.name must be one of"),
      ("sft", "sft.target_success", 1.5, r"config\.sft\.target_success must be <= 1"),
  )
  def test_grpo_bad_value_names_key(self, path, value, pattern):
    grpo = _module("grpo")
    config = grpo.get_config()
    node = config
    *parents, leaf = path.split(".")
    for part in parents:
      node = node[part]
    # Bypass ConfigDict's own type check to reach validate(), as a hand-edited config would.
    node._fields[leaf] = value  # pylint: disable=protected-access
    with self.assertRaisesRegex(configs.ConfigError, pattern):
      rl_config.validate(config, grpo.SCHEMA)

  def test_unknown_key_is_rejected(self):
    grpo = _module("grpo")
    config = grpo.get_config()
    config.rollout.groupsize = 4
    with self.assertRaisesRegex(configs.ConfigError,
                                r"config\.rollout\.groupsize is not a key this experiment reads"):
      rl_config.validate(config, grpo.SCHEMA)

  def test_r2vpo_needs_one_minibatch(self):
    r2vpo = _module("r2vpo")
    config = r2vpo.get_config()
    config.updates.minibatches = 2
    with self.assertRaisesRegex(configs.ConfigError,
                                r"config\.updates\.minibatches must be <= 1 for R2VPO"):
      rl_config.validate(config, r2vpo.SCHEMA)

  def test_scratch_model_needs_a_task_with_a_built_in_tokenizer(self):
    grpo = _module("grpo")
    config = grpo.get_config()
    config.task.name = "reasoning_gym"
    with self.assertRaisesRegex(configs.ConfigError, r"config\.model\.init='scratch'"):
      rl_config.validate(config, grpo.SCHEMA)


class PrmConfigTest(absltest.TestCase):
  """experiments/preference/prm.py: a PRM trainer, not an RL loop, so not in RL_EXPERIMENTS."""

  def test_presets_validate_and_set_only_schema_keys(self):
    prm = _module("prm")
    for arg in (None, "smoke", "pod"):
      config = prm.get_config(arg)
      if arg == "pod":
        config.model.path = "/ckpt/Qwen3-8B"
      rl_config.validate(config, prm.SCHEMA)
      leaves = {path for path, _ in configs.leaves(config)}
      self.assertEqual({p for p in leaves
                        if not any(p == k or p.startswith(k + ".") for k in prm.SCHEMA)}, set())
    with self.assertRaisesRegex(configs.ConfigError, "unknown prm preset 'smollm2'"):
      prm.get_config("smollm2")

  def test_bad_keys_fail_before_anything_is_built(self):
    prm = _module("prm")
    config = prm.get_config()
    config.prm.labels = "fuzzy"
    with self.assertRaisesRegex(configs.ConfigError, r"config\.prm\.labels must be one of"):
      prm.train(config, "/nonexistent/prm")
    config = prm.get_config()
    config.lora.rank = 8
    with self.assertRaisesRegex(configs.ConfigError, r"config\.lora\.rank \(8\) must be 0"):
      prm.train(config, "/nonexistent/prm")

  def test_prm_rl_needs_a_prm_run(self):
    prm_rl = _module("prm_rl")
    config = prm_rl.get_config()
    with self.assertRaisesRegex(configs.ConfigError, r"config\.reward\.prm is empty"):
      prm_rl.train(config, "/nonexistent/prm_rl")
    config.reward.prm = "/nonexistent/prm"
    with self.assertRaisesRegex(configs.ConfigError,
                                r"config\.reward\.prm='/nonexistent/prm' has no prm/"):
      prm_rl.train(config, "/nonexistent/prm_rl")


class SelectionAndShapingExperimentsTest(absltest.TestCase):
  """The cross-key checks of experiments/{d3s,riskpo,delta}.py and FAPO's flaw rule."""

  def test_cross_key_checks_fail_before_anything_is_built(self):
    d3s = _module("d3s")
    config = d3s.get_config()
    self.assertEqual(config.loss.keep_samples, 4)  # G / 2
    config.loss.keep_samples = 9
    with self.assertRaisesRegex(configs.ConfigError,
                                r"config\.loss\.keep_samples \(9\) must be <= "
                                r"config\.rollout\.group_size \(8\)"):
      d3s.train(config, "/nonexistent/d3s")
    riskpo = _module("riskpo")
    self.assertEqual(riskpo.get_config().rollout.prompts_per_step, 65)  # whole bundles of 5
    self.assertEqual(riskpo.get_config("pod").rollout.prompts_per_step, 260)
    self.assertEqual(riskpo.get_config("smoke").loss.bundle_size, 2)  # its 2 prompts
    config = riskpo.get_config()
    config.rollout.prompts_per_step = 64
    with self.assertRaisesRegex(configs.ConfigError,
                                r"config\.loss\.bundle_size \(5\) must divide "
                                r"rollout\.prompts_per_step \(64\)"):
      riskpo.train(config, "/nonexistent/riskpo")
    delta = _module("delta")
    config = delta.get_config()
    config.loss.w_min = 1.5
    with self.assertRaisesRegex(configs.ConfigError, r"config\.loss\.w_min \(1\.5\) must be <="):
      delta.train(config, "/nonexistent/delta")

  def test_icpo_guide_checks(self):
    icpo = _module("icpo")
    self.assertEqual(dict(icpo.get_config().guide), {"num_guided": 1, "shots": 2,
                                                     "gold": False, "sep": "", "answer_prefix": ""})
    config = icpo.get_config()
    config.guide.num_guided = 9
    with self.assertRaisesRegex(configs.ConfigError,
                                r"guide\.num_guided=9 exceeds rollout\.group_size=8"):
      icpo.train(config, "/nonexistent/icpo")
    config = icpo.get_config()
    config.guide.shots = 0
    with self.assertRaisesRegex(configs.ConfigError, r"guide\.shots=0 with guide\.gold=False"):
      icpo.train(config, "/nonexistent/icpo")
    config = icpo.get_config()
    config.updates.max_staleness = 1
    with self.assertRaisesRegex(configs.ConfigError, r"updates\.max_staleness must be 0"):
      icpo.train(config, "/nonexistent/icpo")
    config = icpo.get_config()
    config.loss.weight = "luffy"
    with self.assertRaisesRegex(configs.ConfigError, r"config\.loss\.weight"):
      icpo.train(config, "/nonexistent/icpo")

  def test_lens_checks(self):
    lens = _module("lens")
    self.assertEqual(dict(lens.get_config().lens),
                     {"gamma": 0.05, "tau": 0.5, "num_purified": 8, "success_tau": 1.0,
                      "absolute": True, "min_score": 0.0})
    self.assertEqual(lens.get_config("pod").lens.gamma, 0.02)
    config = lens.get_config()
    config.updates.max_staleness = 1
    with self.assertRaisesRegex(configs.ConfigError, r"updates\.max_staleness must be 0"):
      lens.train(config, "/nonexistent/lens")
    config = lens.get_config()
    config.lens.gamma = 1.5
    with self.assertRaisesRegex(configs.ConfigError, r"config\.lens\.gamma"):
      lens.train(config, "/nonexistent/lens")

  def test_icpo_smollm2_preset_is_grpos_with_a_guide(self):
    # The guided-sampling study (scripts/guided_study.py) compares the two at this preset: every
    # key but the method's own (loss, guide) and the transcript bound (room for the guided
    # prompt) is grpo.py's smollm2 value.
    icpo, grpo = _module("icpo"), _module("grpo")
    for arg in ("smollm2", "preset=smollm2,smoke"):
      config = icpo.get_config(arg)
      rl_config.validate(config, icpo.SCHEMA)
      icpo.check(config)
      mine, theirs = config.to_dict(), grpo.get_config(arg).to_dict()
      for key in set(theirs) - {"loss", "rollout"}:
        self.assertEqual(mine[key], theirs[key], f"{arg}: {key}")
      del mine["rollout"]["max_len"], theirs["rollout"]["max_len"]
      self.assertEqual(mine["rollout"], theirs["rollout"], arg)
      self.assertEqual(mine["loss"]["agg"], theirs["loss"]["agg"], arg)
    self.assertEqual(dict(icpo.get_config("smollm2").guide),
                     {"num_guided": 1, "shots": 3, "gold": False, "sep": "\n\n",
                      "answer_prefix": "\nAnswer: "})
    self.assertEqual(icpo.get_config("smollm2").rollout.max_len, 160)

  def test_fapo_flaw_rule(self):
    # Hand-computed: 123 + 456 = 579, written reversed at width 4 as "9750".
    judge = _module("fapo").judge
    self.assertEqual(judge("9750", "9750"), (True, False))   # exact: a full positive
    self.assertEqual(judge(" 9750\n", "9750"), (True, False))
    self.assertEqual(judge("975", "9750"), (True, True))     # right number, carry digit missing
    self.assertEqual(judge("97500", "9750"), (True, True))   # right number, extra padding
    self.assertEqual(judge("9751", "9750"), (False, False))  # wrong number
    self.assertEqual(judge("", "9750"), (False, False))
    self.assertEqual(judge("97a0", "9750"), (False, False))
    self.assertEqual(judge("\u0669750", "9750"), (False, False))  # non-ASCII digit


class EvalTest(absltest.TestCase):

  def test_pass_at_k_golden_numbers(self):
    evaluation = _module("eval")
    self.assertEqual(evaluation.pass_at_k(2, 1, 1), 0.5)
    self.assertAlmostEqual(evaluation.pass_at_k(5, 2, 2), 1 - 3 / 10)  # 1 - C(3,2)/C(5,2)
    self.assertEqual(evaluation.pass_at_k(8, 0, 4), 0.0)
    self.assertEqual(evaluation.pass_at_k(8, 5, 4), 1.0)  # fewer than k wrong samples

  def test_voted_answers_per_kind_of_task(self):
    evaluation = _module("eval")
    config = _module("prm_rl").get_config()   # the hidden-rule game
    tok = recipe.task_tokenizer(config.task)   # its scratch tokenizer

    def traj(turns):   # prompt ids, then each turn's text sampled (the env's replies left out)
      ids, mask, turn = [tok.bos_id], [0.0], [-1]
      for k, text in enumerate(turns):
        new = tok.encode(text) + [tok.eos_id]
        ids, mask, turn = ids + new, mask + [1.0] * len(new), turn + [k] * len(new)
      n = len(ids)
      return agent_loop.Trajectory(
          tokens=np.asarray(ids, np.int32), loss_mask=np.asarray(mask, np.float32),
          turn=np.asarray(turn, np.int32), sampler_logp=np.zeros(n, np.float32),
          turn_rewards=[0.0] * len(turns), reward=0.0, done=True, truncated=False,
          prompt_len=1)

    # Multi-turn with a command reader: the last turn's command words; no turn, no answer.
    answers, why = evaluation.voted_answers(
        [traj(["guess 50", "guess 37"]), traj(["guess 37", "guess: 50."]), traj([])], tok,
        config.task)
    self.assertEqual((answers, why), (["guess 37", "guess 50", None], ""))
    # Single-turn: the completion as the task reads it (here its last line, all of it).
    config.task.name = "verbose_arithmetic"
    answers, _ = evaluation.voted_answers([traj(["guess 37"])], tok, config.task)
    self.assertEqual(answers, ["guess 37"])
    # Multi-turn without one: no votes, and the output says why.
    config.task.name = "calculator"
    answers, why = evaluation.voted_answers([traj(["guess 37"])], tok, config.task)
    self.assertIsNone(answers)
    self.assertEqual(why, "skipped: task.name='calculator' is multi-turn and its env exposes no "
                          "final answer (no registry parse_action); prm_best@k only")

  def test_bad_eval_config(self):
    evaluation = _module("eval")
    config = evaluation.get_config()
    config.run_dir = "/nonexistent/run"
    with self.assertRaisesRegex(configs.ConfigError,
                                r"config\.run_dir='/nonexistent/run' is not a run directory"):
      evaluation.validate(config)
    config = evaluation.get_config()
    config.ks = "1,16"
    with self.assertRaisesRegex(configs.ConfigError, r"config\.ks='1,16': each k must be an "):
      evaluation.validate(config)
    config = evaluation.get_config()
    config.model_path = "/nonexistent/hf_dir"
    with self.assertRaisesRegex(configs.ConfigError,
                                r"config\.model_path='/nonexistent/hf_dir' does not exist"):
      evaluation.validate(config)


if __name__ == "__main__":
  absltest.main()
