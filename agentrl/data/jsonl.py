"""JSONL prompt files: one JSON object per line, validated line by line.

Each non-blank line must be a JSON object with a non-empty string "prompt" (and any other
`required` keys). A bad line raises JsonlError (a ValueError) naming the file and the 1-based
line number, so a broken dataset fails at load time instead of mid-run: invalid UTF-8 (with the byte
offset), over-deep nesting and bad JSON alike. A UTF-8 byte-order mark is accepted.

Values that parse but that no consumer can use are refused at load too, naming the field: a
lone UTF-16 surrogate escape ("\\ud800", which no tokenizer can encode), an integer longer than
Python converts (sys.get_int_max_str_digits()) and NaN, Infinity or a float literal that
overflows to infinity (not JSON, and poison for any reward or metric). `parse_json` is the one
strict reader; every reader of user JSON in agentrl/data goes through it.
"""
import codecs
from collections.abc import Sequence
import io
import json
import math
import os
import re
import sys
from typing import Any


class JsonlError(ValueError):
  """A JSONL file that cannot be used; the message names the file, the line and the fix."""


_ESCAPED = re.compile(r"[\udc80-\udcff]")  # bytes that were not UTF-8, under surrogateescape
# json.loads joins a valid escaped pair into one character, so any surrogate left is lone.
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# A surrogate escape in the text, or a raw surrogate: only then can a string hold one.
_MAY_HOLD_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]|[\ud800-\udfff]")


class _Unusable:
  """A value json.loads read but no consumer can use; left in place so the walk names its field."""

  def __init__(self, what: str):
    self.what = what


def _constant(name: str) -> _Unusable:  # NaN, Infinity, -Infinity
  return _Unusable(f"is {name}, which JSON does not allow; write null or a string")


def _float(text: str) -> float | _Unusable:
  value = float(text)
  if math.isfinite(value):
    return value
  return _Unusable(f"is {text}, which overflows a float to infinity; write a smaller number "
                   "or a string")


def _int(text: str) -> int | _Unusable:
  try:
    return int(text)
  except ValueError:  # longer than sys.get_int_max_str_digits()
    return _Unusable(f"is an integer of {len(text.lstrip('-'))} digits, more than Python reads "
                     f"({sys.get_int_max_str_digits()}); store it as a string")


def _field(path: str) -> str:
  return f"field {path!r}" if path else "the value"


def _problem(value: Any) -> str | None:
  """The first (in document order) part of a JSON value no consumer can use, described."""
  stack = [(value, "")]
  while stack:
    node, path = stack.pop()
    if isinstance(node, _Unusable):
      return f"{_field(path)} {node.what}"
    if isinstance(node, float) and not math.isfinite(node):
      return f"{_field(path)} is {node}, which JSON does not allow; write null or a string"
    if isinstance(node, str):
      if (bad := _SURROGATE.search(node)):
        return (f"{_field(path)} holds a lone surrogate '\\u{ord(bad.group()):04x}' (half of a "
                "UTF-16 pair, which no tokenizer can encode); write the whole pair or remove it")
    elif isinstance(node, dict):
      for key in node:
        if (bad := _SURROGATE.search(key)):
          owner = f"a key of {_field(path)}" if path else "a key"
          return (f"{owner} holds a lone surrogate '\\u{ord(bad.group()):04x}' (half of a "
                  "UTF-16 pair); write the whole pair or remove it")
      stack += [(v, f"{path}.{k}" if path else k) for k, v in reversed(node.items())]
    elif isinstance(node, list):
      stack += [(v, f"{path}[{i}]") for i, v in reversed(list(enumerate(node)))]
  return None


def parse_json(text: str, where: str) -> Any:
  """json.loads(text), strictly: any unusable value raises JsonlError starting with `where`.

  Refused: bad JSON, nesting too deep to read, NaN/Infinity and floats that overflow, integers
  longer than Python converts, lone surrogates (module docstring); the message names the field.
  """
  unusable = []

  def mark(value):
    if isinstance(value, _Unusable):
      unusable.append(value)
    return value

  try:
    value = json.loads(text, parse_constant=lambda c: mark(_constant(c)),
                       parse_float=lambda t: mark(_float(t)), parse_int=lambda t: mark(_int(t)))
  except json.JSONDecodeError as e:
    raise JsonlError(f"{where}: invalid JSON ({e.msg} at column {e.colno}).") from e
  except RecursionError:
    raise JsonlError(f"{where}: JSON nested too deeply to read; flatten the entry.") from None
  # The walk costs a pass over the value, so it runs only when something can be wrong.
  if unusable or _MAY_HOLD_SURROGATE.search(text):
    problem = _problem(value)
    if problem:
      raise JsonlError(f"{where}: {problem}.")
  return value


def _check(entry, path: str, lineno: int, required: Sequence[str]) -> dict:
  where = f"{path}:{lineno}"
  if not isinstance(entry, dict):
    raise JsonlError(f"{where}: expected a JSON object, got {type(entry).__name__}.")
  missing = [k for k in required if k not in entry]
  if missing:
    raise JsonlError(f"{where}: missing key(s) {missing}; every line needs {list(required)}.")
  if "prompt" in required and not (isinstance(entry["prompt"], str) and entry["prompt"]):
    raise JsonlError(f"{where}: 'prompt' must be a non-empty string.")
  return entry


def _decode_error(path: str, lineno: int, line: str, offset: int) -> JsonlError:
  """Names the first undecodable byte of a line read with errors="surrogateescape"."""
  col = _ESCAPED.search(line).start()
  at = len(line[:col].encode("utf-8", "surrogateescape"))
  bad = line[col:col + 4].encode("utf-8", "surrogateescape")
  hint = (" (it looks like UTF-16)" if lineno == 1 and at == 0 and bad[:2] in (
      codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE) else "")
  return JsonlError(f"{path}:{lineno}: invalid UTF-8 at byte {at} of the line (byte offset "
                    f"{offset + at} in the file): {bad!r}{hint}; save the file as UTF-8.")


def read_jsonl(path: str, *, required: Sequence[str] = ("prompt",)) -> list[dict]:
  """All entries of a JSONL file, validated; blank lines are skipped."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"JSONL file not found: {path!r}")
  entries = []
  with open(path, "rb") as raw:
    # Editors on Windows start files with a byte-order mark; skip it. newline="" keeps text
    # mode's universal-newline splitting but leaves each line's bytes intact (so `offset` is a
    # byte offset), and surrogateescape lets a bad byte be reported with its line number.
    offset = len(codecs.BOM_UTF8) if raw.read(3) == codecs.BOM_UTF8 else 0
    raw.seek(offset)
    lines = io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline="")
    for lineno, line in enumerate(lines, start=1):
      if not line.isascii():
        if _ESCAPED.search(line):
          raise _decode_error(path, lineno, line, offset)
        offset += len(line.encode("utf-8")) - len(line)
      offset += len(line)
      if not line.strip():
        continue
      entry = parse_json(line, f"{path}:{lineno}")
      entries.append(_check(entry, path, lineno, required))
  if not entries:
    raise JsonlError(f"{path}: no entries; expected one JSON object per line.")
  return entries


def write_jsonl(path: str, entries) -> None:
  """Writes one JSON object per line; refuses (JsonlError) what `read_jsonl` would refuse.

  The file is replaced whole, so a refused entry leaves an earlier file at `path` untouched.
  """
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      for i, entry in enumerate(entries):
        problem = _problem(entry)
        if problem:
          raise JsonlError(f"{path}: entry {i}: {problem}.")
        f.write(json.dumps(entry) + "\n")
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


class JsonlSource(Sequence):
  """Random-access source over a validated JSONL file (loaded into memory)."""

  def __init__(self, path: str, *, required: Sequence[str] = ("prompt",)):
    self.path = path
    self._entries = read_jsonl(path, required=required)

  def __len__(self) -> int:
    return len(self._entries)

  def __getitem__(self, index: int) -> dict:
    return dict(self._entries[index])
