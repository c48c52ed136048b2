import json

from absl.testing import absltest

from agentrl.serve import protocol


def _parse(headers=None, **fields):
  body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
  return protocol.parse_chat_request(json.dumps(body).encode(), headers or {})


def _param(test, **fields) -> str | None:
  with test.assertRaises(protocol.APIError) as caught:
    _parse(**fields)
  test.assertEqual(caught.exception.status, 400)
  return caught.exception.param


class ParseTest(absltest.TestCase):

  def test_defaults(self):
    request = _parse()
    self.assertEqual((request.n, request.stop, request.stream, request.include_usage,
                      request.tools, request.tool_choice, request.session),
                     (1, (), False, False, None, None, None))

  def test_aliases_and_session(self):
    request = _parse({"X-SESSION-ID": "ep"}, max_completion_tokens=5, stop="\n", user="u",
                     stream=True, stream_options={"include_usage": True}, presence_penalty=1)
    self.assertEqual((request.max_tokens, request.stop, request.session, request.include_usage),
                     (5, ("\n",), "ep", True))
    self.assertEqual(_parse(user="u").session, "u")

  def test_bounds(self):
    self.assertEqual(_parse(temperature=0, top_p=1, n=128).temperature, 0.0)
    self.assertEqual(_param(self, temperature=True), "temperature")
    self.assertEqual(_param(self, top_p=1.5), "top_p")
    self.assertEqual(_param(self, n=129), "n")
    self.assertEqual(_param(self, seed=1.5), "seed")
    self.assertEqual(_param(self, max_tokens="8"), "max_tokens")
    self.assertEqual(_param(self, stream="yes"), "stream")

  def test_refusals(self):
    self.assertEqual(_parse(logprobs=False, response_format={"type": "text"}).n, 1)
    self.assertEqual(_param(self, logprobs=True), "logprobs")
    self.assertEqual(_param(self, top_logprobs=2), "top_logprobs")
    self.assertEqual(_param(self, functions=[{"name": "f"}]), "functions")
    self.assertEqual(_param(self, messages=[{"role": "assistant"}]), "messages[0].content")

  def test_tool_choice_must_name_a_tool(self):
    tools = [{"type": "function", "function": {"name": "f"}}]
    named = {"type": "function", "function": {"name": "f"}}
    self.assertEqual(_parse(tools=tools, tool_choice=named).tool_choice, named)
    self.assertEqual(_parse(tools=tools).tools[0]["function"]["parameters"]["type"], "object")
    self.assertEqual(_param(self, tools=tools, tool_choice={"function": {"name": "g"}}),
                     "tool_choice")
    self.assertEqual(_param(self, tools=[{"type": "function", "function": {}}]),
                     "tools[0].function.name")

  def test_bad_json_names_no_field(self):
    for body in (b"{", b'"text"'):
      with self.assertRaises(protocol.APIError) as caught:
        protocol.parse_chat_request(body, {})
      self.assertIsNone(caught.exception.param)
      self.assertEqual(protocol.error_body(caught.exception)["error"]["type"],
                       "invalid_request_error")


class BodiesTest(absltest.TestCase):

  def test_pieces_concatenate(self):
    for text in ("", "one", " two  words\n", "a\tb c "):
      self.assertEqual("".join(protocol.pieces(text)), text)
    self.assertEqual(protocol.pieces("a b  c"), ["a ", "b  ", "c"])

  def test_chunks_rebuild_the_completion(self):
    call = protocol.tool_call("f", {"x": 1}, "call_1")
    completion = protocol.Completion((protocol.Choice(0, "hello big world"),
                                      protocol.Choice(1, None, (call,), "tool_calls")), 5, 9)
    maker = protocol.Chunks("id", "m", 0, include_usage=True)
    first, second = completion.choices
    chunks = (maker.opening([0, 1]) + [maker.content(0, "hello b")]   # streamed while sampled
              + maker.ending(first, sent="hello b") + maker.ending(second)
              + maker.usage(completion))
    content, arguments, finish = {0: "", 1: ""}, "", {}
    for chunk in chunks[:-1]:
      self.assertIsNone(chunk["usage"])
      (choice,) = chunk["choices"]
      content[choice["index"]] += choice["delta"].get("content") or ""
      for delta in choice["delta"].get("tool_calls", []):
        arguments += delta["function"]["arguments"]
      if choice["finish_reason"]:
        finish[choice["index"]] = choice["finish_reason"]
    self.assertEqual((content, json.loads(arguments), finish),
                     ({0: "hello big world", 1: ""}, {"x": 1}, {0: "stop", 1: "tool_calls"}))
    self.assertEqual(chunks[-1]["choices"], [])
    self.assertEqual(chunks[-1]["usage"],
                     {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14})
    body = protocol.completion_body("id", "m", 0, completion)
    self.assertEqual(body["choices"][1]["message"]["tool_calls"], [call])
    self.assertNotIn("tool_calls", body["choices"][0]["message"])

  def test_choice_checks_the_finish_reason(self):
    with self.assertRaises(ValueError):
      protocol.Choice(0, "x", (), "eos")


if __name__ == "__main__":
  absltest.main()
