"""Command-line edge of an experiment: user errors become one line, not a traceback.

Every experiment ends with

  def main(argv):
    del argv
    distributed.initialize_distributed()
    cli.run(train, _CONFIG.value, _WORKDIR.value)

  if __name__ == "__main__":
    _CONFIG = config_flags.DEFINE_config_file("config", __file__, lock_config=True)
    _WORKDIR = flags.DEFINE_string("workdir", "runs/<name>", "Output directory.")
    app.run(main, flags_parser=cli.parse_flags)

`parse_flags` turns a missing config file, an unknown preset, an unknown or mistyped
`--config.<key>` (with the closest existing key) and a bad flag into `error: ...` and exit
code 2. `run` does the same for the errors a user can fix (ConfigError, an unusable or busy
workdir, unreadable model files, checkpoints or JSONL data; exit 2) and for a run the loop stopped
(divergence, collapse; exit 1), and prints where the last checkpoint is on Ctrl-C (exit 130).
Anything else is a bug and keeps its traceback.
"""
from collections.abc import Callable, Sequence
import difflib
import importlib.util
import os
import sys
from typing import Any

from absl import flags

from agentrl import checkpoint
from agentrl import configs
from agentrl import loop
from agentrl import rundir
from agentrl.data import jsonl
from agentrl.models import hf

# Errors whose message already says what to fix.
USER_ERRORS = (configs.ConfigError, rundir.WorkdirError, checkpoint.CheckpointError,
               hf.ModelFileError, jsonl.JsonlError)


def _fail(message: str, code: int = 2):
  print(f"error: {message}", file=sys.stderr, flush=True)
  sys.exit(code)


def _config_arg(argv: Sequence[str]) -> str | None:
  """The value of --config in argv (either --config=X or --config X), or None."""
  for i, arg in enumerate(argv):
    if arg.startswith("--config="):
      return arg.split("=", 1)[1]
    if arg == "--config" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _overrides(argv: Sequence[str]) -> list[str]:
  """The dotted keys of every --config.<key>=... in argv."""
  keys = []
  for arg in argv:
    if arg.startswith("--config."):
      keys.append(arg[len("--config."):].split("=", 1)[0])
  return keys


def _load_config(spec: str) -> Any:
  """get_config(arg) of the config file `path[:arg]`, as config_flags would build it."""
  path, _, arg = spec.partition(":")
  module_spec = importlib.util.spec_from_file_location("_agentrl_cli_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg or None)


def _leaf_keys(config, prefix: str = "") -> list[str]:
  out = []
  for key, value in config.items():
    if hasattr(value, "items"):
      out += _leaf_keys(value, f"{prefix}{key}.")
    else:
      out.append(f"{prefix}{key}")
  return out


def _unknown_key(config, key: str) -> str | None:
  """A message if config has no `key` (with the closest existing key), else None."""
  node = config
  for part in key.split("."):
    if not hasattr(node, "items") or part not in node:
      near = difflib.get_close_matches(key, _leaf_keys(config), n=1, cutoff=0.5)
      hint = f"; did you mean --config.{near[0]}?" if near else ""
      return f"--config.{key}: config has no key {key!r}{hint}"
    node = node[part]
  return None


def parse_flags(argv: list[str]) -> list[str]:
  """absl `flags_parser`: parses argv, or exits with one line naming the bad flag or key."""
  spec = _config_arg(argv[1:])
  if spec is not None:
    path = spec.partition(":")[0]
    if not os.path.isfile(path):
      _fail(f"--config={spec}: no such file {path!r}; give an experiment's file, e.g. "
            "--config=experiments/grpo.py:smoke")
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    error = e
  # Find out which part was wrong: the preset, a key, or a value.
  if spec is not None:
    try:
      config = _load_config(spec)
    except configs.ConfigError as e:
      _fail(f"--config={spec}: {e}")
    except Exception:  # pylint: disable=broad-except
      config = None
    if config is not None:
      for key in _overrides(argv[1:]):
        message = _unknown_key(config, key)
        if message:
          _fail(message)
  _fail(str(error).strip().splitlines()[-1] if str(error).strip() else type(error).__name__)


def run(train: Callable[[Any, str], Any], config, workdir: str):
  """train(config, workdir), with user errors, a stopped run and Ctrl-C as one line each."""
  try:
    return train(config, workdir)
  except USER_ERRORS as e:
    _fail(str(e))
  except loop.TrainingStopped as e:
    _fail(str(e), code=1)
  except KeyboardInterrupt:
    _fail(f"interrupted; checkpoints are in {os.path.join(workdir, 'ckpt')} and the same "
          "command resumes from the last one", code=130)
