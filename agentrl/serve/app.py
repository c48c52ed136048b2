"""An OpenAI-compatible HTTP server (Starlette on uvicorn) in front of an abstract chat backend.

Routes: `GET /v1/models`, `GET /v1/models/{id}` and `POST /v1/chat/completions` (a JSON body, or
server-sent events with `stream: true`). The request format is agentrl/serve/protocol.py's.

The app owns the HTTP concerns only: the optional bearer token (constant-time compare), the model
check, admission (at most `max_concurrent` requests in flight, else 429), the per-request timeout,
client disconnects, and an OpenAI error body for every failure (unknown routes and methods
included; never a traceback page). What is generated, and whether the sampling parameters are
honoured, is the `Backend`'s: its `chat` runs on the server's event loop and may wait long for
the engine. When the client disconnects or the timeout passes, the pending `chat` call is
cancelled (the backend sees asyncio.CancelledError, so it can drop the episode).

Streaming: the backend calls `stream(choice index, text)` with each next piece of a choice's
content while it is sampled (the rollout engine's backends: after every decode chunk), and
answers with the whole Completion. The response starts with the first piece (a role delta for
every choice, then that piece), or with the Completion when no piece came first (e.g. the
content was held back for a possible tool call); every error before then (the backend's own
APIErrors, timeouts) is an HTTP status with an OpenAI body, as for a non-streamed request.
Each piece then goes out as one content delta as it comes; the Completion's rest of each
content (a delta per word), its tool calls, finish reasons and usage end the response. An
error after the start (a timeout, a session dropped meanwhile) is sent as an event
`{"error": {...}}` (which the `openai` client raises) that ends the stream without [DONE].

`app.state.stats` counts `serve/requests`, `serve/errors` (every error response),
`serve/disconnects` (clients gone before or during their response), `serve/request_timeouts` and
`serve/rejected` (429s), for the experiment to log as metrics.

Not covered: TLS, a request-body size cap, responses without the /v1 prefix.
"""
import asyncio
import hmac
import ipaddress
import json
import socket
import threading
import time
import typing
import uuid
from typing import Any, Awaitable, Callable, Sequence

from absl import logging
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
import uvicorn

from agentrl.serve import protocol

STATS = ("serve/requests", "serve/errors", "serve/disconnects", "serve/request_timeouts",
         "serve/rejected")
_SSE_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]


class Backend(typing.Protocol):
  """What the server asks for answers.

  Attributes:
    model_names: the model ids it serves (`GET /v1/models`; requests naming another get a 404).
  """
  model_names: Sequence[str]

  async def chat(self, request: protocol.ChatRequest,
                 stream: Callable[[int, str], None] | None = None) -> protocol.Completion:
    """Answers one request with `request.n` choices.

    Runs on the server's event loop; may raise protocol.APIError (e.g. a 400 for an over-long
    context), and sees asyncio.CancelledError when the client leaves or the timeout passes.
    A streamed request passes `stream`, to be called on the event loop with (choice index,
    text) for each next piece of a choice's content: the pieces of a choice must concatenate
    to a prefix of its final content. A backend may send none (the whole reply then streams
    at the end); one that never streams may leave the argument out.
    """
    ...


class _Disconnected(Exception):
  """The client closed the connection before its response was sent."""


async def _wait_disconnect(receive: Callable[[], Awaitable[dict]]) -> None:
  # Once the body is read, uvicorn's receive returns only when the client disconnects.
  while (await receive())["type"] != "http.disconnect":
    pass


def _retrieve(task: asyncio.Task) -> None:
  """Consumes a cancelled backend call's outcome, so asyncio does not warn about it."""
  if not task.cancelled() and task.exception() is not None:
    logging.warning("serve: a cancelled backend call raised %r", task.exception())


async def _race(work: Awaitable, receive, timeout_s: float) -> Any:
  """Awaits `work`, cancelling it when the client disconnects or after `timeout_s`."""
  task = asyncio.ensure_future(work)
  watcher = asyncio.ensure_future(_wait_disconnect(receive))
  try:
    done, _ = await asyncio.wait({task, watcher}, timeout=timeout_s,
                                 return_when=asyncio.FIRST_COMPLETED)
  finally:
    watcher.cancel()
    if not task.done():
      task.cancel()
      task.add_done_callback(_retrieve)
  if task in done:
    return task.result()
  if watcher in done:
    raise _Disconnected()
  raise _timeout(timeout_s)


def _timeout(timeout_s: float) -> protocol.APIError:
  return protocol.APIError(504, f"The backend did not answer within {timeout_s:g} s; the request "
                           "was dropped", type="timeout_error", code="timeout")


def _event(data: str) -> bytes:
  return b"data: " + data.encode() + b"\n\n"


class _Call:
  """A streamed request's backend call: the content pieces it sends, queued for the response
  as (choice index, text), then None once the call is done."""

  def __init__(self, backend: Backend, chat: protocol.ChatRequest):
    self.queue = asyncio.Queue()
    self.task = asyncio.ensure_future(backend.chat(chat, stream=self._put))
    self.task.add_done_callback(lambda _: self.queue.put_nowait(None))

  def _put(self, index: int, text: str) -> None:
    self.queue.put_nowait((index, text))

  def cancel(self) -> None:
    if not self.task.done():
      self.task.cancel()
      self.task.add_done_callback(_retrieve)

  async def first(self, receive, timeout_s: float) -> tuple[int, str] | None:
    """The first piece, or None once the call answered (its error is raised here)."""
    try:
      piece = await _race(self.queue.get(), receive, timeout_s)
    except BaseException:
      self.cancel()
      raise
    if piece is None:
      self.task.result()
    return piece


class _EventStream:
  """A text/event-stream response: the chunks of `call`'s pieces as they come (from `first`,
  None when the call already answered), then its Completion's. Ends early when the client
  leaves, and with an error event when the call fails or `deadline` passes."""

  def __init__(self, service: "_Service", chunks: protocol.Chunks, n: int, call: _Call,
               first: tuple[int, str] | None, deadline: float):
    self.service, self.chunks, self.n, self.call = service, chunks, n, call
    self.first, self.deadline = first, deadline

  async def __call__(self, scope, receive, send) -> None:
    watcher = asyncio.ensure_future(_wait_disconnect(receive))

    async def put(chunk: dict) -> None:
      await send({"type": "http.response.body", "more_body": True,
                  "body": _event(json.dumps(chunk, separators=(",", ":")))})
      await asyncio.sleep(0)  # lets the watcher see a disconnect: sends to a gone client return
      if watcher.done():
        raise _Disconnected()

    try:
      await send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
      for chunk in self.chunks.opening(range(self.n)):
        await put(chunk)
      sent, piece = [""] * self.n, self.first
      while piece is not None:
        index, text = piece
        sent[index] += text
        await put(self.chunks.content(index, text))
        piece = await self._next(watcher)
      completion = self.call.task.result()
      chunks = []
      for choice in completion.choices:
        if not (choice.content or "").startswith(sent[choice.index]):
          logging.warning("serve: choice %d's streamed text is not a prefix of its content",
                          choice.index)
        chunks += self.chunks.ending(choice, sent[choice.index])
      for chunk in chunks + self.chunks.usage(completion):
        await put(chunk)
      watcher.cancel()  # once the response is complete, receive reports a disconnect too
      await send({"type": "http.response.body", "body": _event("[DONE]"), "more_body": False})
    except _Disconnected:
      self.service.count_disconnect()
    except protocol.APIError as err:
      await self._fail(send, err)
    except Exception:  # pylint: disable=broad-except
      logging.exception("serve: a streamed response failed")
      await self._fail(send, protocol.APIError(500, "The server failed on this request; see "
                                               "its log", type="server_error"))
    finally:
      watcher.cancel()
      self.call.cancel()
      self.service.in_flight -= 1

  async def _next(self, watcher: asyncio.Future) -> tuple[int, str] | None:
    """The call's next piece (None: it answered); raises when the client leaves or the
    deadline passes first."""
    get = asyncio.ensure_future(self.call.queue.get())
    done, _ = await asyncio.wait({get, watcher}, return_when=asyncio.FIRST_COMPLETED,
                                 timeout=max(self.deadline - time.monotonic(), 0.0))
    if get in done:
      return get.result()
    get.cancel()
    if watcher in done:
      raise _Disconnected()
    raise _timeout(self.service.request_timeout_s)

  async def _fail(self, send, err: protocol.APIError) -> None:
    self.service.count(err)
    await send({"type": "http.response.body", "more_body": False,
                "body": _event(json.dumps(protocol.error_body(err)))})


class _Service:
  """The endpoints, sharing the backend, the limits and the counters."""

  def __init__(self, backend: Backend, api_key: str | None, max_concurrent: int,
               request_timeout_s: float):
    self.backend = backend
    self.api_key = api_key.encode() if api_key is not None else None
    self.max_concurrent = max_concurrent
    self.request_timeout_s = request_timeout_s
    self.stats = dict.fromkeys(STATS, 0)
    self.in_flight = 0

  def count(self, err: protocol.APIError) -> None:
    self.stats["serve/errors"] += 1
    if err.status == 429:
      self.stats["serve/rejected"] += 1
    if err.type == "timeout_error":
      self.stats["serve/request_timeouts"] += 1

  def error(self, err: protocol.APIError) -> JSONResponse:
    self.count(err)
    headers = {}
    if err.status == 429:
      headers["retry-after"] = "1"
    if err.status == 401:
      headers["www-authenticate"] = "Bearer"
    return JSONResponse(protocol.error_body(err), status_code=err.status, headers=headers)

  def check_auth(self, request: Request) -> None:
    if self.api_key is None:
      return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                             self.api_key):
      raise protocol.APIError(401, "Missing or wrong API key: send 'Authorization: Bearer KEY' "
                              "with the server's key", type="authentication_error",
                              code="invalid_api_key")

  async def handle(self, request: Request, endpoint) -> Response:
    """Runs an endpoint, turning every failure into an OpenAI error response."""
    self.stats["serve/requests"] += 1
    try:
      self.check_auth(request)
      return await endpoint(request)
    except protocol.APIError as err:
      return self.error(err)
    except (_Disconnected, ClientDisconnect):
      self.stats["serve/disconnects"] += 1
      return Response(status_code=499)  # never delivered: uvicorn drops sends to a gone client
    except Exception:  # pylint: disable=broad-except
      logging.exception("serve: %s %s failed", request.method, request.url.path)
      return self.error(protocol.APIError(500, "The server failed on this request; see its log",
                                          type="server_error"))

  def known_model(self, model: str) -> None:
    if model not in self.backend.model_names:
      raise protocol.APIError(404, f"The model {model!r} does not exist; GET /v1/models lists "
                              "the served ones", type="invalid_request_error", param="model",
                              code="model_not_found")

  async def models(self, request: Request) -> Response:
    return JSONResponse(protocol.models_body(list(self.backend.model_names)))

  async def model(self, request: Request) -> Response:
    self.known_model(request.path_params["model"])
    return JSONResponse(protocol.models_body([request.path_params["model"]])["data"][0])

  async def chat(self, request: Request) -> Response:
    if self.in_flight >= self.max_concurrent:
      raise protocol.APIError(429, f"{self.max_concurrent} requests are already in flight; retry "
                              "later", type="rate_limit_error", code="rate_limit_exceeded")
    self.in_flight += 1
    streaming = None   # the response that takes over the in-flight count
    try:
      chat = protocol.parse_chat_request(await request.body(), request.headers)
      self.known_model(chat.model)
      request_id, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
      if chat.stream:
        deadline = time.monotonic() + self.request_timeout_s
        call = _Call(self.backend, chat)
        first = await call.first(request.receive, self.request_timeout_s)
        chunks = protocol.Chunks(request_id, chat.model, created, chat.include_usage)
        streaming = _EventStream(self, chunks, chat.n, call, first, deadline)
        return streaming
      completion = await _race(self.backend.chat(chat), request.receive, self.request_timeout_s)
    finally:
      if streaming is None:
        self.in_flight -= 1
    return JSONResponse(protocol.completion_body(request_id, chat.model, created, completion))

  def count_disconnect(self) -> None:
    self.stats["serve/disconnects"] += 1

  async def http_error(self, request: Request, exc: HTTPException) -> Response:
    """Unknown routes (404) and methods (405), as OpenAI error bodies."""
    self.stats["serve/requests"] += 1
    message = f"No route {request.method} {request.url.path}"
    if exc.status_code == 405:
      message = (f"{request.url.path} does not take {request.method}; use "
                 f"{(exc.headers or {}).get('Allow', 'another method')}")
    err = protocol.APIError(exc.status_code, message, code=f"http_{exc.status_code}")
    response = self.error(err)
    response.headers.update(exc.headers or {})
    return response

  async def server_error(self, request: Request, exc: Exception) -> Response:
    return self.error(protocol.APIError(500, "The server failed on this request; see its log",
                                        type="server_error"))


def make_app(backend: Backend, *, api_key: str | None = None, max_concurrent: int = 256,
             request_timeout_s: float = 600.0) -> Starlette:
  """The OpenAI-compatible ASGI app for `backend`; its counters are `app.state.stats`.

  Args:
    backend: answers the chat requests.
    api_key: when set, every request must send `Authorization: Bearer <api_key>`.
    max_concurrent: chat requests in flight at once; one more is refused with a 429.
    request_timeout_s: a backend call that takes longer is cancelled and answered with a 504.
  """
  if max_concurrent < 1:
    raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
  if api_key == "":
    raise ValueError("api_key is empty: pass None for no authentication, or a non-empty key")
  if request_timeout_s <= 0:
    raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
  service = _Service(backend, api_key, max_concurrent, request_timeout_s)

  def route(path: str, endpoint, method: str) -> Route:
    async def handler(request: Request) -> Response:
      return await service.handle(request, endpoint)
    return Route(path, handler, methods=[method])

  app = Starlette(routes=[route("/v1/models", service.models, "GET"),
                          route("/v1/models/{model:path}", service.model, "GET"),
                          route("/v1/chat/completions", service.chat, "POST")],
                  exception_handlers={HTTPException: service.http_error,
                                      Exception: service.server_error})
  app.state.stats = service.stats
  return app


def _url_host(host: str) -> str:
  if host in ("", "0.0.0.0"):
    return "127.0.0.1"
  if host == "::":
    return "[::1]"
  return f"[{host}]" if ":" in host else host


def _bind(host: str, port: int) -> socket.socket:
  """A bound (not yet listening) TCP socket; a bad host or a taken port raises OSError here."""
  family, kind, proto, _, address = socket.getaddrinfo(
      host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
  sock = socket.socket(family, kind, proto)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind(address)
  except OSError:
    sock.close()
    raise
  if not ipaddress.ip_address(address[0].split("%")[0]).is_loopback:
    logging.warning("serve: listening on %s: reachable from other machines", address[0])
  return sock


class Server:
  """Runs uvicorn for an ASGI app on a background thread.

  Loopback by default; another `host` must be named explicitly. Port 0 picks a free port. Use as
  a context manager, or call start() and stop().

  Attributes:
    url: the OpenAI base URL, "http://HOST:PORT/v1" (set by start()).
    port: the bound port (set by start()).
  """

  def __init__(self, app, host: str = "127.0.0.1", port: int = 0, *, access_log: bool = False,
               graceful_timeout_s: float = 5.0, keep_alive_s: float = 3600.0):
    self.app = app
    self.host = host
    self.port = port
    self.url = None
    # Idle connections stay open for keep_alive_s: agent programs pick pooled connections up
    # again after a training step's score and update phases, and a server that closed one
    # just then fails that request (uvicorn's default closes them after 5 s).
    self._config = uvicorn.Config(app, host=host, port=port, log_config=None,
                                  log_level="warning", access_log=access_log, lifespan="off",
                                  timeout_graceful_shutdown=graceful_timeout_s,
                                  timeout_keep_alive=keep_alive_s)
    self._server = None
    self._thread = None
    self._socket = None

  @property
  def stats(self) -> dict[str, int]:
    """A copy of the app's counters (empty for an app not made by make_app)."""
    return dict(getattr(self.app.state, "stats", {}))

  def start(self, timeout_s: float = 30.0) -> "Server":
    """Starts serving; returns once the socket listens."""
    if self._thread is not None:
      raise RuntimeError("Server.start() called twice; make a new Server")
    self._socket = _bind(self.host, self.port)
    self.port = self._socket.getsockname()[1]
    self.url = f"http://{_url_host(self.host)}:{self.port}/v1"
    self._server = uvicorn.Server(self._config)
    self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [self._socket]},
                                    name=f"agentrl-serve-{self.port}", daemon=True)
    self._thread.start()
    deadline = time.monotonic() + timeout_s
    while not self._server.started:
      if not self._thread.is_alive() or time.monotonic() > deadline:
        self.stop()
        raise RuntimeError(f"the server on {self.url} did not start; see the log above")
      time.sleep(0.005)
    return self

  def stop(self) -> None:
    """Stops accepting, lets in-flight requests finish (up to graceful_timeout_s), joins."""
    if self._thread is None:
      return
    self._server.should_exit = True
    self._thread.join(self._config.timeout_graceful_shutdown + 5.0)
    if self._thread.is_alive():
      self._server.force_exit = True
      self._thread.join()
    self._socket.close()

  def __enter__(self) -> "Server":
    return self.start()

  def __exit__(self, *exc_info) -> None:
    self.stop()
