"""Calculator tool-use task: the model calls <calc>expr</calc>, reads the result, then answers.

A multi-turn Env in the style of Toolformer / ReTool tool calls (Schick et al. 2023; Feng et
al. 2025): the task is a multi-step integer expression, the tool is an arithmetic evaluator,
and the episode ends when the model writes <answer>number</answer> (reward 1.0 if correct) or
runs out of turns (reward 0.0). Calls are written in the format `tool_format` names
(`envs.tool_calls`): "tags" (the default) <calc>2+3</calc> answered <result>5</result>, or
"hermes" <tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>
answered <tool_response>5</tool_response>.

Model text is never `eval`ed. `evaluate` parses with `ast.parse(mode="eval")` and walks the
tree, accepting ONLY: int/float literals (not bool/complex/str), parentheses, unary + and -,
and the binary operators + - * / // % **. Every other node (names, calls, attributes,
subscripts, comparisons, lambdas, comprehensions, bit operators, ...) is an error. Sizes are
bounded before computing: exponents by MAX_EXPONENT, integer results by MAX_BITS bits (so
"2**10**10" is rejected without being computed; so is a long flat product, factor by
factor), input length by MAX_CHARS, nesting by MAX_DEPTH. Nesting is the depth of right
operands and unary operands ("1-(2-(3-4))", "-(-3)", a power tower "2**3**2"); a chain whose
left operands nest, "9*9*...*9" or "((1-2)-3)-4", is one level whatever its length.
"""
import ast
import copy
import math
import operator
import random

from agentrl.envs import base
from agentrl.envs import tool_calls
from agentrl.rewards import verifiers

MAX_CHARS = 200
MAX_DEPTH = 32
MAX_EXPONENT = 128
MAX_BITS = 256

_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
           ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
           ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
ALLOWED_NODES = (ast.Expression, ast.Constant, ast.UnaryOp, ast.BinOp, *_BINOPS, *_UNARY)

TOOL = tool_calls.Tool("calculator", "evaluates numbers with + - * / // % ** and parentheses",
                       {"expression": "string"}, tag="calc", max_chars=MAX_CHARS)
INTRO = "You can use a calculator."
NOTES = "Expressions may use numbers, + - * / // % ** and parentheses."


class CalcError(tool_calls.ToolError):
  """The expression is not allowed or cannot be computed; the message is shown to the model."""


def _check_size(value):
  if isinstance(value, complex):
    raise CalcError("result is not a real number")
  if isinstance(value, int) and value.bit_length() > MAX_BITS:
    raise CalcError(f"result too large (more than {MAX_BITS} bits)")
  if isinstance(value, float) and not math.isfinite(value):
    raise CalcError("result is not finite")
  return value


def _binop(op: ast.operator, left, right):
  if isinstance(op, ast.Pow):
    if abs(right) > MAX_EXPONENT:
      raise CalcError(f"exponent {right} too large (limit {MAX_EXPONENT})")
    if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
      if right * math.log2(abs(left)) > MAX_BITS:
        raise CalcError(f"result too large (more than {MAX_BITS} bits)")
  if isinstance(op, ast.Mult) and isinstance(left, int) and isinstance(right, int):
    if left.bit_length() + right.bit_length() > MAX_BITS + 1:
      raise CalcError(f"result too large (more than {MAX_BITS} bits)")
  try:
    return _check_size(_BINOPS[type(op)](left, right))
  except ZeroDivisionError as e:
    raise CalcError("division by zero") from e
  except OverflowError as e:
    raise CalcError("numeric overflow") from e


def _eval(node: ast.AST, depth: int):
  """Value of `node`, which sits under `depth` levels of nesting (see `evaluate`).

  A chain of binary operators parses as a left-leaning tree, ((a * b) * c) * d: its left
  spine is walked in a loop, not by recursion, so a flat chain costs one level however long
  it is. Right operands and unary operands are one level deeper; this recursion is the only
  one, and MAX_DEPTH bounds it.
  """
  if depth > MAX_DEPTH:
    raise CalcError(f"expression nested too deeply (more than {MAX_DEPTH} levels)")
  spine = []
  while isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
    spine.append(node)
    node = node.left
  if isinstance(node, ast.Constant) and type(node.value) in (int, float):
    value = _check_size(node.value)
  elif isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
    value = _UNARY[type(node.op)](_eval(node.operand, depth + 1))
  else:
    raise _unsupported(node)
  for binop in reversed(spine):  # innermost first: left to right in the text
    value = _binop(binop.op, value, _eval(binop.right, depth + 1))
  return value


def _unsupported(node: ast.AST) -> CalcError:
  what = type(node.op).__name__ if isinstance(node, (ast.BinOp, ast.UnaryOp)) else (
      type(node).__name__)
  hint = " (use ** for powers)" if what == "BitXor" else ""
  return CalcError(f"unsupported syntax: {what}{hint}; only numbers, + - * / // % ** and "
                   "parentheses are allowed")


def evaluate(expr: str) -> int | float:
  """Value of an arithmetic expression; raises CalcError for anything else (see module doc)."""
  if not isinstance(expr, str):
    raise CalcError("expression must be text")
  expr = expr.strip()
  if not expr:
    raise CalcError("empty expression")
  if len(expr) > MAX_CHARS:
    raise CalcError(f"expression longer than {MAX_CHARS} characters")
  try:
    tree = ast.parse(expr, mode="eval")
  except (SyntaxError, ValueError, RecursionError, MemoryError) as e:
    raise CalcError(f"cannot parse expression ({type(e).__name__})") from e
  return _eval(tree.body, 0)


def format_number(value: int | float) -> str:
  if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
    return str(int(value))
  return str(value) if isinstance(value, int) else format(value, ".12g")


def make_problem(seed: int, *, num_ops: int = 3, max_operand: int = 999) -> dict:
  """{"prompt", "answer", "seed"}: a random integer expression with num_ops operators."""
  if not 1 <= num_ops <= 8 or max_operand < 2:
    raise ValueError(f"need 1 <= num_ops <= 8 and max_operand >= 2, got {num_ops}, "
                     f"{max_operand}.")
  rng = random.Random(seed)
  expr = str(rng.randint(2, max_operand))
  for _ in range(num_ops):
    op = rng.choice("+-*")
    operand = str(rng.randint(2, max_operand))
    # Random parenthesization so that operator precedence matters.
    expr = f"({expr}) {op} {operand}" if rng.random() < 0.5 else f"{operand} {op} ({expr})"
  return {"prompt": f"Compute {expr}.", "expression": expr,
          "answer": format_number(evaluate(expr)), "seed": seed}


class CalculatorEnv:
  """Multi-turn tool-use Env: calculator calls get results or <error>s, <answer> ends it.

  Per-turn rewards: 1.0 on the correct final answer, `format_penalty` (<= 0) on a turn with
  neither a tool call nor an answer, 0.0 otherwise. Every call of a turn runs, in order, up to
  `max_calls` [INF]. info adds "tool_calls" and "tool_errors" (calls and rejected calls so far),
  "progress" (the fraction of the turn's calls that ran; the reward on the answer turn) and
  "tool_results". An action is parsed in linear time, and only its last
  `extract.MAX_TEXT_CHARS` characters (a tool call or answer written before them is not seen);
  in those, the first <answer> pair wins over any call.
  """

  def __init__(self, *, num_ops: int = 3, max_operand: int = 999, max_turns: int = 4,
               format_penalty: float = 0.0, tool_format: str = "tags",
               max_calls: int = tool_calls.MAX_CALLS):
    if max_turns < 1 or format_penalty > 0:
      raise ValueError(f"need max_turns >= 1 and format_penalty <= 0, got {max_turns}, "
                       f"{format_penalty}.")
    make_problem(0, num_ops=num_ops, max_operand=max_operand)  # validates the arguments
    self._kwargs = dict(num_ops=num_ops, max_operand=max_operand)
    self.max_turns = max_turns
    self.format_penalty = format_penalty
    self.tools = tool_calls.Toolbox([TOOL], tool_format, max_calls=max_calls)
    self.system_prompt = self.tools.system_prompt(intro=INTRO, notes=NOTES, answer="number")
    self._problem, self._turn, self._calls, self._errors = None, 0, 0, 0

  @base.episode_reset
  def reset(self, seed: int) -> str:
    self._problem = make_problem(seed, **self._kwargs)
    self._turn, self._calls, self._errors = 0, 0, 0
    return self._problem["prompt"]

  def clone(self) -> "CalculatorEnv":
    """A copy in the same state (envs/base.py, "Forking"): the turn and call counts are
    numbers; the problem (replaced by reset, never changed) and the tools are shared."""
    return copy.copy(self)

  def demonstration(self, seed: int, rng: random.Random, *, noise: float = 0.0) -> list[str]:
    """The expert's actions for `seed`: one call on the whole expression, then its answer.

    With probability `noise` a call on the expression's first operand alone comes first (a
    wrong call whose result is not the answer). Within max_turns the wrong call is dropped
    first, then the right one (one turn: the answer alone). Leaves the env's own episode alone.
    """
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"noise must be in [0, 1], got {noise}.")
    problem = make_problem(seed, **self._kwargs)
    expr = problem["expression"]
    call = lambda e: self.tools.format_call({"name": TOOL.name, "arguments": {"expression": e}})
    calls = [call(expr)]
    if rng.random() < noise:
      calls.insert(0, call(expr.split()[0].strip("()")))
    calls = calls[len(calls) - self.max_turns + 1:] if len(calls) >= self.max_turns else calls
    return calls + [f"<answer>{problem['answer']}</answer>"]

  def _info(self, reward: float, **kwargs) -> base.Info:
    return base.make_info(reward=reward, tool_calls=self._calls, tool_errors=self._errors,
                          target=self._problem["answer"], **kwargs)

  @base.episode_step
  def step(self, action: str) -> base.StepResult:
    self._turn += 1
    out_of_turns = self._turn >= self.max_turns
    turn = self.tools.parse(action)
    if turn.answer is not None:
      reward = verifiers.numeric_match(turn.answer, self._problem["answer"], mode="raw")
      return "", reward, True, self._info(reward, success=reward == 1.0, progress=reward)
    if not turn.calls:
      error = self.tools.no_call_error("number")
      return (f"<error>{error}</error>", self.format_penalty, out_of_turns,
              self._info(self.format_penalty, error=error, progress=0.0))
    results = self.tools.run(turn.calls,
                             lambda call: format_number(evaluate(call.arguments["expression"])))
    self._calls += len(turn.calls)
    self._errors += len(turn.calls) - results.ok
    return results.observation, 0.0, out_of_turns, self._info(
        0.0, error=results.error, progress=results.ok / len(turn.calls),
        tool_results=list(results.tool_results))
