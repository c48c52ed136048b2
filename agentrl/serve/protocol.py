"""The chat-completions wire types the serving backends share (stand-in: names and fields only).

  raise APIError(400, "messages[2]: unknown role 'robot'", param="messages")
  request = ChatRequest(model="policy", messages=[{"role": "user", "content": "Hi"}])
  Completion(choices=(Choice(0, "Hello", (), "stop"),), prompt_tokens=9, completion_tokens=2)
"""
import dataclasses
from typing import Any


class APIError(Exception):
  """An error answered with an HTTP status and an OpenAI-style error body."""

  def __init__(self, status: int, message: str, *,
               type: str = "invalid_request_error",  # pylint: disable=redefined-builtin
               param: str | None = None, code: str | None = None):
    super().__init__(message)
    self.status, self.message, self.type, self.param, self.code = (status, message, type,
                                                                   param, code)


@dataclasses.dataclass(frozen=True)
class ChatRequest:
  """A validated chat-completions request (text parts of a message's content already joined)."""
  model: str
  messages: list[dict[str, Any]]
  tools: list[dict[str, Any]] | None = None
  tool_choice: Any = None
  temperature: float | None = None
  top_p: float | None = None
  max_tokens: int | None = None
  stop: tuple[str, ...] = ()
  n: int = 1
  seed: int | None = None
  stream: bool = False
  user: str | None = None
  session: str | None = None


@dataclasses.dataclass(frozen=True)
class Choice:
  index: int
  content: str | None
  tool_calls: tuple[dict[str, Any], ...]
  finish_reason: str


@dataclasses.dataclass
class Completion:
  choices: tuple[Choice, ...]
  prompt_tokens: int
  completion_tokens: int
