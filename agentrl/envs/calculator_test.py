"""Tests for agentrl.envs.calculator: the AST-restricted evaluator and the tool-use env."""
import ast
import time

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.envs import calculator
from agentrl.envs import testing

# One example per non-arithmetic node type. The test below checks that this covers every
# ast.expr / ast.operator / ast.unaryop subclass of the running Python except the allowed ones.
FORBIDDEN = {
    "BoolOp": "1 and 2", "NamedExpr": "(x := 1)", "Lambda": "lambda: 1",
    "IfExp": "1 if 2 else 3", "Dict": "{1: 2}", "Set": "{1}", "ListComp": "[i for i in (1,)]",
    "SetComp": "{i for i in (1,)}", "DictComp": "{i: i for i in (1,)}",
    "GeneratorExp": "(i for i in (1,))", "Await": "await x", "Yield": "(yield 1)",
    "YieldFrom": "(yield from x)", "Compare": "1 < 2", "Call": "abs(-1)",
    "FormattedValue": 'f"{1}"', "JoinedStr": 'f"a"', "Attribute": "(1).real",
    "Subscript": "(1,)[0]", "Starred": "(*x,)", "Name": "x", "List": "[1]", "Tuple": "(1, 2)",
    "Slice": "x[1:2]", "TemplateStr": 't"a"', "Interpolation": 't"{1}"',
    "BitAnd": "1 & 2", "BitOr": "1 | 2", "BitXor": "1 ^ 2", "LShift": "1 << 2",
    "RShift": "1 >> 2", "MatMult": "1 @ 2", "Invert": "~1", "Not": "not 1",
}
FORBIDDEN_CONSTANTS = ["True", "None", "'s'", "b'b'", "1j", "..."]
MALICIOUS = ["__import__('os')", "__import__('os').system('echo pwned')",
             "().__class__.__bases__[0].__subclasses__()", "open('/etc/passwd').read()",
             "eval('1+1')", "exec('x=1')", "globals()"]


class EvaluateTest(parameterized.TestCase):

  @parameterized.parameters(
      ("12*(3+4)", 84), ("-3**2", -9), ("7/2", 3.5), ("7//2", 3), ("-7 % 3", 2),
      ("2**-1", 0.5), ("+5", 5), ("1_000 + 0.5", 1000.5), ("(((2)))", 2), ("2**0.5", 2**0.5))
  def test_arithmetic(self, expr, want):
    self.assertEqual(calculator.evaluate(expr), want)

  def test_examples_cover_every_disallowed_node_type(self):
    node_types = set()
    for base in (ast.expr, ast.operator, ast.unaryop):
      node_types |= {cls.__name__ for cls in base.__subclasses__()}
    allowed = {cls.__name__ for cls in calculator.ALLOWED_NODES}
    self.assertEqual(allowed & node_types, {"BinOp", "UnaryOp", "Constant", "Add", "Sub",
                                            "Mult", "Div", "FloorDiv", "Mod", "Pow", "USub",
                                            "UAdd"})
    self.assertEmpty(node_types - allowed - set(FORBIDDEN))

  @parameterized.parameters(*sorted(FORBIDDEN.items()))
  def test_rejects_node(self, name, expr):
    del name
    with self.assertRaises(calculator.CalcError):
      calculator.evaluate(expr)

  @parameterized.parameters(*(FORBIDDEN_CONSTANTS + MALICIOUS))
  def test_rejects_non_numbers_and_code(self, expr):
    with self.assertRaises(calculator.CalcError):
      calculator.evaluate(expr)

  @parameterized.parameters(
      ("2**10**10", "exponent"), ("9**999", "exponent"), ("10**100*10**100", "too large"),
      ("1e308*10", "finite"), ("(-8)**(1/3)", "real"), ("1/0", "division by zero"),
      ("5 % 0", "division by zero"), ("1" * 201, "longer"), ("-" * 60 + "1", "nested"),
      ("", "empty"), ("1 +", "parse"), ("9" * 100, "too large"), ("2**200*2**200", "too large"))
  def test_bounds(self, expr, message):
    start = time.monotonic()
    with self.assertRaisesRegex(calculator.CalcError, message):
      calculator.evaluate(expr)
    self.assertLess(time.monotonic() - start, 1.0)

  @parameterized.parameters(("*".join(["2"] * 60), 2**60), ("+".join(["9"] * 100), 900),
                            ("-".join(["1"] * 100), -98), ("/".join(["1"] * 50), 1.0),
                            ("2**" + "1**" * 30 + "1", 2), ("-(" * 16 + "3" + ")" * 16, 3))
  def test_flat_chains_are_not_nesting(self, expr, want):
    # A flat product of 40 factors was "nested too deeply": each BinOp of the chain counted.
    self.assertEqual(calculator.evaluate(expr), want)

  @parameterized.parameters(("*".join(["9"] * 100), "too large"),
                            ("*".join(["9" * 9] * 20), "too large"),
                            ("*".join(["1e300"] * 20), "finite"),
                            ("2**" * 40 + "1", "nested"), ("1-(" * 40 + "1" + ")" * 40, "nested"))
  def test_flat_chains_stay_bounded(self, expr, message):
    with self.assertRaisesRegex(calculator.CalcError, message):
      calculator.evaluate(expr)

  def test_format_number(self):
    self.assertEqual(calculator.format_number(4.0), "4")
    self.assertEqual(calculator.format_number(3.5), "3.5")
    self.assertEqual(calculator.format_number(10**20), str(10**20))


class CalculatorEnvTest(absltest.TestCase):

  def test_episode_and_seed_contract(self):
    # After done, "<answer>gold</answer>" paid 1.0 again on every repeat.
    testing.assert_env_contract(self, calculator.CalculatorEnv(max_turns=2), action="1+1",
                                answer=lambda env, info: f"<answer>{info['target']}</answer>")

  def test_tool_call_then_gold_answer(self):
    env = calculator.CalculatorEnv()
    prompt = env.reset(3)
    expr = prompt.removeprefix("Compute ").removesuffix(".")
    obs, reward, done, info = env.step(f"Let me compute. <calc>{expr}</calc>")
    answer = calculator.make_problem(3)["answer"]
    self.assertEqual((obs, reward, done), (f"<result>{answer}</result>", 0.0, False))
    self.assertEqual((info["tool_calls"], info["error"]), (1, ""))
    _, reward, done, info = env.step(f"<answer>{answer}</answer>")
    self.assertEqual((reward, done, info["success"]), (1.0, True, True))

  def test_demonstration_solves_the_episode(self):
    import random  # pylint: disable=g-import-not-at-top
    for fmt, noise, turns in [("tags", 0.0, 4), ("hermes", 1.0, 4), ("tags", 1.0, 2),
                              ("tags", 1.0, 1)]:
      env = calculator.CalculatorEnv(tool_format=fmt, max_turns=turns)
      actions = env.demonstration(7, random.Random(0), noise=noise)
      self.assertLessEqual(len(actions), turns)
      self.assertEqual(len(actions), min(turns, 3 if noise else 2))
      env.reset(7)
      for action in actions:
        _, reward, done, info = env.step(action)
        self.assertEqual(info["error"], "")
      self.assertEqual((reward, done, info["success"]), (1.0, True, True))
    expr = calculator.make_problem(7)["expression"]
    hermes = calculator.CalculatorEnv(tool_format="hermes").demonstration(7, random.Random(0))
    self.assertIn(f'"expression": "{expr}"', hermes[0])
    self.assertEqual(calculator.CalculatorEnv().demonstration(7, random.Random(0))[0],
                     f"<calc>{expr}</calc>")

  def test_default_prompt_is_the_tags_one(self):
    self.assertEqual(calculator.CalculatorEnv().system_prompt, (
        "You can use a calculator. To call it, write <calc>expression</calc> and stop; the "
        "result comes back as <result>value</result>. Expressions may use numbers, + - * / // "
        "% ** and parentheses. When you know the final answer, write <answer>number</answer>."))
    hermes = calculator.CalculatorEnv(tool_format="hermes").system_prompt
    self.assertIn('"name": "calculator"', hermes)
    self.assertIn("Expressions may use numbers", hermes)
    with self.assertRaisesRegex(ValueError, "tool_format='json'"):
      calculator.CalculatorEnv(tool_format="json")

  def test_hermes_calls_several_per_turn_and_progress(self):
    env = calculator.CalculatorEnv(tool_format="hermes")
    env.reset(3)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'
    obs, reward, done, info = env.step(call % "2+3" + call % "1/0" + call % "6*7")
    self.assertEqual(obs, "<tool_response>5</tool_response>\n<error>division by zero</error>"
                     "\n<tool_response>42</tool_response>")
    self.assertEqual((reward, done, info["error"]), (0.0, False, "division by zero"))
    self.assertEqual((info["tool_calls"], info["tool_errors"]), (3, 1))
    self.assertAlmostEqual(info["progress"], 2 / 3)
    self.assertEqual(info["tool_results"], ["5", "<error>division by zero</error>", "42"])
    # Cut at the stop string "</tool_call>": still a call.
    obs, _, _, info = env.step(call.removesuffix("</tool_call>") % "2**3")
    self.assertEqual((obs, info["progress"]), ("<tool_response>8</tool_response>", 1.0))
    _, _, _, info = env.step("<calc>1+1</calc>")          # the other family's call
    self.assertEqual(info["progress"], 0.0)
    self.assertIn("<tool_call>", info["error"])
    _, reward, done, info = env.step(f"<answer>{calculator.make_problem(3)['answer']}</answer>")
    self.assertEqual((reward, done, info["progress"]), (1.0, True, 1.0))

  def test_tags_several_calls_cut_call_and_the_limit(self):
    env = calculator.CalculatorEnv(max_calls=2)
    env.reset(0)
    obs, _, _, info = env.step("<calc>1+1</calc> and <calc>2*3")
    self.assertEqual(obs, "<result>2</result>\n<result>6</result>")
    self.assertEqual((info["tool_calls"], info["progress"], info["error"]), (2, 1.0, ""))
    obs, _, _, info = env.step("<calc>1</calc><calc>2</calc><calc>3</calc>")
    self.assertEqual(obs.split("\n")[:2], ["<result>1</result>", "<result>2</result>"])
    self.assertIn("more than 2 tool calls", info["error"])
    self.assertAlmostEqual(info["progress"], 2 / 3)
    self.assertEqual((info["tool_calls"], info["tool_errors"]), (5, 1))

  def test_wrong_answer(self):
    env = calculator.CalculatorEnv()
    env.reset(3)
    _, reward, done, info = env.step("<answer>0.5</answer>")
    self.assertEqual((reward, done, info["success"]), (0.0, True, False))

  def test_malicious_call_is_an_error_observation(self):
    env = calculator.CalculatorEnv()
    env.reset(0)
    obs, reward, done, info = env.step("<calc>__import__('os').system('echo pwned')</calc>")
    self.assertTrue(obs.startswith("<error>unsupported syntax"))
    self.assertEqual((reward, done, info["tool_errors"]), (0.0, False, 1))
    self.assertIn("unsupported", info["error"])

  def test_missing_tags_get_format_penalty_and_turns_run_out(self):
    env = calculator.CalculatorEnv(max_turns=2, format_penalty=-0.1)
    env.reset(0)
    obs, reward, done, info = env.step("I am not sure.")
    self.assertEqual((reward, done), (-0.1, False))
    self.assertIn("<calc>", info["error"])
    self.assertTrue(obs.startswith("<error>"))
    _, _, done, _ = env.step("<calc>1+1</calc>")
    self.assertTrue(done)

  def test_problems_are_deterministic_and_correct(self):
    self.assertEqual(calculator.make_problem(5), calculator.make_problem(5))
    self.assertNotEqual(calculator.make_problem(5), calculator.make_problem(6))
    p = calculator.make_problem(5)
    expr = p["prompt"].removeprefix("Compute ").removesuffix(".")
    self.assertEqual(calculator.format_number(calculator.evaluate(expr)), p["answer"])

  def test_bad_arguments(self):
    with self.assertRaisesRegex(ValueError, "format_penalty"):
      calculator.CalculatorEnv(format_penalty=0.5)
    with self.assertRaisesRegex(ValueError, "num_ops"):
      calculator.CalculatorEnv(num_ops=0)


class HostileActionTest(absltest.TestCase):

  def test_megabyte_actions_are_parsed_in_linear_time(self):
    env = calculator.CalculatorEnv()
    env.reset(0)
    for action in ("<calc>" * 170_000, "<answer>" * 125_000, "<calc>1+1</calc>" * 60_000):
      start = time.perf_counter()
      obs, _, _, _ = env.step(action)
      self.assertLess(time.perf_counter() - start, 3.0, action[:20])
      self.assertTrue(obs.startswith(("<error>", "<result>")), obs[:80])

  def test_megabyte_actions_get_correct_results_quickly(self):
    target = calculator.make_problem(0)["answer"]
    cases = [  # (action, observation, reward, done); each action is about 1 MB
        ("<calc>" * 170_000 + "<calc>6*7</calc>",  # the first opening tag pairs, as before
         "<error>expression longer than 200 characters</error>", 0.0, False),
        ("x" * 1_000_000 + "<calc>6*7</calc>", "<result>42</result>", 0.0, False),
        ("<answer>" * 125_000 + f"<answer>{target}</answer>", "", 1.0, True),
        ("<answer>" * 125_000 + "<answer>-1</answer>", "", 0.0, True),
        ("<calc>1+1</calc>" + "x" * 1_000_000, "<error>no tool call or answer; write "
         "<calc>expression</calc> or <answer>number</answer></error>", 0.0, False),
    ]
    for action, want_obs, want_reward, want_done in cases:
      env = calculator.CalculatorEnv()
      env.reset(0)
      start = time.perf_counter()
      obs, reward, done, _ = env.step(action)
      self.assertLess(time.perf_counter() - start, 3.0, action[-40:])
      self.assertEqual((obs, reward, done), (want_obs, want_reward, want_done), action[-40:])


if __name__ == "__main__":
  absltest.main()
