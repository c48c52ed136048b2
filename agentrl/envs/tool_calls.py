"""Tool calls per model family: parsing a turn's calls, rendering results, describing the tools.

A tool env (calculator, tool_use, search) names its tools (`Tool`: a name, a description and
typed arguments) and a call format; `Toolbox(tools, fmt)` then parses model text, runs and
renders a turn's calls, and writes the tools' part of the system prompt. The format follows the
model family, not the env (`FORMATS`):

  hermes  The Hermes / Qwen2.5 function-calling format (the Qwen2.5 chat template given
          `tools`; MatchTIR's `parse_qwen`, quchangle1/MatchTIR Code/utils/parse_output.py):
          one or more
            <tool_call>{"name": "weekday", "arguments": {"date": "2031-05-17"}}</tool_call>
          blocks ("arguments" an object, or an object serialized as a JSON string; missing:
          {}), each answered by <tool_response>result</tool_response>. The system prompt lists
          the tools as JSON function schemas inside <tools></tools> and asks for <tool_call>
          blocks, as that template does.
  tags    The plain tags of our envs: a tool whose one argument is a string is
          <tag>argument</tag> (<calc>2+3</calc>, <search>query</search>); any other tool's tag
          holds a JSON object of its arguments
          (<lookup>{"entity": "Varnholt", "attribute": "population"}</lookup>). Each result
          comes back as <result>...</result>, or in the tool's own result tag (search's
          <information>).

In both, the final answer is <answer>...</answer>, and a rejected call is answered by
<error>why</error>; a turn's results are joined by newlines, in the order of its calls.

Parsing (`Toolbox.parse`) never raises on model text and never `eval`s it. It reads the last
`extract.MAX_TEXT_CHARS` characters in linear time and returns a `Turn`: every call of the turn
in order (at most `max_calls`, [INF]; a surplus becomes one more rejected call, or is ignored
with `reject_extra=False`), the content of the first <answer> pair, and for each malformed call
why (not JSON, not an object, no name, unknown tool, a missing, unexpected or mistyped
argument, too long, too deep). A JSON body is parsed only when it is at most MAX_CALL_CHARS
long with at most MAX_BRACKETS opening brackets [INF]; a string argument is at most the tool's
`max_chars` characters, a number at most MAX_NUMBER in magnitude. Which of an answer and a call
wins is the env's rule (`Turn.answer_first` gives the order).

Calls cut at a stop string. Generation that stops at "</tool_call>" (or "</calc>") leaves the
last call without its closing tag. An opening tag with no closing tag after it, after every
complete call, is read as a complete call when the rest of the text holds no "<" and is well
formed: a JSON call or object that parses, or a non-empty plain argument. An <answer> needs
its closing tag (an answer ends the episode; a cut one may be a cut-off thought).

Tool roles. `Results.tool_results` are the turn's tool messages, one per call, each a part of
the observation: where the chat template has a tool role, the agent loop renders them as tool
messages instead of the observation text (agentrl/rollout/agent_loop.py `Renderer`). A hermes
tool message is the bare result, since the templates of that family wrap tool messages in
<tool_response> themselves; a tags tool message keeps its result tag.
"""
from collections.abc import Callable, Mapping, Sequence
import dataclasses
import json
import re

from agentrl.rewards import extract

FORMATS = ("hermes", "tags")
TYPES = ("string", "number", "integer")
MAX_CALL_CHARS = 2000
MAX_BRACKETS = 16
MAX_STRING_CHARS = 200
MAX_NUMBER = 10**12
MAX_CALLS = 4
ANSWER = "answer"
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,63}")
_RESERVED = (ANSWER, "error", "tool_call", "tool_response", "think", "tools")


class ToolError(ValueError):
  """A call the env rejects; the message is shown to the model."""


@dataclasses.dataclass(frozen=True)
class Tool:
  """One tool: its name, what it does and its arguments (all required).

  Attributes:
    name: the name a hermes call gives.
    description: one line for the system prompt.
    parameters: argument -> JSON type (one of TYPES), in the order the prompt lists them.
    tag: the tags format's tag ("": the name).
    result_tag: the tags format's result tag.
    max_chars: the longest string argument accepted.
  """
  name: str
  description: str
  parameters: Mapping[str, str]
  tag: str = ""
  result_tag: str = "result"
  max_chars: int = MAX_STRING_CHARS

  def __post_init__(self):
    for what, value in (("name", self.name), ("tag", self.tag_name),
                        ("result_tag", self.result_tag)):
      if not _NAME.fullmatch(value) or value in _RESERVED:
        raise ValueError(f"Tool {what}={value!r} must be a word of letters, digits, _ or - "
                         f"and none of {_RESERVED}.")
    if not self.parameters or any(t not in TYPES for t in self.parameters.values()):
      raise ValueError(f"Tool {self.name!r} needs one or more arguments typed {TYPES}, got "
                       f"{dict(self.parameters)}.")
    if self.max_chars < 1:
      raise ValueError(f"Tool {self.name!r}: max_chars must be >= 1, got {self.max_chars}.")

  @property
  def tag_name(self) -> str:
    return self.tag or self.name

  @property
  def plain(self) -> str | None:
    """The argument of a tool whose only argument is a string (bare in a tag), else None."""
    if len(self.parameters) == 1:
      (arg, kind), = self.parameters.items()
      if kind == "string":
        return arg
    return None

  def schema(self) -> dict:
    """The tool as a function schema (the JSON a Qwen / Hermes system prompt lists)."""
    return {"type": "function", "function": {
        "name": self.name, "description": self.description,
        "parameters": {"type": "object",
                       "properties": {a: {"type": t} for a, t in self.parameters.items()},
                       "required": list(self.parameters)}}}


@dataclasses.dataclass(frozen=True)
class Call:
  """One call of a turn.

  Attributes:
    name: the tool it names ("" if none could be read).
    arguments: its arguments, or None when they could not be read (the text is not a call).
    error: why the call is rejected before it runs ("": well formed).
    start: its offset in the parsed text.
  """
  name: str
  arguments: dict | None
  error: str = ""
  start: int = 0

  def as_dict(self) -> dict | None:
    """{"name", "arguments"} as parse_qwen reads it (also when rejected), or None."""
    if self.arguments is None:
      return None
    return {"name": self.name, "arguments": dict(self.arguments)}


@dataclasses.dataclass(frozen=True)
class Turn:
  """A parsed model turn: its calls in order, and the content of its first <answer> pair."""
  calls: tuple[Call, ...]
  answer: str | None = None
  answer_start: int = -1

  @property
  def error(self) -> str:
    """Why its malformed calls were rejected, joined by "; " ("" if none was)."""
    return "; ".join(c.error for c in self.calls if c.error)

  @property
  def answer_first(self) -> bool:
    """The answer pair starts before every call (Search-R1's first-pair rule)."""
    return self.answer is not None and all(self.answer_start < c.start for c in self.calls)


@dataclasses.dataclass(frozen=True)
class Results:
  """What a turn's calls returned.

  Attributes:
    observation: the results as the model reads them, joined by newlines.
    tool_results: one tool message per call (see the module docstring, "Tool roles").
    errors: per call, why it failed ("": it ran).
  """
  observation: str
  tool_results: tuple[str, ...]
  errors: tuple[str, ...]

  @property
  def ok(self) -> int:
    return sum(not e for e in self.errors)

  @property
  def error(self) -> str:
    return "; ".join(e for e in self.errors if e)


def loads(text: str):
  """json.loads on a bounded string: its length and bracket count are checked first."""
  if len(text) > MAX_CALL_CHARS:
    raise ToolError(f"tool call longer than {MAX_CALL_CHARS} characters")
  if text.count("[") + text.count("{") > MAX_BRACKETS:
    raise ToolError(f"tool call nests more than {MAX_BRACKETS} brackets")
  try:
    return json.loads(text)
  except (ValueError, RecursionError) as e:
    raise ToolError(f"tool call is not valid JSON ({type(e).__name__})") from e


def parse_json_call(text: str) -> dict:
  """{"name": str, "arguments": dict} from the inside of a <tool_call> pair, or ToolError."""
  call = loads(text.strip())
  if not isinstance(call, dict):
    raise ToolError('a tool call must be a JSON object {"name": ..., "arguments": {...}}')
  name, args = call.get("name"), call.get("arguments", {})
  if not isinstance(name, str):
    raise ToolError('a tool call needs a string "name"')
  if isinstance(args, str):  # parse_qwen also accepts arguments serialized as a JSON string
    args = loads(args)
  if not isinstance(args, dict):
    raise ToolError('"arguments" must be a JSON object')
  return {"name": name, "arguments": args}


def _check_value(arg: str, value, kind: str, max_chars: int) -> None:
  if kind == "string":
    if not isinstance(value, str):
      raise ToolError(f"argument {arg!r} must be a string")
    if len(value) > max_chars:
      raise ToolError(f"{arg} longer than {max_chars} characters")
    return
  if kind == "integer" and (isinstance(value, bool) or not isinstance(value, int)):
    raise ToolError(f"argument {arg!r} must be an integer")
  if isinstance(value, bool) or not isinstance(value, (int, float)):
    raise ToolError(f"argument {arg!r} must be a number")
  if not abs(value) <= MAX_NUMBER:  # also False for NaN; no float() of a huge int
    raise ToolError(f"argument {arg!r} must be a finite number of magnitude <= {MAX_NUMBER}")


def check_arguments(tool: Tool, args: dict) -> None:
  """ToolError unless `args` has exactly the tool's arguments, each of its type and size."""
  unexpected = sorted(set(args) - set(tool.parameters))
  missing = [a for a in tool.parameters if a not in args]
  if unexpected or missing:
    raise ToolError(f"{tool.name} takes arguments {', '.join(tool.parameters)}"
                    + (f"; missing {', '.join(missing)}" if missing else "")
                    + (f"; unexpected {', '.join(repr(a[:20]) for a in unexpected[:5])}"
                       if unexpected else ""))
  for arg, kind in tool.parameters.items():
    _check_value(arg, args[arg], kind, tool.max_chars)


def _spans(text: str, tag: str, limit: int) -> list[tuple[int, int, str]]:
  """The first `limit` complete <tag>...</tag> pairs (extract.tag_spans' pairing)."""
  spans = []
  for span in extract.tag_spans(text, tag):
    if len(spans) == limit:
      break
    spans.append(span)
  return spans


def _cut_body(text: str, tags: Sequence[str], after: int) -> tuple[int, str, str] | None:
  """(start, tag, body) of a last opening tag with no closing tag, starting at or after
  `after`, whose body (the rest of the text) holds no "<"; None if there is none."""
  best = None
  for tag in tags:
    at = text.rfind(f"<{tag}>")
    if at >= after and text.find(f"</{tag}>", at) < 0 and (best is None or at > best[0]):
      best = (at, tag, text[at + len(tag) + 2:])
  return best if best is not None and "<" not in best[2] else None


class Toolbox:
  """An env's tools in one call format: parses turns, runs and renders calls, writes the
  tools' part of the system prompt (module docstring).

  Args:
    tools: the tools; their names and tags must differ.
    fmt: one of FORMATS.
    max_calls: the most calls of one turn that run [INF].
    reject_extra: a turn's calls after the first max_calls become one rejected call (True),
      or are ignored (False: Search-R1 reads only an action's first pair).
  """

  def __init__(self, tools: Sequence[Tool], fmt: str, *, max_calls: int = MAX_CALLS,
               reject_extra: bool = True):
    if fmt not in FORMATS:
      raise ValueError(f"tool_format={fmt!r} must be one of {FORMATS}.")
    if max_calls < 1:
      raise ValueError(f"max_calls must be >= 1, got {max_calls}.")
    self.tools = {t.name: t for t in tools}
    self.by_tag = {t.tag_name: t for t in tools}
    if not tools or len(self.tools) != len(tools) or len(self.by_tag) != len(tools):
      raise ValueError(f"Toolbox needs tools with distinct names and tags, got "
                       f"{[t.name for t in tools]}.")
    self.fmt, self.max_calls, self.reject_extra = fmt, max_calls, reject_extra

  # Parsing.

  def parse(self, text: str) -> Turn:
    """The calls and answer of one model turn (module docstring); never raises."""
    text = extract.cap(text)
    limit = self.max_calls + 1
    if self.fmt == "hermes":
      found = [(s, e, None, body) for s, e, body in _spans(text, "tool_call", limit)]
    else:
      found = sorted(((s, e, tool, body) for tool in self.by_tag.values()
                      for s, e, body in _spans(text, tool.tag_name, limit)),
                     key=lambda span: span[0])[:limit]
    calls = [self._read(tool, body, start) for start, _, tool, body in found]
    if len(calls) < limit:
      cut = self._cut_call(text, after=max((end for _, end, _, _ in found), default=0))
      calls += [cut] if cut is not None else []
    if len(calls) > self.max_calls:
      extra = calls[self.max_calls].start
      calls = calls[:self.max_calls] + ([Call(
          "", None, f"more than {self.max_calls} tool calls in one turn: the calls after "
          f"the first {self.max_calls} did not run", extra)] if self.reject_extra else [])
    answer = next(extract.tag_spans(text, ANSWER), None)
    return Turn(tuple(calls), answer[2] if answer else None, answer[0] if answer else -1)

  def _cut_call(self, text: str, after: int) -> Call | None:
    """The call cut at a stop string at the end of `text`, if one is well formed."""
    tags = ["tool_call"] if self.fmt == "hermes" else list(self.by_tag)
    found = _cut_body(text, tags, after)
    if found is None or not found[2].strip():
      return None
    start, tag, body = found
    call = self._read(self.by_tag.get(tag), body, start)
    return call if call.arguments is not None else None

  def _read(self, tool: Tool | None, body: str, start: int) -> Call:
    """The call in a tag's body: `tool`'s (tags) or the one the JSON names (hermes)."""
    body = body.strip()
    if tool is None:
      try:
        parsed = parse_json_call(body)
      except ToolError as e:
        return Call("", None, str(e), start)
      name, args = parsed["name"], parsed["arguments"]
    elif tool.plain is not None:
      name, args = tool.name, {tool.plain: body}
    else:
      name = tool.name
      try:
        args = loads(body)
      except ToolError as e:
        return Call(name, None, str(e), start)
      if not isinstance(args, dict):
        return Call(name, None, f"<{tool.tag_name}> takes a JSON object of its arguments: "
                    f"{self._tag_usage(tool)}", start)
    return Call(name, args, self._check(name, args), start)

  def _check(self, name: str, args: dict) -> str:
    tool = self.tools.get(name)
    if tool is None:
      return f"unknown tool {name[:40]!r}; the tools are {', '.join(self.tools)}"
    try:
      check_arguments(tool, args)
    except ToolError as e:
      return str(e)
    return ""

  # Running and rendering.

  def run(self, calls: Sequence[Call], execute: Callable[[Call], str]) -> Results:
    """Runs each well-formed call with `execute(call) -> result text` (ToolError: rejected),
    in order, and renders every result or error."""
    pieces, messages, errors = [], [], []
    for call in calls:
      error = call.error
      if not error:
        try:
          payload = execute(call)
        except ToolError as e:
          error = str(e) or type(e).__name__
      if error:
        piece = message = f"<error>{error}</error>"
      elif self.fmt == "hermes":
        piece, message = f"<tool_response>{payload}</tool_response>", payload
      else:
        tag = self.tools[call.name].result_tag
        piece = message = f"<{tag}>{payload}</{tag}>"
      pieces.append(piece)
      messages.append(message)
      errors.append(error)
    return Results("\n".join(pieces), tuple(messages), tuple(errors))

  def format_call(self, call: dict) -> str:
    """A call {"name", "arguments"} as a model of this format writes it."""
    if self.fmt == "hermes":
      return f"<tool_call>{json.dumps(call)}</tool_call>"
    if call["name"] not in self.tools:
      raise ValueError(f"unknown tool {call['name']!r}; the tools are {list(self.tools)}.")
    tool, args = self.tools[call["name"]], call["arguments"]
    body = args[tool.plain] if tool.plain is not None else json.dumps(args)
    return f"<{tool.tag_name}>{body}</{tool.tag_name}>"

  # Prompts.

  @staticmethod
  def _tag_usage(tool: Tool) -> str:
    if tool.plain is not None:
      return f"<{tool.tag_name}>{tool.plain}</{tool.tag_name}>"
    args = ", ".join(f'"{a}": ...' for a in tool.parameters)
    return f"<{tool.tag_name}>{{{args}}}</{tool.tag_name}>"

  def usage(self) -> str:
    """How to write a call, for error messages."""
    if self.fmt == "hermes":
      return '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'
    if len(self.tools) == 1:
      return self._tag_usage(next(iter(self.tools.values())))
    return f"<TOOL>...</TOOL> (TOOL one of {', '.join(self.by_tag)})"

  def no_call_error(self, answer: str) -> str:
    """The error of a turn with neither a call nor an answer."""
    return f"no tool call or answer; write {self.usage()} or <answer>{answer}</answer>"

  def system_prompt(self, *, intro: str = "", notes: str = "", answer: str = "...") -> str:
    """The system prompt: `intro`, the tools and how to call them, `notes`, how to answer.

    tags with one tool says "To call it, ...", so `intro` should name the tool.
    """
    finish = f"When you know the final answer, write <answer>{answer}</answer>."
    if self.fmt == "hermes":
      tools = "\n".join(json.dumps(t.schema()) for t in self.tools.values())
      calls = ("Write one call per turn" if self.max_calls == 1
               else f"Write at most {self.max_calls} calls per turn")
      head = (f"{intro}\n\n" if intro else "") + (
          "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
          "You are provided with function signatures within <tools></tools> XML tags:\n"
          f"<tools>\n{tools}\n</tools>\n\nFor each function call, return a json object with "
          "function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
          '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>\n\n')
      return head + " ".join(filter(None, [
          f"{calls} and stop; the results come back as <tool_response>...</tool_response>.",
          notes, finish]))
    if len(self.tools) == 1:
      tool = next(iter(self.tools.values()))
      how = (f"To call it, write {self._tag_usage(tool)} and stop; the result comes back as "
             f"<{tool.result_tag}>value</{tool.result_tag}>.")
    else:
      listed = "\n".join(f"- {self._tag_usage(t)}: {t.description}" for t in self.tools.values())
      results = " or ".join(dict.fromkeys(f"<{t.result_tag}>...</{t.result_tag}>"
                                          for t in self.tools.values()))
      how = (f"You can call these tools:\n{listed}\nTo call one, write its tag as shown and "
             f"stop; each result comes back as {results}.")
    return " ".join(filter(None, [intro, how, notes, finish]))
