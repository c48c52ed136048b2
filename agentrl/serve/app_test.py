"""The server against the real `openai` client (and raw httpx for what that client cannot send).

A deterministic test backend stands in for the rollout engine: it echoes the last message, calls
the `add` tool when tools are given, and sleeps, holds, raises, answers at length or streams the
start of its answer before it waits on demand.
One Server per test class.
"""
import asyncio
import concurrent.futures
import json
import threading
import time

from absl.testing import absltest
import httpx
import openai

from agentrl.serve import app as serve_app
from agentrl.serve import protocol

KEY = "test-key"
TOOLS = [{"type": "function", "function": {
    "name": "add", "description": "Adds two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}}}}}]


class EchoBackend:
  """Answers from the last message; a few commands test the server's failure handling."""
  model_names = ("echo", "echo-large")

  def __init__(self):
    self.requests = []
    self.cancelled = 0
    self.in_flight = 0
    self.max_in_flight = 0
    self.gate = None  # releases the "hold" requests: an asyncio.Event on the server loop
    self.drip = None  # releases a "drip" request (an asyncio.Event)
    self.loop = None
    self.lock = threading.Lock()

  def release(self, gate: str = "gate") -> None:
    self.loop.call_soon_threadsafe(getattr(self, gate).set)

  async def _command(self, text: str, n: int, stream) -> str | None:
    """Waits as `text` asks; returns a replacement answer or None."""
    verb, _, arg = text.partition(" ")
    if verb == "drip":   # streams "echo: ", then waits `arg` seconds or for release("drip")
      self.drip = asyncio.Event()
      for i in range(n):
        stream(i, "echo: ")
      await (asyncio.sleep(float(arg)) if arg else self.drip.wait())
    elif verb == "sleep":
      await asyncio.sleep(float(arg))
    elif verb == "hold":
      await self.gate.wait()
    elif verb == "gather":  # answers once `arg` requests are in flight together
      while self.max_in_flight < int(arg):
        await asyncio.sleep(0.01)
    elif verb == "raise":
      raise RuntimeError("a backend bug")
    elif verb == "overlong":
      raise protocol.APIError(400, "The context is too long", param="messages",
                              code="context_length_exceeded")
    elif verb == "long":
      return " ".join(["w" * 1000] * int(arg))
    return None

  async def chat(self, request: protocol.ChatRequest, stream=None) -> protocol.Completion:
    self.loop = asyncio.get_running_loop()
    self.gate = self.gate or asyncio.Event()
    self.requests.append(request)
    self.in_flight += 1
    self.max_in_flight = max(self.max_in_flight, self.in_flight)
    try:
      last = request.messages[-1]
      answer = await self._command(last["content"] or "", request.n, stream)
    except asyncio.CancelledError:
      with self.lock:
        self.cancelled += 1
      raise
    finally:
      self.in_flight -= 1
    choices = []
    for i in range(request.n):
      if request.tools and last["role"] == "user":
        call = protocol.tool_call("add", {"a": 1, "b": i + 2})
        choices.append(protocol.Choice(i, None, (call,), "tool_calls"))
      else:
        text = answer or f"echo: {last['content']}" + (f" #{i}" if request.n > 1 else "")
        choices.append(protocol.Choice(i, text, (), "stop"))
    return protocol.Completion(tuple(choices), prompt_tokens=len(request.messages) * 10,
                               completion_tokens=7 * request.n)


def _user(text: str) -> list[dict]:
  return [{"role": "user", "content": text}]


def _wait_for(predicate, timeout_s: float = 5.0) -> bool:
  deadline = time.monotonic() + timeout_s
  while not predicate():
    if time.monotonic() > deadline:
      return False
    time.sleep(0.01)
  return True


class _ServerTest(absltest.TestCase):
  APP_KWARGS = {}

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cls.backend = EchoBackend()
    cls.server = serve_app.Server(serve_app.make_app(cls.backend, **cls.APP_KWARGS)).start()
    cls.client = openai.OpenAI(base_url=cls.server.url, api_key=KEY, max_retries=0)
    cls.http = httpx.Client(base_url=cls.server.url, headers={"authorization": f"Bearer {KEY}"})

  @classmethod
  def tearDownClass(cls):
    cls.http.close()
    cls.client.close()
    cls.server.stop()
    super().tearDownClass()

  def chat(self, text: str, **kwargs):
    return self.client.chat.completions.create(model="echo", messages=_user(text), **kwargs)


class ChatTest(_ServerTest):
  APP_KWARGS = {"api_key": KEY}

  def test_chat(self):
    response = self.client.chat.completions.create(
        model="echo", messages=[{"role": "system", "content": "Be brief."},
                                {"role": "user", "content": [{"type": "text", "text": "hi"},
                                                             {"type": "text", "text": "there"}]}],
        temperature=0.7, top_p=0.9, max_completion_tokens=64, stop=["\n\n"], seed=3,
        user="u-1", frequency_penalty=0.0, extra_headers={"X-Session-Id": "ep-1"})
    self.assertTrue(response.id.startswith("chatcmpl-"))
    self.assertEqual(response.object, "chat.completion")
    self.assertEqual(response.choices[0].message.content, "echo: hi\nthere")
    self.assertEqual(response.choices[0].finish_reason, "stop")
    self.assertEqual((response.usage.prompt_tokens, response.usage.total_tokens), (20, 27))
    request = self.backend.requests[-1]
    self.assertEqual(request.messages, [{"role": "system", "content": "Be brief."},
                                        {"role": "user", "content": "hi\nthere"}])
    self.assertEqual((request.temperature, request.top_p, request.max_tokens, request.stop,
                      request.seed, request.session, request.user),
                     (0.7, 0.9, 64, ("\n\n",), 3, "ep-1", "u-1"))
    self.chat("again", user="u-2")
    self.assertEqual(self.backend.requests[-1].session, "u-2")

  def test_tool_call_round_trip(self):
    messages = _user("What is 1 + 2?")
    first = self.client.chat.completions.create(model="echo", messages=messages, tools=TOOLS,
                                                tool_choice="auto")
    choice = first.choices[0]
    self.assertEqual(choice.finish_reason, "tool_calls")
    call = choice.message.tool_calls[0]
    self.assertEqual((call.function.name, json.loads(call.function.arguments)),
                     ("add", {"a": 1, "b": 2}))
    messages += [choice.message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "3"}]
    second = self.client.chat.completions.create(model="echo", messages=messages, tools=TOOLS)
    self.assertEqual(second.choices[0].message.content, "echo: 3")
    sent = self.backend.requests[-1]
    self.assertEqual(sent.messages[1], {"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "type": "function",
         "function": {"name": "add", "arguments": call.function.arguments}}]})
    self.assertEqual(sent.messages[2], {"role": "tool", "content": "3", "tool_call_id": call.id})
    self.assertEqual(sent.tools[0]["function"]["name"], "add")

  def test_stream(self):
    with self.client.chat.completions.stream(
        model="echo", messages=_user("one two three"),
        stream_options={"include_usage": True}) as stream:
      deltas = [e.delta for e in stream if e.type == "content.delta"]
      final = stream.get_final_completion()
    self.assertEqual(final.choices[0].message.content, "echo: one two three")
    self.assertEqual("".join(deltas), "echo: one two three")
    self.assertGreater(len(deltas), 2)
    self.assertEqual(final.usage.completion_tokens, 7)
    self.assertTrue(self.backend.requests[-1].include_usage)

  def test_pieces_stream_while_the_backend_works(self):
    stream = self.client.chat.completions.create(
        model="echo", messages=_user("drip"), n=2, stream=True,
        stream_options={"include_usage": True})
    chunks, seen = iter(stream), []
    for chunk in chunks:   # the role deltas, then each choice's first piece
      seen.append(chunk)
      if sum(bool(c.delta.content) for s in seen for c in s.choices) == 2:
        break
    self.assertEqual(self.backend.in_flight, 1)   # it has not answered yet
    self.backend.release("drip")
    seen += list(chunks)
    content = {0: "", 1: ""}
    for chunk in seen:
      for choice in chunk.choices:
        content[choice.index] += choice.delta.content or ""
    self.assertEqual(content, {0: "echo: drip #0", 1: "echo: drip #1"})
    self.assertEqual(seen[-1].usage.completion_tokens, 14)

  def test_stream_tool_calls_and_n(self):
    chunks = list(self.client.chat.completions.create(
        model="echo", messages=_user("add"), tools=TOOLS, n=2, stream=True))
    arguments = {0: "", 1: ""}
    for chunk in chunks:
      self.assertIsNone(chunk.usage)
      for choice in chunk.choices:
        for call in choice.delta.tool_calls or []:
          arguments[choice.index] += call.function.arguments or ""
    self.assertEqual([json.loads(arguments[i]) for i in (0, 1)],
                     [{"a": 1, "b": 2}, {"a": 1, "b": 3}])
    finishes = [c.finish_reason for chunk in chunks for c in chunk.choices if c.finish_reason]
    self.assertEqual(finishes, ["tool_calls", "tool_calls"])

  def test_n_choices(self):
    response = self.chat("hi", n=3)
    self.assertEqual([c.index for c in response.choices], [0, 1, 2])
    self.assertEqual([c.message.content for c in response.choices],
                     ["echo: hi #0", "echo: hi #1", "echo: hi #2"])

  def test_32_concurrent_sessions(self):
    async def run():
      async with openai.AsyncOpenAI(base_url=self.server.url, api_key=KEY,
                                    max_retries=0) as client:
        return await asyncio.gather(*[client.chat.completions.create(
            model="echo", messages=_user("gather 32"), extra_headers={"X-Session-Id": f"s{i}"})
            for i in range(32)])
    responses = asyncio.run(run())
    self.assertEqual({r.choices[0].message.content for r in responses}, {"echo: gather 32"})
    self.assertEqual(self.backend.max_in_flight, 32)
    self.assertEqual({r.session for r in self.backend.requests[-32:]},
                     {f"s{i}" for i in range(32)})

  def test_models(self):
    self.assertEqual([m.id for m in self.client.models.list()], ["echo", "echo-large"])
    self.assertEqual(self.client.models.retrieve("echo").owned_by, "agentrl")
    with self.assertRaises(openai.NotFoundError):
      self.client.models.retrieve("gpt-nope")

  def test_bad_requests_name_the_field(self):
    cases = [({"messages": []}, "messages"),
             ({"messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
             ({"temperature": 3.0}, "temperature"),
             ({"top_p": 0}, "top_p"),
             ({"n": 0}, "n"),
             ({"max_tokens": 0}, "max_tokens"),
             ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
             ({"tool_choice": "required"}, "tool_choice"),
             ({"messages": [{"role": "tool", "content": "3"}]}, "messages[0].tool_call_id"),
             ({"messages": [{"role": "user", "content": [
                 {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]},
              "messages[0].content[0]"),
             ({"logit_bias": {"42": 5}}, "logit_bias"),
             ({"response_format": {"type": "json_object"}}, "response_format")]
    for overrides, param in cases:
      with self.subTest(param=param):
        kwargs = {"model": "echo", "messages": _user("hi"), **overrides}
        with self.assertRaises(openai.BadRequestError) as caught:
          self.client.chat.completions.create(**kwargs)
        self.assertEqual((caught.exception.param, caught.exception.type),
                         (param, "invalid_request_error"))

  def test_malformed_bodies(self):
    for body in (b'{"model": "echo", "messages": [', b"[1, 2]", b"\xff\xfe"):
      with self.subTest(body=body):
        response = self.http.post("/chat/completions", content=body,
                                  headers={"content-type": "application/json"})
        self.assertEqual(response.status_code, 400)
        self.assertEqual(response.json()["error"]["type"], "invalid_request_error")
    missing = self.http.post("/chat/completions", json={"model": "echo"})
    self.assertEqual(missing.json()["error"]["param"], "messages")

  def test_unknown_model(self):
    with self.assertRaises(openai.NotFoundError) as caught:
      self.client.chat.completions.create(model="gpt-nope", messages=_user("hi"))
    self.assertEqual((caught.exception.code, caught.exception.param), ("model_not_found", "model"))

  def test_auth(self):
    bad = openai.OpenAI(base_url=self.server.url, api_key="wrong", max_retries=0)
    with self.assertRaises(openai.AuthenticationError) as caught:
      bad.chat.completions.create(model="echo", messages=_user("hi"))
    self.assertEqual(caught.exception.code, "invalid_api_key")
    bad.close()
    for headers in ({}, {"authorization": "Basic " + KEY}):
      response = httpx.get(self.server.url + "/models", headers=headers)
      self.assertEqual(response.status_code, 401)
      self.assertEqual(response.json()["error"]["type"], "authentication_error")

  def test_unknown_routes_and_methods_are_json(self):
    for method, path, status in (("GET", "/nope", 404), ("GET", "/chat/completions", 405)):
      response = self.http.request(method, path)
      self.assertEqual(response.status_code, status)
      self.assertIn("message", response.json()["error"])

  def test_backend_errors(self):
    for stream in (False, True):   # streamed: an HTTP error too, before any chunk
      with self.assertRaises(openai.BadRequestError) as caught:
        self.chat("overlong", stream=stream)
      self.assertEqual(caught.exception.code, "context_length_exceeded")
    errors = self.server.stats["serve/errors"]
    with self.assertLogs(level="ERROR"):
      with self.assertRaises(openai.InternalServerError) as caught:
        self.chat("raise")
    self.assertEqual((caught.exception.status_code, caught.exception.type), (500, "server_error"))
    self.assertNotIn("Traceback", caught.exception.response.text)
    self.assertEqual(self.server.stats["serve/errors"], errors + 1)
    self.assertEqual(self.chat("still up").choices[0].message.content, "echo: still up")


class LimitsTest(_ServerTest):
  APP_KWARGS = {"max_concurrent": 2, "request_timeout_s": 1.0}

  def test_too_many_concurrent_requests(self):
    rejected = self.server.stats["serve/rejected"]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
      held = [pool.submit(self.chat, "hold") for _ in range(2)]
      self.assertTrue(_wait_for(lambda: self.backend.in_flight == 2))
      with self.assertRaises(openai.RateLimitError) as caught:
        self.chat("hi")
      self.assertEqual(caught.exception.type, "rate_limit_error")
      self.backend.release()
      self.assertEqual([f.result().choices[0].message.content for f in held], ["echo: hold"] * 2)
    self.assertEqual(self.server.stats["serve/rejected"], rejected + 1)

  def test_backend_timeout(self):
    cancelled, timeouts = self.backend.cancelled, self.server.stats["serve/request_timeouts"]
    with self.assertRaises(openai.InternalServerError) as caught:
      self.chat("sleep 30")
    self.assertEqual((caught.exception.status_code, caught.exception.type),
                     (504, "timeout_error"))
    self.assertTrue(_wait_for(lambda: self.backend.cancelled == cancelled + 1))
    self.assertEqual(self.server.stats["serve/request_timeouts"], timeouts + 1)

  def test_disconnect_while_the_backend_works(self):
    cancelled, before = self.backend.cancelled, self.server.stats
    body = {"model": "echo", "messages": _user("sleep 30"), "stream": True}
    with self.assertRaises(httpx.ReadTimeout):
      httpx.post(self.server.url + "/chat/completions", json=body, timeout=0.3)
    self.assertTrue(_wait_for(lambda: self.backend.cancelled == cancelled + 1))
    self.assertTrue(_wait_for(
        lambda: self.server.stats["serve/disconnects"] == before["serve/disconnects"] + 1))
    self.assertEqual(self.server.stats["serve/request_timeouts"], before["serve/request_timeouts"])
    self.assertEqual(self.chat("next").choices[0].message.content, "echo: next")

  def test_disconnect_mid_stream(self):
    # A long answer streamed at its end; a backend still working after its first piece.
    for text, cancelled in (("long 20000", 0), ("drip 30", 1)):
      disconnects, before = self.server.stats["serve/disconnects"], self.backend.cancelled
      body = {"model": "echo", "messages": _user(text), "stream": True}
      with httpx.stream("POST", self.server.url + "/chat/completions", json=body) as response:
        self.assertEqual(response.status_code, 200)
        first = next(response.iter_lines())
      self.assertEqual(json.loads(first.removeprefix("data: "))["choices"][0]["delta"]["role"],
                       "assistant")
      self.assertTrue(_wait_for(
          lambda: self.server.stats["serve/disconnects"] == disconnects + 1))
      self.assertTrue(_wait_for(lambda: self.backend.cancelled == before + cancelled))
      self.assertEqual(self.chat("next").choices[0].message.content, "echo: next")

  def test_timeout_after_the_first_piece_is_an_error_event(self):
    before, cancelled = self.server.stats, self.backend.cancelled
    content = ""
    with self.assertRaisesRegex(openai.APIError, "did not answer within 1 s"):
      for chunk in self.chat("drip 30", stream=True):
        content += chunk.choices[0].delta.content or ""
    self.assertEqual(content, "echo: ")
    self.assertTrue(_wait_for(lambda: self.backend.cancelled == cancelled + 1))
    after = self.server.stats
    self.assertEqual([after[k] - before[k] for k in ("serve/errors", "serve/request_timeouts")],
                     [1, 1])


class ServerTest(absltest.TestCase):

  def test_a_taken_port_fails_in_start(self):
    app = serve_app.make_app(EchoBackend())
    with serve_app.Server(app) as server:
      self.assertTrue(server.url.startswith("http://127.0.0.1:"))
      self.assertEqual(httpx.get(server.url + "/models").status_code, 200)
      with self.assertRaises(OSError):
        serve_app.Server(app, port=server.port).start()
    with self.assertRaises(httpx.ConnectError):
      httpx.get(server.url + "/models")


if __name__ == "__main__":
  absltest.main()
