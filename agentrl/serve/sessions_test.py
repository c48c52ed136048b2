"""Client sessions as engine episodes: messages in, exact tokens out.

The protocol side is driven through `await hub.chat(ChatRequest(...))` on an asyncio loop in a
thread while `Engine.run` runs the sessions' ClientEnvs (a tiny random float32 transformer and
the hidden-rule task's ChatML tokenizer); tool-call parsing and rendering are checked on a
ClientEnv driven by a scripted "engine" thread, whose model turns are given texts. Streamed
content is checked piece by piece on both, over HTTP with the real `openai` client when serving,
and its detokenizer on a SentencePiece and a byte-level BPE tokenizer.
"""
import asyncio
import json
import threading
import time

from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np
import openai
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from agentrl.envs import tool_calls
from agentrl.harness import recipe
from agentrl.models import policy
from agentrl.models import testing
from agentrl.models import tokenizer
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import engine as engine_lib
from agentrl.rollout import pack
from agentrl.serve import app
from agentrl.serve import messages
from agentrl.serve import protocol
from agentrl.serve import serving
from agentrl.serve import sessions

TOK = recipe.task_tokenizer(mlc.ConfigDict(dict(name="hidden_rule", family="mixed",
                                                max_turns=3)))
CFG = transformer.Config(vocab=TOK.vocab_size, width=32, depth=2, heads=4, kv_heads=2,
                         head_dim=8, mlp=64, dtype=jnp.float32)
GRAPHDEF, PARAMS = testing.random_params(CFG)
ENGINE = engine_lib.Engine(GRAPHDEF, pad_id=TOK.pad_id, slots=32, chunk=4, env_workers=32)
RUN = dict(max_turns=2, max_new_tokens=8, max_len=256, temperature=1.0)
ADD = {"type": "function", "function": {
    "name": "add", "description": "Adds two numbers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "number"},
                                                    "b": {"type": "number"}}}}}
STOP = TOK.end_of_turn_ids[0]


def _request(messages, session=None, **kwargs):
  return protocol.ChatRequest(model="policy", messages=list(messages), session=session,
                              **kwargs)


def _assistant(completion, i=0):
  choice = completion.choices[i]
  message = {"role": "assistant", "content": choice.content}
  if choice.tool_calls:
    message["tool_calls"] = [dict(c) for c in choice.tool_calls]
  return message


def _sampled(env, text: str, prompt_tokens: int = 7):
  """What the engine's watch tells a session about a turn whose text is `text` (stopped): its
  ids two at a time as they are decoded, then the turn."""
  ids = TOK.encode(text) + [STOP]
  for k in range(0, len(ids), 2):
    env.hub.watch("decoded", env, np.asarray(ids[k:k + 2], np.int32))
  n = prompt_tokens + len(ids)
  env.hub.watch("sampled", env, agent_loop.Trajectory(
      tokens=np.asarray([0] * prompt_tokens + ids, np.int32),
      loss_mask=np.asarray([0] * prompt_tokens + [1] * len(ids), np.float32),
      turn=np.asarray([-1] * prompt_tokens + [0] * len(ids), np.int32),
      sampler_logp=np.zeros(n, np.float32), turn_rewards=[], reward=0.0, done=False,
      truncated=False, prompt_len=prompt_tokens))


class _Script(threading.Thread):
  """An "engine" that runs one ClientEnv with given model turns, recording what it saw."""

  def __init__(self, env, actions):
    super().__init__(daemon=True)
    self.env, self.actions, self.seen = env, actions, []

  def run(self):
    self.seen.append(self.env.reset(0))
    for action in self.actions:
      _sampled(self.env, action)
      result = self.env.step(action)
      self.seen.append(result)
      if result[2]:
        return


class ScriptedSessionTest(absltest.TestCase):

  def test_tool_call_round_trip(self):
    hub = sessions.SessionHub(TOK, model_name="policy", tool_format="hermes")
    env, = hub.open(1)
    call = '<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>'
    script = _Script(env, [f"Let me add.\n{call}", "It is 5."])
    script.start()
    messages = [{"role": "developer", "content": "Be brief."},
                {"role": "user", "content": "2+3?"}]

    pieces = ([], [])   # streamed: the call's text must not leak into the content

    async def agent():
      first = await hub.chat(_request(messages, env.session_id, tools=[ADD]),
                             lambda i, text: pieces[0].append(text))
      messages.append(_assistant(first))
      messages.append({"role": "tool", "tool_call_id": first.choices[0].tool_calls[0]["id"],
                       "content": "5"})
      second = await hub.chat(_request(messages, env.session_id, tools=[ADD]),
                              lambda i, text: pieces[1].append(text))
      hub.finish(env.session_id, 1.0)
      return first, second

    first, second = asyncio.run(agent())
    script.join(5)
    choice = first.choices[0]
    self.assertEqual((choice.content, choice.finish_reason), ("Let me add.", "tool_calls"))
    self.assertEqual(["".join(p) for p in pieces], ["Let me add.", "It is 5."])
    fn = choice.tool_calls[0]["function"]
    self.assertEqual((fn["name"], json.loads(fn["arguments"])), ("add", {"a": 2, "b": 3}))
    self.assertEqual((first.prompt_tokens, first.completion_tokens),
                     (7, len(TOK.encode(script.actions[0])) + 1))
    self.assertEqual(second.choices[0].content, "It is 5.")
    self.assertEqual(second.choices[0].finish_reason, "stop")
    # What the engine saw: the system prompt with the tools, the tool result as a tool turn.
    self.assertEqual(script.seen[0], "2+3?")
    self.assertTrue(env.system_prompt.startswith("Be brief.\n\n# Tools"))
    self.assertIn('"name": "add"', env.system_prompt)
    obs, reward, done, info = script.seen[1]
    self.assertEqual((obs, reward, done), ("<tool_response>5</tool_response>", 0.0, False))
    self.assertEqual(info["tool_results"], ["5"])
    self.assertEqual(script.seen[2][1:3], (1.0, True))
    self.assertEqual(hub.stats["serve/sessions"], 1.0)

  def test_diverged_history_fails_and_the_session_goes_on(self):
    hub = sessions.SessionHub(TOK, model_name="policy")
    env, = hub.open(1)
    script = _Script(env, ["one", "two"])
    script.start()
    messages = [{"role": "user", "content": "hi"}]

    async def agent():
      first = await hub.chat(_request(messages, env.session_id))
      edited = messages + [{"role": "assistant", "content": "edited"},
                           {"role": "user", "content": "go on"}]
      with self.assertRaisesRegex(protocol.APIError, "diverged at message 1"):
        await hub.chat(_request(edited, env.session_id))
      with self.assertRaisesRegex(protocol.APIError, "must be tool messages, then user"):
        await hub.chat(_request(messages + [_assistant(first)] * 2, env.session_id))
      good = messages + [_assistant(first), {"role": "user", "content": "go on"}]
      second = await hub.chat(_request(good, env.session_id))
      hub.finish(env.session_id, 0.5)
      return second

    self.assertEqual(asyncio.run(agent()).choices[0].content, "two")
    script.join(5)
    self.assertEqual(script.seen[1][0], "go on")
    self.assertEqual(hub.stats["serve/diverged"], 1.0)

  def test_first_request_with_history_becomes_examples(self):
    hub = sessions.SessionHub(TOK, model_name="policy", tool_format="tags")
    env, = hub.open(1)
    script = _Script(env, ["done"])
    script.start()
    call = {"id": "c1", "type": "function",
            "function": {"name": "add", "arguments": '{"a": 1, "b": 1}'}}
    messages = [{"role": "system", "content": "Use tools."},
                {"role": "user", "content": "1+1?"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "2"},
                {"role": "assistant", "content": "<answer>2</answer>"},
                {"role": "user", "content": "2+2?"}]
    asyncio.run(hub.chat(_request(messages, env.session_id, tools=[ADD])))
    hub.drop(env.session_id, "test over")
    script.join(5)
    self.assertEqual(script.seen[0], "2+2?")
    self.assertEqual(env.examples, (
        {"role": "user", "content": "1+1?"},
        {"role": "assistant", "content": '<add>{"a": 1, "b": 1}</add>'},
        {"role": "user", "content": "<result>2</result>", "tool_results": ["<result>2</result>"]},
        {"role": "assistant", "content": "<answer>2</answer>"}))
    self.assertEqual(script.seen[1][3]["dropped"], "test over")

  def test_bad_tools_and_requests(self):
    bad = {"type": "function", "function": {"name": "flag", "parameters": {
        "type": "object", "properties": {"on": {"type": "boolean"}}}}}
    with self.assertRaisesRegex(protocol.APIError, r"'flag'.*argument 'on'.*'boolean'"):
      messages.tools_of([bad])
    hub = sessions.SessionHub(TOK, model_name="policy")
    env, = hub.open(1)
    user = [{"role": "user", "content": "hi"}]
    cases = [(_request(user), "X-Session-Id"), (_request(user, "nope"), "unknown session"),
             (_request(user, env.session_id, n=2), "n=2"),
             (_request(user, env.session_id, tools=[bad]), "boolean"),
             (_request(user, env.session_id, tool_choice="required"), "tool_choice"),
             (protocol.ChatRequest(model="other", messages=user), "does not exist")]
    for request, message in cases:
      with self.assertRaisesRegex(protocol.APIError, message):
        asyncio.run(hub.chat(request))

  def test_reply_parses_the_families_formats(self):
    calc = tool_calls.Tool("calc", "Evaluates.", {"expression": "string"})
    choice = messages.reply("Compute <calc>2+3</calc>", tool_calls.Toolbox([calc], "tags"),
                            stopped=False)
    self.assertEqual(choice.content, "Compute")
    self.assertEqual(choice.tool_calls[0]["function"]["arguments"], '{"expression": "2+3"}')
    cut = messages.reply('<tool_call>{"name": "calc", "arguments": {"expression": "1"}}',
                         tool_calls.Toolbox([calc], "hermes"), stopped=True)
    self.assertEqual((cut.content, cut.finish_reason), (None, "tool_calls"))
    plain = messages.reply("no calls <tool_call>not json</tool_call>",
                           tool_calls.Toolbox([calc], "hermes"), stopped=False)
    self.assertEqual((plain.tool_calls, plain.finish_reason), ((), "length"))
    self.assertEqual(plain.content, "no calls <tool_call>not json</tool_call>")

  def test_too_many_sessions(self):
    hub = sessions.SessionHub(TOK, model_name="policy", max_sessions=1, serving=True)
    user = [{"role": "user", "content": "hi"}]
    with self.assertRaisesRegex(ValueError, "over max_sessions=1"):
      hub.open(2)

    async def clients():
      waiting = asyncio.ensure_future(hub.chat(_request(user)))   # no engine takes it
      await asyncio.sleep(0.01)
      with self.assertRaises(protocol.APIError) as full:
        await hub.chat(_request(user))
      self.assertEqual((full.exception.status, full.exception.code), (429, "too_many_sessions"))
      self.assertLen(hub.arrivals(0.0), 1)
      hub.close_all("the server stopped")
      self.assertIsNone(hub.arrivals(0.0))
      with self.assertRaisesRegex(protocol.APIError, "dropped .the server stopped"):
        await waiting

    asyncio.run(clients())

  def test_a_client_that_disconnects_drops_its_session(self):
    hub = sessions.SessionHub(TOK, model_name="policy")
    env, = hub.open(1)

    async def client():
      request = asyncio.ensure_future(
          hub.chat(_request([{"role": "user", "content": "hi"}], env.session_id)))
      await asyncio.sleep(0.01)
      request.cancel()          # what the server does when the connection closes
      await asyncio.sleep(0.01)

    asyncio.run(client())
    self.assertIn("disconnected", env.dropped)
    with self.assertRaises(sessions.SessionDropped):
      env.reset(0)

  def test_timeout_drops_the_session(self):
    hub = sessions.SessionHub(TOK, model_name="policy", session_timeout_s=0.2)
    env, = hub.open(1)
    with self.assertRaises(Exception):
      env.reset(0)
    self.assertIn("session_timeout_s", env.dropped)
    self.assertEqual((hub.stats["serve/timeouts"], hub.stats["serve/dropped"]), (1.0, 1.0))
    with self.assertRaisesRegex(protocol.APIError, "ended: dropped"):
      env.submit(_request([{"role": "user", "content": "late"}], env.session_id))


class StreamedTextTest(absltest.TestCase):

  def test_streamable_text_never_takes_back(self):
    calc = tool_calls.Tool("calc", "Evaluates.", {"expression": "string"})
    call = '<tool_call>{"name": "calc", "arguments": {"expression": "1"}}</tool_call>'
    cases = [("Let me see.\n" + call + " done", "hermes", ()),
             (call, "hermes", ()), ("  spaced " + call, "hermes", ()),
             ("a <b> <tool_call>not json</tool_call> c", "hermes", ()),
             ("Compute <calc>2+3</calc>", "tags", ()), ("no calls at all", "tags", ()),
             ("one STOP two", None, ("STOP", "xyz")), ("a <calc>1</calc> END b", "tags", ("END",))]
    for text, fmt, stop in cases:
      toolbox = fmt and tool_calls.Toolbox([calc], fmt)
      cut = messages.first_of(text, stop)
      content = messages.reply(text[:cut] if cut >= 0 else text, toolbox, True).content or ""
      streamed = [messages.streamable(text[:k], toolbox, stop) for k in range(len(text) + 1)]
      for before, after in zip(streamed, streamed[1:]):
        self.assertTrue(after.startswith(before), (text, before, after))
      self.assertTrue(content.startswith(streamed[-1]), (text, streamed[-1], content))
    toolbox = tool_calls.Toolbox([calc], "hermes")
    self.assertEqual(messages.streamable("Let me see.\n<tool_", toolbox), "Let me see.")
    self.assertEqual(messages.streamable("x < 2", toolbox), "x < 2")   # "< " starts no tag
    self.assertEqual(messages.streamable("x <", toolbox), "x")
    self.assertEqual(messages.streamable("one ST", None, ("STOP",)), "one ")

  def test_turn_text_of_sentencepiece_and_byte_level_tokenizers(self):
    lines = ["the cat sat on the mat while seven dogs ran past the old red barn"] * 20
    # SentencePiece's word starts ("\u2581cat") decode with their space, but not the first.
    sp = tokenizer.train_sentencepiece(lines, 340, add_dummy_prefix=True)
    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    text = "the cat é sat ✓ on 😀 mat"   # characters of 2, 3 and 4 bytes, one token per byte
    for name, encode, decode, stop_id in (("sentencepiece", sp.encode, sp.decode, sp.eos_id),
                                          ("byte-level", lambda t: bpe.encode(t).ids,
                                           bpe.decode, bpe.token_to_id("<eos>"))):
      ids = encode(text) + [stop_id]
      for chunk in (1, 2, 3):
        with self.subTest(name=name, chunk=chunk):
          turn = messages.TurnText(decode, {stop_id})
          pieces = [turn.add(ids[k:k + chunk]) for k in range(0, len(ids), chunk)]
          self.assertEqual("".join(pieces), text)
          self.assertFalse(any("\ufffd" in p for p in pieces))
          if chunk == 1:
            self.assertIn(" cat", pieces)
            self.assertIn("😀", pieces)   # on the token of its last byte, the others ""
            self.assertEqual(pieces[pieces.index("😀") - 3:pieces.index("😀")], [""] * 3)


class _Loop:
  """An asyncio loop on a thread (the server's), running the agents."""

  def __init__(self):
    self.loop = asyncio.new_event_loop()
    self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
    self.thread.start()

  def submit(self, coro):
    return asyncio.run_coroutine_threadsafe(coro, self.loop)

  def close(self):
    self.loop.call_soon_threadsafe(self.loop.stop)
    self.thread.join(5)


def _check_exact(test, traj, env):
  """The trajectory's sampled ids are the turns' ids, and decode to the texts returned."""
  test.assertEqual(env.trajectory.tokens.tolist(), traj.tokens.tolist())
  sampled = traj.tokens[traj.loss_mask > 0].tolist()
  test.assertEqual(sampled, [int(t) for turn in env.turns for t in turn.ids])
  for turn in env.turns:
    ids = turn.ids[:-1] if turn.choice.finish_reason == "stop" else turn.ids
    test.assertEqual(TOK.decode(ids), turn.text)
    test.assertEqual(turn.choice.content, turn.text)   # no tools: the text as it is
    start = turn.prompt_tokens
    test.assertEqual(traj.tokens[start:start + len(turn.ids)].tolist(), turn.ids.tolist())


class EngineSessionsTest(absltest.TestCase):

  def test_training_sessions(self):
    hub = sessions.SessionHub(TOK, model_name="policy", session_timeout_s=2.0,
                              max_turns=RUN["max_turns"], max_new_tokens=RUN["max_new_tokens"])
    envs = hub.open(32)
    ids = [e.session_id for e in envs]
    errors, pieces = {}, []

    async def agent(i):
      sid = ids[i]
      messages = [{"role": "system", "content": "You play a game."},
                  {"role": "user", "content": f"Round {i}: guess."}]
      if i == 4:
        for request in (_request(messages), _request(messages, "nope"),
                        _request(messages, sid, n=2)):
          try:
            await hub.chat(request)
          except protocol.APIError as e:
            errors.setdefault(i, []).append(e.message)
      extra = dict(temperature=0.3, seed=1) if i == 5 else {}
      stream = (lambda _, text: pieces.append(text)) if i == 7 else None
      first = await hub.chat(_request(messages, sid, **extra), stream)
      messages += [_assistant(first), {"role": "user", "content": "Again."}]
      if i == 0:
        try:
          await hub.chat(_request(messages[:2] + [{"role": "assistant", "content": "x"}]
                                  + messages[3:], sid))
        except protocol.APIError as e:
          errors[i] = [e.message]
      if i == 2:
        hub.drop(sid, "the agent crashed")
      if i == 3:
        await asyncio.sleep(2.5)
      if i in (2, 3):
        try:
          await hub.chat(_request(messages, sid))
        except protocol.APIError as e:
          errors[i] = [e.message]
        return [first]
      if i == 6:   # two requests at once: the second is refused
        both = await asyncio.gather(hub.chat(_request(messages, sid)),
                                    hub.chat(_request(messages, sid)), return_exceptions=True)
        errors[i] = [str(x) for x in both if isinstance(x, protocol.APIError)]
        second = next(x for x in both if not isinstance(x, Exception))
      else:
        second = await hub.chat(_request(messages, sid))
      if i == 1:   # past max_turns=2
        messages += [_assistant(second), {"role": "user", "content": "More."}]
        try:
          await hub.chat(_request(messages, sid))
        except protocol.APIError as e:
          errors[i] = [e.message]
      hub.finish(sid, float(i))
      return [first, second]

    loop = _Loop()
    futures = [loop.submit(agent(i)) for i in range(32)]
    trajs, metrics = ENGINE.run(PARAMS, TOK, envs, [0] * 32, rng=jax.random.key(3),
                                watch=hub.watch, **RUN)
    replies = [f.result(10) for f in futures]
    loop.close()
    hub.close_all()

    self.assertEqual(metrics["rollout/turns_mean"] > 1.5, True)
    self.assertLen(errors[4], 3)
    self.assertIn("X-Session-Id", errors[4][0])
    self.assertIn("diverged at message 2", errors[0][0])
    self.assertIn("ended: turn limit (max_turns=2)", errors[1][0])
    self.assertIn("ended: dropped (the agent crashed)", errors[2][0])
    self.assertIn("ended: dropped (no request within session_timeout_s=2.0)", errors[3][0])
    self.assertLen(errors[6], 1)
    self.assertIn("in flight", errors[6][0])
    # Streamed as decoded: all of the turn's text but an incomplete last character.
    self.assertEqual("".join(pieces), envs[7].turns[0].text.rstrip("\ufffd"))
    self.assertEqual(hub.stats, {"serve/sessions": 32.0, "serve/dropped": 2.0,
                                 "serve/timeouts": 1.0, "serve/diverged": 1.0,
                                 "serve/ignored_sampling": 1.0})
    for i, (traj, env) in enumerate(zip(trajs, envs)):
      _check_exact(self, traj, env)
      if i in (2, 3):
        self.assertTrue(traj.infos[-1]["dropped"])
        continue
      self.assertLen(env.turns, 2)
      for reply, turn in zip(replies[i], env.turns):
        self.assertEqual(reply.prompt_tokens, turn.prompt_tokens)
        self.assertEqual(reply.completion_tokens, len(turn.ids))
      if i == 1:   # the engine's turn limit ended it; the reward is the env's
        self.assertEqual((traj.truncated, traj.reward, env.reward), (True, 0.0, 1.0))
      else:
        self.assertEqual((traj.done, traj.reward), (True, float(i)))
    # The trainer's log-probs of the packed rows are the sampler's.
    batch = pack.pack_numpy(trajs, max_len=RUN["max_len"], pad_id=TOK.pad_id)
    model = nnx.merge(GRAPHDEF, PARAMS)
    logp = np.asarray(policy.token_logprobs(
        model, jnp.asarray(batch.tokens_BT), jnp.asarray(batch.positions_BT),
        jnp.asarray(batch.input_mask_BT), temperature=RUN["temperature"]))
    mask = np.asarray(batch.loss_mask_BT) > 0
    np.testing.assert_allclose(logp[mask], np.asarray(batch.sampler_logp_BT)[mask], atol=1e-5)

  def test_serving_sessions_arrive_mid_run(self):
    recorded = {}
    backend = serving.EngineBackend(
        ENGINE, PARAMS, TOK, model_name="policy", max_sessions=32, session_timeout_s=1.0,
        record=lambda sid, traj: recorded.setdefault(sid, traj), **RUN)
    backend.start()
    loop = _Loop()
    user = [{"role": "user", "content": "Guess a number."}]

    async def client():
      sid = "conversation-1"
      first = await backend.chat(_request(user, sid))
      await asyncio.sleep(0.2)   # the others arrive while the run goes on
      pair = await backend.chat(_request(user, n=2, temperature=0.0))
      with self.assertRaisesRegex(protocol.APIError, "temperature=1.0"):
        await backend.chat(_request(user, temperature=0.5))
      with self.assertRaises(protocol.APIError) as long:
        await backend.chat(_request([{"role": "user", "content": "guess " * 300}]))
      self.assertEqual(long.exception.code, "context_length_exceeded")
      messages = user + [_assistant(first), {"role": "user", "content": "Again."}]
      second = await backend.chat(_request(messages, sid))
      return first, pair, second

    first, pair, second = loop.submit(client()).result(60)
    loop.close()
    time.sleep(1.5)   # conversation-1 times out: the end of a served session
    backend.stop(10)
    self.assertIsNone(backend.error)
    self.assertEqual(pair.choices[0].content, pair.choices[1].content)   # greedy, one prompt
    self.assertEqual([c.index for c in pair.choices], [0, 1])
    self.assertLen(recorded, 4)   # conversation-1, the pair, the long one; not the refused one
    traj = recorded["conversation-1"]
    sampled = traj.tokens[traj.loss_mask > 0]
    self.assertLen(sampled, first.completion_tokens + second.completion_tokens)
    for completion in (first, second):   # the returned text is the decoding of the ids
      start, n = completion.prompt_tokens, completion.completion_tokens
      ids = traj.tokens[start:start + n]
      self.assertTrue(np.all(traj.loss_mask[start:start + n] > 0))
      choice = completion.choices[0]
      self.assertEqual(TOK.decode(ids[:-1] if choice.finish_reason == "stop" else ids),
                       choice.content)
    self.assertEqual(backend.stats["serve/sessions"], 4.0)
    self.assertEqual(backend.stats["serve/timeouts"], 1.0)
    self.assertGreater(backend.metrics["rollout/sampled_tokens"], 0)

  def test_streaming_over_http(self):
    backend = serving.EngineBackend(ENGINE, PARAMS, TOK, model_name="policy", max_sessions=4,
                                     session_timeout_s=1.0, max_turns=1, max_new_tokens=24,
                                     max_len=256)
    backend.start()
    self.addCleanup(backend.stop, 10)
    server = app.Server(app.make_app(backend)).start()
    self.addCleanup(server.stop)
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0)
    self.addCleanup(client.close)
    user = [{"role": "user", "content": "Guess a number."}]
    plain = client.chat.completions.create(model="policy", messages=user, temperature=0)
    chunks = list(client.chat.completions.create(
        model="policy", messages=user, temperature=0, n=2, stream=True,
        stream_options={"include_usage": True}))
    deltas = {0: [], 1: []}
    for chunk in chunks:
      for choice in chunk.choices:
        if choice.delta.content:
          deltas[choice.index].append(choice.delta.content)
    content = plain.choices[0].message.content
    self.assertEqual(["".join(deltas[i]) for i in (0, 1)], [content, content])
    self.assertGreater(len(deltas[0]), 3)   # sent as the chunks (4 steps) were decoded
    self.assertEqual(chunks[-1].usage.completion_tokens, 2 * plain.usage.completion_tokens)
    with self.assertRaises(openai.BadRequestError) as long:   # found before sampling: HTTP
      client.chat.completions.create(
          model="policy", messages=[{"role": "user", "content": "guess " * 300}], stream=True)
    self.assertEqual(long.exception.code, "context_length_exceeded")


if __name__ == "__main__":
  absltest.main()
