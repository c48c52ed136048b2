"""Tests for agentrl.harness.recipe and the verbose task's recipe plumbing."""
from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from agentrl import configs
from agentrl.envs import base
from agentrl.envs import verbose_arithmetic
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.rollout import agent_loop


class ConfigTest(absltest.TestCase):

  def test_verbose_task_config_validates(self):
    for smoke in (False, True):
      c = rl_config.rl_config("cpu", smoke=smoke)
      recipe.use_verbose_task(c)
      self.assertEqual((c.task.name, c.rollout.max_new_tokens, c.rollout.max_len),
                       ("verbose_arithmetic", 16, 32))
      rl_config.validate(c, rl_config.RL_SCHEMA)
    c.rollout.max_new_tokens = 6                 # shorter than the longest demonstration
    with self.assertRaisesRegex(configs.ConfigError,
                                r"max_new_tokens \(6\) must be >= 15 for task.name="):
      rl_config.validate(c, rl_config.RL_SCHEMA)

  def test_parse_ints_and_reject_preset(self):
    self.assertEqual(recipe.parse_ints("hbpo.budgets", "6,8,10,12"), [6, 8, 10, 12])
    for bad in ("", "8,6", "6,6", "0,2", "a,b"):
      with self.assertRaisesRegex(configs.ConfigError, r"config\.hbpo\.budgets="):
        recipe.parse_ints("hbpo.budgets", bad)
    recipe.reject_preset("brpo", "cpu", ("cpu",), "why")
    with self.assertRaisesRegex(configs.ConfigError,
                                r"^unknown brpo preset 'pod'; use one of \('cpu',\) "
                                r"\(and smoke\): no thinking format$"):
      recipe.reject_preset("brpo", "pod", ("cpu",), "no thinking format")

  def test_verbose_prompt_stream_revisits_a_finite_training_set(self):
    c = rl_config.rl_config("cpu")
    recipe.use_verbose_task(c)
    stream = recipe.prompt_stream(recipe.make_task(c.task))
    size = verbose_arithmetic.TRAIN_SIZE
    first = [e["seed"] for e in stream.take(size)]
    second = [e["seed"] for e in stream.take(size)]
    self.assertEqual(sorted(first), list(range(size)))   # every problem once per epoch
    self.assertEqual(sorted(second), list(range(size)))
    self.assertNotEqual(first, second)                   # reshuffled each epoch
    # Tasks without a training set still stream fresh seeds in order.
    plain = recipe.prompt_stream(recipe.make_task(rl_config.rl_config("cpu").task))
    self.assertEqual([e["seed"] for e in plain.take(3)], [0, 1, 2])


class RowHelpersTest(absltest.TestCase):

  def test_correct_and_length(self):
    np.testing.assert_array_equal(recipe.is_correct(jnp.asarray([1.0, 0.0, 0.5, 2.0])),
                                  [True, False, False, True])
    mask = jnp.asarray([[0, 1, 1, 0], [0, 0, 0, 0], [1, 1, 1, 1]], jnp.float32)
    np.testing.assert_array_equal(recipe.response_length(mask), [2.0, 0.0, 4.0])


class FakeEngine:
  """Greedy 'rollouts' whose response to seed s has s % 3 + 1 tokens and succeeds if s is even."""

  def run(self, params, tok, envs, seeds, **kw):
    del params, tok, envs
    assert kw["greedy"]
    trajs = []
    for s in seeds:
      n = s % 3 + 1
      trajs.append(agent_loop.Trajectory(
          tokens=np.zeros(2 + n, np.int32), loss_mask=np.r_[0, 0, np.ones(n)].astype(np.float32),
          turn=np.zeros(2 + n, np.int32), sampler_logp=np.zeros(2 + n, np.float32),
          turn_rewards=[1.0], reward=1.0, done=True, truncated=False, prompt_len=2,
          infos=[base.make_info(reward=1.0, success=s % 2 == 0)]))
    return trajs, {}


class LengthEvaluatorTest(absltest.TestCase):

  def test_success_and_mean_response_tokens_on_held_out_seeds(self):
    c = rl_config.rl_config("cpu")
    c.eval.num_problems = 6
    evaluate = recipe.length_evaluator(c, FakeEngine(), None, lambda: None)
    # Seeds HELDOUT_START + 0..5; HELDOUT_START = 2**30 is 1 mod 3 and even.
    lengths = [(recipe.EVAL_SEED_BASE + i) % 3 + 1 for i in range(6)]
    self.assertEqual(evaluate(None), {"success": 0.5, "response_tokens": np.mean(lengths)})


if __name__ == "__main__":
  absltest.main()
