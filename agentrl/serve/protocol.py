"""The OpenAI Chat Completions wire format: request validation and response bodies (pure, no I/O).

Covered: `POST /v1/chat/completions` requests with messages (system, developer, user, assistant,
tool), text content (a string, or a list of text parts joined with newlines), function tools,
tool_choice, temperature, top_p, max_tokens (max_completion_tokens is its alias), stop, n, seed,
stream and stream_options.include_usage, user; responses as `chat.completion` bodies or
`chat.completion.chunk` server-sent-event bodies; `GET /v1/models` bodies; OpenAI's error body.

Sampling parameters are parsed and range-checked here; whether they are honoured is the backend's
decision (a backend that trains the policy may sample with its own settings).

Not covered, and refused with a 400 naming the field rather than silently mis-served: image,
audio and file content parts; `logprobs: true` and `top_logprobs` (responses carry no
log-probs: the trainer records its own); a non-empty `logit_bias`; `response_format` other than
`{"type": "text"}` (no constrained decoding); the legacy `functions` / `function_call` fields
(use `tools` / `tool_choice`). Every other unknown top-level field (frequency_penalty,
presence_penalty, parallel_tool_calls, metadata, store, ...) is accepted and ignored, as
OpenAI-style clients send them by default.

The session id ties requests to one episode: the `X-Session-Id` header, else the `user` field.
"""
import dataclasses
import json
import re
import uuid
from typing import Any, Mapping, Sequence

ROLES = ("system", "developer", "user", "assistant", "tool")
TOOL_CHOICES = ("auto", "none", "required")
FINISH_REASONS = ("stop", "length", "tool_calls")
SESSION_HEADER = "x-session-id"
MAX_STOP = 4
MAX_N = 128


class APIError(Exception):
  """An error a client receives as an HTTP status and OpenAI's error body.

  Attributes:
    status: the HTTP status code.
    message: one line saying what is wrong and how to fix it.
    type: OpenAI's error type (invalid_request_error, authentication_error, not_found_error,
      rate_limit_error, timeout_error, server_error).
    param: the request field at fault, or None.
    code: a machine-readable code (model_not_found, invalid_api_key, ...), or None.
  """

  def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
               param: str | None = None, code: str | None = None):
    super().__init__(message)
    self.status = status
    self.message = message
    self.type = type
    self.param = param
    self.code = code


def error_body(err: APIError) -> dict:
  """OpenAI's error body: {"error": {"message", "type", "param", "code"}}."""
  return {"error": {"message": err.message, "type": err.type, "param": err.param,
                    "code": err.code}}


def invalid(param: str | None, message: str) -> APIError:
  """A 400 invalid_request_error naming `param` (None: the body as a whole)."""
  return APIError(400, message, param=param)


@dataclasses.dataclass(frozen=True)
class ChatRequest:
  """A validated chat completion request.

  `messages` are normalised dicts: {"role", "content": str | None} plus "name" (optional),
  "tool_calls" (assistant: [{"id", "type": "function", "function": {"name", "arguments"}}],
  arguments a JSON string) and "tool_call_id" (tool). `tools` are
  {"type": "function", "function": {"name", "description", "parameters"}} dicts.
  `session` is the X-Session-Id header, else `user`, else None.
  """
  model: str
  messages: list[dict]
  tools: list[dict] | None = None
  tool_choice: str | dict | None = None
  temperature: float | None = None
  top_p: float | None = None
  max_tokens: int | None = None
  stop: tuple[str, ...] = ()
  n: int = 1
  seed: int | None = None
  stream: bool = False
  include_usage: bool = False
  user: str | None = None
  session: str | None = None


@dataclasses.dataclass(frozen=True)
class Choice:
  """One generated answer: text and/or tool calls (OpenAI's tool_call dicts, see `tool_call`)."""
  index: int
  content: str | None
  tool_calls: tuple[dict, ...] = ()
  finish_reason: str = "stop"

  def __post_init__(self):
    if self.finish_reason not in FINISH_REASONS:
      raise ValueError(f"finish_reason is {self.finish_reason!r}; use one of {FINISH_REASONS}")
    object.__setattr__(self, "tool_calls", tuple(self.tool_calls))


@dataclasses.dataclass(frozen=True)
class Completion:
  """A backend's answer to one ChatRequest: its `n` choices and the token counts."""
  choices: tuple[Choice, ...]
  prompt_tokens: int
  completion_tokens: int


def tool_call(name: str, arguments: str | Mapping[str, Any], call_id: str | None = None) -> dict:
  """OpenAI's tool_call dict; `arguments` a JSON string or a mapping (encoded here)."""
  if not isinstance(arguments, str):
    arguments = json.dumps(arguments)
  return {"id": call_id or f"call_{uuid.uuid4().hex[:24]}", "type": "function",
          "function": {"name": name, "arguments": arguments}}


# -- request parsing ------------------------------------------------------------------------------


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _optional_str(body: Mapping, key: str) -> str | None:
  value = body.get(key)
  if value is not None and not isinstance(value, str):
    raise invalid(key, f"'{key}' must be a string, got {type(value).__name__}")
  return value


def _number(body: Mapping, key: str, low: float, high: float, low_open: bool) -> float | None:
  value = body.get(key)
  if value is None:
    return None
  below = value <= low if low_open else value < low
  if not _is_number(value) or below or value > high:
    bracket = "(" if low_open else "["
    raise invalid(key, f"'{key}' must be a number in {bracket}{low:g}, {high:g}], got {value!r}")
  return float(value)


def _content(value, param: str, role: str) -> str | None:
  """A message's content as one string: text parts are joined with newlines."""
  if value is None:
    return None
  if isinstance(value, str):
    return value
  if not isinstance(value, list):
    raise invalid(param, f"'{param}' must be a string or a list of text parts")
  texts = []
  for i, part in enumerate(value):
    kind = part.get("type") if isinstance(part, dict) else None
    if role == "assistant" and kind == "refusal":
      continue
    if kind != "text":
      raise invalid(f"{param}[{i}]", f"'{param}[{i}]' is a {kind!r} part: this server takes "
                    "text only (send {'type': 'text', 'text': ...} parts or a string)")
    if not isinstance(part.get("text"), str):
      raise invalid(f"{param}[{i}].text", f"'{param}[{i}].text' must be a string")
    texts.append(part["text"])
  return "\n".join(texts)


def _tool_calls(value, param: str) -> list[dict]:
  if not isinstance(value, list):
    raise invalid(param, f"'{param}' must be a list of tool calls")
  calls = []
  for i, call in enumerate(value):
    where = f"{param}[{i}]"
    function = call.get("function") if isinstance(call, dict) else None
    if (not isinstance(call, dict) or call.get("type", "function") != "function"
        or not isinstance(call.get("id"), str) or not isinstance(function, dict)):
      raise invalid(where, f"'{where}' must be {{'id': str, 'type': 'function', "
                    "'function': {'name': str, 'arguments': str}}")
    name, arguments = function.get("name"), function.get("arguments")
    if not isinstance(name, str) or not name:
      raise invalid(f"{where}.function.name", f"'{where}.function.name' must be a string")
    if not isinstance(arguments, str):
      raise invalid(f"{where}.function.arguments",
                    f"'{where}.function.arguments' must be a JSON string")
    calls.append(tool_call(name, arguments, call["id"]))
  return calls


def _message(value, i: int) -> dict:
  where = f"messages[{i}]"
  if not isinstance(value, dict):
    raise invalid(where, f"'{where}' must be an object with 'role' and 'content'")
  role = value.get("role")
  if role not in ROLES:
    raise invalid(f"{where}.role", f"'{where}.role' is {role!r}; use one of {', '.join(ROLES)}")
  message = {"role": role, "content": _content(value.get("content"), f"{where}.content", role)}
  name = _optional_str(value, "name")
  if name is not None:
    message["name"] = name
  if role == "assistant" and value.get("tool_calls"):
    message["tool_calls"] = _tool_calls(value["tool_calls"], f"{where}.tool_calls")
  elif message["content"] is None:
    raise invalid(f"{where}.content", f"'{where}.content' is missing: a {role} message needs "
                  "content (only an assistant message with tool_calls may omit it)")
  if role == "tool":
    call_id = value.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
      raise invalid(f"{where}.tool_call_id",
                    f"'{where}.tool_call_id' is missing: a tool message answers one tool call id")
    message["tool_call_id"] = call_id
  return message


def _messages(value) -> list[dict]:
  if not isinstance(value, list) or not value:
    raise invalid("messages", "'messages' must be a non-empty list of messages")
  return [_message(m, i) for i, m in enumerate(value)]


def _tools(value) -> list[dict] | None:
  if value is None:
    return None
  if not isinstance(value, list):
    raise invalid("tools", "'tools' must be a list of {'type': 'function', 'function': {...}}")
  tools = []
  for i, tool in enumerate(value):
    where = f"tools[{i}]"
    function = tool.get("function") if isinstance(tool, dict) else None
    if not isinstance(function, dict) or tool.get("type", "function") != "function":
      raise invalid(where, f"'{where}' must be {{'type': 'function', 'function': {{'name': ...}}}}")
    if not isinstance(function.get("name"), str) or not function["name"]:
      raise invalid(f"{where}.function.name", f"'{where}.function.name' must be a string")
    parameters = function.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(parameters, dict):
      raise invalid(f"{where}.function.parameters",
                    f"'{where}.function.parameters' must be a JSON schema object")
    tools.append({"type": "function", "function": {
        "name": function["name"], "description": _optional_str(function, "description") or "",
        "parameters": parameters}})
  return tools


def _tool_choice(value, tools: list[dict] | None) -> str | dict | None:
  if value is None:
    return None
  if isinstance(value, str) and value in TOOL_CHOICES:
    if value != "none" and not tools:
      raise invalid("tool_choice", f"'tool_choice' is {value!r} but no 'tools' were given")
    return value
  name = value.get("function", {}).get("name") if isinstance(value, dict) else None
  if not isinstance(name, str) or value.get("type", "function") != "function":
    raise invalid("tool_choice", "'tool_choice' must be 'auto', 'none', 'required' or "
                  "{'type': 'function', 'function': {'name': ...}}")
  if name not in [t["function"]["name"] for t in tools or []]:
    raise invalid("tool_choice", f"'tool_choice' names {name!r}, which is not in 'tools'")
  return {"type": "function", "function": {"name": name}}


def _stop(value) -> tuple[str, ...]:
  if value is None:
    return ()
  if isinstance(value, str):
    return (value,)
  if (not isinstance(value, list) or len(value) > MAX_STOP
      or not all(isinstance(s, str) and s for s in value)):
    raise invalid("stop", f"'stop' must be a string or a list of at most {MAX_STOP} strings")
  return tuple(value)


def _max_tokens(body: Mapping) -> int | None:
  key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
  value = body.get(key)
  if value is not None and (not _is_int(value) or value < 1):
    raise invalid(key, f"'{key}' must be an integer >= 1, got {value!r}")
  return value


def _refuse_unsupported(body: Mapping) -> None:
  """Raises for fields whose meaning this server cannot honour (see the module docstring)."""
  if body.get("logprobs") or body.get("top_logprobs"):
    key = "logprobs" if body.get("logprobs") else "top_logprobs"
    raise invalid(key, f"'{key}' is not supported: responses carry no log-probs")
  if body.get("logit_bias"):
    raise invalid("logit_bias", "'logit_bias' is not supported: remove it")
  response_format = body.get("response_format")
  if response_format is not None and response_format != {"type": "text"}:
    raise invalid("response_format", "'response_format' is not supported (no constrained "
                  "decoding): remove it or send {'type': 'text'}")
  for key in ("functions", "function_call"):
    if body.get(key) is not None:
      raise invalid(key, f"'{key}' is the legacy function API: send 'tools' / 'tool_choice'")


def _flag(body: Mapping, key: str) -> bool:
  value = body.get(key, False)
  if value is None:
    return False
  if not isinstance(value, bool):
    raise invalid(key, f"'{key}' must be true or false, got {value!r}")
  return value


def _include_usage(body: Mapping) -> bool:
  options = body.get("stream_options")
  if options is None:
    return False
  if not isinstance(options, dict):
    raise invalid("stream_options", "'stream_options' must be an object")
  return _flag(options, "include_usage")


def _session(headers: Mapping[str, str], user: str | None) -> str | None:
  for key, value in headers.items():
    if key.lower() == SESSION_HEADER and value:
      return value
  return user


def _decode(body: bytes) -> dict:
  try:
    decoded = json.loads(body)
  except (ValueError, UnicodeDecodeError) as err:
    raise invalid(None, f"The request body is not valid JSON ({err}); send a JSON object") from None
  if not isinstance(decoded, dict):
    raise invalid(None, f"The request body must be a JSON object, got {type(decoded).__name__}")
  return decoded


def parse_chat_request(body: bytes, headers: Mapping[str, str]) -> ChatRequest:
  """Validates a chat completion request body.

  Args:
    body: the raw request body.
    headers: the request headers (any case); `X-Session-Id` sets the session.

  Returns:
    The validated request.

  Raises:
    APIError: 400 naming the bad field (`param`).
  """
  request = _decode(body)
  model = request.get("model")
  if not isinstance(model, str) or not model:
    raise invalid("model", "'model' is missing: name one of the models GET /v1/models lists")
  messages = _messages(request.get("messages"))
  _refuse_unsupported(request)
  tools = _tools(request.get("tools"))
  n = request.get("n")
  if n is not None and (not _is_int(n) or not 1 <= n <= MAX_N):
    raise invalid("n", f"'n' must be an integer in [1, {MAX_N}], got {n!r}")
  seed = request.get("seed")
  if seed is not None and not _is_int(seed):
    raise invalid("seed", f"'seed' must be an integer, got {seed!r}")
  user = _optional_str(request, "user")
  return ChatRequest(
      model=model, messages=messages, tools=tools,
      tool_choice=_tool_choice(request.get("tool_choice"), tools),
      temperature=_number(request, "temperature", 0.0, 2.0, low_open=False),
      top_p=_number(request, "top_p", 0.0, 1.0, low_open=True),
      max_tokens=_max_tokens(request), stop=_stop(request.get("stop")), n=n or 1, seed=seed,
      stream=_flag(request, "stream"), include_usage=_include_usage(request), user=user,
      session=_session(headers, user))


# -- response bodies ------------------------------------------------------------------------------


def _usage(completion: Completion) -> dict:
  return {"prompt_tokens": completion.prompt_tokens,
          "completion_tokens": completion.completion_tokens,
          "total_tokens": completion.prompt_tokens + completion.completion_tokens}


def _message_body(choice: Choice) -> dict:
  message = {"role": "assistant", "content": choice.content, "refusal": None}
  if choice.tool_calls:
    message["tool_calls"] = [dict(call) for call in choice.tool_calls]
  return message


def completion_body(request_id: str, model: str, created: int, completion: Completion) -> dict:
  """The `chat.completion` response body."""
  return {
      "id": request_id, "object": "chat.completion", "created": created, "model": model,
      "choices": [{"index": c.index, "message": _message_body(c), "logprobs": None,
                   "finish_reason": c.finish_reason} for c in completion.choices],
      "usage": _usage(completion), "system_fingerprint": None,
  }


def pieces(text: str) -> list[str]:
  """Splits text before each word (after whitespace); the pieces concatenate to `text`."""
  return [p for p in re.split(r"(?<=\s)(?=\S)", text) if p]


def _tool_call_deltas(index: int, call: dict) -> list[dict]:
  """The deltas streaming one tool call: id and name first, then the arguments in pieces."""
  function = call["function"]
  first = {"index": index, "id": call["id"], "type": "function",
           "function": {"name": function["name"], "arguments": ""}}
  return [first] + [{"index": index, "function": {"arguments": p}}
                    for p in pieces(function["arguments"])]


class Chunks:
  """The `chat.completion.chunk` bodies of one streamed response, one server-sent event each.

  Per choice: a role delta (`opening`), content deltas (`content`), then (`ending`) the rest
  of its content a piece per word, tool-call deltas (id and name, then argument pieces) and a
  chunk with the finish_reason; with `include_usage`, a last chunk with no choices carrying
  the usage (every other chunk has "usage": null, as OpenAI's).
  """

  def __init__(self, request_id: str, model: str, created: int, include_usage: bool):
    self.head = {"id": request_id, "object": "chat.completion.chunk", "created": created,
                 "model": model, "system_fingerprint": None}
    self.include_usage = include_usage

  def _chunk(self, choices: list[dict]) -> dict:
    body = {**self.head, "choices": choices}
    if self.include_usage:
      body["usage"] = None
    return body

  def _delta(self, index: int, delta: dict, finish: str | None = None) -> dict:
    return self._chunk([{"index": index, "delta": delta, "logprobs": None,
                         "finish_reason": finish}])

  def opening(self, indices: Sequence[int]) -> list[dict]:
    return [self._delta(i, {"role": "assistant", "content": ""}) for i in indices]

  def content(self, index: int, text: str) -> dict:
    return self._delta(index, {"content": text})

  def ending(self, choice: Choice, sent: str = "") -> list[dict]:
    """The chunks finishing `choice`, whose content began with `sent` (streamed before)."""
    chunks = [self.content(choice.index, p) for p in pieces((choice.content or "")[len(sent):])]
    for i, call in enumerate(choice.tool_calls):
      chunks += [self._delta(choice.index, {"tool_calls": [d]})
                 for d in _tool_call_deltas(i, call)]
    return chunks + [self._delta(choice.index, {}, choice.finish_reason)]

  def usage(self, completion: Completion) -> list[dict]:
    return [self._chunk([]) | {"usage": _usage(completion)}] if self.include_usage else []


def models_body(names: Sequence[str], created: int = 0) -> dict:
  """The `GET /v1/models` response body."""
  return {"object": "list", "data": [{"id": name, "object": "model", "created": created,
                                      "owned_by": "agentrl"} for name in names]}
