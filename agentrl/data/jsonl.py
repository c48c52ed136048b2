"""JSONL prompt files: one JSON object per line, validated line by line.

Each non-blank line must be a JSON object with a non-empty string "prompt" (and any other
`required` keys). A bad line raises ValueError naming the file and the 1-based line number,
so a broken dataset fails at load time instead of mid-run.
"""
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
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        entry = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno}).") from e
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
