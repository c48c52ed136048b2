"""Command-line edge of an experiment: user errors become one line, not a traceback.

Every experiment ends with

  def main(argv):
    del argv
    distributed.initialize_distributed()
    cli.run(train, _CONFIG.value, _WORKDIR.value)

  if __name__ == "__main__":
    _CONFIG, _WORKDIR = cli.define_flags(__file__)
    app.run(main, flags_parser=cli.parse_flags)

`define_flags` defines --config (the file's presets, e.g. --config=experiments/policy/grpo.py:smoke,
and --config.<key>=value overrides), --workdir and --print_config. Without --workdir a run goes
to runs/<experiment> for the default preset and runs/<experiment>_<preset> otherwise, so runs
of different presets never share a directory. --print_config prints every resolved key with its
type and range from the experiment's SCHEMA, and exits.

A missing config file, an unknown preset, an unknown or mistyped `--config.<key>` (with the
closest existing key) and a bad flag become `error: ...` and exit code 2. `run` does the same
for the errors a user can fix (ConfigError, an unusable or busy workdir, unreadable model
files, checkpoints or JSONL data; exit 2) and for a run the loop stopped (divergence,
collapse; exit 1). On Ctrl-C (SIGINT) or SIGTERM it stops in order, names the last checkpoint
and exits with 130 or 143 without the interpreter's teardown (agentrl/train/shutdown.py says why).
Anything else is a bug and keeps its traceback.
"""
from collections.abc import Callable, Mapping, Sequence
import difflib
import importlib.util
import os
import sys
from typing import Any

from absl import flags
from ml_collections import config_flags

from agentrl import checkpoint
from agentrl import configs
from agentrl.data import jsonl
from agentrl.models import hf
from agentrl.records import rundir
from agentrl.train import loop
from agentrl.train import shutdown

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


def _unknown_key(config, key: str, spec: str = "") -> str | None:
  """A message if config has no `key` (with the closest existing key), else None."""
  node = config
  for part in key.split("."):
    if not hasattr(node, "items") or part not in node:
      near = difflib.get_close_matches(key, _leaf_keys(config), n=1, cutoff=0.5)
      hint = f"; did you mean --config.{near[0]}?" if near else ""
      where = f" ({spec}; --print_config lists them)" if spec else ""
      return f"--config.{key}: the config has no key {key!r}{where}{hint}"
    node = node[part]
  return None


def _diagnose(argv: Sequence[str], error: Exception, default_file: str | None):
  """Exits with one line saying which part of argv was wrong: the preset, a key, or a value."""
  spec = _config_arg(argv[1:]) or default_file
  if spec is not None:
    try:
      config = _load_config(spec)
    except configs.ConfigError as e:
      _fail(f"--config={spec}: {e}")
    except Exception:  # pylint: disable=broad-except
      config = None
    if config is not None:
      for key in _overrides(argv[1:]):
        message = _unknown_key(config, key, spec)
        if message:
          _fail(message)
  text = str(error).strip()
  _fail(text.splitlines()[-1] if text else type(error).__name__)


def _check_config_file(argv: Sequence[str]) -> None:
  spec = _config_arg(argv[1:])
  if spec is not None:
    path = spec.partition(":")[0]
    if not os.path.isfile(path):
      _fail(f"--config={spec}: no such file {path!r}; give an experiment's file, e.g. "
            "--config=experiments/policy/grpo.py:smoke")


_EXPERIMENT = {}  # "file": the experiment file given to define_flags


def define_flags(experiment_file: str) -> tuple[Any, Any]:
  """Defines --config, --workdir and --print_config; returns the (config, workdir) holders.

  config_flags reads the --config.<key> overrides while the flag is defined, so a bad key or
  preset is reported here, in one line.
  """
  _EXPERIMENT["file"] = os.path.relpath(experiment_file)
  _check_config_file(sys.argv)
  try:
    config = config_flags.DEFINE_config_file("config", experiment_file, lock_config=True)
  except Exception as e:  # pylint: disable=broad-except
    _diagnose(sys.argv, e, _EXPERIMENT["file"])
  workdir = flags.DEFINE_string(
      "workdir", "", "Output directory; default runs/<experiment> (default preset) or "
      "runs/<experiment>_<preset>, so runs of different presets never share one.")
  flags.DEFINE_bool("print_config", False, "Print every resolved config key with its type and "
                    "range, then exit.")
  return config, workdir


def parse_flags(argv: list[str]) -> list[str]:
  """absl `flags_parser`: parses argv, or exits with one line naming the bad flag or key."""
  _check_config_file(argv)
  try:
    return flags.FLAGS(argv)
  except Exception as e:  # pylint: disable=broad-except
    _diagnose(argv, e, _EXPERIMENT.get("file"))


def default_workdir(argv: Sequence[str] | None = None) -> str:
  """runs/<experiment>, or runs/<experiment>_<preset args> when --config names a preset."""
  argv = sys.argv if argv is None else argv
  name = os.path.splitext(os.path.basename(_EXPERIMENT.get("file", argv[0])))[0]
  arg = (_config_arg(argv[1:]) or "").partition(":")[2]
  suffix = "".join(c if c.isalnum() or c in "-." else "_" for c in arg.replace("=", "-"))
  return os.path.join("runs", f"{name}_{suffix}" if suffix else name)


def describe_config(config, schema: Mapping[str, configs.Key] | None) -> str:
  """One line per leaf: `key = value  # type, range or choices` (from the SCHEMA)."""
  lines = []
  for key in _leaf_keys(config):
    value = configs.get(config, key)
    rule = (schema or {}).get(key)
    if rule is None:
      covering = [p for p in (schema or {}) if key.startswith(p + ".")]
      rule = (schema or {}).get(covering[0]) if covering else None
    note = ""
    if rule is not None:
      parts = [" or ".join(t.__name__ for t in (rule.type if isinstance(rule.type, tuple)
                                                 else (rule.type,)))]
      if rule.choices is not None:
        parts.append("one of " + ", ".join(repr(c) for c in rule.choices))
      if rule.min is not None or rule.max is not None:
        parts.append(f"in [{'' if rule.min is None else rule.min}, "
                     f"{'' if rule.max is None else rule.max}]")
      note = "  # " + ", ".join(parts)
    lines.append(f"{key} = {value!r}{note}")
  return "\n".join(lines)


def run(train: Callable[[Any, str], Any], config, workdir: str):
  """train(config, workdir), with user errors, a stopped run, Ctrl-C and SIGTERM as one line
  each.

  An empty `workdir` means `default_workdir()`. With --print_config it prints the config and
  the experiment's SCHEMA (the module global next to `train`) instead of training.
  """
  if "print_config" in flags.FLAGS and flags.FLAGS.print_config:
    print(describe_config(config, train.__globals__.get("SCHEMA")))
    print(f"\nA fork adds a key by setting it in get_config and describing it in SCHEMA "
          f"({train.__globals__.get('__file__', 'the experiment file')}).")
    return None
  workdir = workdir or default_workdir()
  ckpt_dir = os.path.join(workdir, "ckpt")
  with shutdown.handle_signals(ckpt_dir):  # still set while the message is written
    try:
      return train(config, workdir)
    except USER_ERRORS as e:
      _fail(str(e))
    except loop.TrainingStopped as e:
      _fail(str(e), code=1)
    except KeyboardInterrupt as e:  # Ctrl-C or SIGTERM; the code it unwound stopped in order
      name, code = shutdown.describe(e)
      steps = checkpoint.saved_steps(ckpt_dir)
      where = (f"the last checkpoint is step {steps[-1]} in {ckpt_dir}; the same command "
               "resumes from it" if steps else "no checkpoint was written yet")
      print(f"error: interrupted ({name}); {where}", file=sys.stderr)
      shutdown.exit_now(code)
