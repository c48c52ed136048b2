"""JSONL prompt files: one JSON object per line, validated line by line.

Each non-blank line must be a JSON object with a non-empty string "prompt" (and any other
`required` keys). A bad line raises ValueError naming the file and the 1-based line number,
so a broken dataset fails at load time instead of mid-run: invalid UTF-8 (with the byte
offset), over-deep nesting and bad JSON alike. A UTF-8 byte-order mark is accepted.
"""
import codecs
from collections.abc import Sequence
import json
import os


def _check(entry, path: str, lineno: int, required: Sequence[str]) -> dict:
  where = f"{path}:{lineno}"
  if not isinstance(entry, dict):
    raise ValueError(f"{where}: expected a JSON object, got {type(entry).__name__}.")
  missing = [k for k in required if k not in entry]
  if missing:
    raise ValueError(f"{where}: missing key(s) {missing}; every line needs {list(required)}.")
  if "prompt" in required and not (isinstance(entry["prompt"], str) and entry["prompt"]):
    raise ValueError(f"{where}: 'prompt' must be a non-empty string.")
  return entry


def read_jsonl(path: str, *, required: Sequence[str] = ("prompt",)) -> list[dict]:
  """All entries of a JSONL file, validated; blank lines are skipped."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"JSONL file not found: {path!r}")
  entries = []
  with open(path, "rb") as f:
    for lineno, raw in enumerate(f, start=1):
      if lineno == 1 and raw.startswith(codecs.BOM_UTF8):
        raw = raw[len(codecs.BOM_UTF8):]  # editors on Windows write a byte-order mark
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise ValueError(f"{path}:{lineno}: invalid UTF-8 at byte {e.start} of the line "
                         f"({raw[e.start:e.start + 4]!r}); save the file as UTF-8.") from None
      if not line.strip():
        continue
      try:
        entry = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno}).") from e
      except RecursionError:
        raise ValueError(f"{path}:{lineno}: JSON nested too deeply to read; flatten the "
                         "entry.") from None
      entries.append(_check(entry, path, lineno, required))
  if not entries:
    raise ValueError(f"{path}: no entries; expected one JSON object per line.")
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
