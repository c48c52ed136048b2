"""PromptStream: deterministic, resumable iteration over any random-access prompt source.

Sources are sequences of entry dicts (`JsonlSource`, `ArrayRecordSource`, `GeneratorSource`,
a list). Epoch e visits every index once, in the order of a permutation drawn from
numpy's PCG64 seeded with (seed, e) when `shuffle`, else in index order. The position is two
integers, so

  state = stream.state()                 # {"seed", "shuffle", "size", "epoch", "index"}
  ...save state with the checkpoint...
  stream = PromptStream(source, seed=...); stream.restore(state)

continues with exactly the entries the uninterrupted stream would have produced.
"""
from collections.abc import Sequence

import numpy as np

# A shuffled epoch holds one permutation in memory; bigger sources (e.g. generator seed
# ranges) are already random per index and are streamed in order.
MAX_SHUFFLE_SIZE = 1 << 26
_STATE_KEYS = ("seed", "shuffle", "size", "epoch", "index")


class PromptStream:
  """Iterator over entries of `source`; `state()`/`restore()` give an exact resume point."""

  def __init__(self, source: Sequence, *, seed: int = 0, shuffle: bool = True,
               num_epochs: int | None = None):
    size = len(source)
    if size == 0:
      raise ValueError("PromptStream source is empty.")
    if shuffle and size > MAX_SHUFFLE_SIZE:
      raise ValueError(f"source has {size} entries, more than MAX_SHUFFLE_SIZE="
                       f"{MAX_SHUFFLE_SIZE}; pass shuffle=False (generator sources are random "
                       "per seed already).")
    if num_epochs is not None and num_epochs < 1:
      raise ValueError(f"num_epochs must be >= 1 or None, got {num_epochs}.")
    self.source, self.seed, self.shuffle, self.num_epochs = source, int(seed), shuffle, num_epochs
    self._size, self._epoch, self._index = size, 0, 0
    self._order_epoch, self._order = None, None

  def _position(self) -> int:
    if not self.shuffle:
      return self._index
    if self._order_epoch != self._epoch:
      rng = np.random.Generator(np.random.PCG64([self.seed, self._epoch]))
      self._order, self._order_epoch = rng.permutation(self._size), self._epoch
    return int(self._order[self._index])

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    if self.num_epochs is not None and self._epoch >= self.num_epochs:
      raise StopIteration
    entry = self.source[self._position()]
    self._index += 1
    if self._index == self._size:
      self._epoch, self._index = self._epoch + 1, 0
    return entry

  def take(self, n: int) -> list[dict]:
    """The next n entries (fewer only if num_epochs runs out)."""
    out = []
    while len(out) < n:
      try:
        out.append(next(self))
      except StopIteration:
        break
    return out

  @property
  def epoch(self) -> int:
    return self._epoch

  def state(self) -> dict[str, int | bool]:
    return {"seed": self.seed, "shuffle": self.shuffle, "size": self._size,
            "epoch": self._epoch, "index": self._index}

  def restore(self, state: dict) -> None:
    """Moves to a position saved by state(); the stream must be configured the same way."""
    missing = [k for k in _STATE_KEYS if k not in state]
    if missing:
      raise ValueError(f"PromptStream state is missing {missing}; expected keys {_STATE_KEYS}.")
    for key, mine in (("seed", self.seed), ("shuffle", self.shuffle), ("size", self._size)):
      if state[key] != mine:
        raise ValueError(f"PromptStream state has {key}={state[key]!r} but this stream has "
                         f"{key}={mine!r}; build the stream with the same source and seed.")
    epoch, index = int(state["epoch"]), int(state["index"])
    if epoch < 0 or not 0 <= index < self._size:
      raise ValueError(f"PromptStream state position (epoch={epoch}, index={index}) is out of "
                       f"range for a source of size {self._size}.")
    self._epoch, self._index = epoch, index
