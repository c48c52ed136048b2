"""Experiment config helpers: preset strings and up-front validation.

`parse_arg` follows big_vision's `configs/common.py`: the single string after the colon in
`--config=experiments/policy/grpo.py:smoke,size=tiny` becomes a ConfigDict of typed values.
`validate` checks a finished config against a schema of dotted keys before anything is built, so a
bad value fails in one line that names the key, instead of as a shape error deep inside `jit`:

  configs.validate(c, {
      "total_steps": configs.Key(int, min=1),
      "rollout.group_size": configs.Key(int, min=2, why="for GRPO"),
      "loss.agg": configs.Key(str, choices=aggregation.MODES),
  })
  -> ConfigError: config.rollout.group_size must be >= 2 for GRPO, got 1

Library functions never see a config (docs/style.md C2): the experiment validates, converts to
typed values, and passes individual arguments down.
"""
from collections.abc import Iterator, Mapping, Sequence
import dataclasses
import math
from typing import Any

import ml_collections as mlc

_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


class ConfigError(ValueError):
  """A user-supplied config value is missing, unknown, mistyped or out of range."""


def parse_value(name: str, text: str, default: Any) -> Any:
  """Parses `text` to the type of `default` (bool, int, float or str)."""
  kind = type(default)
  if kind is bool:
    if text.lower() in _TRUE:
      return True
    if text.lower() in _FALSE:
      return False
    raise ConfigError(f"config arg {name!r} must be a boolean (true/false), got {text!r}")
  if kind in (int, float):
    try:
      return kind(text)
    except ValueError:
      raise ConfigError(
          f"config arg {name!r} must be {kind.__name__}, got {text!r}") from None
  return text


def parse_arg(arg: str | None, **defaults: Any) -> mlc.ConfigDict:
  """Parses "smoke,size=tiny" into ConfigDict(smoke=True, size="tiny", ...) with typed defaults.

  A bare word sets a boolean default to True ("smoke"); with exactly one non-boolean default, a
  bare word that is the whole argument is its value (":tiny" means ":size=tiny"; with several
  parts write "size=tiny,smoke"). Unknown names are an error that lists the accepted ones.
  """
  result = mlc.ConfigDict(dict(defaults))
  parts = (arg or "").split(",")
  for part in parts:
    part = part.strip()
    if not part:
      continue
    if "=" in part:
      name, text = (s.strip() for s in part.split("=", 1))
    else:
      valued = [k for k, v in defaults.items() if not isinstance(v, bool)]
      if part in defaults and isinstance(defaults[part], bool):
        name, text = part, "true"
      elif len(valued) == 1 and part not in defaults and len(parts) == 1:
        name, text = valued[0], part
      else:
        name, text = part, "true"
    if name not in defaults:
      raise ConfigError(f"unknown config arg {name!r} in {arg!r}; accepted: "
                        f"{', '.join(sorted(defaults)) or '(none)'}")
    result[name] = parse_value(name, text, defaults[name])
  return result


@dataclasses.dataclass(frozen=True)
class Key:
  """The schema of one config leaf.

  Attributes:
    type: accepted Python type(s). `float` also accepts ints; `bool` is never an int here.
    min, max: inclusive bounds for numbers (or for the length of a sequence).
    choices: accepted values.
    why: appended to range errors ("for GRPO"), to say which method needs the bound.
    optional: whether None is accepted.
  """
  type: type | tuple[type, ...]
  min: float | None = None
  max: float | None = None
  choices: Sequence[Any] | None = None
  why: str = ""
  optional: bool = False


def leaves(tree: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
  for name, value in tree.items():
    path = f"{prefix}{name}"
    if isinstance(value, (mlc.ConfigDict, Mapping)) and len(value):
      yield from leaves(value, path + ".")
    else:
      yield path, value


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
  """{"a.b": leaf} for a nested dict of plain values (e.g. a loaded config.json)."""
  if isinstance(tree, dict):
    out = {}
    for key, value in tree.items():
      out.update(flatten(value, f"{prefix}{key}."))
    return out
  return {prefix[:-1]: tree}


def get(config: Mapping[str, Any], path: str) -> Any:
  """config["a"]["b"] for path "a.b"; ConfigError naming the path if it is missing."""
  found, value = _lookup(config, path)
  if not found:
    raise ConfigError(f"config.{path} is missing")
  return value


def _lookup(config: Mapping[str, Any], path: str) -> tuple[bool, Any]:
  """(True, config["a"]["b"]) for path "a.b", (False, None) if a part is missing; ConfigError
  naming the part if it is not a dict (e.g. a hand-edited config.json)."""
  node, parts = config, path.split(".")
  for i, part in enumerate(parts):
    if not isinstance(node, (mlc.ConfigDict, Mapping)):
      raise ConfigError(f"config.{'.'.join(parts[:i])} must be a dict, got "
                        f"{type(node).__name__} {node!r}")
    if part not in node:
      return False, None
    node = node[part]
  return True, node


def _type_ok(value: Any, kind: type | tuple[type, ...]) -> bool:
  kinds = kind if isinstance(kind, tuple) else (kind,)
  if isinstance(value, bool):
    return bool in kinds or object in kinds
  if float in kinds and isinstance(value, int):
    return True
  if (list in kinds or tuple in kinds) and isinstance(value, (list, tuple)):
    return True
  if dict in kinds and isinstance(value, (mlc.ConfigDict, Mapping)):
    return True
  return isinstance(value, kinds)


def _type_name(kind: type | tuple[type, ...]) -> str:
  kinds = kind if isinstance(kind, tuple) else (kind,)
  return " or ".join(k.__name__ for k in kinds)


def check_key(path: str, value: Any, key: Key) -> None:
  """Raises ConfigError if `value` does not fit `key`; the message names config.<path>."""
  why = f" {key.why}" if key.why else ""
  if value is None:
    if key.optional:
      return
    raise ConfigError(f"config.{path} must be set ({_type_name(key.type)}), got None")
  if not _type_ok(value, key.type):
    raise ConfigError(f"config.{path} must be {_type_name(key.type)}, got "
                      f"{type(value).__name__} {value!r}")
  if key.choices is not None and value not in key.choices:
    raise ConfigError(f"config.{path} must be one of {tuple(key.choices)}{why}, got {value!r}")
  size = len(value) if isinstance(value, (list, tuple, str)) else value
  if isinstance(size, float) and not math.isfinite(size):
    raise ConfigError(f"config.{path} must be finite, got {value!r}")
  noun = "length" if isinstance(value, (list, tuple, str)) else ""
  what = f"config.{path}" + (f" {noun}" if noun else "")
  if key.min is not None and size < key.min:
    raise ConfigError(f"{what} must be >= {key.min}{why}, got {size!r}")
  if key.max is not None and size > key.max:
    raise ConfigError(f"{what} must be <= {key.max}{why}, got {size!r}")


def validate(config: Mapping[str, Any], schema: Mapping[str, Key], *,
             allow_extra: Sequence[str] = ()) -> None:
  """Checks every schema key is present and valid, and that no unknown key is set.

  Args:
    config: the experiment's ConfigDict.
    schema: dotted path -> Key. A path whose Key type is dict covers a whole sub-dict.
    allow_extra: dotted prefixes whose contents are not checked (free-form sub-configs).
  """
  for path, key in schema.items():
    check_key(path, get(config, path), key)
  covered = tuple(schema) + tuple(allow_extra)
  for path, _ in leaves(config):
    if not any(path == p or path.startswith(p + ".") for p in covered):
      near = [p for p in schema if p.rsplit(".", 1)[-1] == path.rsplit(".", 1)[-1]]
      hint = f" (did you mean config.{near[0]}?)" if near else ""
      raise ConfigError(f"config.{path} is not a key this experiment reads{hint}; "
                        "remove it, or (in a fork that reads it) describe it in the "
                        "experiment file's SCHEMA dict")


def validate_present(config: Mapping[str, Any], schema: Mapping[str, Key], *,
                     required: Sequence[str] = ()) -> None:
  """Checks the schema keys that `config` holds, and that every `required` path is there.

  For a stored config (a run's config.json): a key added to the schema after the run was made
  is absent there, and readers give it a default, so absence is refused only for `required`.
  """
  for path in required:
    get(config, path)
  for path, key in schema.items():
    found, value = _lookup(config, path)
    if found:
      check_key(path, value, key)


def require(condition: bool, message: str) -> None:
  """Cross-key check: raises ConfigError(message) when `condition` is false.

  Example: require(B % minibatches == 0, f"config.update.minibatches ({m}) must divide the
  rollout batch prompts_per_step * group_size ({B})").
  """
  if not condition:
    raise ConfigError(message)


def divides(path_d: str, d: int, what: str, n: int) -> None:
  """Raises unless `d` (config.<path_d>) divides `n`, naming both in the message."""
  require(d > 0 and n % d == 0,
          f"config.{path_d} ({d}) must divide {what} ({n})")

