"""Tests for agentrl.envs.tool_calls: each format's parse, its errors, bounds and rendering."""
import json
import time

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.envs import tool_calls

CALC = tool_calls.Tool("calculator", "evaluates arithmetic", {"expression": "string"},
                       tag="calc")
LOOKUP = tool_calls.Tool("lookup", "a fact about an entity",
                         {"entity": "string", "attribute": "string"})
ADD_DAYS = tool_calls.Tool("add_days", "a date plus days", {"date": "string", "days": "integer"},
                           result_tag="date")
TOOLS = [CALC, LOOKUP, ADD_DAYS]


def box(fmt, **kwargs):
  return tool_calls.Toolbox(TOOLS, fmt, **kwargs)


def hermes(name, arguments) -> str:
  return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def calls(turn):
  return [(c.name, c.arguments, c.error) for c in turn.calls]


class ValidTest(parameterized.TestCase):

  def test_hermes_calls_in_order_with_arguments_as_object_or_string(self):
    text = ("Let me look. " + hermes("lookup", {"entity": "Varnholt", "attribute": "population"})
            + "\n<tool_call>\n" + json.dumps({"name": "calculator",
                                              "arguments": json.dumps({"expression": "2+3"})})
            + "\n</tool_call>")
    turn = box("hermes").parse(text)
    self.assertEqual(calls(turn), [
        ("lookup", {"entity": "Varnholt", "attribute": "population"}, ""),
        ("calculator", {"expression": "2+3"}, "")])
    self.assertEqual((turn.answer, turn.error), (None, ""))
    self.assertEqual(turn.calls[0].start, len("Let me look. "))

  def test_tags_calls_in_order_plain_and_json_bodies(self):
    text = ('<calc> 2+3 </calc> then <add_days>{"date": "2024-01-01", "days": 3}</add_days>'
            '<lookup>{"entity": "X", "attribute": "height"}</lookup>')
    turn = box("tags").parse(text)
    self.assertEqual(calls(turn), [
        ("calculator", {"expression": "2+3"}, ""),
        ("add_days", {"date": "2024-01-01", "days": 3}, ""),
        ("lookup", {"entity": "X", "attribute": "height"}, "")])

  @parameterized.parameters("hermes", "tags")
  def test_format_call_parses_back(self, fmt):
    b = box(fmt)
    for call in ({"name": "calculator", "arguments": {"expression": "7 * 6"}},
                 {"name": "add_days", "arguments": {"date": "2024-02-28", "days": 1}}):
      self.assertEqual([c.as_dict() for c in b.parse(b.format_call(call)).calls], [call])
    if fmt == "tags":
      self.assertEqual(b.format_call({"name": "calculator", "arguments": {"expression": "1"}}),
                       "<calc>1</calc>")
      with self.assertRaisesRegex(ValueError, "unknown tool 'rm'"):
        b.format_call({"name": "rm", "arguments": {}})

  def test_several_calls_beyond_max_calls(self):
    text = "<calc>1</calc>" * 5
    turn = box("tags", max_calls=3).parse(text)
    self.assertLen(turn.calls, 4)
    self.assertEqual([c.error for c in turn.calls[:3]], ["", "", ""])
    self.assertIn("more than 3 tool calls", turn.calls[3].error)
    self.assertIsNone(turn.calls[3].as_dict())
    self.assertEqual(turn.calls[3].start, 3 * len("<calc>1</calc>"))
    quiet = box("tags", max_calls=3, reject_extra=False).parse(text)
    self.assertEqual([c.error for c in quiet.calls], ["", "", ""])


class AnswerTest(parameterized.TestCase):

  @parameterized.parameters("hermes", "tags")
  def test_answer_and_calls_are_both_returned_with_their_order(self, fmt):
    b = box(fmt)
    call = b.format_call({"name": "calculator", "arguments": {"expression": "1"}})
    after = b.parse(f"{call} <answer> 42 </answer> <answer>7</answer>")
    self.assertEqual((after.answer, after.answer_first, len(after.calls)), (" 42 ", False, 1))
    before = b.parse(f"<answer>42</answer>{call}")
    self.assertEqual((before.answer, before.answer_first), ("42", True))
    alone = b.parse("<answer>42</answer>")
    self.assertEqual((alone.answer, alone.answer_first, alone.calls), ("42", True, ()))
    # An answer needs its closing tag; a cut one is no answer.
    self.assertIsNone(b.parse("<answer>42").answer)


class CutCallTest(parameterized.TestCase):
  """Generation stopped at "</tool_call>" or "</calc>": the last call lacks its closing tag."""

  @parameterized.parameters(
      ("hermes", '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}',
       [("calculator", {"expression": "2+3"}, "")]),
      ("hermes", '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n',
       [("calculator", {"expression": "2+3"}, "")]),
      ("tags", "<calc>2+3", [("calculator", {"expression": "2+3"}, "")]),
      ("tags", '<lookup>{"entity": "X", "attribute": "height"}',
       [("lookup", {"entity": "X", "attribute": "height"}, "")]),
      # After complete calls: the cut one is the last call of the turn.
      ("tags", "<calc>1</calc> <calc>2", [("calculator", {"expression": "1"}, ""),
                                          ("calculator", {"expression": "2"}, "")]),
      # Well formed but rejected (unknown tool): still a call, with its error.
      ("hermes", '<tool_call>{"name": "rm", "arguments": {}}',
       [("rm", {}, "unknown tool 'rm'; the tools are calculator, lookup, add_days")]),
  )
  def test_cut_calls_parse_as_complete(self, fmt, text, want):
    self.assertEqual(calls(box(fmt).parse(text)), want)

  @parameterized.parameters(
      ("hermes", '<tool_call>{"name": "calculator", "arguments": {"expression": "2+'),
      ("hermes", '<tool_call>{"name": "calculator", "arguments": {}} and then'),
      ("hermes", "<tool_call>"),
      ("tags", "<calc>   "),
      ("tags", "<calc>2+3 <answer>5</answer>"),      # a tag after it: not cut at a stop
      ("tags", '<lookup>{"entity": "X", "attr'),
      ("tags", "<calc>" * 1000),
  )
  def test_cut_text_that_is_not_a_call_is_ignored(self, fmt, text):
    self.assertEqual(box(fmt).parse(text).calls, ())


# name -> (format, action, the error it must get)
MALFORMED = {
    "not_json": ("hermes", "<tool_call>lookup(Varnholt)</tool_call>", "not valid JSON"),
    "cut_json": ("hermes", '<tool_call>{"name": "calculator", "arguments": </tool_call>',
                 "not valid JSON"),
    "not_object": ("hermes", "<tool_call>[1, 2]</tool_call>", "must be a JSON object"),
    "no_name": ("hermes", '<tool_call>{"arguments": {}}</tool_call>', 'needs a string "name"'),
    "arguments_list": ("hermes", hermes("calculator", [1]), '"arguments" must be a JSON object'),
    "arguments_bad_string": ("hermes", hermes("calculator", "{oops"), "not valid JSON"),
    "unknown_tool": ("hermes", hermes("rm_rf", {}), "unknown tool 'rm_rf'"),
    "missing": ("hermes", hermes("add_days", {"days": 3}), "missing date"),
    "extra": ("hermes", hermes("calculator", {"expression": "1", "x": 2}), "unexpected 'x'"),
    "string_for_integer": ("hermes", hermes("add_days", {"date": "2024-01-01", "days": "3"}),
                           "'days' must be an integer"),
    "float_for_integer": ("hermes", hermes("add_days", {"date": "2024-01-01", "days": 1.5}),
                          "'days' must be an integer"),
    "bool_for_integer": ("hermes", hermes("add_days", {"date": "2024-01-01", "days": True}),
                         "'days' must be an integer"),
    "number_for_string": ("hermes", hermes("calculator", {"expression": 5}), "must be a string"),
    "huge_integer": ("hermes", hermes("add_days", {"date": "d", "days": 10**13}),
                     "magnitude <= 1000000000000"),
    "long_string": ("hermes", hermes("calculator", {"expression": "1" * 201}),
                    "expression longer than 200 characters"),
    "long_call": ("hermes", '<tool_call>{"name": "' + "x" * 3000 + '"}</tool_call>',
                  "longer than 2000 characters"),
    "deep": ("hermes", "<tool_call>" + "[" * 17 + "]" * 17 + "</tool_call>",
             "nests more than 16 brackets"),
    "deep_in_arguments_string": ("hermes", hermes("calculator", "[" * 17),
                                 "nests more than 16 brackets"),
    "tags_not_json": ("tags", "<lookup>entity=X</lookup>", "not valid JSON"),
    "tags_not_object": ("tags", "<lookup>[1]</lookup>", "<lookup> takes a JSON object"),
    "tags_missing": ("tags", '<lookup>{"entity": "X"}</lookup>', "missing attribute"),
    "tags_long_plain": ("tags", "<calc>" + "1" * 201 + "</calc>",
                        "expression longer than 200 characters"),
    "tags_deep": ("tags", "<add_days>" + "{" * 17 + "</add_days>", "nests more than 16"),
}


class MalformedTest(parameterized.TestCase):

  @parameterized.named_parameters((name, *case) for name, case in MALFORMED.items())
  def test_each_malformed_call_is_one_rejected_call(self, fmt, text, message):
    turn = box(fmt).parse(text)
    self.assertLen(turn.calls, 1)
    self.assertIn(message, turn.calls[0].error)
    self.assertEqual(turn.error, turn.calls[0].error)

  def test_a_bad_call_does_not_hide_the_good_ones(self):
    text = hermes("calculator", {"expression": "1"}) + "<tool_call>{oops</tool_call>" + hermes(
        "lookup", {"entity": "X", "attribute": "y"})
    turn = box("hermes").parse(text)
    self.assertEqual([bool(c.error) for c in turn.calls], [False, True, False])
    # info["call"] semantics: a call whose JSON names a tool is reported even when rejected.
    self.assertIsNone(turn.calls[1].as_dict())
    rejected = box("hermes").parse(hermes("rm", {"a": 1})).calls[0]
    self.assertEqual(rejected.as_dict(), {"name": "rm", "arguments": {"a": 1}})

  @parameterized.parameters("hermes", "tags")
  def test_hostile_input_is_bounded_and_fast(self, fmt):
    b = box(fmt)
    good = b.format_call({"name": "calculator", "arguments": {"expression": "6*7"}})
    opening = "<tool_call>" if fmt == "hermes" else "<calc>"
    for text in (opening * 200_000, "[" * 1_000_000, "x\x00" * 500_000 + good,
                 good * 100_000, "<answer>" * 200_000, opening + "{" * 1_000_000):
      start = time.perf_counter()
      turn = b.parse(text)
      self.assertLess(time.perf_counter() - start, 1.0)
      self.assertLessEqual(len(turn.calls), b.max_calls + 1)
    # Only the last extract.MAX_TEXT_CHARS characters are read: the call at the end is found.
    self.assertEqual(calls(b.parse("x\x00" * 500_000 + good)),
                     [("calculator", {"expression": "6*7"}, "")])

  def test_never_raises_on_odd_text(self):
    for fmt in tool_calls.FORMATS:
      for text in ("", "<", "</tool_call><tool_call>", "<calc></calc>", "\ud800",
                   '<tool_call>{"name": "calculator", "arguments": {"expression": NaN}}'
                   "</tool_call>", "<tool_call>1e999</tool_call>"):
        box(fmt).parse(text)


class RenderTest(absltest.TestCase):

  def _run(self, fmt, text):
    def execute(call):
      if call.arguments.get("expression") == "boom":
        raise tool_calls.ToolError("cannot compute boom")
      return {"calculator": "5", "add_days": "2024-01-04"}[call.name]
    return box(fmt).run(box(fmt).parse(text).calls, execute)

  def test_hermes_results(self):
    text = (hermes("calculator", {"expression": "2+3"}) + hermes("calculator", {"expression":
                                                                                "boom"})
            + "<tool_call>{</tool_call>")
    out = self._run("hermes", text)
    self.assertEqual(out.observation, "<tool_response>5</tool_response>\n"
                     "<error>cannot compute boom</error>\n"
                     "<error>tool call is not valid JSON (JSONDecodeError)</error>")
    # Tool messages: the bare result (the template wraps it), errors as written.
    self.assertEqual(out.tool_results, ("5", "<error>cannot compute boom</error>",
                                        "<error>tool call is not valid JSON (JSONDecodeError)"
                                        "</error>"))
    self.assertEqual(out.ok, 1)
    self.assertEqual(out.error, "cannot compute boom; tool call is not valid JSON "
                     "(JSONDecodeError)")

  def test_tags_results_keep_their_tool_result_tag(self):
    out = self._run("tags", '<calc>1</calc><add_days>{"date": "2024-01-01", "days": 3}'
                    "</add_days>")
    self.assertEqual(out.observation, "<result>5</result>\n<date>2024-01-04</date>")
    self.assertEqual(out.tool_results, ("<result>5</result>", "<date>2024-01-04</date>"))
    self.assertEqual((out.ok, out.error), (2, ""))
    # Each tool message is a part of the observation (the Renderer relies on it).
    self.assertLessEqual(sum(map(len, out.tool_results)), len(out.observation))

  def test_system_prompts(self):
    hermes_prompt = box("hermes").system_prompt(intro="Intro.", notes="Notes.", answer="n")
    self.assertTrue(hermes_prompt.startswith("Intro.\n\n# Tools\n\nYou may call one or more"))
    tools = hermes_prompt.split("<tools>\n")[1].split("\n</tools>")[0].split("\n")
    self.assertEqual([json.loads(t) for t in tools], [t.schema() for t in TOOLS])
    self.assertEqual(json.loads(tools[2])["function"]["parameters"], {
        "type": "object", "properties": {"date": {"type": "string"}, "days": {"type": "integer"}},
        "required": ["date", "days"]})
    self.assertIn("<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                  "<args-json-object>}\n</tool_call>", hermes_prompt)
    self.assertTrue(hermes_prompt.endswith("Notes. When you know the final answer, write "
                                           "<answer>n</answer>."))
    tags_prompt = box("tags").system_prompt(notes="Notes.")
    self.assertIn('- <lookup>{"entity": ..., "attribute": ...}</lookup>: a fact', tags_prompt)
    self.assertIn("- <calc>expression</calc>: evaluates arithmetic", tags_prompt)
    self.assertIn("<result>...</result> or <date>...</date>", tags_prompt)
    one = tool_calls.Toolbox([CALC], "tags").system_prompt(intro="You can use a calculator.")
    self.assertEqual(one, "You can use a calculator. To call it, write <calc>expression</calc> "
                     "and stop; the result comes back as <result>value</result>. When you "
                     "know the final answer, write <answer>...</answer>.")

  def test_usage_and_bad_construction(self):
    self.assertEqual(tool_calls.Toolbox([CALC], "tags").no_call_error("number"),
                     "no tool call or answer; write <calc>expression</calc> or "
                     "<answer>number</answer>")
    self.assertIn("TOOL one of calc, lookup, add_days", box("tags").usage())
    with self.assertRaisesRegex(ValueError, "tool_format='json' must be one of"):
      tool_calls.Toolbox(TOOLS, "json")
    with self.assertRaisesRegex(ValueError, "distinct names and tags"):
      tool_calls.Toolbox([CALC, CALC], "tags")
    with self.assertRaisesRegex(ValueError, "max_calls"):
      tool_calls.Toolbox(TOOLS, "tags", max_calls=0)
    for bad in (dict(name="answer"), dict(name="a b"), dict(tag="tool_call"),
                dict(parameters={}), dict(parameters={"x": "list"}), dict(max_chars=0)):
      with self.assertRaises(ValueError, msg=bad):
        tool_calls.Tool(**{"name": "t", "description": "", "parameters": {"x": "string"},
                           **bad})


if __name__ == "__main__":
  absltest.main()
