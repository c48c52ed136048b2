"""Tests for agentrl.serve.programs: agent programs through the real server and engine."""
import sys
import time
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
from agentrl.serve import testing as bad_programs

TASK = registry.task_config("hidden_rule", names=registry.NAMES, family="guess", max_turns=3,
                            style="compact")
TURN = dict(max_turns=3, max_new_tokens=4, max_len=48, temperature=1.0, chat_template=False)


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
    with programs.AgentRunner(self.server.url, processes=2) as runner:   # one episode each
      out = programs.rollout(self.engine, self.params, self.tok, self.hub, runner,
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
    out = programs.rollout(self.engine, self.params, self.tok, self.hub, self.runner,
                           bad_programs.raises,
                           [{"seed": 7}], rng=jax.random.key(1), **TURN)
    self.assertIn("RuntimeError: the program's own bug on seed 7", out.outcomes[0].dropped)
    self.assertEqual(out.metrics["serve/program_errors"], 1.0)
    self.assertEqual(out.metrics["serve/dropped"], 1.0)

  def test_a_dead_process_drops_its_programs_and_the_next_start_makes_another(self):
    out = programs.rollout(self.engine, self.params, self.tok, self.hub, self.runner,
                           bad_programs.exits,
                           [{"seed": 1}, {"seed": 2}], rng=jax.random.key(1), **TURN)
    for outcome in out.outcomes:
      self.assertIn("process exited with code 3", outcome.dropped)
    again = programs.rollout(self.engine, self.params, self.tok, self.hub, self.runner,
                             env_agent.agent, [env_agent.make_task(TASK, 3)],
                             rng=jax.random.key(0), greedy=True, **TURN)
    self.assertEqual(again.outcomes[0].dropped, "")

  def test_a_program_that_never_yields_is_ended_at_the_timeout(self):
    self.hub.session_timeout_s, before = 0.5, self.hub.session_timeout_s
    self.addCleanup(setattr, self.hub, "session_timeout_s", before)
    start = time.monotonic()
    out = programs.rollout(self.engine, self.params, self.tok, self.hub, self.runner,
                           bad_programs.never_yields, [{"seed": 5}], rng=jax.random.key(1),
                           timeout_s=0.5, **TURN)
    self.assertIn("did not end within 0.5s", out.outcomes[0].dropped)
    self.assertLess(time.monotonic() - start, 30.0)

  def test_programs_must_be_importable_by_the_runners_process(self):
    async def nested(client, task):
      del client, task
    for agent in (nested, lambda c, t: 0.0):
      with self.assertRaisesRegex(ValueError, "top level of an importable module"):
        programs.rollout(self.engine, self.params, self.tok, self.hub, self.runner, agent,
                         [{"seed": 0}], rng=jax.random.key(1), **TURN)
    self.assertEqual(programs.program_name(env_agent.agent),
                     ("agentrl.serve.env_agent", "agent"))
    opened = self.hub.stats["serve/sessions"]
    with self.assertRaisesRegex(ValueError, "task is not JSON"):
      programs.rollout(self.engine, self.params, self.tok, self.hub, self.runner,
                       env_agent.agent, [{"seed": object()}], rng=jax.random.key(1), **TURN)
    self.assertEqual(self.hub.stats["serve/sessions"], opened)   # no session was opened

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
