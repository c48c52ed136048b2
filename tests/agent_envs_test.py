# pylint: disable=invalid-name
"""Every registry env through experiments/agents/agent.py's rollout path: one short batch each.

Per env: the agent config with --config.task.name set (validated by the experiment's SCHEMA
and its credit check), `recipe.make_task`, the prompt stream and `agent.make_rollout_fn` with a
tiny random model, then the credit's advantages. The episodes must have sampled tokens, finite
rewards and advantages, and observation (and prompt) tokens outside the loss mask. One
tokenizer (trained on every env's first texts) and one model serve all envs, so the engine and
the scoring programs compile once; the suite's persistent compilation cache (conftest.py) keeps
them across runs.
"""
import importlib

from absl.testing import absltest
from absl.testing import parameterized
from flax import nnx
import jax
import numpy as np

from agentrl.credit import probes
from agentrl.envs import registry
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.models import tokenizer as tokenizer_lib
from agentrl.models import transformer
from agentrl import sharding

agent = importlib.import_module("experiments.agents.agent")

# The credit each env is rolled out with: the probed A2TGPO path where the env has gold
# actions, GiGPO's step groups (every env) elsewhere.
CREDIT = {name: "a2tgpo_igpo" if row.gold_action else "gigpo"
          for name, row in registry.ENVS.items()}
# Values the agent config's hidden-rule defaults do not fit.
VALUES = {"tool_use": {"family": "mixed"}}
NEW_TOKENS = {"verbose_arithmetic": 16}   # its longest demonstrated answer (rl_config.validate)
MAX_LEN = 512   # holds a TextWorld or ALFWorld observation with its command list


def _config(name: str):
  config = agent.get_config("smoke")
  config.task.update(name=name, max_turns=2, **VALUES.get(name, {}))
  config.loss.credit = CREDIT[name]
  config.rollout.update(prompts_per_step=1, group_size=2, max_len=MAX_LEN, min_len=MAX_LEN,
                        max_new_tokens=NEW_TOKENS.get(name, 8), slots=2)
  if registry.ENVS[name].vocab is None:   # validated as the pretrained run it needs
    config.model.init = "gguf"
  return config


def _texts(name: str) -> list[str]:
  env = recipe.make_task(_config(name).task)()
  texts = [getattr(env, "system_prompt", "") or "", env.reset(0), env.step("?")[0]]
  if hasattr(env, "close"):
    env.close()
  return texts


class AgentEnvsTest(parameterized.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    lines = [t for name in registry.NAMES for t in _texts(name) if t]
    cls.tok = tokenizer_lib.train_sentencepiece(lines, 512)
    config = _config("hidden_rule")
    cls.mesh = sharding.make_mesh(config.mesh)
    cfg = recipe.model_config(config.model, cls.tok.vocab_size)
    cls.graphdef, cls.params = sharding.create_sharded(
        lambda: transformer.Transformer(cfg, rngs=nnx.Rngs(0)), cls.mesh, config.sharding_rules)
    cls.engine = recipe.rollout_engine(config, cls.graphdef, cls.tok)
    cls.steps = {"probe": jax.jit(probes.make_probe_step(cls.graphdef, logprob_impl="xla"))}

  def test_every_env_is_a_task_name_choice(self):
    self.assertEqual(agent.SCHEMA["task.name"].choices, registry.NAMES)

  @parameterized.named_parameters((name, name) for name in registry.NAMES)
  def test_one_rollout_batch(self, name):
    config = _config(name)
    rl_config.validate(config, agent.SCHEMA)
    agent.check_credit(config)
    make_env = recipe.make_task(config.task)
    rollout_fn = agent.make_rollout_fn(config, self.engine, self.tok, make_env,
                                       recipe.prompt_stream(make_env), self.mesh,
                                       self.steps["probe"])
    with jax.set_mesh(self.mesh):
      rollout = rollout_fn(self.params, jax.random.key(0), 0)
      batch, metrics = agent.make_advantage_fn(config)(rollout.batch, rollout.extras)
    mask_BT, turn_BT = np.asarray(batch.loss_mask_BT), np.asarray(batch.turn_BT)
    self.assertGreater(mask_BT.sum(), 0, "no sampled tokens")
    self.assertTrue(np.isfinite(np.asarray(batch.reward_B)).all())
    self.assertTrue(np.isfinite(np.asarray(batch.adv_BT)).all())
    self.assertTrue(all(np.isfinite(np.asarray(v)).all() for v in metrics.values()))
    # The prompt (turn -1) is never trained on; within a turn the sampled ids come first and
    # the observation that answers them after, outside the loss mask and with no advantage.
    self.assertTrue((mask_BT[turn_BT < 0] == 0).all())
    self.assertTrue((np.asarray(batch.adv_BT)[mask_BT == 0] == 0).all())
    for mask_T, turn_T in zip(mask_BT, turn_BT):
      for u in set(turn_T[turn_T >= 0].tolist()):
        in_turn = mask_T[turn_T == u]
        self.assertTrue((np.diff(in_turn) <= 0).all(), f"turn {u} interleaves obs and policy")

if __name__ == "__main__":
  absltest.main()
