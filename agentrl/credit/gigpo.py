# pylint: disable=invalid-name
"""GiGPO: group-in-group policy optimisation (Feng et al. 2025, arXiv 2505.10978).

A = A_episode + omega * A_step, per turn (docs/algorithms.md §5.1):

- A_episode: GRPO over each prompt's trajectories (the episode reward, paper Eq. 3).
- A_step: the turns of a prompt's G trajectories that start from the *same* environment state
  (an "anchor state") form a step group; each turn's discounted return (Eq. 5) is normalised
  within its step group (Eq. 7).

Official code: langfengQ/verl-agent, `gigpo/core_gigpo.py` (`compute_gigpo_outcome_advantage`,
`episode_norm_reward`, `build_step_group`, `step_norm_reward`; the file as of upstream commit
29e3e8b, 2025-09-03, read through the fork vanzll/verl-agent) and the
`examples/gigpo_trainer/*.sh` launchers. Defaults [code]: gamma 0.95
(every launcher; the trainer yaml's own default is 1.0), omega (`step_advantage_w`) 1.0, mode
"mean_norm" (the function's and yaml's default and most launchers; ALFWorld and search use
"mean_std_norm"), eps 1e-6, torch's unbiased std. Conventions of the official code kept here:
a step group of one turn gets step advantage 0 (its own mean), an episode group of one counted
entry uses mean 0 and std 1 (verl's GRPO rule), and by default the episode statistics are taken
over every *step* row of the group, so a trajectory weighs as many times as it has turns
(`compute_mean_std_cross_steps=True`, "more stable"); `weight_by_steps=False` gives the paper's
per-trajectory Eq. 3.

`anchor_groups` is host Python (it hashes environment states); the rest are pure jax functions
over `[B, U]` arrays (rows [i*G, (i+1)*G) are prompt i's trajectories, valid turns a prefix of
each row). `estimators.broadcast_turn_to_tokens` carries the result to the turn's tokens.
"""
from collections.abc import Sequence
import difflib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl import types

MODES = ("mean_norm", "mean_std_norm")


def _hashable(x: Any) -> Any:
  """A hashable stand-in for an environment state (verl-agent's `to_hashable` rules)."""
  if isinstance(x, (str, bytes, bool, int, float)):
    return x
  if isinstance(x, np.generic):
    return x.item()
  if isinstance(x, np.ndarray):
    return (x.shape, tuple(x.reshape(-1).tolist()))
  if isinstance(x, (list, tuple)):
    return tuple(_hashable(e) for e in x)
  if isinstance(x, dict):
    return tuple(sorted((k, _hashable(v)) for k, v in x.items()))
  raise TypeError(f"anchor state of type {type(x).__name__} is not hashable; pass a str, "
                  "number, tuple, list, dict or numpy array.")


def _cluster(states: list[Any], similarity_thresh: float | None) -> list[int]:
  """Cluster index of each state: exact equality, or greedy SequenceMatcher similarity."""
  if similarity_thresh is None:
    first: dict[Any, int] = {}
    return [first.setdefault(_hashable(s), len(first)) for s in states]
  reps: list[str] = []
  out = []
  for s in states:
    if not isinstance(s, str):
      raise TypeError("similarity-based anchor grouping compares text states only; got "
                      f"{type(s).__name__}.")
    # Like verl-agent, a state joins the first cluster whose representative (its first member)
    # is similar enough; the order of the rows therefore matters.
    hit = next((k for k, r in enumerate(reps)
                if difflib.SequenceMatcher(None, s, r).ratio() >= similarity_thresh), None)
    if hit is None:
      reps.append(s)
      hit = len(reps) - 1
    out.append(hit)
  return out


def anchor_groups(state_keys: Sequence[Sequence[Any]], *, group_size: int,
                  num_turns: int | None = None,
                  similarity_thresh: float | None = None) -> np.ndarray:
  """Step-group ids int32 [B, U] from each turn's anchor state (host side, `build_step_group`).

  Args:
    state_keys: per trajectory, the environment state each turn starts from (the observation the
      policy acted on), e.g. a string, a tuple or a numpy array; rows may be ragged and `None`
      marks a turn that did not happen. Rows [i*G, (i+1)*G) are prompt i's trajectories.
    group_size: G.
    num_turns: U of the output (default: the longest row).
    similarity_thresh: None groups identical states only (verl-agent's default); a value in
      (0, 1) groups text states whose `difflib.SequenceMatcher` ratio to a cluster's first state
      is at least the threshold (verl-agent's `enable_similarity`, 0.95 by default there).

  Returns:
    int32 [B, U]: equal ids mark turns in the same step group; ids never repeat across
    prompts; -1 where no turn happened.
  """
  B = len(state_keys)
  if group_size < 1 or B % group_size:
    raise ValueError(f"anchor_groups: {B} trajectories do not split into groups of "
                     f"group_size={group_size}.")
  if similarity_thresh is not None and not 0.0 < similarity_thresh < 1.0:
    raise ValueError(f"similarity_thresh={similarity_thresh} must be in (0, 1) or None.")
  U = max((len(row) for row in state_keys), default=0) if num_turns is None else num_turns
  if any(len(row) > U for row in state_keys):
    raise ValueError(f"anchor_groups: a row has more than num_turns={U} turns.")
  ids = np.full((B, U), -1, np.int32)
  next_id = 0
  for start in range(0, B, group_size):
    where = [(b, u) for b in range(start, start + group_size)
             for u, s in enumerate(state_keys[b]) if s is not None]
    cluster = _cluster([state_keys[b][u] for b, u in where], similarity_thresh)
    for (b, u), c in zip(where, cluster):
      ids[b, u] = next_id + c
    next_id += max(cluster, default=-1) + 1
  return ids


def group_normalize(x_N: jax.Array, segment_N: jax.Array, valid_N: jax.Array, *,
                    num_segments: int, norm_by_std: bool, eps: float = 1e-6,
                    single: str = "zero") -> jax.Array:
  """x normalised within its segment: (x - mean) [/ (std + eps)], unbiased std; 0 where invalid.

  `single` is what a segment with one valid entry gets: "zero" (its own mean, so 0; GiGPO's
  step groups) or "raw" (mean 0 and std 1, verl's GRPO rule). A segment of equal values gives
  exactly 0. `num_segments` bounds the segment ids (static).
  """
  if single not in ("zero", "raw"):
    raise ValueError(f"single={single!r}; expected 'zero' or 'raw'.")
  valid_N = valid_N > 0
  seg_N = jnp.where(valid_N, segment_N, 0).astype(jnp.int32)
  x_N = jnp.where(valid_N, x_N.astype(jnp.float32), 0.0)
  ssum = lambda v: jax.ops.segment_sum(v, seg_N, num_segments=num_segments)
  count_N = ssum(valid_N.astype(jnp.float32))[seg_N]
  # Centre on the segment minimum first, so equal values give exactly 0 (as types.centre).
  low_S = jax.ops.segment_min(jnp.where(valid_N, x_N, jnp.inf), seg_N, num_segments=num_segments)
  d_N = jnp.where(valid_N, x_N - low_S[seg_N], 0.0)
  centred_N = d_N - ssum(d_N)[seg_N] / jnp.maximum(count_N, 1.0)
  var_N = ssum(jnp.where(valid_N, jnp.square(centred_N), 0.0))[seg_N] / jnp.maximum(
      count_N - 1.0, 1.0)
  lone_N = count_N == 1.0
  if single == "raw":
    centred_N = jnp.where(lone_N, x_N, centred_N)
  out_N = centred_N
  if norm_by_std:
    out_N = centred_N / (jnp.where(lone_N, 1.0, jnp.sqrt(var_N)) + eps)
  return jnp.where(valid_N, out_N, 0.0)


def _check(turn_mask_BU: jax.Array, group_size: int, **named: jax.Array) -> None:
  B, U = turn_mask_BU.shape
  for name, x in named.items():
    if x.shape not in ((B,), (B, U)):
      raise ValueError(f"{name} has shape {x.shape}; expected [B] or [B, U] with "
                       f"[B, U] = {(B, U)}.")
  if group_size < 1 or B % group_size:
    raise ValueError(f"B={B} rows do not split into groups of group_size={group_size}.")


def episode_advantage(episode_reward_B: jax.Array, turn_mask_BU: jax.Array, *, group_size: int,
                      norm_by_std: bool = False, eps: float = 1e-6,
                      weight_by_steps: bool = True) -> jax.Array:
  """Episode-relative advantage [B] (paper Eq. 3, `episode_norm_reward`).

  With weight_by_steps=True (verl-agent's default) the group mean and std run over every valid
  turn, each carrying its trajectory's reward; False counts each trajectory once (Eq. 3). A row
  without valid turns is left out of its group's statistics and gets 0.
  """
  _check(turn_mask_BU, group_size, episode_reward_B=episode_reward_B)
  B, U = turn_mask_BU.shape
  valid_BU = turn_mask_BU > 0
  if not weight_by_steps:  # one entry per trajectory: its first valid turn
    valid_BU = valid_BU & (jnp.cumsum(valid_BU, axis=1) == 1)
  prompt_BU = jnp.broadcast_to((jnp.arange(B) // group_size)[:, None], (B, U))
  reward_BU = jnp.broadcast_to(episode_reward_B.astype(jnp.float32)[:, None], (B, U))
  adv_BU = group_normalize(reward_BU.reshape(-1), prompt_BU.reshape(-1), valid_BU.reshape(-1),
                           num_segments=B // group_size, norm_by_std=norm_by_std, eps=eps,
                           single="raw").reshape(B, U)
  return adv_BU.sum(axis=1) / jnp.maximum(valid_BU.sum(axis=1), 1)


def step_advantage(step_return_BU: jax.Array, anchor_id_BU: jax.Array, *,
                   norm_by_std: bool = False, eps: float = 1e-6) -> jax.Array:
  """Step-relative advantage [B, U] (paper Eq. 7, `step_norm_reward`).

  Turns with equal `anchor_id_BU` (from `anchor_groups`; -1 = no turn) are one step group;
  a step group of one turn gets 0.
  """
  if step_return_BU.shape != anchor_id_BU.shape or step_return_BU.ndim != 2:
    raise ValueError(f"step_advantage expects matching [B, U] arrays; got "
                     f"{step_return_BU.shape} and {anchor_id_BU.shape}.")
  n = step_return_BU.size
  return group_normalize(step_return_BU.reshape(-1), anchor_id_BU.reshape(-1),
                         (anchor_id_BU >= 0).reshape(-1), num_segments=n,
                         norm_by_std=norm_by_std, eps=eps,
                         single="zero").reshape(step_return_BU.shape)


def gigpo(episode_reward_B: jax.Array, step_reward_BU: jax.Array, anchor_id_BU: jax.Array, *,
          group_size: int, gamma: float = 0.95, omega: float = 1.0, mode: str = "mean_norm",
          eps: float = 1e-6, weight_by_steps: bool = True) -> jax.Array:
  """GiGPO advantages per turn [B, U]: A_episode + omega * A_step (Eq. 8); 0 on absent turns.

  Args:
    episode_reward_B: the episode's total reward R(tau).
    step_reward_BU: each turn's environment reward (e.g. 0 until the last turn, plus any
      invalid-action penalty); its discounted return (Eq. 5) enters the step groups.
    anchor_id_BU: `anchor_groups` output; -1 marks turns that did not happen.
    group_size: G.
    gamma: discount of the step returns (0.95 in every official launcher).
    omega: step-advantage weight `step_advantage_w` (1.0).
    mode: "mean_norm" (centre only) or "mean_std_norm" (also divide by std + eps), both levels.
    eps: 1e-6.
    weight_by_steps: see `episode_advantage`.
  """
  if mode not in MODES:
    raise ValueError(f"mode={mode!r}; expected one of {MODES}.")
  turn_mask_BU = anchor_id_BU >= 0
  _check(turn_mask_BU, group_size, episode_reward_B=episode_reward_B,
         step_reward_BU=step_reward_BU)
  norm = mode == "mean_std_norm"
  returns_BU = estimators.discounted_turn_returns(step_reward_BU, turn_mask_BU, gamma=gamma)
  ep_B = episode_advantage(episode_reward_B, turn_mask_BU, group_size=group_size,
                           norm_by_std=norm, eps=eps, weight_by_steps=weight_by_steps)
  step_BU = step_advantage(returns_BU, anchor_id_BU, norm_by_std=norm, eps=eps)
  return jnp.where(turn_mask_BU, ep_B[:, None] + omega * step_BU, 0.0)
