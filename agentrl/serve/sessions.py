"""Chat sessions as rollout episodes: the backend of the OpenAI-compatible server.

A client session (the requests of one conversation, tied by the X-Session-Id header or the
`user` field) is one episode of the rollout engine (agentrl/rollout/engine.py), seen from the
engine as an env, `ClientEnv`:

  reset(seed)   blocks until the session's first request and returns its last user message;
                the env's `system_prompt` is the request's system (and developer) messages
                followed by the tools' part of the system prompt in the configured
                `tool_format` (envs/tool_calls.py `Toolbox.system_prompt`, the text the tool
                envs train with), and its `examples` are the messages between the system
                messages and that user message.
  step(action)  hands the sampled turn back to the waiting request, then blocks until the
                session's next request and returns its new messages as the observation: tool
                results (with info["tool_results"], so the Renderer renders them in the
                template's tool role as for any tool env) or user text.

Token-in, token-out. The engine samples a turn's ids and feeds them back as they are; the text
a client gets is parsed from their decoding (content, and `tool_calls` read by the model
family's parser) and is never tokenized again: the next request's history is checked against
what the session returned (message for message, content and tool calls), and only its new
messages are rendered and prefilled. So a session's trajectory holds exactly the sampled ids,
with the sampler's log-probs, and nothing a client re-serialized.

Training (`SessionHub`, an experiment's rollout):

  hub = SessionHub(tok, model_name="policy", tool_format="hermes", temperature=1.0)
  envs = hub.open(32)                              # give envs[i].session_id to agent i
  trajs, metrics = engine.run(params, tok, envs, seeds, watch=hub.watch, ...)
  # meanwhile each agent calls the server with its session id, then hub.finish(id, reward)
  hub.close_all()

`watch=hub.watch` is required: it tells a session its turn's ids as they are decoded, its
turn's token counts and its end. A session's episode ends when `finish(reward)` answers its
blocked step (done, that reward), when it is dropped (`drop(why)`, a client that waited more
than session_timeout_s, a client that disconnected while its request was sampled,
`close_all`: info["dropped"] says why and `env.dropped` too, so the experiment trains on none
of it), or when the rollout's max_turns or max_len ends it: the session's next request then
fails with a 400 naming the limit, and a later `finish(reward)` only sets `env.reward` (the
experiment reads it there).

Sampling parameters. The engine samples a whole run with one temperature and top_p, and the
trainer's log-probs assume them, so in training a request's temperature, top_p, seed, stop and
max_tokens are not applied; a request that asks for other values than the run's is counted in
serve/ignored_sampling. When serving (`serving.EngineBackend`), temperature 0 samples that
session greedily, any other temperature or top_p must equal the server's (400 naming it), `stop`
cuts the reply of a session-less request (a one-turn episode) and is ignored otherwise;
seed and a max_tokens below the server's max_new_tokens are not applied (counted).

Messages. A request's messages are system/developer messages first, then user, assistant and
tool messages; a session's first request ends with a user message. After an assistant turn,
new messages are tool messages (answering that turn's calls by tool_call_id), user messages,
or tool messages then user messages (rendered together as one user message). A tool must be
expressible as a `tool_calls.Tool`: arguments typed string, number or integer (a 400 names the
tool and argument otherwise); tool_choice "auto" or "none" ("none": calls are not parsed).

Streaming. `chat(request, stream=f)` calls f(choice index, text) on the event loop with each
next piece of a choice's content while its turn is sampled: the engine's watch hands a
session its turn's ids after every decode chunk (`Engine(chunk=...)` steps), and the event
loop decodes them (`messages.TurnText`). The pieces concatenate to a prefix of the choice's
content (the rest comes with the reply): an incomplete character, a possible stop string and,
for a request with tools, anything from a possible tool call on wait (`messages.streamable`).
Nothing else changes: the engine samples the same ids, and the trajectory is the same.

Counters (`hub.stats`): serve/sessions (opened), serve/dropped, serve/timeouts (dropped for
waiting too long), serve/diverged (requests whose history did not match), serve/ignored_sampling.

Threads. `chat` runs on the server's event loop and never blocks it: a request is checked and
handed to its session under the session's lock, and its reply is a concurrent future the
engine's env thread completes. Every open session holds one of the engine's env workers while it
waits for its client, so the engine needs env_workers >= the sessions open at once and an
env_timeout_s above session_timeout_s (`check_engine`); it also holds a decode slot (a KV
cache row), so at most `slots` sessions are under way and the others' first requests wait.

Plain rendering. A run whose task.chat_template is False (the scratch tiny models, trained on
raw text) is served as it was trained: a first request becomes BOS, the system text (system
messages, then the tools' part) and each message's text, an assistant's followed by EOS (where a
sampled plain turn stops), consecutive non-assistant texts joined by a blank line
(`messages.plain`, agentrl/rollout/agent_loop.py); later messages are appended as raw text (tool
results in the tool format's own text). So a conversation of user messages alone gets exactly
the ids the run's rollouts gave its observations.

Serving (`serving.EngineBackend`, agentrl/serve/serving.py): a SessionHub with serving=True,
whose sessions open themselves at their first request and join one never-ending engine run
(`arrivals`).
"""
import asyncio
import collections
import concurrent.futures
import dataclasses
import functools
import json
import queue
import threading
import time
import uuid
from typing import Callable

from absl import logging
import numpy as np

from agentrl.envs import base
from agentrl.envs import safe
from agentrl.envs import tool_calls
from agentrl.rollout import agent_loop
from agentrl.serve import messages as msg
from agentrl.serve import protocol

HEADER = "X-Session-Id"
# Engine.run's gather_s for sessions: a client's next request comes back over HTTP a few ms
# after its reply, those of many sessions some ms apart, so a decode chunk waits over such
# gaps to take them together (docs/performance.md, "Agent programs through the server").
GATHER_S = 0.02
STATS = ("serve/sessions", "serve/dropped", "serve/timeouts", "serve/diverged",
         "serve/ignored_sampling")
_ENDED_KEPT = 4096   # ended sessions remembered, so their requests get "ended", not "unknown"


class SessionDropped(RuntimeError):
  """A session ended before its first request was sampled (dropped, closed or finished)."""


@dataclasses.dataclass(frozen=True)
class SampledTurn:
  """One model turn of a session, as sampled and as returned.

  Attributes:
    ids: the sampled ids (the stop id included when the turn stopped).
    text: their decoding without the stop id (the env's action).
    prompt_tokens: the transcript's length before the turn.
    choice: what the client got.
  """
  ids: np.ndarray
  text: str
  prompt_tokens: int
  choice: protocol.Choice


@dataclasses.dataclass
class _Request:
  """A request handed to a session: what to feed the engine, and its reply."""
  request: protocol.ChatRequest
  messages: list[dict]            # the normalized history it carries
  future: concurrent.futures.Future
  opening: dict | None = None     # first request: system_prompt, examples, user
  obs: str = ""                   # later request: the observation text
  tool_results: list[str] | None = None
  stream: "_Stream | None" = None  # a streamed request's content pieces


class _Stream:
  """Carries a streamed request's sampled ids from the engine's scheduler thread to the
  server's event loop, which turns them into content pieces for `on_text`."""

  def __init__(self, loop: asyncio.AbstractEventLoop, on_text: Callable[[str], None],
               text: msg.TurnText):
    self.loop, self.on_text, self.text = loop, on_text, text
    self.closed = False          # the request was answered or cancelled: no more pieces
    self._lock = threading.Lock()
    self._ids = []               # ids not yet decoded

  def push(self, ids) -> None:
    """Queues a decode chunk's ids (scheduler thread): cheap, and never raises."""
    with self._lock:
      wake = not self._ids
      self._ids.extend(ids)
    if wake:
      self._on_loop(self._drain)

  def _drain(self) -> None:
    with self._lock:
      ids, self._ids = self._ids, []
    if not self.closed:
      piece = self.text.add(ids)
      if piece:
        self.on_text(piece)

  def end(self, _=None) -> None:
    """Ends the stream once the pieces queued so far are out (any thread; the request was
    answered or cancelled): they reach the loop before its answer does."""
    self._on_loop(self._close)

  def _close(self) -> None:
    self.closed = True

  def _on_loop(self, callback) -> None:
    try:
      self.loop.call_soon_threadsafe(callback)
    except RuntimeError:   # the server's loop is closed: no one reads the stream
      self.closed = True


# Messages.


def _set(future: concurrent.futures.Future, *, result=None, error=None) -> None:
  """Completes a reply future unless it is done (e.g. cancelled: the client went away)."""
  try:
    if error is not None:
      future.set_exception(error)
    else:
      future.set_result(result)
  except concurrent.futures.InvalidStateError:
    pass


class ClientEnv:
  """One client session seen from the engine as an env (module docstring).

  Attributes:
    session_id: the id its requests carry (X-Session-Id header or `user`).
    turns: its model turns (`SampledTurn`), in order.
    reward: the reward `finish` gave (None before).
    dropped: why the episode was dropped ("" if it was not).
    ended: why the session ended ("" while it is open).
    trajectory: its trajectory once the engine ended the episode (None before).
  """
  replayable = False
  max_turns = 2**31 - 1   # the rollout's max_turns ends it

  def __init__(self, hub: "SessionHub", session_id: str, *, one_turn: bool = False,
               greedy: bool = False):
    self.hub, self.session_id, self.one_turn, self.greedy = hub, session_id, one_turn, greedy
    self.system_prompt, self.examples = "", ()
    self.turns: list[SampledTurn] = []
    self.reward, self.dropped, self.ended, self.trajectory = None, "", "", None
    self._cv = threading.Condition()
    self._inbox = None       # a request accepted but not yet taken by reset/step
    self._pending = None     # the request whose reply the engine is sampling
    self._history = None     # normalized messages so far; None before the first request
    self._toolbox, self._tools_key = None, None
    self._sampled = None     # (ids, prompt_tokens) of the turn just sampled (watch)
    self._finish = None      # the reward `finish` gave while the session was open

  # The server's side (event loop thread).

  def submit(self, request: protocol.ChatRequest,
             on_text: Callable[[str], None] | None = None) -> concurrent.futures.Future:
    """Checks a request against the session and hands it over; its reply future. Raises
    APIError when the session cannot take it. `on_text` (called on the event loop that
    submits) streams the reply's content (module docstring, *Streaming*)."""
    with self._cv:
      if self.ended or self.dropped or self._finish is not None:
        raise msg.bad(f"session {self.session_id} ended: {self._why()}", None)
      if self._inbox is not None or self._pending is not None:
        raise msg.bad(f"session {self.session_id} already has a request in flight; send the "
                   "next one after its reply.", None)
      messages = msg.normalize(request.messages)
      item = _Request(request, messages, concurrent.futures.Future())
      if self._history is None:
        self._open(item)
      else:
        self._continue(item)
      if on_text is not None:
        parse = self._toolbox if request.tool_choice != "none" else None
        text = msg.TurnText(self.hub.tok.decode, self.hub.stop_ids, parse,
                            request.stop if self.one_turn else ())
        item.stream = _Stream(asyncio.get_running_loop(), on_text, text)
        item.future.add_done_callback(item.stream.end)
      item.future.add_done_callback(self._maybe_gone)
      self._inbox = item
      self._cv.notify_all()
    return item.future

  def _open(self, item: _Request) -> None:
    tools = msg.tools_of(item.request.tools)
    if item.request.tool_choice not in (None, "auto", "none"):
      raise msg.bad(f"tool_choice={item.request.tool_choice!r} is not supported: the engine does "
                 "not constrain decoding; use 'auto' or 'none'.", "tool_choice")
    self._toolbox = tool_calls.Toolbox(tools, self.hub.tool_format) if tools else None
    item.opening = msg.opening(item.messages, self._toolbox)
    if not self.hub.chat_template:
      item.opening = msg.plain(item.opening)
    self._tools_key = json.dumps(item.request.tools or None, sort_keys=True)

  def _continue(self, item: _Request) -> None:
    history, messages = self._history, item.messages
    k = next((k for k, (a, b) in enumerate(zip(history, messages)) if a != b),
             min(len(history), len(messages)))
    tools_key = json.dumps(item.request.tools or None, sort_keys=True)
    if k < len(history) or tools_key != self._tools_key:
      self.hub.count("serve/diverged")
      what = (f"message {k}" if k < len(history) else "its tools")
      raise msg.bad(f"the history of session {self.session_id} diverged at {what}: send the "
                 "session's messages as returned (content and tool calls), then only new "
                 "tool or user messages.")
    new = messages[len(history):]
    if not new:
      raise msg.bad(f"session {self.session_id}: the request has no new message after the last "
                 "assistant message.")
    roles = [m["role"] for m in new]
    n_tools = next((k for k, r in enumerate(roles) if r != "tool"), len(roles))
    if any(r != "user" for r in roles[n_tools:]):
      raise msg.bad(f"session {self.session_id}: new messages after an assistant message must "
                 "be tool messages, then user messages; got roles "
                 f"{', '.join(roles)}.")
    parts, item.tool_results = [], None
    if n_tools:
      if self._toolbox is None:
        raise msg.bad("tool messages, but the session's requests list no tools.")
      results = msg.tool_answers(self._toolbox, msg.calls_by_id(history[-1]), new[:n_tools],
                              len(history))
      parts.append(results.observation)
      item.tool_results = list(results.tool_results)
    users = [m["content"] for m in new[n_tools:]]
    if users:
      parts.append("\n\n".join(users))
      item.tool_results = None   # tool and user messages together: one user message
    item.obs = "\n\n".join(parts)

  def _maybe_gone(self, future: concurrent.futures.Future) -> None:
    if future.cancelled():
      self.drop("the client disconnected before its reply")

  # The engine's side (env worker threads).

  def reset(self, seed: int) -> str:
    """Waits for the session's first request; its last user message (module docstring)."""
    del seed   # a client session is not a seeded task
    item = self._wait()
    with self._cv:
      self._pending, self._history = item, item.messages
      self.system_prompt = item.opening["system_prompt"]
      self.examples = item.opening["examples"]
    return item.opening["user"]

  def step(self, action: str) -> base.StepResult:
    """Answers the waiting request with the sampled turn, then waits for the next one."""
    with self._cv:
      item, self._pending = self._pending, None
      sampled, self._sampled = self._sampled, None
    if item is None:   # the session ended while its turn was sampled
      return self._end_result()
    if sampled is None:
      _set(item.future, error=protocol.APIError(
          500, "the engine runs sessions without watch=hub.watch", type="server_error"))
      raise RuntimeError("ClientEnv needs the engine run's watch=hub.watch (its turn's ids).")
    ids, prompt_tokens = sampled
    stop_ids = self.hub.stop_ids
    stopped = bool(len(ids)) and int(ids[-1]) in stop_ids
    text = action
    if self.one_turn and item.request.stop:   # a one-turn episode may cut its reply
      cut = msg.first_of(text, item.request.stop)
      text, stopped = (text[:cut], True) if cut >= 0 else (text, stopped)
    parse = item.request.tool_choice != "none"
    choice = msg.reply(text, self._toolbox if parse else None, stopped)
    with self._cv:
      self.turns.append(SampledTurn(np.asarray(ids), action, prompt_tokens, choice))
      self._history = self._history + [msg.returned(choice)]
    _set(item.future, result=protocol.Completion(choices=(choice,), prompt_tokens=prompt_tokens,
                                                 completion_tokens=len(ids)))
    if self.one_turn:
      with self._cv:
        self.ended = self.ended or "one-turn request answered"
      return "", 0.0, True, base.make_info(reward=0.0, session=self.session_id)
    try:
      item = self._wait()
    except (SessionDropped, safe.EnvTimeout):
      return self._end_result()
    with self._cv:
      self._pending, self._history = item, item.messages
    info = base.make_info(reward=0.0, session=self.session_id)
    if item.tool_results is not None:
      info[agent_loop.TOOL_RESULTS] = item.tool_results
    return item.obs, 0.0, False, info

  def _wait(self) -> _Request:
    """The next request; raises SessionDropped or EnvTimeout when the session ends first."""
    deadline = time.monotonic() + self.hub.session_timeout_s
    with self._cv:
      while (self._inbox is None and not self.dropped and not self.ended
             and self._finish is None):
        left = deadline - time.monotonic()
        if left <= 0:
          break
        self._cv.wait(left)
      item, self._inbox = self._inbox, None
      if item is not None and not (self.dropped or self.ended or self._finish is not None):
        return item
    if item is not None:
      _set(item.future, error=msg.bad(f"session {self.session_id} ended: {self._why()}", None))
    if not (self.dropped or self.ended or self._finish is not None):
      self.hub.count("serve/timeouts")
      self.drop(f"no request within session_timeout_s={self.hub.session_timeout_s}")
      raise safe.EnvTimeout(f"session {self.session_id}: {self.dropped}")
    raise SessionDropped(f"session {self.session_id} ended: {self._why()}")

  def _end_result(self) -> base.StepResult:
    with self._cv:
      if self.dropped:
        return "", 0.0, True, base.make_info(reward=0.0, error=f"dropped: {self.dropped}",
                                             dropped=self.dropped, session=self.session_id)
      reward = float(self._finish if self._finish is not None else 0.0)
    return "", reward, True, base.make_info(reward=reward, session=self.session_id)

  def _why(self) -> str:
    if self.dropped:
      return f"dropped ({self.dropped})"
    if self._finish is not None:
      return "finished"
    return self.ended

  # The experiment's side (any thread).

  def finish(self, reward: float) -> None:
    """Ends the session with `reward`: its blocked step returns done with it (or, if the
    engine already ended the episode, `reward` is only recorded)."""
    with self._cv:
      self.reward = float(reward)
      if not (self.ended or self.dropped):
        self._finish = float(reward)
      self._cv.notify_all()

  def drop(self, why: str) -> bool:
    """Drops the episode (nothing of it should be trained on); False if it had ended."""
    with self._cv:
      if self.ended or self.dropped:
        return False
      self.dropped = str(why) or "dropped"
      items = [i for i in (self._inbox, self._pending) if i is not None]
      self._inbox = None
      self._cv.notify_all()
    for item in items:
      _set(item.future, error=msg.bad(f"session {self.session_id} ended: dropped ({why})", None))
    self.hub.count("serve/dropped")
    return True

  # The engine's scheduler thread (hub.watch).

  def on_decoded(self, ids: np.ndarray) -> None:
    """Hands a decode chunk's ids of the turn to the request it answers, if it streams."""
    with self._cv:
      item = self._pending
    if item is not None and item.stream is not None:
      item.stream.push(ids.tolist())

  def on_sampled(self, traj: agent_loop.Trajectory) -> None:
    """Records the turn just sampled: its ids and the transcript length before it."""
    u = traj.turn[-1]
    index = np.nonzero((traj.turn == u) & (traj.loss_mask > 0))[0]
    with self._cv:
      self._sampled = (traj.tokens[index], int(index[0]) if len(index) else len(traj.tokens))

  def on_ended(self, traj: agent_loop.Trajectory, why: str) -> None:
    """The engine ended the episode: a request still waiting fails with `why`."""
    with self._cv:
      self.trajectory = traj
      self.ended = self.ended or why
      items = [i for i in (self._inbox, self._pending) if i is not None]
      self._inbox = self._pending = None
      self._cv.notify_all()
    code = "context_length_exceeded" if why.startswith("context length") else None
    for item in items:
      _set(item.future, error=protocol.APIError(
          400, f"session {self.session_id} ended: {self._why()}", code=code))


def check_engine(engine, *, sessions: int, session_timeout_s: float) -> None:
  """ValueError unless `engine` can hold `sessions` client sessions open at once: each holds
  an env worker while it waits for its client, up to session_timeout_s."""
  if engine.env_workers < sessions:
    raise ValueError(f"Engine(env_workers={engine.env_workers}) runs fewer env calls at once "
                     f"than the {sessions} sessions it serves; every open session holds one "
                     f"while it waits for its client: use env_workers >= {sessions}.")
  if engine.env_timeout_s is not None and engine.env_timeout_s <= session_timeout_s:
    raise ValueError(f"Engine(env_timeout_s={engine.env_timeout_s}) must exceed "
                     f"session_timeout_s={session_timeout_s} (or be None), so a session's "
                     "own timeout ends it first.")


class SessionHub:
  """The sessions of a server, and its `Backend` (model_names, async chat).

  Args:
    tok: the policy's tokenizer (its stop ids tell a stopped turn from a cut one).
    model_name: the one model name requests may give.
    tool_format: the model family's tool-call format (tool_calls.FORMATS).
    max_sessions: the most sessions open at once.
    session_timeout_s: how long a session waits for its client's next request.
    temperature, top_p: the run's sampling settings (what requests are compared against).
    max_new_tokens: the run's per-turn budget (a smaller max_tokens is counted as ignored).
    max_turns, max_len: the run's budgets, named in the error of a session they ended.
    serving: requests open sessions themselves (`serving.EngineBackend`) instead of `open`.
    record: None, or a function (session id, Trajectory) -> None called at each episode's end.
    chat_template: False for a run that renders raw text (Engine.run's chat_template): a
      first request's messages are then laid out by `messages.plain`.
  """

  def __init__(self, tok, *, model_name: str, tool_format: str = "hermes",
               max_sessions: int = 256, session_timeout_s: float = 120.0,
               temperature: float = 1.0, top_p: float = 1.0, max_new_tokens: int | None = None,
               max_turns: int | None = None, max_len: int | None = None,
               serving: bool = False,
               record: Callable[[str, agent_loop.Trajectory], None] | None = None,
               chat_template: bool = True):
    if tool_format not in tool_calls.FORMATS:
      raise ValueError(f"tool_format={tool_format!r} must be one of {tool_calls.FORMATS}.")
    if max_sessions < 1 or not session_timeout_s > 0:
      raise ValueError(f"need max_sessions >= 1 and session_timeout_s > 0; got {max_sessions}, "
                       f"{session_timeout_s}.")
    self.model_names = (model_name,)
    self.tool_format, self.max_sessions = tool_format, max_sessions
    self.session_timeout_s = float(session_timeout_s)
    self.temperature, self.top_p, self.max_new_tokens = temperature, top_p, max_new_tokens
    self.max_turns, self.max_len, self.serving = max_turns, max_len, serving
    self.record, self.chat_template, self.tok = record, chat_template, tok
    self.stop_ids = frozenset({int(t) for t in tok.end_of_turn_ids} | {int(tok.eos_id)})
    self._lock = threading.Lock()
    self._sessions: dict[str, ClientEnv] = {}
    self._ended: collections.OrderedDict[str, tuple] = collections.OrderedDict()
    self._stats = collections.Counter(dict.fromkeys(STATS, 0))
    self._arrivals = queue.SimpleQueue()   # serving: (env, seed, greedy) for the engine
    self._closed = False

  @property
  def stats(self) -> dict[str, float]:
    with self._lock:
      return {k: float(v) for k, v in self._stats.items()}

  def count(self, name: str, n: int = 1) -> None:
    with self._lock:
      self._stats[name] += n

  def session(self, session_id: str) -> ClientEnv | None:
    """The open session with that id, or None."""
    with self._lock:
      return self._sessions.get(session_id)

  # Training mode.

  def open(self, n: int) -> list[ClientEnv]:
    """n new sessions (training mode): the envs of one rollout, in order."""
    with self._lock:
      if len(self._sessions) + n > self.max_sessions:
        raise ValueError(f"opening {n} sessions would make {len(self._sessions) + n} open at "
                         f"once, over max_sessions={self.max_sessions}.")
      self._closed = False
    return [self._new(uuid.uuid4().hex) for _ in range(n)]

  def _new(self, session_id: str, **kwargs) -> ClientEnv:
    env = ClientEnv(self, session_id, **kwargs)
    with self._lock:
      self._sessions[session_id] = env
      self._stats["serve/sessions"] += 1
    return env

  def finish(self, session_id: str, reward: float) -> None:
    """Ends the session with `reward` (ClientEnv.finish); unknown ids are ignored."""
    env = self.session(session_id)
    if env is None:
      with self._lock:
        env = self._ended.get(session_id, (None, None))[1]
    if env is not None:
      env.finish(reward)

  def drop(self, session_id: str, why: str) -> None:
    """Drops the session's episode (ClientEnv.drop)."""
    env = self.session(session_id)
    if env is not None:
      env.drop(why)

  def close_all(self, why: str = "the rollout ended") -> None:
    """Drops every open session (their requests get 400) and stops arrivals (serving)."""
    with self._lock:
      envs = list(self._sessions.values())
      self._closed = True
    for env in envs:
      env.drop(why)
      self._forget(env, f"dropped ({why})")

  def _forget(self, env: ClientEnv, why: str) -> None:
    with self._lock:
      if self._sessions.get(env.session_id) is env:
        del self._sessions[env.session_id]
      # Training keeps ended sessions' envs (a rollout's worth), so a late finish() still
      # records its reward; a server keeps only why they ended.
      self._ended[env.session_id] = (why, None if self.serving else env)
      while len(self._ended) > _ENDED_KEPT:
        self._ended.popitem(last=False)

  # The engine's hooks.

  def watch(self, kind: str, env, traj) -> None:
    """Engine.run's `watch`: a session's decoded ids ("decoded": `traj` holds the ids), its
    turn's token counts ("sampled") and its end ("ended")."""
    if not isinstance(env, ClientEnv):
      return
    if kind == "decoded":
      env.on_decoded(traj)
      return
    if kind == "sampled":
      env.on_sampled(traj)
      return
    why = env.dropped and f"dropped ({env.dropped})"
    error = traj.infos[-1].get(base.ERROR) if traj.infos else ""
    if not why and error and traj.done:
      why = f"the session failed ({error})"
    if not why and traj.truncated:
      turns = len(traj.turn_rewards)
      if self.max_turns is not None and turns >= self.max_turns:
        why = f"turn limit (max_turns={self.max_turns})"
      else:
        why = (f"context length: the transcript ({len(traj.tokens)} tokens) and its new "
               f"messages reach max_len={self.max_len}")
    env.on_ended(traj, why or "finished")
    self._forget(env, env.ended)
    if self.record is not None:
      try:
        self.record(env.session_id, traj)
      except Exception:  # pylint: disable=broad-except
        logging.exception("record(%s, ...) failed; the server goes on", env.session_id)

  def arrivals(self, wait_s: float):
    """Engine.run's `arrivals` (serving): the sessions opened since the last call, or None
    once the hub is closed."""
    items = []
    try:
      items.append(self._arrivals.get(timeout=wait_s) if wait_s > 0
                   else self._arrivals.get_nowait())
      while True:
        items.append(self._arrivals.get_nowait())
    except queue.Empty:
      pass
    if not items and self._closed:
      return None
    return items

  # The Backend.

  def _sampling(self, request: protocol.ChatRequest) -> bool:
    """Counts a request's ignored sampling parameters; serving: whether it asks for greedy
    decoding (an APIError for a temperature or top_p this server cannot apply)."""
    greedy = self.serving and request.temperature == 0
    if self.serving:
      for name, asked, ours in (("temperature", request.temperature, self.temperature),
                                ("top_p", request.top_p, self.top_p)):
        if asked is not None and asked != ours and not (name == "temperature" and greedy):
          raise msg.bad(f"{name}={asked} is not served: this server samples with {name}={ours} "
                     f"(temperature 0 for greedy decoding).", name)
    ignored = (
        (not self.serving and (request.temperature not in (None, self.temperature)
                               or request.top_p not in (None, self.top_p)))
        or request.seed is not None
        or (bool(request.stop) and not (self.serving and request.session is None))
        or (request.max_tokens is not None and (self.max_new_tokens is None
                                                or request.max_tokens < self.max_new_tokens)))
    if ignored:
      self.count("serve/ignored_sampling")
    return greedy

  async def chat(self, request: protocol.ChatRequest,
                 stream: Callable[[int, str], None] | None = None) -> protocol.Completion:
    """Answers a chat request through its session; `stream` gets its content pieces (module
    docstring)."""
    if request.model not in self.model_names:
      raise protocol.APIError(404, f"model {request.model!r} does not exist; this server "
                              f"serves {', '.join(self.model_names)}.", param="model",
                              code="model_not_found")
    greedy = self._sampling(request)
    sid = request.session
    if sid is None and not self.serving:
      raise msg.bad(f"no session: send the {HEADER} header (or the `user` field) with the id of "
                 "the session the rollout gave your agent.", HEADER)
    if sid is not None and request.n != 1:
      raise msg.bad(f"n={request.n} in session {sid}: a session continues one conversation; "
                 "use n=1.", "n")
    env = None if sid is None else self.session(sid)
    if env is not None:
      if self.serving and request.temperature is not None and env.greedy != greedy:
        raise msg.bad(f"session {sid} samples with temperature "
                   f"{0 if env.greedy else self.temperature} (set by its first request).",
                   "temperature")
      futures = [env.submit(request, None if stream is None else functools.partial(stream, 0))]
    elif not self.serving:
      raise self._ended_error(sid, request) or msg.bad(
          f"unknown session {sid!r} ({HEADER}): use an id the rollout gave your agent.", HEADER)
    else:
      error = None if sid is None else self._ended_error(sid, request)
      if error is not None:
        raise error
      futures = self._start(request, sid, greedy, stream)
    done = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
    choices = tuple(dataclasses.replace(c.choices[0], index=i) for i, c in enumerate(done))
    return protocol.Completion(choices=choices, prompt_tokens=done[0].prompt_tokens,
                               completion_tokens=sum(c.completion_tokens for c in done))

  def _ended_error(self, session_id: str, request) -> protocol.APIError | None:
    """The error for a request of an ended session (None: unknown id, or a serving request
    that starts a new conversation under an ended session's id)."""
    with self._lock:
      why = self._ended.get(session_id, (None,))[0]
    if why is None or (self.serving and not any(m.get("role") == "assistant"
                                                for m in request.messages)):
      return None
    return msg.bad(f"session {session_id} ended: {why}", None)

  def _start(self, request: protocol.ChatRequest, sid: str | None, greedy: bool,
             stream: Callable[[int, str], None] | None) -> list[concurrent.futures.Future]:
    """Serving: the sessions a request opens (sid None: n one-turn sessions), handed to the
    engine once the request is accepted."""
    n = 1 if sid is not None else request.n
    envs = [ClientEnv(self, sid or f"request-{uuid.uuid4().hex}", one_turn=sid is None,
                      greedy=greedy) for _ in range(n)]
    texts = [None if stream is None else functools.partial(stream, i) for i in range(n)]
    futures = [env.submit(request, text)   # checks the request first
               for env, text in zip(envs, texts)]
    with self._lock:
      if self._closed:
        raise protocol.APIError(503, "the server is shutting down.", type="server_error")
      if len(self._sessions) + n > self.max_sessions:
        raise protocol.APIError(429, f"too many concurrent sessions (max_sessions="
                                f"{self.max_sessions}); retry later.", type="rate_limit_error",
                                code="too_many_sessions")
      if sid is not None and sid in self._sessions:
        raise msg.bad(f"session {sid} already has a request in flight; send the next one after "
                   "its reply.", None)
      for env in envs:
        self._sessions[env.session_id] = env
        self._ended.pop(env.session_id, None)
      self._stats["serve/sessions"] += n
    for env in envs:
      self._arrivals.put((env, 0, greedy))
    return futures
