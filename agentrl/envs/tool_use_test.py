"""Tests for agentrl.envs.tool_use: gold traces solve every task, hostile calls are errors."""
import collections
import json
import random
import time

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.envs import base
from agentrl.envs import registry
from agentrl.envs import safe
from agentrl.envs import testing
from agentrl.envs import tool_use


def _call_text(call) -> str:
  return f"<tool_call>{json.dumps(call)}</tool_call>"


def _tool_similarity(pred: dict, gold: dict) -> float:
  """MatchTIR's tool_similarity (quchangle1/MatchTIR@f614ce1, Code/verl/utils/reward_score/
  tool.py), on calls whose arguments are dicts: name match, then argument-key overlap
  (match_score) and one point per gold argument value matched, over 2 + len(gold args)."""
  if pred["name"].lower() != gold["name"].lower():
    return 0.0
  pred_args, gold_args = pred["arguments"], gold["arguments"]
  keys_p, keys_g = collections.Counter(list(pred_args)), collections.Counter(list(gold_args))
  both = sum((keys_p & keys_g).values())
  key_score = 1.0 if list(pred_args) == list(gold_args) else (
      both / (len(pred_args) + len(gold_args) - both) if pred_args and gold_args else 0.0)
  values = sum(1.0 for k, v in gold_args.items() if k in pred_args and pred_args[k] == v)
  return (1.0 + key_score + values) / (2.0 + len(gold_args))


class ToolsTest(parameterized.TestCase):

  @parameterized.parameters(
      # Known calendar facts: 2024-02-29 was a Thursday; 2000-01-01 a Saturday.
      ({"name": "weekday", "arguments": {"date": "2024-02-29"}}, {"result": "Thursday"}),
      ({"name": "weekday", "arguments": {"date": "2000-01-01"}}, {"result": "Saturday"}),
      ({"name": "add_days", "arguments": {"date": "2024-02-28", "days": 1}},
       {"result": "2024-02-29"}),
      ({"name": "add_days", "arguments": {"date": "2023-02-28", "days": 366}},
       {"result": "2024-02-29"}),
      ({"name": "convert_units", "arguments": {"value": 412, "from_unit": "m", "to_unit": "cm"}},
       {"result": 41200, "unit": "cm"}),
      ({"name": "convert_units", "arguments": {"value": 1, "from_unit": "cm", "to_unit": "m"}},
       {"result": 0.01, "unit": "m"}),
      ({"name": "convert_units", "arguments": {"value": 1.5, "from_unit": "h", "to_unit": "min"}},
       {"result": 90, "unit": "min"}),
      ({"name": "calculator", "arguments": {"expression": "791630 - 468422"}},
       {"result": 323208}),
  )
  def test_tool_results(self, call, want):
    self.assertEqual(tool_use.run_tool({}, call), want)

  def test_lookup_is_case_and_space_insensitive(self):
    facts = {"Quorin Tower": {"height": 412, "opened": "1901-05-02"}}
    call = {"name": "lookup", "arguments": {"entity": " quorin   TOWER", "attribute": "Height"}}
    self.assertEqual(tool_use.run_tool(facts, call), {"result": 412, "unit": "m"})
    with self.assertRaisesRegex(tool_use.ToolError, "has no attribute.*height, opened"):
      tool_use.run_tool(facts, {"name": "lookup", "arguments": {"entity": "Quorin Tower",
                                                                "attribute": "population"}})

  @parameterized.parameters(
      ({"name": "convert_units", "arguments": {"value": 5, "from_unit": "km", "to_unit": "kg"}},
       "cannot convert length"),
      ({"name": "convert_units", "arguments": {"value": 5, "from_unit": "km", "to_unit": "mi"}},
       "unknown unit"),
      ({"name": "add_days", "arguments": {"date": "9999-12-31", "days": 1}}, "out of range"),
      ({"name": "add_days", "arguments": {"date": "2024-01-01", "days": 10**6}}, "within"),
      ({"name": "weekday", "arguments": {"date": "2023-02-29"}}, "invalid date"),
      ({"name": "weekday", "arguments": {"date": "tomorrow"}}, "YYYY-MM-DD"),
      ({"name": "calculator", "arguments": {"expression": "__import__('os')"}}, "unsupported"),
      ({"name": "lookup", "arguments": {"entity": "Atlantis", "attribute": "height"}},
       "unknown entity"),
  )
  def test_tool_errors(self, call, message):
    with self.assertRaisesRegex(tool_use.ToolError, message):
      tool_use.run_tool({}, call)


class TaskTest(parameterized.TestCase):

  def test_tasks_are_deterministic_in_the_seed(self):
    self.assertEqual(tool_use.make_task(7), tool_use.make_task(7))
    self.assertNotEqual(tool_use.make_task(7).prompt, tool_use.make_task(8).prompt)
    a, b = tool_use.ToolUseEnv(), tool_use.ToolUseEnv()
    self.assertEqual(a.reset(3), b.reset(3))
    self.assertEqual(a.gold_calls, b.gold_calls)

  @parameterized.parameters(*tool_use.TASKS)
  def test_each_task_kind_uses_its_tools(self, kind):
    want = {"weekday": ["weekday"], "convert": ["lookup", "convert_units"],
            "scale": ["lookup", "calculator"], "difference": ["lookup", "lookup", "calculator"],
            "anniversary": ["lookup", "add_days", "weekday"]}[kind]
    for seed in range(5):
      self.assertEqual([c["name"] for c in tool_use.make_task(seed, kind).gold_calls], want)

  def test_playing_the_gold_trace_solves_every_task(self):
    env = tool_use.ToolUseEnv()
    lengths = collections.Counter()
    for seed in range(300):
      env.reset(seed)
      gold = env.gold_calls
      lengths[len(gold)] += 1
      for i, call in enumerate(gold):
        obs, reward, done, info = env.step(f"Step {i}. {_call_text(call)}")
        self.assertTrue(obs.startswith("<tool_response>{"), (seed, obs))
        self.assertEqual((reward, done, info["error"]), (0.0, False, ""), seed)
        self.assertEqual(info["call"], call)
        self.assertEqual(info["gold_calls"], gold)
        # MatchTIR's turn-level similarity is computable from info alone: 1 for the gold call.
        self.assertEqual(_tool_similarity(info["call"], info["gold_calls"][i]), 1.0)
      answer = json.loads(obs.removeprefix("<tool_response>").removesuffix("</tool_response>"))
      _, reward, done, info = env.step(f"<answer>{answer['result']}</answer>")
      self.assertEqual((reward, done, info["success"]), (1.0, True, True), seed)
    self.assertEqual(set(lengths), {1, 2, 3})

  def test_tags_format_plays_the_gold_trace(self):
    env = tool_use.ToolUseEnv(tool_format="tags")
    self.assertIn("- <weekday>date</weekday>: the day of the week", env.system_prompt)
    for seed in range(40):
      actions = env.demonstration(seed, random.Random(seed))
      env.reset(seed)
      for action, call in zip(actions, env.gold_calls):
        self.assertTrue(action.startswith(f"<{call['name']}>"), action)
        obs, reward, done, info = env.step(action)
        self.assertTrue(obs.startswith("<result>{"), obs)
        self.assertEqual((reward, done, info["error"], info["progress"]), (0.0, False, "", 1.0))
        self.assertEqual(info["call"], call)
      _, reward, done, _ = env.step(actions[-1])
      self.assertEqual((reward, done), (1.0, True), seed)

  def test_several_calls_in_one_turn_and_progress(self):
    env = tool_use.ToolUseEnv("difference")
    env.reset(4)
    first, second, _ = env.gold_calls
    wrong = {"name": "lookup", "arguments": {**first["arguments"], "attribute": "founded"}}
    text = _call_text(first) + "\n" + _call_text(wrong) + _call_text(second)
    obs, reward, done, info = env.step(text)
    self.assertEqual((reward, done, info["error"]), (0.0, False, ""))
    self.assertEqual(obs.count("<tool_response>"), 3)
    self.assertEqual(info["calls"], [first, wrong, second])
    self.assertEqual(info["call"], first)
    self.assertAlmostEqual(info["progress"], 2 / 3)   # the wrong lookup ran but matches no gold
    self.assertEqual(info["tool_calls"], 3)
    self.assertEqual([json.loads(r) for r in info["tool_results"]],
                     [json.loads(part.removeprefix("<tool_response>")
                                 .removesuffix("</tool_response>")) for part in obs.split("\n")])
    # Matching ignores case and repeated spaces in text, as lookup does.
    loud = {"name": "lookup", "arguments": {k: f" {v.upper()} " for k, v in
                                            first["arguments"].items()}}
    self.assertTrue(tool_use.matches_gold(loud, [first]))
    _, _, _, info = env.step(_call_text({"name": "rm", "arguments": {}}))
    self.assertEqual((info["progress"], info["tool_errors"]), (0.0, 1))

  def test_wrong_answer_scores_zero(self):
    env = tool_use.ToolUseEnv()
    for seed in range(20):
      env.reset(seed)
      wrong = "Monday" if env.answer == "Sunday" else "Sunday"
      wrong = str(int(env.answer) + 1) if env.answer.isdigit() else wrong
      _, reward, done, info = env.step(f"<answer>{wrong}</answer>")
      self.assertEqual((reward, done, info["success"]), (0.0, True, False), seed)

  def test_answers_compare_as_numbers_or_without_case(self):
    self.assertTrue(tool_use.same_answer(" 41,200 ", "41200"))
    self.assertTrue(tool_use.same_answer("41200.0", "41200"))
    self.assertFalse(tool_use.same_answer("41200 cm or 5", "41200"))
    self.assertTrue(tool_use.same_answer("thursday", "Thursday"))
    self.assertFalse(tool_use.same_answer("Thursday.", "Thursday"))

  def test_partial_call_similarity_from_info(self):
    # A call with the right tool, both keys and one of two values: MatchTIR's similarity is
    # (1 name + 1 keys + 1 value) / (2 + 2 args) = 0.75 (tool_similarity, hand-computed).
    env = tool_use.ToolUseEnv("convert")
    env.reset(0)
    lookup = env.gold_calls[0]
    wrong = {"name": "lookup", "arguments": {**lookup["arguments"], "attribute": "opened"}}
    _, _, _, info = env.step(_call_text(wrong))
    self.assertEqual(_tool_similarity(info["call"], info["gold_calls"][0]), 0.75)
    _, _, _, info = env.step(_call_text({"name": "weekday", "arguments": lookup["arguments"]}))
    self.assertEqual(_tool_similarity(info["call"], info["gold_calls"][0]), 0.0)
    self.assertIn("takes arguments date", info["error"])  # rejected, but still reported

  def test_answer_wins_and_missing_tags_get_the_penalty(self):
    env = tool_use.ToolUseEnv(max_turns=2, format_penalty=-0.1)
    env.reset(0)
    obs, reward, done, info = env.step("I am thinking.")
    self.assertEqual((reward, done, info["call"]), (-0.1, False, None))
    self.assertTrue(obs.startswith("<error>no tool call"))
    _, reward, done, _ = env.step(_call_text(env.gold_calls[0]) + f"<answer>{env.answer}</answer>")
    self.assertEqual((reward, done), (1.0, True))

  def test_turn_budget_ends_the_episode(self):
    env = tool_use.ToolUseEnv(max_turns=2)
    env.reset(1)
    self.assertFalse(env.step(_call_text(env.gold_calls[0]))[2])
    self.assertTrue(env.step(_call_text(env.gold_calls[0]))[2])

  def test_arguments_as_a_json_string_are_accepted(self):
    env = tool_use.ToolUseEnv("weekday")
    env.reset(0)
    call = env.gold_calls[0]
    obs, _, _, info = env.step(_call_text({"name": call["name"],
                                           "arguments": json.dumps(call["arguments"])}))
    self.assertEqual(obs, f'<tool_response>{{"result": "{env.answer}"}}</tool_response>')
    self.assertEqual(info["call"], call)

  def test_demonstrations_solve_the_task_with_and_without_wrong_calls(self):
    env = tool_use.ToolUseEnv(max_turns=7)   # 3 gold calls, 3 wrong ones and the answer
    wrong = 0
    for seed in range(60):
      for noise in (0.0, 1.0):
        actions = env.demonstration(seed, random.Random(seed), noise=noise)
        env.reset(seed)
        self.assertLen(actions, len(env.gold_calls) * (1 + int(noise)) + 1)
        for action in actions:
          _, reward, done, info = env.step(action)
          wrong += bool(info["error"]) or (info["call"] not in (None, *env.gold_calls))
        self.assertEqual((reward, done), (1.0, True), (seed, noise))
        self.assertEqual(actions[-1], f"<answer>{env.answer}</answer>")
    self.assertGreater(wrong, 60)   # noise=1 showed a wrong call before every gold one
    self.assertEqual(env.demonstration(7, random.Random(0)), env.demonstration(7, random.Random(1)))
    self.assertLen(tool_use.ToolUseEnv(max_turns=2).demonstration(3, random.Random(3)), 2)
    with self.assertRaisesRegex(ValueError, "noise"):
      env.demonstration(0, random.Random(0), noise=1.5)

  def test_gold_calls_cannot_be_mutated_from_outside(self):
    env = tool_use.ToolUseEnv()
    env.reset(0)
    env.gold_calls[0]["arguments"].clear()
    _, _, _, info = env.step("<tool_call>{}</tool_call>")
    info["gold_calls"][0]["name"] = "x"
    self.assertNotEqual(env.gold_calls[0]["arguments"], {})
    self.assertNotEqual(env.gold_calls[0]["name"], "x")

  def test_episode_and_seed_contract(self):
    # After done, the gold answer paid 1.0 again on every repeat.
    testing.assert_env_contract(self, tool_use.ToolUseEnv(max_turns=2), action="no call",
                                answer=lambda env, info: f"<answer>{info['target']}</answer>")

  def test_bad_constructor_arguments(self):
    with self.assertRaisesRegex(ValueError, "task="):
      tool_use.ToolUseEnv("chess")
    with self.assertRaisesRegex(ValueError, "format_penalty"):
      tool_use.ToolUseEnv(format_penalty=1.0)
    with self.assertRaisesRegex(RuntimeError, "reset"):
      _ = tool_use.ToolUseEnv().gold_calls


_NO_CALL = "no tool call or answer"
_NOT_JSON = "not valid JSON"
_TOO_DEEP = "nests more than 16 brackets"
_CONVERT = '{"name": "convert_units", "arguments": {"from_unit": "m", "to_unit": "cm", "value": '
# name -> (action, the error it must get)
HOSTILE = {
    "not_json": ("<tool_call>lookup(Varnholt)</tool_call>", _NOT_JSON),
    "truncated_json": ('<tool_call>{"name": "weekday", "arguments": {"date": </tool_call>',
                       _NOT_JSON),
    "nul_bytes": ('<tool_call>{"name": "week\x00day", "arguments": {}}</tool_call>', _NOT_JSON),
    "nul_in_value": ('<tool_call>{"name": "weekday", "arguments": {"date": "\\u0000"}}'
                     "</tool_call>", r"got '\x00'"),
    "list": ("<tool_call>[1, 2, 3]</tool_call>", "must be a JSON object"),
    "string": ('<tool_call>"weekday"</tool_call>', "must be a JSON object"),
    "number": ("<tool_call>1e999</tool_call>", "must be a JSON object"),
    "no_name": ('<tool_call>{"arguments": {}}</tool_call>', 'needs a string "name"'),
    "name_not_str": ('<tool_call>{"name": 5, "arguments": {}}</tool_call>',
                     'needs a string "name"'),
    "unknown_tool": ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>',
                     "unknown tool 'rm_rf'"),
    "arguments_list": ('<tool_call>{"name": "weekday", "arguments": [1]}</tool_call>',
                       '"arguments" must be a JSON object'),
    "arguments_bad_string": ('<tool_call>{"name": "weekday", "arguments": "{oops"}</tool_call>',
                             _NOT_JSON),
    "missing_argument": ('<tool_call>{"name": "add_days", "arguments": {"days": 3}}</tool_call>',
                         "missing date"),
    "extra_argument": ('<tool_call>{"name": "weekday", "arguments": {"date": "2024-01-01", '
                       '"x": 1}}</tool_call>', "unexpected 'x'"),
    "bool_for_number": (f"<tool_call>{_CONVERT}true}}}}</tool_call>", "must be a number"),
    "nan": (f"<tool_call>{_CONVERT}NaN}}}}</tool_call>", "finite number"),
    "infinity": (f"<tool_call>{_CONVERT}1e999}}}}</tool_call>", "finite number"),
    "huge_int": (f"<tool_call>{_CONVERT}{'9' * 1000}}}}}</tool_call>", "finite number"),
    "float_for_integer": ('<tool_call>{"name": "add_days", "arguments": {"date": "2024-01-01", '
                          '"days": 1.5}}</tool_call>', "must be an integer"),
    "dict_for_string": ('<tool_call>{"name": "weekday", "arguments": {"date": {}}}</tool_call>',
                        "must be a string"),
    "long_string": ('<tool_call>{"name": "weekday", "arguments": {"date": "' + "1" * 500
                    + '"}}</tool_call>', "longer than 200 characters"),
    "bomb_list": ("<tool_call>" + "[" * 1000 + "]" * 1000 + "</tool_call>", _TOO_DEEP),
    "bomb_object": ("<tool_call>" + '{"a":' * 300 + "1" + "}" * 300 + "</tool_call>", _TOO_DEEP),
    "bomb_in_arguments_string": ('<tool_call>{"name": "weekday", "arguments": "'
                                 + "\\u005b" * 200 + '"}</tool_call>', _TOO_DEEP),
    "long_call": ("<tool_call>" + "[" * 60_000 + "</tool_call>", "longer than 2000 characters"),
    # A megabyte call: its opening tag falls outside the last MAX_TEXT_CHARS characters.
    "megabyte_call": ('<tool_call>{"name": "' + "x" * 1_000_000 + '"}</tool_call>', _NO_CALL),
    "many_open_tags": ("<tool_call>" * 100_000, _NO_CALL),
}


class HostileActionTest(parameterized.TestCase):

  @parameterized.named_parameters((name, *case) for name, case in HOSTILE.items())
  def test_bad_calls_are_quick_error_observations(self, action, message):
    env = tool_use.ToolUseEnv()
    env.reset(0)
    start = time.perf_counter()
    obs, reward, done, info = env.step(action)
    self.assertLess(time.perf_counter() - start, 1.0)
    self.assertTrue(obs.startswith("<error>") and obs.endswith("</error>"), obs[:200])
    self.assertLess(len(obs), 500)
    self.assertNotIn("\x00", obs)
    self.assertEqual((reward, done), (0.0, False))
    self.assertIn(message, info["error"])

  def test_megabyte_junk_before_a_call_still_reaches_it(self):
    env = tool_use.ToolUseEnv("weekday")
    env.reset(0)
    start = time.perf_counter()
    obs, _, _, _ = env.step("x\x00" * 500_000 + _call_text(env.gold_calls[0]))
    self.assertLess(time.perf_counter() - start, 1.0)
    self.assertEqual(obs, f'<tool_response>{{"result": "{env.answer}"}}</tool_response>')

  def test_safe_env_and_registry(self):
    env = safe.SafeEnv(registry.make("tool_use", max_turns=6))
    self.assertIn("<tool_call>", env.system_prompt)
    env.reset(5)
    obs, _, _, _ = env.step(HOSTILE["bomb_list"][0])
    self.assertTrue(obs.startswith("<error>"))
    for call in env.env.gold_calls:
      obs, _, done, _ = env.step(_call_text(call))
    self.assertEqual(env.counters["invalid_actions"], 1)
    self.assertEqual(env.counters["env_errors"], 0)
    self.assertIsInstance(registry.make("tool_use"), tool_use.ToolUseEnv)
    self.assertIsInstance(registry.make("tool_use"), base.Env)


if __name__ == "__main__":
  absltest.main()
