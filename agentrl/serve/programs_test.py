"""Tests for agentrl.serve.programs: agent programs through the real server and engine."""
import sys
import types

from absl.testing import absltest
import jax

from agentrl import configs
from agentrl.envs import registry
from agentrl.harness import recipe
from agentrl.models import testing
from agentrl.models import transformer
from agentrl.rollout import engine as engine_lib
from agentrl.serve import app as app_lib
from agentrl.serve import env_agent
from agentrl.serve import programs
from agentrl.serve import sessions

TASK = registry.task_config("hidden_rule", names=registry.NAMES, family="guess", max_turns=3,
                            style="compact")
TURN = dict(max_turns=3, max_new_tokens=4, max_len=48, temperature=1.0, chat_template=False)


async def _raises(client, task):
  await client.chat.completions.create(model="policy", messages=[
      {"role": "user", "content": "hello"}])
  raise RuntimeError(f"the program's own bug on seed {task['seed']}")


class ProgramsTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.tok = recipe.task_tokenizer(TASK)
    cls.graphdef, cls.params = testing.random_params(
        transformer.Config.named("tiny", vocab=cls.tok.vocab_size))
    cls.engine = engine_lib.Engine(cls.graphdef, pad_id=cls.tok.pad_id, slots=4, env_workers=4,
                                   env_timeout_s=60.0)
    cls.hub = sessions.SessionHub(cls.tok, model_name="policy", max_sessions=4,
                                  session_timeout_s=30.0, max_new_tokens=4, max_turns=3,
                                  max_len=48)
    cls.server = app_lib.Server(app_lib.make_app(cls.hub, max_concurrent=8)).start()
    cls.runner = programs.AgentRunner(cls.server.url)

  @classmethod
  def tearDownClass(cls):
    cls.runner.close()
    cls.server.stop()
    super().tearDownClass()

  def test_env_agent_samples_what_the_engine_samples_from_the_env(self):
    seeds = [3, 4]
    out = programs.rollout(self.engine, self.params, self.tok, self.hub, self.runner,
                           env_agent.agent, [env_agent.make_task(TASK, s) for s in seeds],
                           rng=jax.random.key(0), greedy=True, **TURN)
    make_env = registry.factory(TASK)
    plain, _ = self.engine.run(self.params, self.tok, [make_env() for _ in seeds], [0, 1],
                               rng=jax.random.key(0), greedy=True, **TURN)
    for served, direct, outcome in zip(out.trajectories, plain, out.outcomes):
      self.assertEqual(list(served.tokens), list(direct.tokens))
      self.assertEqual(list(served.loss_mask), list(direct.loss_mask))
      self.assertEqual(outcome.dropped, "")
      self.assertAlmostEqual(outcome.reward, direct.reward)
    self.assertEqual(out.metrics["serve/sessions"], 2.0)
    self.assertEqual(out.metrics["serve/program_errors"], 0.0)

  def test_a_program_that_raises_is_dropped(self):
    out = programs.rollout(self.engine, self.params, self.tok, self.hub, self.runner, _raises,
                           [{"seed": 7}], rng=jax.random.key(1), **TURN)
    self.assertIn("RuntimeError: the program's own bug on seed 7", out.outcomes[0].dropped)
    self.assertEqual(out.metrics["serve/program_errors"], 1.0)
    self.assertEqual(out.metrics["serve/dropped"], 1.0)

  def test_load_program_names_what_is_missing(self):
    self.assertIs(programs.load_program("agentrl.serve.env_agent"), env_agent)
    with self.assertRaisesRegex(configs.ConfigError, "cannot be imported"):
      programs.load_program("no_such_module_here")
    sys.modules["_sync_agent"] = types.SimpleNamespace(agent=lambda c, t: 0.0,
                                                       make_task=lambda c, s: {})
    self.addCleanup(sys.modules.pop, "_sync_agent")
    with self.assertRaisesRegex(configs.ConfigError, "async def agent"):
      programs.load_program("_sync_agent")


if __name__ == "__main__":
  absltest.main()
