"""Tests for agentrl.serve.calculator_agent: its tasks, and its episodes through the real server.

The program runs on an `AgentRunner` (the real `openai` client) against the real HTTP server
and `SessionHub`; the engine's side of its session is a thread that hands the session given
model turns (no model), so what the program sent is checked as the engine sees it.
"""
import json
import threading

from absl.testing import absltest
import numpy as np

from agentrl import configs
from agentrl.envs import calculator
from agentrl.envs import registry
from agentrl.harness import recipe
from agentrl.rollout import agent_loop
from agentrl.serve import app as app_lib
from agentrl.serve import calculator_agent
from agentrl.serve import programs
from agentrl.serve import sessions

TASK = registry.task_config("calculator", num_ops=2, max_operand=99, max_turns=3, few_shot=1,
                            chat_template=True)
TOK = recipe.task_tokenizer(TASK)


def _turn(truncated: bool = False) -> agent_loop.Trajectory:
  """A transcript whose last turn stopped (what the engine's watch tells a session)."""
  ids = np.asarray([3, 4, TOK.end_of_turn_ids[0]], np.int32)
  return agent_loop.Trajectory(
      tokens=ids, loss_mask=np.ones(3, np.float32), turn=np.zeros(3, np.int32),
      sampler_logp=np.zeros(3, np.float32), turn_rewards=[0.0], reward=0.0, done=False,
      truncated=truncated, prompt_len=0)


class _Turns(threading.Thread):
  """The engine's side of one session: reset, then each given model turn (text) in turn,
  recording what reset and every step returned; `overflow`: after the last one the episode
  ends at the length budget, as when its next observation does not fit."""

  def __init__(self, env: sessions.ClientEnv, texts: list[str], overflow: bool = False):
    super().__init__(daemon=True)
    self.env, self.texts, self.overflow, self.returned = env, texts, overflow, []

  def run(self):
    self.returned.append(self.env.reset(0))
    for text in self.texts:
      self.env.on_sampled(_turn())
      self.returned.append(self.env.step(text))
      if self.returned[-1][2]:
        return
    if self.overflow:
      self.env.hub.watch("ended", self.env, _turn(truncated=True))


class CalculatorAgentTest(absltest.TestCase):

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.hub = sessions.SessionHub(TOK, model_name="policy", tool_format="tags", max_sessions=4,
                                  session_timeout_s=30.0)
    server = cls.enterClassContext(app_lib.Server(app_lib.make_app(cls.hub, max_concurrent=4)))
    cls.runner = cls.enterClassContext(programs.AgentRunner(server.url))

  def _episode(self, task: dict, texts: list[str],
               overflow: bool = False) -> tuple[programs.Outcome, _Turns]:
    env, = self.hub.open(1)
    model = _Turns(env, texts, overflow)
    model.start()
    future, = self.runner.start(calculator_agent.agent, [(env.session_id, task)], self.hub)
    outcome = future.result(timeout=30)
    model.join(10)
    self.assertFalse(model.is_alive())
    return outcome, model

  def test_make_task_is_the_envs_problem_of_the_seed(self):
    task = calculator_agent.make_task(TASK, 12)
    self.assertEqual(task, calculator_agent.make_task(TASK, 12))
    self.assertNotEqual(task["question"], calculator_agent.make_task(TASK, 13)["question"])
    self.assertEqual(json.loads(json.dumps(task)), task)
    env = registry.factory(TASK)()
    self.assertEqual(task["question"], env.reset(12))
    self.assertEqual(env.step(f"<answer>{task['answer']}</answer>")[1], 1.0)  # the env's check
    self.assertEqual(task["max_turns"], 3)
    shown, = task["examples"]   # few_shot=1: the env's own demonstrated problem
    self.assertEqual(env.examples[0]["content"], shown["question"])
    self.assertEqual(calculator.format_number(calculator.evaluate(shown["expression"])),
                     shown["answer"])
    self.assertEqual(calculator_agent.make_task({**TASK, "few_shot": 0}, 12)["examples"], [])
    with self.assertRaisesRegex(configs.ConfigError, "set --config.task.name=calculator"):
      calculator_agent.make_task(registry.task_config("hidden_rule"), 12)

  def test_tool_and_answer_never_eval_model_text(self):
    self.assertEqual(calculator_agent.run_tool('{"expression": "2*(3+4)"}'), "14")
    for bad in ('{"expression": "__import__(\'os\')"}', "not json", "[1]", '{"expr": "1"}'):
      self.assertStartsWith(calculator_agent.run_tool(bad), "error: ")
    self.assertEqual(calculator_agent.score("so <answer> 1,234 </answer>", "1234"), 1.0)
    self.assertEqual(calculator_agent.score("<answer>-7</answer>", "7"), 0.0)
    self.assertEqual(calculator_agent.score("<answer>none</answer>", "7"), 0.0)
    self.assertIsNone(calculator_agent.score("<calc>1+1</calc>", "2"))
    self.assertIsNone(calculator_agent.score(None, "2"))

  def test_a_solved_episode_through_the_server(self):
    task = calculator_agent.make_task(TASK, 5)
    expression = calculator.make_problem(5, num_ops=2, max_operand=99)["expression"]
    outcome, model = self._episode(task, [f"<calc>{expression}</calc>",
                                          f"<answer>{task['answer']}</answer>"])
    self.assertEqual((outcome.reward, outcome.dropped), (1.0, ""))
    # The engine saw the tool in the system prompt in the tags format, the demonstration as
    # earlier turns (its call written as a model of that format writes it), then the question.
    env = model.env
    self.assertEqual(model.returned[0], task["question"])
    # It is the env's own but for the env's notes and its answer placeholder.
    own = registry.factory(TASK)().system_prompt
    self.assertEqual(env.system_prompt, own.replace(" " + calculator.NOTES, "")
                     .replace("<answer>number</answer>", "<answer>...</answer>"))
    shown = task["examples"][0]
    self.assertEqual([(m["role"], m["content"]) for m in env.examples], [
        ("user", shown["question"]),
        ("assistant", f"<calc>{shown['expression']}</calc>"),
        ("user", f"<result>{shown['answer']}</result>"),
        ("assistant", f"<answer>{shown['answer']}</answer>")])
    # The program ran the call and answered it with a tool message: the next observation.
    obs, reward, done, info = model.returned[1]
    self.assertEqual((obs, reward, done), (f"<result>{task['answer']}</result>", 0.0, False))
    self.assertEqual(info[agent_loop.TOOL_RESULTS], [f"<result>{task['answer']}</result>"])
    self.assertEqual(model.returned[2][1:3], (1.0, True))   # finished with the reward

  def test_no_call_a_rejected_call_and_no_answer_score_zero(self):
    task = calculator_agent.make_task(TASK, 6)
    outcome, model = self._episode(task, ["I think it is big.",
                                          "<calc>open('x')</calc>",
                                          "<calc>1+1</calc>"])
    self.assertEqual((outcome.reward, outcome.dropped), (0.0, ""))
    self.assertEqual(model.returned[1][0], calculator_agent.NUDGE)
    self.assertStartsWith(model.returned[2][0], "<result>error: unsupported syntax: Call")
    self.assertEqual(model.returned[3][1:3], (0.0, True))   # max_turns replies: over

  def test_a_transcript_past_the_length_budget_scores_zero(self):
    # The server answers the next request with a 400 context_length_exceeded: the program
    # ends the episode as a failure (trained on) instead of raising (dropped).
    outcome, model = self._episode(calculator_agent.make_task(TASK, 7),
                                   ["<calc>1+1</calc>"], overflow=True)
    self.assertEqual((outcome.reward, outcome.dropped), (0.0, ""))
    self.assertStartsWith(model.env.ended, "context length")


if __name__ == "__main__":
  absltest.main()
