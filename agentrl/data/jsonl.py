"""JSONL prompt files: one JSON object per line, validated line by line.

Each non-blank line must be a JSON object with a non-empty string "prompt" (and any other
`required` keys). A bad line raises JsonlError (a ValueError) naming the file and the 1-based
line number, so a broken dataset fails at load time instead of mid-run: invalid UTF-8 (with the byte
offset), over-deep nesting and bad JSON alike. A UTF-8 byte-order mark is accepted.
"""
import codecs
from collections.abc import Sequence
import io
import json
import os
import re


class JsonlError(ValueError):
  """A JSONL file that cannot be used; the message names the file, the line and the fix."""


_ESCAPED = re.compile(r"[\udc80-\udcff]")  # bytes that were not UTF-8, under surrogateescape


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
      try:
        entry = json.loads(line)
      except json.JSONDecodeError as e:
        raise JsonlError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno}).") from e
      except RecursionError:
        raise JsonlError(f"{path}:{lineno}: JSON nested too deeply to read; flatten the "
                         "entry.") from None
      entries.append(_check(entry, path, lineno, required))
  if not entries:
    raise JsonlError(f"{path}: no entries; expected one JSON object per line.")
  return entries


def write_jsonl(path: str, entries) -> None:
  with open(path, "w", encoding="utf-8") as f:
    for entry in entries:
      f.write(json.dumps(entry) + "\n")


class JsonlSource(Sequence):
  """Random-access source over a validated JSONL file (loaded into memory)."""

  def __init__(self, path: str, *, required: Sequence[str] = ("prompt",)):
    self.path = path
    self._entries = read_jsonl(path, required=required)

  def __len__(self) -> int:
    return len(self._entries)

  def __getitem__(self, index: int) -> dict:
    return dict(self._entries[index])
