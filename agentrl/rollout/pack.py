"""The single host->device boundary: trajectories -> a fixed-shape `types.Batch`.

  batch = pack.pack(trajs, max_len=1024, pad_id=tok.pad_id)            # rows keep their order
  batch = pack.pack(trajs, max_len=1024, pad_id=tok.pad_id, sharding=data_sharding)

Rows are right-padded to T = the smallest power of two (>= min_len) that holds the longest
trajectory, capped at max_len, so a run sees a handful of shapes. A trajectory longer than
max_len is cut to its first max_len tokens and its `truncated_B` flag is set (never silently).
B is len(trajs): group layout (rows [i*G, (i+1)*G) share a prompt) is the caller's order.

loss_mask is 1 only on tokens the policy sampled: tool and environment tokens are context,
not actions, so they get loss_mask 0 even though the model attends to them (docs/style.md C9).
"""
from typing import Sequence

import jax
import numpy as np

from agentrl import types
from agentrl.rollout import agent_loop
from agentrl.rollout import sampler as sampler_lib


def padded_length(lengths: Sequence[int], *, max_len: int, min_len: int = 16) -> int:
  """The bucketed T for trajectories of these lengths."""
  return min(sampler_lib.bucket(max(lengths, default=1), min_len), max_len)


def pack_numpy(trajs: Sequence[agent_loop.Trajectory], *, max_len: int, pad_id: int,
               min_len: int = 16) -> types.Batch:
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
                                   min_len=min_len)
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
         sharding: jax.sharding.Sharding | None = None) -> types.Batch:
  """Right-pads trajectories into a device `types.Batch` ([B, T], T bucketed, <= max_len).

  Args:
    trajs: host trajectories, in batch order.
    max_len: hard cap on T; longer trajectories are cut and flagged in truncated_B.
    pad_id: token id written on padding (input_mask is 0 there).
    min_len: smallest T bucket.
    sharding: optional sharding for every leaf (e.g. rows over the data axes); default device
      otherwise. This is an explicit device_put, so it is allowed under
      jax_transfer_guard="disallow".
  """
  batch = pack_numpy(trajs, max_len=max_len, pad_id=pad_id, min_len=min_len)
  return jax.device_put(batch, sharding)
