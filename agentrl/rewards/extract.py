"""Answer extraction from model completions.

Every verifier first reduces a free-text completion to a candidate answer string with one of
the modes below, so the rule that decides what "the answer" is lives in one place:

  raw               the whole completion, stripped.
  tag               the content of the LAST <answer>...</answer> pair (reasoning-gym's
                    convention, `reasoning_gym.utils.extract_answer`); None if there is none.
  last_line         the last non-empty line, stripped.
  tag_or_last_line  `tag` if the completion has an answer tag, else `last_line`.
  boxed             the content of the LAST \\boxed{...} (nested braces matched); None if none.
  last_number       the last integer/decimal/fraction literal in the text (commas in thousands
                    groups are removed); None if none.

A mode returns None when the completion holds no candidate; verifiers score None as 0.

Hostile text. Every parser here runs in time linear in its input (tags are found with
`str.find`, not a lazy regex, whose retries from every opening tag made '<answer>' * 20000
take seconds), and sees at most the last MAX_TEXT_CHARS characters of a completion: answers
come at the end, so the tail is what is kept.
"""
from collections.abc import Iterator
import re

MODES = ("raw", "tag", "last_line", "tag_or_last_line", "boxed", "last_number")
MAX_TEXT_CHARS = 65536

_NUMBER_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?|-?\d+(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def cap(text: str) -> str:
  """The last MAX_TEXT_CHARS characters of `text` (all of it when shorter)."""
  return text if len(text) <= MAX_TEXT_CHARS else text[-MAX_TEXT_CHARS:]


def tag_spans(text: str, name: str = "answer") -> Iterator[tuple[int, int, str]]:
  """(start, end, content) of each <name>...</name> pair, left to right, in linear time.

  The pairs `re.finditer("<name>(.*?)</name>", text, re.DOTALL)` would give: each opening tag
  is closed by the first closing tag after it, and the scan resumes after that closing tag.
  Call it on `cap(text)` for model output.
  """
  opening, closing = f"<{name}>", f"</{name}>"
  pos = 0
  while True:
    start = text.find(opening, pos)
    if start < 0:
      return
    end = text.find(closing, start + len(opening))
    if end < 0:
      return  # no later opening tag can be closed either
    yield start, end + len(closing), text[start + len(opening):end]
    pos = end + len(closing)


def tag(text: str, name: str = "answer") -> str | None:
  """Content of the last <name>...</name> pair, stripped; None if there is none."""
  found = None
  for _, _, content in tag_spans(cap(text), name):
    found = content
  return found.strip() if found is not None else None


def last_line(text: str) -> str | None:
  lines = [line.strip() for line in cap(text).splitlines() if line.strip()]
  return lines[-1] if lines else None


def boxed(text: str) -> str | None:
  """Content of the last \\boxed{...}, with nested braces matched; None if absent/unclosed."""
  text = cap(text)
  start = text.rfind("\\boxed{")
  if start < 0:
    return None
  depth, i = 0, start + len("\\boxed")
  for j in range(i, len(text)):
    if text[j] == "{":
      depth += 1
    elif text[j] == "}":
      depth -= 1
      if depth == 0:
        return text[i + 1:j].strip()
  return None


def last_number(text: str) -> str | None:
  matches = _NUMBER_RE.findall(cap(text))
  return matches[-1].replace(",", "") if matches else None


def extract(text: str, mode: str = "tag_or_last_line") -> str | None:
  """Candidate answer of `text` under `mode` (see the module docstring)."""
  if not isinstance(text, str):
    raise TypeError(f"completion must be str, got {type(text).__name__}")
  if mode == "raw":
    return cap(text).strip()
  if mode == "tag":
    return tag(text)
  if mode == "last_line":
    return last_line(text)
  if mode == "tag_or_last_line":
    found = tag(text)
    return found if found is not None else last_line(text)
  if mode == "boxed":
    return boxed(text)
  if mode == "last_number":
    return last_number(text)
  raise ValueError(f"Unknown extraction mode {mode!r}; use one of {MODES}.")
