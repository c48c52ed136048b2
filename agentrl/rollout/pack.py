"""The single host->device boundary: trajectories -> a fixed-shape `types.Batch`.

  batch = pack.pack(trajs, max_len=1024, pad_id=tok.pad_id)            # rows keep their order
  batch = pack.pack(trajs, max_len=1024, pad_id=tok.pad_id, sharding=data_sharding)

Rows are right-padded to T = the smallest power of two (>= min_len) that holds the longest
trajectory, capped at max_len, so a run sees a handful of shapes; `per_octave=k` splits each
octave (p/2, p] into k equal steps (k=4: ..., 160, 192, 224, 256), less padding for rows just
above a power of two at up to k shapes per octave. A trajectory longer than max_len is cut
to its first max_len tokens and its `truncated_B` flag is set (never silently).
B is len(trajs): group layout (rows [i*G, (i+1)*G) share a prompt) is the caller's order.

loss_mask is 1 only on tokens the policy sampled: tool and environment tokens are context,
not actions, so they get loss_mask 0 even though the model attends to them (docs/style.md C9).

Padding is right-padding, so cutting columns past a row's length changes none of its real
tokens' log-probs (attention is causal and pads are masked keys): a row gives the same values
in any bucket that holds it. `length_sorted_layout` plans minibatches of rows of similar
length, each padded only to its own bucket (`loop.length_sorted_minibatches`).
"""
from typing import Sequence

import jax
import numpy as np

from agentrl.rollout import agent_loop
from agentrl.rollout import sampler as sampler_lib
from agentrl import types


def padded_length(lengths: Sequence[int], *, max_len: int, min_len: int = 16,
                  per_octave: int = 1) -> int:
  """The bucketed T for trajectories of these lengths (see the module docstring)."""
  if per_octave < 1:
    raise ValueError(f"per_octave must be >= 1, got {per_octave}.")
  n = max(lengths, default=1)
  top = sampler_lib.bucket(n, min_len)
  if top > min_len and per_octave > 1:
    step = max(top // (2 * per_octave), 1)
    top = -(-n // step) * step
  return min(top, max_len)


def length_sorted_layout(lengths_B: Sequence[int], *, num: int, max_len: int, min_len: int = 16,
                         per_octave: int = 1, seed=None) -> list[tuple[np.ndarray, int]]:
  """Host plan of `num` length-sorted minibatches: [(row indices, their padded length T)].

  Rows are sorted by length (stable: ties keep batch order), cut into `num` runs of B / num
  rows, and each run gets T = `padded_length` of its own longest row, so short rows no longer
  pay for the longest row of the batch. Indices inside a run are ascending (batch order).
  With `seed` (any numpy seed, e.g. (step, epoch)) the runs come in a random order; without it,
  shortest first.
  """
  lengths = np.asarray(lengths_B, np.int64)
  if lengths.ndim != 1 or not lengths.size:
    raise ValueError(f"lengths_B must be a non-empty [B] vector; got shape {lengths.shape}.")
  if num < 1 or lengths.size % num:
    raise ValueError(f"num={num} minibatches must divide the batch size {lengths.size}.")
  size = lengths.size // num
  order = np.argsort(lengths, kind="stable")
  runs = [np.sort(order[i * size:(i + 1) * size]) for i in range(num)]
  if seed is not None:
    runs = [runs[i] for i in np.random.default_rng(seed).permutation(num)]
  return [(rows, padded_length(lengths[rows].tolist(), max_len=max_len, min_len=min_len,
                               per_octave=per_octave)) for rows in runs]


def pack_numpy(trajs: Sequence[agent_loop.Trajectory], *, max_len: int, pad_id: int,
               min_len: int = 16, per_octave: int = 1) -> types.Batch:
  """Host-side: the Batch as numpy arrays (what `pack` transfers)."""
  if not trajs:
    raise ValueError("pack needs at least one trajectory.")
  if max_len < 1:
    raise ValueError(f"max_len must be >= 1, got {max_len}.")
  for i, t in enumerate(trajs):
    n = len(t.tokens)
    if not len(t.loss_mask) == len(t.turn) == len(t.sampler_logp) == n:
      raise ValueError(f"trajectory {i} has per-token arrays of different lengths (tokens {n}, "
                       f"loss_mask {len(t.loss_mask)}, turn {len(t.turn)}, sampler_logp "
                       f"{len(t.sampler_logp)}).")
  B, T = len(trajs), padded_length([len(t.tokens) for t in trajs], max_len=max_len,
                                   min_len=min_len, per_octave=per_octave)
  tokens_BT = np.full((B, T), pad_id, np.int32)
  positions_BT = np.zeros((B, T), np.int32)
  input_mask_BT = np.zeros((B, T), bool)
  loss_mask_BT = np.zeros((B, T), np.float32)
  turn_BT = np.full((B, T), -1, np.int32)
  logp_BT = np.zeros((B, T), np.float32)
  reward_B = np.zeros((B,), np.float32)
  truncated_B = np.zeros((B,), bool)
  for i, t in enumerate(trajs):
    n = min(len(t.tokens), T)
    tokens_BT[i, :n] = t.tokens[:n]
    positions_BT[i, :n] = np.arange(n)
    input_mask_BT[i, :n] = True
    loss_mask_BT[i, :n] = t.loss_mask[:n]
    turn_BT[i, :n] = t.turn[:n]
    logp_BT[i, :n] = t.sampler_logp[:n]
    reward_B[i] = t.reward
    truncated_B[i] = t.truncated or len(t.tokens) > T
  return types.Batch(tokens_BT=tokens_BT, positions_BT=positions_BT, input_mask_BT=input_mask_BT,
                     loss_mask_BT=loss_mask_BT, turn_BT=turn_BT, reward_B=reward_B,
                     sampler_logp_BT=logp_BT, truncated_B=truncated_B)


def pack(trajs: Sequence[agent_loop.Trajectory], *, max_len: int, pad_id: int, min_len: int = 16,
         per_octave: int = 1, sharding: jax.sharding.Sharding | None = None) -> types.Batch:
  """Right-pads trajectories into a device `types.Batch` ([B, T], T bucketed, <= max_len).

  Args:
    trajs: host trajectories, in batch order.
    max_len: hard cap on T; longer trajectories are cut and flagged in truncated_B.
    pad_id: token id written on padding (input_mask is 0 there).
    min_len: smallest T bucket.
    per_octave: bucket steps per power of two (1: powers of two).
    sharding: optional sharding for every leaf (e.g. rows over the data axes); default device
      otherwise. This is an explicit device_put, so it is allowed under
      jax_transfer_guard="disallow".
  """
  batch = pack_numpy(trajs, max_len=max_len, pad_id=pad_id, min_len=min_len,
                     per_octave=per_octave)
  return jax.device_put(batch, sharding)
