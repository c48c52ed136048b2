"""Chat messages to and from what an env shows the engine (agentrl/serve/sessions.py).

A session's first request becomes the env's system prompt, few-shot `examples` and first
observation (`opening`; `plain` lays it out for a policy without a chat template); the messages
after an assistant turn become the next observation (tool messages through `tool_answers`, in
the model family's tool format); a sampled turn's text becomes the reply's content and OpenAI
`tool_calls` (`reply`), and the message a client sends back for it is checked against
`returned(choice)`. `normalize` gives messages one form for that comparison; `tools_of`
converts a request's function schemas to `tool_calls.Tool`s. A streamed reply's content is sent
while the turn is sampled (`TurnText`: the text of the ids so far, less what `reply` may still
cut off, `streamable`).
"""
import json
from typing import Any, Callable, Collection, Iterable, Sequence
import uuid

from agentrl.envs import tool_calls
from agentrl.rewards import extract
from agentrl.serve import protocol


def bad(message: str, param: str | None = "messages") -> protocol.APIError:
  return protocol.APIError(400, message, param=param)


def arguments_key(arguments) -> str:
  """A tool call's arguments for comparison: canonical JSON when they parse."""
  try:
    return json.dumps(json.loads(arguments), sort_keys=True)
  except (TypeError, ValueError):
    return str(arguments)


def call_key(call: Any, where: str) -> tuple:
  if not isinstance(call, dict) or not isinstance(call.get("function"), dict):
    raise bad(f"{where}: a tool call is {{id, type: 'function', function: {{name, "
               "arguments}}}}")
  fn = call["function"]
  return (call.get("id"), fn.get("name"), arguments_key(fn.get("arguments", "{}")))


def normalize(messages: Sequence[dict]) -> list[dict]:
  """Messages as sessions compare them: role (developer -> system), content ("" for None),
  an assistant's tool calls as (id, name, canonical arguments), a tool message's call id."""
  out = []
  for k, m in enumerate(messages):
    if not isinstance(m, dict):
      raise bad(f"messages[{k}] must be an object with a role and content.")
    role = m.get("role")
    role = "system" if role == "developer" else role
    if role not in ("system", "user", "assistant", "tool"):
      raise bad(f"messages[{k}] has role {role!r}; use system, developer, user, assistant or "
                 "tool.")
    content = m.get("content")
    if content is not None and not isinstance(content, str):
      raise bad(f"messages[{k}].content must be text.")
    entry = {"role": role, "content": content or ""}
    if role == "assistant":
      entry["tool_calls"] = tuple(call_key(c, f"messages[{k}]")
                                  for c in m.get("tool_calls") or ())
    if role == "tool":
      entry["tool_call_id"] = m.get("tool_call_id")
    out.append(entry)
  return out


def tools_of(specs: Sequence[dict] | None) -> list[tool_calls.Tool]:
  """The request's tools as `tool_calls.Tool`s; an APIError 400 names a tool or argument the
  Tool cannot express (arguments must be typed string, number or integer)."""
  tools = []
  for i, spec in enumerate(specs or ()):
    fn = spec.get("function") if isinstance(spec, dict) else None
    if not isinstance(fn, dict) or spec.get("type") != "function":
      raise bad(f"tools[{i}] must be {{type: 'function', function: {{name, description, "
                 "parameters}}}}.", "tools")
    name = fn.get("name")
    schema = fn.get("parameters") or {}
    props = (schema.get("properties") or {}) if isinstance(schema, dict) else None
    if not isinstance(props, dict):
      raise bad(f"tools[{i}] ({name!r}): parameters must be a JSON object schema.", "tools")
    types = {}
    for arg, arg_schema in props.items():
      kind = arg_schema.get("type") if isinstance(arg_schema, dict) else None
      if kind not in tool_calls.TYPES:
        raise bad(f"tools[{i}] ({name!r}): argument {arg!r} has JSON type {kind!r}; this "
                   f"server's tool format supports {', '.join(tool_calls.TYPES)}.", "tools")
      types[arg] = kind
    try:
      tools.append(tool_calls.Tool(str(name), str(fn.get("description") or ""), types))
    except ValueError as e:
      raise bad(f"tools[{i}]: {e}", "tools") from e
  return tools


def tool_answers(toolbox, calls: dict[str, tuple], messages: Sequence[dict],
                  first: int) -> tool_calls.Results:
  """Tool messages rendered as a tool env renders results (Toolbox.run): `calls` maps a call
  id to its (name, arguments) of the assistant turn they answer."""
  found = []
  for k, m in enumerate(messages):
    if m["tool_call_id"] not in calls:
      raise bad(f"messages[{first + k}] answers tool_call_id {m['tool_call_id']!r}, not a "
                 "call of the assistant message before it.")
    name, args = calls[m["tool_call_id"]]
    if toolbox.fmt == "tags" and name not in toolbox.tools:   # its result tag is the tool's
      raise bad(f"messages[{first + k}] answers a call of {name!r}, not one of the tools.")
    found.append((tool_calls.Call(name, args), m["content"]))
  answers = {id(call): content for call, content in found}
  return toolbox.run([call for call, _ in found], lambda call: answers[id(call)])


def calls_by_id(message: dict) -> dict[str, tuple]:
  """An assistant message's tool calls: id -> (name, arguments as a dict, or {})."""
  calls = {}
  for cid, name, args in message.get("tool_calls", ()):
    try:
      parsed = json.loads(args)
    except ValueError:
      parsed = {}
    calls[cid] = (name, parsed if isinstance(parsed, dict) else {})
  return calls


def assistant_text(toolbox, message: dict, k: int) -> str:
  """An assistant message of the history as the model would have written it."""
  calls = message["tool_calls"]
  if not calls:
    return message["content"]
  if toolbox is None:
    raise bad(f"messages[{k}] has tool calls but the request lists no tools.")
  try:
    text = [toolbox.format_call({"name": name, "arguments": json.loads(args)})
            for _, name, args in calls]
  except (ValueError, TypeError, KeyError) as e:
    raise bad(f"messages[{k}]: a tool call this tool format cannot write ({e})") from e
  return "\n".join(([message["content"]] if message["content"] else []) + text)


def opening(messages: list[dict], toolbox) -> dict:
  """A session's first request as the env's reset shows it: system_prompt, examples (few-shot
  chat messages, agentrl/envs/few_shot.py) and the user text."""
  n_system = next((k for k, m in enumerate(messages) if m["role"] != "system"), len(messages))
  if not messages or messages[-1]["role"] != "user" or n_system == len(messages):
    raise bad("a session's first request must end with a user message.")
  system = "\n\n".join(m["content"] for m in messages[:n_system])
  examples, k = [], n_system
  while k < len(messages) - 1:
    m = messages[k]
    if m["role"] == "system":
      raise bad(f"messages[{k}]: system and developer messages must come first.")
    if m["role"] == "tool":
      if toolbox is None:
        raise bad(f"messages[{k}] is a tool message but the request lists no tools.")
      run = k
      while run < len(messages) - 1 and messages[run]["role"] == "tool":
        run += 1
      before = messages[k - 1] if k > n_system else {}
      results = tool_answers(toolbox, calls_by_id(before), messages[k:run], k)
      examples.append({"role": "user", "content": results.observation,
                       "tool_results": list(results.tool_results)})
      k = run
      continue
    text = assistant_text(toolbox, m, k) if m["role"] == "assistant" else m["content"]
    examples.append({"role": m["role"], "content": text})
    k += 1
  if toolbox is not None:
    system = toolbox.system_prompt(intro=system)
  return dict(system_prompt=system, examples=tuple(examples),
              user=messages[-1]["content"])


def plain(opening_: dict) -> dict:
  """An `opening` for a policy without a chat template (agentrl/rollout/agent_loop.py's plain
  layout: BOS, each message's text, EOS after an assistant's). The system text (the system
  messages and the tools' part) starts the first message, and consecutive system, user and tool
  texts are joined by a blank line into one, as the texts between two model turns of a rollout
  are one observation. A first request of one user message is thus exactly a training prompt."""
  system = opening_["system_prompt"]
  segments = [{"role": "user", "content": system}] if system else []
  for m in [*opening_["examples"], {"role": "user", "content": opening_["user"]}]:
    if m["role"] != "assistant" and segments and segments[-1]["role"] != "assistant":
      segments[-1] = {"role": "user",
                      "content": segments[-1]["content"] + "\n\n" + m["content"]}
    else:
      segments.append({"role": m["role"], "content": m["content"]})
  return dict(system_prompt="", examples=tuple(segments[:-1]), user=segments[-1]["content"])


def reply(text: str, toolbox, stopped: bool) -> protocol.Choice:
  """The choice for a sampled turn's text: the tool calls the model family's parser reads in
  it (each with a new id) and the text around them as content (None when empty)."""
  calls, spans = [], []
  if toolbox is not None:
    capped = extract.cap(text)
    offset = len(text) - len(capped)
    tags = {"tool_call"} if toolbox.fmt == "hermes" else set(toolbox.by_tag)
    ends = {s: e for tag in tags for s, e, _ in extract.tag_spans(capped, tag)}
    for call in toolbox.parse(text).calls:
      if call.arguments is None:
        continue   # not a call: it stays in the content
      calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                    "function": {"name": call.name,
                                 "arguments": json.dumps(call.arguments)}})
      spans.append((offset + call.start, offset + ends.get(call.start, len(capped))))
  if calls:
    pieces, at = [], 0
    for start, end in sorted(spans):
      pieces.append(text[at:start])
      at = end
    content = ("".join(pieces) + text[at:]).strip() or None
    finish = "tool_calls"
  else:
    content, finish = text, "stop" if stopped else "length"
  return protocol.Choice(index=0, content=content, tool_calls=tuple(calls),
                         finish_reason=finish)


def returned(choice: protocol.Choice) -> dict:
  """The assistant message a choice adds to its session's history (normalized)."""
  return normalize([{"role": "assistant", "content": choice.content,
                     "tool_calls": list(choice.tool_calls)}])[0]


def first_of(text: str, markers: Iterable[str]) -> int:
  """Where the first of the non-empty `markers` occurs in `text`; -1 if none does."""
  return min((text.find(m) for m in markers if m and m in text), default=-1)


def _before_markers(text: str, markers: Sequence[str]) -> str:
  """`text` up to its first marker, less a tail that a longer text could make a marker."""
  markers = [m for m in markers if m]
  cut = first_of(text, markers)
  if cut >= 0:
    return text[:cut]
  longest = max(map(len, markers), default=0)
  for start in range(max(0, len(text) - longest + 1), len(text)):
    if any(m.startswith(text[start:]) for m in markers):
      return text[:start]
  return text


def streamable(text: str, toolbox, stop: Sequence[str] = ()) -> str:
  """The part of a turn's text so far that surely begins its reply's content (`reply` of the
  whole text), so a streamed reply never sends what it would take back.

  `stop` (a one-turn request's stop strings) ends the text at the first one. With a `toolbox`
  (a request with tools and tool_choice other than "none"), the text ends before the first
  opening tag of a call in its format (<tool_call>, or a tool's tag), and whitespace at its
  end waits for what follows (`reply` strips the text around calls); a text that starts with
  whitespace waits for the turn's end. A tail that may still grow into a stop string or a tag
  waits too.
  """
  text = _before_markers(text, stop)
  if toolbox is None:
    return text
  tags = ["tool_call"] if toolbox.fmt == "hermes" else list(toolbox.by_tag)
  text = _before_markers(text, [f"<{tag}>" for tag in tags])
  return "" if text[:1].isspace() else text.rstrip()


class TurnText:
  """A streamed turn's content while it is sampled: `add(ids)` takes the ids of the next
  decode chunk and returns the text that follows what it returned before.

  The ids so far are decoded whole (a SentencePiece word start keeps its space, a byte-level
  BPE token is read with its neighbours); an incomplete last character (U+FFFD) waits for the
  token that completes it, stop ids are left out, and `streamable` holds back what a stop
  string or a tool call may still remove. So the pieces concatenate to a prefix of the reply's
  content, for a tokenizer whose decoding of a prefix of the ids is a prefix of the whole
  decoding up to an incomplete last character (SentencePiece, byte-level BPE). Each call
  decodes the turn so far.
  """

  def __init__(self, decode: Callable[[list[int]], str], stop_ids: Collection[int],
               toolbox=None, stop: Sequence[str] = ()):
    self.decode, self.stop_ids, self.toolbox, self.stop = decode, stop_ids, toolbox, stop
    self.ids: list[int] = []
    self.sent = ""

  def add(self, ids: Iterable[int]) -> str:
    self.ids += [t for t in map(int, ids) if t not in self.stop_ids]
    text = streamable(self.decode(self.ids).rstrip("\ufffd"), self.toolbox, self.stop)
    if len(text) <= len(self.sent) or not text.startswith(self.sent):
      return ""
    piece, self.sent = text[len(self.sent):], text
    return piece
