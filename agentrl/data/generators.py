"""Prompt sources from procedural generators (the built-in envs' `make_problem(seed)`).

A generator is a pure function `fn(seed) -> dict` with at least "prompt" (and usually
"answer"), e.g. `functools.partial(arithmetic.make_problem, digits=3)`,
`calculator.make_problem`, `ReasoningGymTask("countdown").make_problem`, or `env_prompts(env)`
for any Env. `GeneratorSource(fn, start, stop)` exposes seeds [start, stop) as a random-access
sequence (entry i is fn(start + i), tagged with its "seed"), so `PromptStream` can iterate and
resume it like a file.

Held-out split by seed range: `split_by_seed` gives train seeds [0, HELDOUT_START) and
held-out seeds [HELDOUT_START, HELDOUT_START + heldout_size). The seeds are disjoint; when the
problem space is small (3-digit addition has 10^6 problems) a held-out problem can still
coincide with a training one, so compare prompts if exact disjointness matters.
"""
from collections.abc import Callable, Sequence

HELDOUT_START = 2**30


class GeneratorSource(Sequence):
  """Entries fn(seed) for seed in [start, stop), indexable as a sequence."""

  def __init__(self, fn: Callable[[int], dict], start: int = 0, stop: int = HELDOUT_START):
    if not callable(fn):
      raise TypeError(f"GeneratorSource needs a callable fn(seed) -> dict, got {fn!r}.")
    if stop <= start:
      raise ValueError(f"GeneratorSource needs start < stop, got [{start}, {stop}).")
    self.fn, self.start, self.stop = fn, int(start), int(stop)

  def __len__(self) -> int:
    return self.stop - self.start

  def __getitem__(self, index: int) -> dict:
    if not 0 <= index < len(self):
      raise IndexError(f"index {index} outside [0, {len(self)})")
    seed = self.start + index
    entry = self.fn(seed)
    if not isinstance(entry, dict) or "prompt" not in entry:
      raise TypeError(f"generator {self.fn!r} must return a dict with 'prompt' (seed {seed}), "
                      f"got {type(entry).__name__}.")
    return {**entry, "seed": seed}


def env_prompts(env) -> Callable[[int], dict]:
  """fn(seed) -> {"prompt": env.reset(seed), "system_prompt": ...} for any Env.

  The env is reset to read its first observation; give this function its own env instance.
  """
  def fn(seed: int) -> dict:
    return {"prompt": env.reset(seed), "system_prompt": env.system_prompt}
  return fn


def split_by_seed(fn: Callable[[int], dict], *, heldout_size: int,
                  train_size: int = HELDOUT_START) -> tuple[GeneratorSource, GeneratorSource]:
  """(train source over seeds [0, train_size), held-out over [HELDOUT_START, +heldout_size))."""
  if not 0 < train_size <= HELDOUT_START or heldout_size < 1:
    raise ValueError(f"need 0 < train_size <= {HELDOUT_START} and heldout_size >= 1, got "
                     f"{train_size}, {heldout_size}.")
  return (GeneratorSource(fn, 0, train_size),
          GeneratorSource(fn, HELDOUT_START, HELDOUT_START + heldout_size))
