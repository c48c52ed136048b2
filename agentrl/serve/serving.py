"""A policy served for evaluation: `EngineBackend`, the server's backend over one engine run.

The engine run never ends while the server is up; sessions join it as their requests come
(Engine.run's `arrivals`), each one engine episode whose env is a `sessions.ClientEnv`
(agentrl/serve/sessions.py: token-in token-out, tools, streaming, plain rendering). A request
without a session id is a one-turn episode (n > 1: n episodes that share the prompt's
prefill); with one, the session goes on across requests. A session id names one conversation:
a request whose history is not the session's fails while the session is open; once it ended
(e.g. timed out), a request without assistant messages starts a new session under that id.
Serving sessions end by the timeout, the rollout's budgets or `stop()`. Temperature 0 samples
a session greedily; any other temperature or top_p must equal the server's (sessions.py,
"Sampling parameters"). `python -m agentrl.serve` (main.py) serves a finished run this way.
"""
import threading
from typing import Callable

from absl import logging
import jax

from agentrl.rollout import agent_loop
from agentrl.serve import protocol
from agentrl.serve import sessions


class EngineBackend:
  """A policy served for evaluation (no training): the app's `Backend` (module docstring).

    backend = EngineBackend(engine, params, tok, model_name="policy", max_turns=8,
                            max_new_tokens=256, max_len=4096)
    backend.start()
    ...   # serve `make_app(backend)`
    backend.stop()

  Args:
    engine: the rollout engine (env_workers >= max_sessions, `sessions.check_engine`).
    params, tok: the policy's params and tokenizer.
    model_name, tool_format, max_sessions, session_timeout_s: as `sessions.SessionHub`.
    max_turns, max_new_tokens, max_len, temperature, top_p: the run's settings (Engine.run);
      requests may ask for temperature 0 (greedy) or these values.
    rng: the run's PRNG key (default key 0); episode e samples with fold_in(rng, e).
    record: None, or a function (session id, Trajectory) -> None at each episode's end.
    chat_template: the run's task.chat_template: False renders raw text as its rollouts did
      (sessions.py, *Plain rendering*).
  """

  def __init__(self, engine, params, tok, *, model_name: str, max_turns: int,
               max_new_tokens: int, max_len: int, tool_format: str = "hermes",
               temperature: float = 1.0, top_p: float = 1.0, max_sessions: int = 256,
               session_timeout_s: float = 120.0, rng=None,
               record: Callable[[str, agent_loop.Trajectory], None] | None = None,
               chat_template: bool = True):
    sessions.check_engine(engine, sessions=max_sessions, session_timeout_s=session_timeout_s)
    self.engine, self.params, self.tok = engine, params, tok
    self.hub = sessions.SessionHub(tok, model_name=model_name, tool_format=tool_format,
                          max_sessions=max_sessions, session_timeout_s=session_timeout_s,
                          temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                          max_turns=max_turns, max_len=max_len, serving=True, record=record,
                          chat_template=chat_template)
    self.model_names = self.hub.model_names
    self.run_kwargs = dict(rng=jax.random.key(0) if rng is None else rng, max_turns=max_turns,
                           max_new_tokens=max_new_tokens, max_len=max_len,
                           temperature=temperature, top_p=top_p, chat_template=chat_template)
    self.metrics, self.error = None, None
    self._thread = None

  def start(self) -> None:
    """Starts the engine run on a background thread."""
    if self._thread is not None:
      raise RuntimeError("EngineBackend.start() was already called.")
    self._thread = threading.Thread(target=self._run, name="engine-backend", daemon=True)
    self._thread.start()

  def _run(self) -> None:
    try:
      _, self.metrics = self.engine.run(self.params, self.tok, [], [],
                                        arrivals=self.hub.arrivals, watch=self.hub.watch,
                                        gather_s=sessions.GATHER_S, **self.run_kwargs)
    except Exception as e:  # pylint: disable=broad-except
      self.error = e
      logging.exception("the serving engine run failed")
      self.hub.close_all(f"the engine failed ({type(e).__name__}: {e})")

  def stop(self, timeout_s: float | None = None) -> None:
    """Ends every open session and waits for the engine run to end."""
    self.hub.close_all("the server stopped")
    if self._thread is not None:
      self._thread.join(timeout_s)

  @property
  def stats(self) -> dict[str, float]:
    return self.hub.stats

  async def chat(self, request: protocol.ChatRequest,
                 stream: Callable[[int, str], None] | None = None) -> protocol.Completion:
    if self.error is not None:
      raise protocol.APIError(503, f"the engine failed ({type(self.error).__name__}); "
                              "restart the server.", type="server_error")
    if self._thread is None:
      raise protocol.APIError(503, "the backend is not started.", type="server_error")
    return await self.hub.chat(request, stream)
