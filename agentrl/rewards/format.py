"""Format rewards: required tags and regular expressions.

Same signature as the verifiers (`fn(completion, target=None, **hyperparameters) -> float`);
`target` is ignored, so a format term composes with an outcome term in
`agentrl.rewards.compose.Weighted`. Format shaping as in DeepSeek-R1 (Guo et al. 2025, sec.
2.2.2: "<think>...</think> <answer>...</answer>"). `tags` and `regex` see only the
completion's last `extract.MAX_TEXT_CHARS` characters; `tags` runs in linear time.
"""
import re

from agentrl.rewards import extract


def tags(completion: str, target=None, *, names=("think", "answer"), ordered: bool = True,
         exactly_once: bool = True, strict_ends: bool = False) -> float:
  """1.0 iff every <name>...</name> pair is present (once each, in order if asked).

  strict_ends additionally requires that nothing but whitespace precedes the first tag and
  follows the last one.
  """
  del target
  if not names:
    raise ValueError("tags() needs at least one tag name, e.g. names=('answer',).")
  completion = extract.cap(completion)
  spans = []
  for name in names:
    found = list(extract.tag_spans(completion, name))
    if not found or (exactly_once and len(found) != 1):
      return 0.0
    if exactly_once and completion.count(f"<{name}>") != 1:
      return 0.0  # an unclosed duplicate opening tag is still malformed
    spans.append((found[0][0], found[-1][1]))
  if ordered and any(a[1] > b[0] for a, b in zip(spans, spans[1:])):
    return 0.0
  if strict_ends:
    first, last = min(s[0] for s in spans), max(s[1] for s in spans)
    if completion[:first].strip() or completion[last:].strip():
      return 0.0
  return 1.0


def regex(completion: str, target=None, *, pattern: str, fullmatch: bool = False,
          flags: int = re.DOTALL) -> float:
  """1.0 iff `pattern` matches the completion (anywhere, or the whole stripped text).

  The pattern sees the completion's last `extract.MAX_TEXT_CHARS` characters, so a pattern
  anchored at the start (`^<think>`) fails on a longer completion. The cap bounds the cost of
  a backtracking pattern but does not make it linear: an unanchored lazy
  "<think>.*?</think>...<answer>.*?</answer>" still takes ~1.5 s on 64 KiB of "<think>"; check
  tag structure with `tags` (linear) instead.
  """
  del target
  compiled = re.compile(pattern, flags)
  completion = extract.cap(completion)
  text = completion.strip() if fullmatch else completion
  found = compiled.fullmatch(text) if fullmatch else compiled.search(text)
  return float(found is not None)


def non_empty(completion: str, target=None) -> float:
  """1.0 iff the completion has any non-whitespace text (an empty generation scores 0)."""
  del target
  return float(bool(completion.strip()))
