"""Multi-turn tool use with gold tool-call traces, for turn-level call-matching rewards.

Each `reset(seed)` draws a small fictional world (towns, towers, rivers whose facts no model
knows) and a task needing 1 to 3 tool calls in sequence (later ones use earlier results), then
`<answer>...</answer>`. The tools are `TOOLS` below (lookup, convert_units, calculator,
add_days, weekday; every argument required; `calculator` parses, never `eval`s).

Calls are parsed, run and answered by `envs.tool_calls` in the format `tool_format` names:
"hermes" (the default, the Hermes/Qwen format MatchTIR trains with: Qu et al. 2026, arXiv
2601.10712), answered with <tool_response>{"result": ...}</tool_response> (+ "unit" for
measures), or "tags" (<weekday>2031-05-17</weekday>, <lookup>{"entity": ..., "attribute":
...}</lookup>, answered with <result>...</result>):

  <tool_call>{"name": "weekday", "arguments": {"date": "2031-05-17"}}</tool_call>

Gold traces: after reset, `env.gold_calls` (and each step's info["gold_calls"]) lists the calls
that solve the task, {"name", "arguments"} in order, computed by running the tools. info["call"]
is the turn's first call parsed as `parse_qwen` does (`arguments` an object or a JSON string;
missing: {}), also when rejected, or None; info["calls"] all of the turn's calls read that way.
MatchTIR's turn reward (Code/verl/utils/reward_score/tool.py, whose data says "parameters")
needs them. info["progress"] is the fraction of the turn's calls that ran and match a gold call
(`matches_gold`; 0.0 for a turn with no call, the reward on the answer turn).

Rewards: 1.0 right answer, 0.0 wrong (the episode ends; numbers compare as numbers, other text
case-insensitively), `format_penalty` (<= 0) for a turn with neither call nor answer, 0.0 for a
turn of calls. Every call of a turn runs, in order, up to `max_calls` [INF] (MatchTIR runs every
call); an <answer> wins over any call, as in compute_process_KM. Parsing is bounded as
`tool_calls` says: never slow or deep.
"""
import copy
import dataclasses
import datetime
import fractions
import json
import random
import re

from agentrl.envs import base
from agentrl.envs import calculator
from agentrl.envs import fictional
from agentrl.envs import tool_calls
from agentrl.rewards import verifiers

MAX_DAYS = 100_000
TASKS = ("weekday", "convert", "scale", "difference", "anniversary")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
# Unit -> (dimension, size in the dimension's base unit).
UNITS = {"km": ("length", 1000), "m": ("length", 1), "cm": ("length", fractions.Fraction(1, 100)),
         "mm": ("length", fractions.Fraction(1, 1000)), "t": ("mass", 1000), "kg": ("mass", 1),
         "g": ("mass", fractions.Fraction(1, 1000)), "h": ("time", 3600), "min": ("time", 60),
         "s": ("time", 1)}
UNITS_OF = {"height": "m", "length": "km"}  # the unit `lookup` reports a measure in
TOOLS = {tool.name: tool for tool in (
    tool_calls.Tool("lookup", "a fact about an entity: towns have population and founded, "
                    "towers have height and opened, rivers have length",
                    {"entity": "string", "attribute": "string"}),
    tool_calls.Tool("convert_units", f"converts between units ({', '.join(UNITS)})",
                    {"value": "number", "from_unit": "string", "to_unit": "string"}),
    tool_calls.Tool("calculator", "evaluates numbers with + - * / // % ** and parentheses",
                    {"expression": "string"}, max_chars=calculator.MAX_CHARS),
    tool_calls.Tool("add_days", "the date (YYYY-MM-DD) a number of days after a date",
                    {"date": "string", "days": "integer"}),
    tool_calls.Tool("weekday", "the day of the week of a date (YYYY-MM-DD)", {"date": "string"}),
)}
NOTES = "Facts about the towns, towers and rivers are known only through the tools."
ToolError = tool_calls.ToolError


@dataclasses.dataclass(frozen=True)
class Task:
  prompt: str
  answer: str
  gold_calls: tuple   # ({"name": str, "arguments": dict}, ...)
  facts: dict         # entity -> {attribute: value}; measures in UNITS_OF units


def _date(rng: random.Random, first_year: int, last_year: int) -> str:
  start = datetime.date(first_year, 1, 1).toordinal()
  return datetime.date.fromordinal(
      rng.randint(start, datetime.date(last_year, 12, 31).toordinal())).isoformat()


def make_world(rng: random.Random) -> dict:
  """entity -> {attribute: value}: three towns, two towers and two rivers with fresh names."""
  words = fictional.names(rng, 7)
  facts = {}
  for word in words[:3]:
    facts[word] = {"population": rng.randint(1_000, 900_000),
                   "founded": _date(rng, 1600, 1950)}
  for word in words[3:5]:
    facts[f"{word} Tower"] = {"height": rng.randint(40, 900), "opened": _date(rng, 1850, 2020)}
  for word in words[5:]:
    facts[f"{word} River"] = {"length": rng.randint(30, 3000)}
  return facts


# Tools: (facts, validated arguments) -> result dict; ToolError for a call they cannot answer.


def _key(text: str) -> str:
  return " ".join(text.split()).casefold()


def _lookup(facts: dict, args: dict) -> dict:
  entities = {_key(name): name for name in facts}
  name = entities.get(_key(args["entity"]))
  if name is None:
    raise ToolError(f"unknown entity {args['entity'][:40]!r}")
  attribute = _key(args["attribute"])
  if attribute not in facts[name]:
    raise ToolError(f"{name} has no attribute {args['attribute'][:40]!r}; it has "
                    f"{', '.join(sorted(facts[name]))}")
  result = {"result": facts[name][attribute]}
  if attribute in UNITS_OF:
    result["unit"] = UNITS_OF[attribute]
  return result


def _number(value: fractions.Fraction) -> int | float:
  return int(value) if value.denominator == 1 else float(value)


def _convert_units(facts: dict, args: dict) -> dict:
  del facts
  units = [args["from_unit"].strip(), args["to_unit"].strip()]
  for unit in units:
    if unit not in UNITS:
      raise ToolError(f"unknown unit {unit[:20]!r}; use one of {', '.join(UNITS)}")
  (dim_from, size_from), (dim_to, size_to) = UNITS[units[0]], UNITS[units[1]]
  if dim_from != dim_to:
    raise ToolError(f"cannot convert {dim_from} ({units[0]}) to {dim_to} ({units[1]})")
  return {"result": _number(fractions.Fraction(args["value"]) * size_from / size_to),
          "unit": units[1]}


def _calculator(facts: dict, args: dict) -> dict:
  del facts
  return {"result": calculator.evaluate(args["expression"])}  # CalcError is a ToolError


def _parse_date(text: str) -> datetime.date:
  text = text.strip()
  if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
    raise ToolError(f"date must be YYYY-MM-DD, got {text[:40]!r}")
  try:
    return datetime.date.fromisoformat(text)
  except ValueError as e:
    raise ToolError(f"invalid date {text!r}") from e


def _add_days(facts: dict, args: dict) -> dict:
  del facts
  if abs(args["days"]) > MAX_DAYS:
    raise ToolError(f"days must be within +-{MAX_DAYS}")
  try:
    return {"result": (_parse_date(args["date"]) + datetime.timedelta(args["days"])).isoformat()}
  except OverflowError as e:
    raise ToolError("date out of range") from e


def _weekday(facts: dict, args: dict) -> dict:
  del facts
  return {"result": WEEKDAYS[_parse_date(args["date"]).weekday()]}


_IMPLS = {"lookup": _lookup, "convert_units": _convert_units, "calculator": _calculator,
          "add_days": _add_days, "weekday": _weekday}


def run_tool(facts: dict, call: dict) -> dict:
  """The result dict of a parsed call {"name", "arguments"}; ToolError if it is not valid."""
  if call["name"] not in TOOLS:
    raise ToolError(f"unknown tool {call['name'][:40]!r}; the tools are {', '.join(TOOLS)}")
  tool_calls.check_arguments(TOOLS[call["name"]], call["arguments"])
  return _IMPLS[call["name"]](facts, call["arguments"])


# Tasks: a prompt, the calls that solve it (computed by running the tools), the answer.


def _call(name: str, **arguments) -> dict:
  return {"name": name, "arguments": arguments}


def _trace(facts: dict, rng: random.Random, kind: str) -> tuple[str, list]:
  """(prompt, list of call builders); each builder maps the previous results to a call."""
  towns = [e for e in facts if "population" in facts[e]]
  if kind == "weekday":
    date = _date(rng, 1900, 2100)
    return (f"On which day of the week does {date} fall?",
            [lambda r: _call("weekday", date=date)])
  if kind == "convert":
    entity = rng.choice([e for e in facts if set(facts[e]) & set(UNITS_OF)])
    if "height" in facts[entity]:
      attribute, (unit, noun) = "height", rng.choice((("cm", "centimeters"), ("mm", "millimeters")))
      prompt = f"How tall is {entity} in {noun}?"
    else:
      attribute, unit, noun = "length", "m", "meters"
      prompt = f"How long is the {entity} in {noun}?"
    return prompt, [lambda r: _call("lookup", entity=entity, attribute=attribute),
                    lambda r: _call("convert_units", value=r[0]["result"],
                                    from_unit=UNITS_OF[attribute], to_unit=unit)]
  if kind == "scale":
    town, factor = rng.choice(towns), rng.randint(2, 12)
    return (f"If the population of {town} were multiplied by {factor}, how many people would "
            "live there?",
            [lambda r: _call("lookup", entity=town, attribute="population"),
             lambda r: _call("calculator", expression=f"{r[0]['result']} * {factor}")])
  if kind == "difference":
    first, second = sorted(rng.sample(towns, 2), key=lambda t: -facts[t]["population"])
    return (f"How many more people live in {first} than in {second}?",
            [lambda r: _call("lookup", entity=first, attribute="population"),
             lambda r: _call("lookup", entity=second, attribute="population"),
             lambda r: _call("calculator",
                             expression=f"{r[0]['result']} - {r[1]['result']}")])
  if kind == "anniversary":
    town, days = rng.choice(towns), rng.randint(10, 20_000)
    return (f"On which day of the week was {town} exactly {days} days old (counting from the "
            "day it was founded)?",
            [lambda r: _call("lookup", entity=town, attribute="founded"),
             lambda r: _call("add_days", date=r[0]["result"], days=days),
             lambda r: _call("weekday", date=r[1]["result"])])
  raise ValueError(f"task={kind!r} must be one of {TASKS}.")


def make_task(seed: int, kind: str = "mixed") -> Task:
  """The task of `seed`: a fresh world, a prompt, its gold calls and answer."""
  if kind != "mixed" and kind not in TASKS:
    raise ValueError(f"task={kind!r} must be 'mixed' or one of {TASKS}.")
  rng = random.Random(seed)
  facts = make_world(rng)
  prompt, builders = _trace(facts, rng, rng.choice(TASKS) if kind == "mixed" else kind)
  calls, results = [], []
  for build in builders:
    calls.append(build(results))
    results.append(run_tool(facts, calls[-1]))
  answer = results[-1]["result"]
  answer = calculator.format_number(answer) if not isinstance(answer, str) else answer
  return Task(prompt, answer, tuple(calls), facts)


def _same_value(given, gold) -> bool:
  if isinstance(gold, str):
    return isinstance(given, str) and _key(given) == _key(gold)
  return not isinstance(given, (bool, str)) and given == gold


def matches_gold(call: dict, gold_calls) -> bool:
  """The call names the tool of some gold call with its arguments (text compared as `lookup`
  compares it: ignoring case and repeated spaces)."""
  return any(call["name"] == gold["name"] and set(call["arguments"]) == set(gold["arguments"])
             and all(_same_value(call["arguments"][k], v) for k, v in gold["arguments"].items())
             for gold in gold_calls)


def same_answer(given: str, gold: str) -> bool:
  """Exact match: as numbers when the gold is one ("41,200" == "41200"), else ignoring case."""
  want = verifiers.parse_number(gold)
  if want is not None:
    return verifiers.parse_number(given.strip()) == want
  return verifiers.exact_match(given, gold, mode="raw", ignore_case=True) == 1.0


def toolbox(tool_format: str = "hermes", max_calls: int = tool_calls.MAX_CALLS
            ) -> tool_calls.Toolbox:
  """The tools of this env in `tool_format` (one of tool_calls.FORMATS)."""
  return tool_calls.Toolbox(list(TOOLS.values()), tool_format, max_calls=max_calls)


def format_call(call: dict, tool_format: str = "hermes") -> str:
  """A call {"name", "arguments"} as a model writes it in `tool_format`."""
  return toolbox(tool_format).format_call(call)


class ToolUseEnv:
  """Multi-turn Env: tool calls get results or <error>s; <answer> ends it (module docstring).

  Args:
    task: "mixed" (a kind drawn per seed) or one of TASKS.
    max_turns: the turn budget.
    format_penalty: the reward (<= 0) of a turn with neither a call nor an answer.
    tool_format: how calls and results are written, one of tool_calls.FORMATS.
    max_calls: the most calls of one turn that run [INF].
  """

  def __init__(self, task: str = "mixed", *, max_turns: int = 6, format_penalty: float = 0.0,
               tool_format: str = "hermes", max_calls: int = tool_calls.MAX_CALLS):
    if task != "mixed" and task not in TASKS:
      raise ValueError(f"task={task!r} must be 'mixed' or one of {TASKS}.")
    if max_turns < 1 or format_penalty > 0:
      raise ValueError(f"need max_turns >= 1 and format_penalty <= 0, got {max_turns}, "
                       f"{format_penalty}.")
    self.task, self.max_turns, self.format_penalty = task, max_turns, format_penalty
    self.tools = toolbox(tool_format, max_calls)
    self.system_prompt = self.tools.system_prompt(notes=NOTES)
    self._task, self._turn, self._calls, self._errors = None, 0, 0, 0

  @base.episode_reset
  def reset(self, seed: int) -> str:
    self._task = make_task(seed, self.task)
    self._turn, self._calls, self._errors = 0, 0, 0
    return self._task.prompt

  def clone(self) -> "ToolUseEnv":
    """A copy in the same state (envs/base.py, "Forking"): the turn and call counts are
    numbers; the task (replaced by reset, never changed: the tools only read its facts) and
    the tools are shared."""
    return copy.copy(self)

  @property
  def gold_calls(self) -> list[dict]:
    """The calls that solve the current task, in order (a fresh copy)."""
    if self._task is None:
      raise RuntimeError("ToolUseEnv.gold_calls needs reset(seed) first.")
    return copy.deepcopy(list(self._task.gold_calls))

  def demonstration(self, seed: int, rng: random.Random, *, noise: float = 0.0) -> list[str]:
    """The expert's actions for `seed`: each gold call, then the answer (at most max_turns).
    With probability `noise` a gold call follows a wrong one (its first argument replaced by a
    random entity), to show recovery. Leaves the env's own episode alone."""
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"noise must be in [0, 1], got {noise}.")
    task, actions = make_task(seed, self.task), []
    for call in task.gold_calls:
      if rng.random() < noise:
        first = next(iter(call["arguments"]))
        actions.append(self.tools.format_call({"name": call["name"], "arguments": {
            **call["arguments"], first: rng.choice(sorted(task.facts))}}))
      actions.append(self.tools.format_call(call))
    return (actions + [f"<answer>{task.answer}</answer>"])[:self.max_turns]

  @property
  def answer(self) -> str:
    if self._task is None:
      raise RuntimeError("ToolUseEnv.answer needs reset(seed) first.")
    return self._task.answer

  def _info(self, reward: float, calls=(), **kwargs) -> base.Info:
    read = [c.as_dict() for c in calls]
    return base.make_info(reward=reward, call=read[0] if read else None,
                          calls=[c for c in read if c is not None], gold_calls=self.gold_calls,
                          tool_calls=self._calls, tool_errors=self._errors,
                          target=self._task.answer, turn=self._turn, **kwargs)

  def _execute(self, call: tool_calls.Call) -> str:
    return json.dumps(run_tool(self._task.facts, call.as_dict()))

  @base.episode_step
  def step(self, action: str) -> base.StepResult:
    self._turn += 1
    last = self._turn >= self.max_turns
    turn = self.tools.parse(action)
    if turn.answer is not None:
      correct = float(same_answer(turn.answer, self._task.answer))
      return "", correct, True, self._info(correct, success=correct == 1.0, progress=correct,
                                           answer=turn.answer.strip()[:200])
    if not turn.calls:
      error = self.tools.no_call_error("...")
      return (f"<error>{error}</error>", self.format_penalty, last,
              self._info(self.format_penalty, error=error, progress=0.0))
    results = self.tools.run(turn.calls, self._execute)
    self._calls += len(turn.calls)
    self._errors += len(turn.calls) - results.ok
    matched = sum(not error and matches_gold(call.as_dict(), self._task.gold_calls)
                  for call, error in zip(turn.calls, results.errors))
    return results.observation, 0.0, last, self._info(
        0.0, turn.calls, error=results.error, progress=matched / len(turn.calls),
        tool_results=list(results.tool_results))
