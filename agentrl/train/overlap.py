# pylint: disable=invalid-name
"""Overlapped (asynchronous) training: rollouts for steps s+1..s+k are made while step s trains.

`loop.run(max_staleness=k)` draws its rollouts from a `RolloutProducer`. With k = 0 the rollout
of step s is made from the params step s starts with, inline (the synchronous loop). With
k > 0 a single background thread makes them, and the rollout of step t is sampled from the
params after max(0, t - 1 - k) updates: at step s the loop hands the producer a private copy
of its current params (the update donates the state's buffers) for the rollout of step s + k,
then scores and updates on the rollout of step s, which was sampled k updates ago. This is
verl's one-step-off-policy pipeline (k = 1) and AReaL's bounded staleness: the schedule is
fixed, not decided by whichever thread is faster, so a run is reproducible and resumable.

Every row records the version (number of updates) of the policy that sampled it
(`Batch.version_B`). The score step recomputes old log-probs with the current params (the
proximal policy of decoupled PPO), so the ratio pi / pi_old stays on-policy-sized, and
`off_policy_correction` reweights each token by pi_old / pi_behaviour, the sampler's own
log-probs standing for pi_behaviour: truncated importance sampling (token or sequence level,
`ratios.rollout_correction_weight`) or masked importance sampling (tokens or rows whose weight
leaves [1 / threshold, threshold] are dropped, `ratios.rollout_rejection_mask`). The weight
multiplies the advantage, which for every surrogate linear in A with a non-negative weight
(PPO-clip, CISPO, REINFORCE) is the same as multiplying the per-token policy loss.

Exact resume. A checkpoint at step s holds, for each pending step s+1..s+k, the params its
rollout is sampled from (adapters only with LoRA) and their version, and the data stream's
position after step s's rollout. On restore those rollouts are made again, in order, from
the same params, keys and prompts, so the resumed run reproduces the uninterrupted one.

What overlaps. The rollout thread's host work (the environment, tokenization, packing, Python
in the sampler) runs while the update's compiled computation runs, and with an accelerator the
sampler's device work overlaps the host side of the update as well. On a 2-core CPU both
computations share the same two cores (docs/scaling.md §3 has the figures).
"""
from collections.abc import Callable
import concurrent.futures
import dataclasses
import time
from typing import Any

import jax
import jax.numpy as jnp

from agentrl.losses import aggregation
from agentrl.losses import ratios
from agentrl.models import lora
from agentrl import types

CORRECTIONS = ("none", "token_tis", "sequence_tis", "token_mask", "sequence_mask")


def rollout_key(rng: jax.Array, step: int) -> jax.Array:
  """The rollout key of step `step` (the shuffle key is the other half of the split)."""
  return jax.random.split(jax.random.fold_in(rng, step))[0]


def behaviour_version(step: int, max_staleness: int) -> int:
  """Updates applied to the params that sample step `step`'s rollout (steps count from 1)."""
  return max(0, step - 1 - max_staleness)


@dataclasses.dataclass
class _Pending:
  version: int
  inputs: Any                                   # rollout_fn's first argument
  future: concurrent.futures.Future | None = None


class RolloutProducer:
  """Makes the rollouts of `loop.run` on the fixed staleness schedule (module docstring).

  rollout_fn(inputs, key, step) -> loop.Rollout; `data` (may be None) is the prompt stream the
  rollouts draw from, only ever touched by the thread that makes rollouts.
  """

  def __init__(self, rollout_fn: Callable, *, rng: jax.Array, max_staleness: int,
               total_steps: int, data=None):
    if max_staleness < 0:
      raise ValueError(f"max_staleness must be >= 0; got {max_staleness}.")
    self.k, self._fn, self._rng, self._total, self._data = (max_staleness, rollout_fn, rng,
                                                            total_steps, data)
    self._pending: dict[int, _Pending] = {}
    self._pool = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rollout")
                  if max_staleness else None)
    # Mesh contexts are per thread: the worker re-enters the caller's.
    get_mesh = getattr(jax.sharding, "get_mesh", None)
    self._mesh = get_mesh() if get_mesh is not None and max_staleness else None
    self.data_state = data.state() if data is not None else {}  # after the last taken rollout

  # -- The schedule.
  def take(self, step: int, inputs: Any) -> tuple[Any, float]:
    """The rollout of `step` and the seconds spent making it; `inputs` (the current params)
    also sample every step up to step + k that has no rollout scheduled yet."""
    for t in range(step, step + self.k + 1):
      if t not in self._pending:
        self._schedule(t, inputs)
    entry = self._pending.pop(step)
    if entry.future is None:  # synchronous, or beyond total_steps when scheduled
      rollout, seconds, self.data_state = self._make(step, entry.version, entry.inputs)
    else:
      rollout, seconds, self.data_state = entry.future.result()
    return rollout, seconds

  def drain(self) -> None:
    """Waits until the rollout thread is idle (it shares the engine with evaluation)."""
    for entry in self._pending.values():
      if entry.future is not None:
        entry.future.result()

  def close(self, wait: bool = True) -> None:
    """Cancels the rollouts not started; with `wait`, waits for the one being made (without,
    the thread finishes it alone and its result is dropped)."""
    if self._pool is not None:
      for entry in self._pending.values():
        if entry.future is not None:
          entry.future.cancel()
      self._pool.shutdown(wait=wait)

  def _schedule(self, t: int, inputs: Any) -> None:
    version = behaviour_version(t, self.k)
    if self.k:
      inputs = jax.tree.map(jnp.copy, inputs)  # survives the update's donation of the state
    entry = _Pending(version, inputs)
    if self._pool is not None and t <= self._total:
      entry.future = self._pool.submit(self._make, t, version, inputs)
    self._pending[t] = entry

  def _make(self, step: int, version: int, inputs: Any):
    start = time.perf_counter()
    if self._mesh is None or self._mesh.empty:
      rollout = self._fn(inputs, rollout_key(self._rng, step), step)
    else:
      with jax.set_mesh(self._mesh):
        rollout = self._fn(inputs, rollout_key(self._rng, step), step)
    batch = rollout.batch
    rollout.batch = batch.replace(
        version_B=jnp.zeros_like(batch.tokens_BT[:, 0], jnp.int32) + jnp.int32(version))
    jax.block_until_ready(rollout.batch)
    # The stream's position after this rollout, where the next one starts: a checkpoint after
    # this step records it (the thread may have drawn later rollouts' prompts by then).
    data_state = self._data.state() if self._data is not None else {}
    return rollout, time.perf_counter() - start, data_state

  # -- Checkpointing (exact resume).
  def pending_tree(self, step: int) -> list[Any]:
    """The saved part of the pending rollouts after step `step`: their params (the trainable
    part), in step order. Always k entries: a rollout beyond total_steps is scheduled too, so a
    run resumed with more steps samples it from the params the longer run would have used."""
    return [lora.trainable(self._pending[t].inputs) for t in range(step + 1, step + self.k + 1)]

  def pending_meta(self, step: int) -> dict:
    return {"versions": [self._pending[t].version for t in range(step + 1, step + self.k + 1)],
            "data": self.data_state}

  def restore(self, step: int, tree: list[Any], meta: dict, inputs: Any) -> None:
    """Schedules the pending rollouts of a checkpoint at `step` again (after the data stream
    is restored to the position it recorded); `inputs` supplies LoRA's frozen base."""
    self._pending.clear()
    for i, (saved, version) in enumerate(zip(tree, meta["versions"])):
      t = step + 1 + i
      entry = _Pending(version, lora.combine(inputs, saved))
      if self._pool is not None and t <= self._total:
        entry.future = self._pool.submit(self._make, t, version, entry.inputs)
      self._pending[t] = entry


def pending_template(inputs: Any, max_staleness: int) -> list[Any]:
  """The structure `RolloutProducer.pending_tree` saves, for restoring onto."""
  return [lora.trainable(inputs)] * max_staleness


def off_policy_correction(mode: str = "token_tis", threshold: float = 2.0) -> Callable:
  """correct(batch) -> (batch, metrics): reweights stale rows by pi_old / pi_behaviour.

  mode: "token_tis" / "sequence_tis" multiply `adv_BT` by the truncated importance weight
  min(pi_old / pi_behaviour, threshold) per token / per row (the row's product of token
  ratios); "token_mask" / "sequence_mask" drop tokens / rows whose weight lies outside
  [1 / threshold, threshold] from `loss_mask_BT` and `adv_BT`; "none" returns the batch.
  pi_old is the score step's recomputation with the current params, pi_behaviour the
  sampler's log-probs (`sampler_logp_BT`). Metrics: `offpolicy/weight` (token-mean weight,
  1 for a fresh rollout) and `offpolicy/kept` (fraction of policy tokens kept).
  """
  if mode not in CORRECTIONS:
    raise ValueError(f"unknown off-policy correction {mode!r}; use one of {CORRECTIONS}")
  level = mode.split("_")[0]

  def correct(batch: types.Batch):
    if mode == "none":
      return batch, {}
    if batch.sampler_logp_BT is None or batch.old_logp_BT is None or batch.adv_BT is None:
      raise ValueError("off-policy correction needs the sampler's log-probs (sampler_logp_BT), "
                       "the score step's old_logp_BT and the advantages (adv_BT)")
    mask_BT = batch.loss_mask_BT
    if mode.endswith("tis"):
      w_BT = ratios.rollout_correction_weight(batch.old_logp_BT, batch.sampler_logp_BT, mask_BT,
                                              level=level, threshold=threshold)
      kept_BT = (mask_BT > 0).astype(jnp.float32)
      batch = batch.replace(adv_BT=batch.adv_BT * w_BT)
    else:
      w_BT = ratios.rollout_rejection_mask(batch.old_logp_BT, batch.sampler_logp_BT, mask_BT,
                                           level=level, threshold=threshold)
      kept_BT = w_BT
      batch = batch.replace(adv_BT=batch.adv_BT * w_BT, loss_mask_BT=mask_BT * w_BT)
    metrics = {"offpolicy/weight": aggregation.masked_mean(w_BT, mask_BT),
               "offpolicy/kept": aggregation.masked_mean(kept_BT, mask_BT)}
    return batch, metrics

  return correct
