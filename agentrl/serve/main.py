r"""Serve a finished run's policy over the OpenAI chat API: `python -m agentrl.serve`.

  python -m agentrl.serve --run_dir=runs/grpo                      # newest checkpoint, :8000
  python -m agentrl.serve --run_dir=runs/grpo --step=50 --port=0   # a kept step, a free port
  python -m agentrl.serve --run_dir=runs/grpo --step=warm_start    # the SFT policy before RL

Any experiment's run and any model, the scratch tiny models included: the run is read as
experiments.eval reads it (agentrl/harness/saved_run.py: config.json and one checkpoint's
policy params, read-only, a LoRA policy merged), and served by the OpenAI-compatible server
(agentrl/serve/app.py) over an `EngineBackend` (agentrl/serve/serving.py): one engine run that
sessions join as their requests come. It prints one line,

  serving runs/grpo step 150 as model 'grpo' at http://127.0.0.1:8000/v1 (...)

and runs until Ctrl-C or SIGTERM, when it stops accepting, ends the open sessions and exits 0.

Flags (the defaults in brackets come from the run's config.json):
  --run_dir            the --workdir of an experiment's run (required).
  --step               "latest" (default), a kept step number, or "warm_start".
  --host, --port       127.0.0.1 (loopback; another host must be named) and 8000; --port=0
                       picks a free port (the printed URL has it).
  --model_name         the model id requests give; default the run directory's base name.
  --api_key            a bearer token every request must send; default $AGENTRL_API_KEY, none
                       when that is unset.
  --max_turns          model turns per session [task.max_turns; 1 for a single-turn task].
  --max_new_tokens     tokens per reply [rollout.max_new_tokens].
  --max_len            tokens per session, prompt included [rollout.max_len].
  --temperature        the sampling temperature [rollout.temperature]; a request may ask for
                       it or for 0 (greedy), any other value is a 400.
  --tool_format        how `tools` are written and calls parsed, hermes or tags
                       [task.tool_format, else the env's own default; hermes without tools].
  --max_sessions       sessions open at once (64); --session_timeout_s: how long a session
                       waits for its next request (120).
  --slots              decode slots [rollout.slots, at most --max_sessions].

Messages are rendered as the run's rollouts rendered them (task.chat_template): through the
tokenizer's chat template, or, for a run trained on raw text (the scratch models), in the plain
layout of agentrl/serve/sessions.py (*Plain rendering*): BOS, the system text and each
message's text, EOS after an assistant's. A request of one user message then gets exactly the
ids of a training prompt.

A run_dir that is not a run, a run without a checkpoint, a step that was not kept and a port in
use each end the command with one `error:` line naming the flag (exit code 2).
"""
import dataclasses
import inspect
import os
import signal
import socket
import sys
import threading

from absl import flags

from agentrl import configs
from agentrl.envs import registry
from agentrl.envs import tool_calls
from agentrl.harness import cli
from agentrl.harness import saved_run
from agentrl.rollout import engine as engine_lib
from agentrl.serve import app as app_lib
from agentrl.serve import serving

API_KEY_ENV = "AGENTRL_API_KEY"


@dataclasses.dataclass(frozen=True)
class Settings:
  """What a served run's sessions get (module docstring: the flags and their defaults)."""
  model_name: str
  max_turns: int
  max_new_tokens: int
  max_len: int
  temperature: float
  tool_format: str
  chat_template: bool
  max_sessions: int
  session_timeout_s: float
  slots: int


def env_tool_format(task) -> str:
  """The run's task.tool_format, else its env's own default (its constructor's), else hermes."""
  if task.get("tool_format"):
    return task.tool_format
  try:
    param = inspect.signature(registry.row(task.name).build).parameters.get("tool_format")
  except (TypeError, ValueError):  # a builder whose signature cannot be read
    param = None
  default = None if param is None else param.default
  return default if isinstance(default, str) and default else "hermes"


def settings(run: saved_run.SavedRun, run_dir: str, **flags_) -> Settings:
  """The run's Settings; `flags_` (the flags' values; None: the run's) override them. A
  ConfigError names the flag of a bad value."""
  rc, tc = run.config.rollout, run.config.task
  defaults = dict(
      model_name=os.path.basename(os.path.normpath(os.path.abspath(run_dir))),
      max_turns=tc.get("max_turns", 1), max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
      temperature=rc.get("temperature", 1.0), tool_format=env_tool_format(tc),
      chat_template=tc.chat_template, max_sessions=64, session_timeout_s=120.0, slots=None)
  unknown = sorted(set(flags_) - set(defaults))
  if unknown:
    raise TypeError(f"settings() got unknown settings {unknown}")
  values = {**defaults, **{k: v for k, v in flags_.items() if v is not None and v != ""}}
  if values["slots"] is None:
    values["slots"] = min(rc.get("slots", 64), values["max_sessions"])
  for name, low in (("max_turns", 1), ("max_new_tokens", 1), ("max_len", 2), ("slots", 1),
                    ("max_sessions", 1)):
    configs.require(values[name] >= low, f"--{name} must be >= {low}, got {values[name]}")
  configs.require(values["max_new_tokens"] < values["max_len"],
                  f"--max_new_tokens ({values['max_new_tokens']}) must be < --max_len "
                  f"({values['max_len']}), which also holds the prompt")
  configs.require(values["temperature"] > 0, f"--temperature must be > 0, got "
                  f"{values['temperature']}; a request asks for temperature 0 to decode greedily")
  configs.require(values["session_timeout_s"] > 0, f"--session_timeout_s must be > 0, got "
                  f"{values['session_timeout_s']}")
  configs.require(values["tool_format"] in tool_calls.FORMATS,
                  f"--tool_format must be one of {tool_calls.FORMATS}, got "
                  f"{values['tool_format']!r}")
  return Settings(**values)


@dataclasses.dataclass
class Serving:
  """A running server: its base URL, what it serves, and `stop()`."""
  url: str
  step: str
  settings: Settings
  server: app_lib.Server
  backend: serving.EngineBackend
  token: bool   # whether requests must send the bearer token

  def stop(self, timeout_s: float = 30.0) -> None:
    """Stops accepting (in-flight requests may finish), ends every session, joins the engine."""
    self.server.stop()
    self.backend.stop(timeout_s)

  def describe(self, run_dir: str) -> str:
    s = self.settings
    rendering = "chat template" if s.chat_template else "plain text, no chat template"
    return (f"serving {run_dir} step {self.step} as model {s.model_name!r} at {self.url} "
            f"({rendering}; max_turns={s.max_turns}, max_new_tokens={s.max_new_tokens}, "
            f"max_len={s.max_len}, temperature={s.temperature} or 0 for greedy, "
            f"{s.slots} slots, {'bearer token required' if self.token else 'no token'}); "
            "Ctrl-C stops it")


def serve(run_dir: str, *, step: str = "latest", host: str = "127.0.0.1", port: int = 8000,
          api_key: str | None = None, **overrides) -> Serving:
  """Loads checkpoint `step` of the run and serves it on host:port until `stop()`.

  `overrides` are `settings`' (the flags' names). User errors (not a run, no such checkpoint,
  a bad setting, a port that cannot be bound) are one ConfigError each, naming the flag.
  """
  run = saved_run.load_run(run_dir, step, prefix="--")
  s = settings(run, run_dir, **overrides)
  # Every open session holds an env worker while it waits for its client, and its own
  # session_timeout_s ends it (sessions.check_engine).
  engine = engine_lib.Engine(run.graphdef, pad_id=run.tok.pad_id, slots=s.slots,
                             env_workers=s.max_sessions, env_timeout_s=None)
  backend = serving.EngineBackend(
      engine, run.params, run.tok, model_name=s.model_name, max_turns=s.max_turns,
      max_new_tokens=s.max_new_tokens, max_len=s.max_len, tool_format=s.tool_format,
      temperature=s.temperature, max_sessions=s.max_sessions,
      session_timeout_s=s.session_timeout_s, chat_template=s.chat_template)
  app = app_lib.make_app(backend, api_key=api_key or None, max_concurrent=s.max_sessions)
  server = app_lib.Server(app, host, port)
  try:
    server.start()
  except socket.gaierror as e:
    raise configs.ConfigError(f"--host={host!r} cannot be resolved ({e.strerror or e}); give "
                              "an address such as 127.0.0.1") from None
  except OSError as e:
    raise configs.ConfigError(f"--port={port}: cannot listen on {host}:{port} ("
                              f"{e.strerror or e}); stop what uses it, or choose another port "
                              "(--port=0 picks a free one)") from None
  backend.start()
  return Serving(server.url, run.step, s, server, backend, token=bool(api_key))


# The command line.

_SETTING_FLAGS = ("model_name", "max_turns", "max_new_tokens", "max_len", "temperature",
                  "tool_format", "max_sessions", "session_timeout_s", "slots")


def define_flags() -> None:
  """Defines the command's flags (module docstring); called by agentrl/serve/__main__.py only,
  so that importing this module defines none."""
  flags.DEFINE_string("run_dir", None, "The --workdir of an experiment's run.", required=True)
  flags.DEFINE_string("step", "latest", "'latest', a kept step number, or 'warm_start'.")
  flags.DEFINE_string("host", "127.0.0.1", "Address to listen on (loopback by default).")
  flags.DEFINE_integer("port", 8000, "Port to listen on; 0 picks a free one.")
  flags.DEFINE_string("model_name", None, "Model id requests give; default the run_dir's "
                      "base name.")
  flags.DEFINE_string("api_key", None, f"Bearer token requests must send; default "
                      f"${API_KEY_ENV}, none if unset.")
  flags.DEFINE_integer("max_turns", None, "Model turns per session; default task.max_turns.")
  flags.DEFINE_integer("max_new_tokens", None, "Tokens per reply; default "
                       "rollout.max_new_tokens.")
  flags.DEFINE_integer("max_len", None, "Tokens per session; default rollout.max_len.")
  flags.DEFINE_float("temperature", None, "Sampling temperature; default rollout.temperature.")
  flags.DEFINE_string("tool_format", None, "hermes or tags; default the run's task's.")
  flags.DEFINE_integer("max_sessions", None, "Sessions open at once; default 64.")
  flags.DEFINE_float("session_timeout_s", None, "Seconds a session waits for its next "
                     "request; default 120.")
  flags.DEFINE_integer("slots", None, "Decode slots; default rollout.slots, at most "
                       "max_sessions.")


def _fail(message: str, code: int = 2):
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def main(argv) -> None:
  """Serves until SIGINT or SIGTERM; user errors are one `error:` line and exit code 2."""
  del argv
  values = flags.FLAGS
  try:
    serving = serve(values.run_dir, step=values.step, host=values.host, port=values.port,
                    api_key=values.api_key or os.environ.get(API_KEY_ENV) or None,
                    **{name: values[name].value for name in _SETTING_FLAGS})
  except cli.USER_ERRORS as e:
    _fail(str(e))
  except KeyboardInterrupt:
    _fail("interrupted before the server started", code=130)
  stop = threading.Event()
  for sig in (signal.SIGINT, signal.SIGTERM):
    signal.signal(sig, lambda *_: stop.set())
  print(serving.describe(values.run_dir), flush=True)
  while not stop.wait(0.5) and serving.backend.error is None:
    pass
  serving.stop()
  if serving.backend.error is not None:
    _fail(f"the engine failed ({type(serving.backend.error).__name__}: "
          f"{serving.backend.error}); see the log above", code=1)
  print("stopped", flush=True)
