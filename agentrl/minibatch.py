# pylint: disable=invalid-name
"""Splitting a scored batch into the update's minibatches.

  parts = minibatch.minibatches(batch, num=4, rng=key)                # shuffled, equal sizes
  parts = minibatch.length_sorted_minibatches(batch, lengths_B, num=4)  # similar lengths

Every field is split by rows; `length_sorted_minibatches` also cuts each minibatch's `*_BT`
fields (and `aux` entries) to its own padded length, so short rows are not padded to the
longest row of the whole batch.
"""
import dataclasses

import jax
import jax.numpy as jnp

from agentrl import types
from agentrl.rollout import pack as pack_lib


def minibatches(batch: types.Batch, *, num: int, rng: jax.Array | None) -> list[types.Batch]:
  """Splits the rows into `num` equal minibatches, shuffled by `rng` (None: in order)."""
  B = batch.tokens_BT.shape[0]
  if B % num:
    raise ValueError(f"minibatches={num} must divide the batch size {B}.")
  if num == 1 and rng is None:
    return [batch]
  order = jnp.arange(B) if rng is None else jax.random.permutation(rng, B)
  size = B // num
  return [jax.tree.map(lambda x, idx=order[i * size:(i + 1) * size]: x[idx], batch)
          for i in range(num)]


def length_sorted_minibatches(batch: types.Batch, lengths_B, *, num: int, seed=None,
                              min_len: int = 16) -> list[types.Batch]:
  """`num` minibatches of rows of similar length, each cut to its own padded length.

  The plan is `pack.length_sorted_layout` (rows sorted by length, runs of B / num rows, T = the
  power-of-two bucket of each run's longest row, capped at the batch's T). Each minibatch takes
  its rows and the first T columns of every `*_BT` field (`aux` entries too). Only padding is
  cut, so per-row values (log-probs, per-sequence sums) are unchanged; which rows share a
  minibatch differs from `minibatches`, so per-minibatch normalizers do too; with num=1 the
  rows keep their order and only the padding past the bucket of the longest row is cut.
  """
  T = batch.tokens_BT.shape[1]
  layout = pack_lib.length_sorted_layout(lengths_B, num=num, max_len=T, min_len=min_len,
                                         seed=seed)
  return [_take(batch, jax.device_put(rows), width) for rows, width in layout]


def _take(batch: types.Batch, rows: jax.Array, width: int) -> types.Batch:
  cut = lambda name, x: x[rows][:, :width] if name.endswith("_BT") else x[rows]
  fields = {}
  for field in dataclasses.fields(batch):
    x = getattr(batch, field.name)
    if isinstance(x, dict):
      fields[field.name] = {k: cut(k, v) for k, v in x.items()}
    elif x is not None:
      fields[field.name] = cut(field.name, x)
  return batch.replace(**fields)
