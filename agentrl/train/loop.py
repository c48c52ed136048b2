# pylint: disable=invalid-name
"""The RL step driver shared by experiments (docs/architecture.md §2).

One step of `run`:

  rollout      host: prompts -> rollout engine (+ env turns) -> rewards -> `pack` -> device Batch
  score        jitted, no grad: old_logp, entropy (and ref_logp, values) for every token
  advantages   jitted: the experiment's estimator, e.g. `agentrl.advantages.estimators.grpo`
  update       epochs x minibatches of the experiment's jitted `update_step(state, batch)`
  log, save    one dict of scalars (with the alarms' `alarm/*`) to `metrics.Writer`; on record
               steps the trajectory records; a checkpoint every `save_every` steps

The loop owns no algorithm: every piece of math is a function the experiment passes in. State
beyond params and optimizer (a critic, a dual variable, a replay batch) rides in the train
state pytree, so it is donated, checkpointed and restored with it (experiments/policy/ppo.py,
experiments/policy/r2vpo.py); host-side state that a method's rollout or advantage code keeps
across steps (an experience-replay buffer, `agentrl.train.replay_buffer`) is a `HostState`
passed as `host_state`, checkpointed in the same tree. A method that needs a different step
order writes its own loop and reuses the helpers here.

Exact resume. Step s draws its randomness from `fold_in(rng, s)` and its prompts from the data
stream, whose position (`state()`) is checkpointed with the train state. A run killed at any
point (SIGKILL included) and started again with the same workdir restores the last complete
checkpoint, drops later metrics and trajectory records, and reproduces the uninterrupted
run's records exactly on CPU (the time and throughput fields aside). `replay` reruns one
recorded step's update from its checkpoint and batch (`--config.replay_batch=RUN_DIR:STEP`).
On Ctrl-C or SIGTERM (`agentrl.train.shutdown`, set up by `cli.run`) the exception leaves `run`
after the background rollout is abandoned, a checkpoint save in flight is finished and the
metrics files are closed.
"""
from collections.abc import Callable, Mapping, Sequence
import dataclasses
import math
import os
import sys
import time
from typing import Any, Protocol

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl import checkpoint as checkpoint_lib
from agentrl.losses import aggregation
from agentrl.losses import kl
from agentrl.models import lora
from agentrl.models import policy as policy_lib
from agentrl.rollout import collect
from agentrl.rollout import pack as pack_lib
from agentrl.records import alarms as alarms_lib
from agentrl.records import metrics as metrics_lib
from agentrl.records import trajectories as trajectories_lib
from agentrl.train import overlap
from agentrl.train import shutdown
from agentrl import types

class DataStream(Protocol):
  """A prompt source whose position can be checkpointed (JSON-able) and restored.

  `agentrl.data.stream.PromptStream` is the usual one.
  """

  def state(self) -> dict[str, Any]:
    ...

  def restore(self, state: Mapping[str, Any]) -> None:
    ...


class HostState(Protocol):
  """Host-side method state (numpy arrays of fixed shapes) checkpointed with the train state.

  `tree()` is the current state (also the restore template: its shapes never change) and
  `restore(tree)` takes a restored one. `replay_buffer.Holder` is the usual one.
  """

  def tree(self) -> Any:
    ...

  def restore(self, tree: Any) -> None:
    ...


# What one rollout hands to the device side (rollout_fn's return value).
Rollout = collect.Rollout


def sampler_score(params, batch: types.Batch) -> tuple[types.Batch, dict]:
  """A score_fn that takes pi_old from the rollout's own log-probs, with no forward pass.

  Valid when the sampler scores tokens as the learner does (float32, the same temperature,
  logp_mode "tempered": the engine's log-probs equal `token_logprobs` to <= 1e-5, tested in
  tests/engine_test.py, also for LoRA over merged weights); a bfloat16 or otherwise mismatched
  sampler needs `make_score_step`. The step then logs no `entropy` or `logp_mismatch`.
  """
  del params
  return batch.replace(old_logp_BT=batch.sampler_logp_BT), {}


def make_score_step(graphdef, *, temperature: float, logprob_impl: str = "auto",
                    with_ref: bool = False) -> Callable:
  """score_step(params, ref_params, batch) -> (batch, metrics); pure, jit it in the experiment.

  Fills `old_logp_BT` with the learner's own log-probs of the behaviour policy (the ratio's
  denominator), `entropy_BT` with pi_old's per-token entropy (for an advantage step that
  selects or weighs tokens by it, experiments/shaping/d3s.py, and for the trajectory records)
  and, with `with_ref`, `ref_logp_BT` from the frozen reference params, which
  stay a separate non-donated argument (docs/style.md C4); ref_params=None with LoRA params
  (`recipe.reference_params`) scores their frozen base with the adapters off. Metrics:
  `logp_mismatch` (mean |learner - sampler| log-prob over policy tokens, ~0 in float32),
  `entropy` (token-mean, of pi_old), and with a reference `kl` (token-mean k3 estimate of
  KL(pi_old || pi_ref) on the sampled tokens). These names are the score step's in every
  experiment: a loss's own KL or entropy is `kl_loss` / `entropy_loss` (docs/metrics.md).
  """

  def logprobs(params, batch, return_entropy, adapters_off=False):
    model = nnx.merge(graphdef, params)
    model = lora.base_model(model) if adapters_off else model
    return policy_lib.token_logprobs(
        model, batch.tokens_BT, batch.positions_BT, batch.input_mask_BT,
        temperature=temperature, return_entropy=return_entropy, impl=logprob_impl)

  def score_step(params, ref_params, batch: types.Batch):
    old_logp_BT, entropy_BT = logprobs(params, batch, True)
    mask_BT = batch.loss_mask_BT
    metrics = {"entropy": aggregation.masked_mean(entropy_BT, mask_BT)}
    if batch.sampler_logp_BT is not None:
      metrics["logp_mismatch"] = aggregation.masked_mean(
          jnp.abs(old_logp_BT - batch.sampler_logp_BT), mask_BT)
    ref_logp_BT = None
    if with_ref:
      ref_logp_BT = logprobs(params if ref_params is None else ref_params, batch, False,
                             adapters_off=ref_params is None)
      metrics["kl"] = aggregation.aggregate(kl.kl_penalty(old_logp_BT, ref_logp_BT, "k3"),
                                            mask_BT, "token-mean")
    return batch.replace(old_logp_BT=old_logp_BT, ref_logp_BT=ref_logp_BT,
                         entropy_BT=entropy_BT), metrics

  return score_step


def apply_gradients(state, grads, tx) -> tuple[Any, dict[str, jax.Array]]:
  """One optimizer step: (state with new params/opt_state and step + 1, {"grad_norm"}).

  `grad_norm` is the global norm of `grads` before the optimizer (and its clipping) sees them;
  with LoRA params both see the adapters only, and the frozen bases pass through unchanged.
  """
  grads, trained = lora.trainable(grads), lora.trainable(state.params)
  updates, opt_state = tx.update(grads, state.opt_state, trained)
  params = lora.combine(state.params, optax.apply_updates(trained, updates))
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state)
  return new_state, {"grad_norm": optax.tree.norm(grads)}


def gradient_step(loss_fn: Callable, tx, *, with_step: bool = False) -> Callable:
  """update_step(state, batch) -> (state, metrics): one optimizer step on `loss_fn`.

  loss_fn(params, batch) -> (loss, metrics), or loss_fn(params, batch, step) with `with_step`
  (`state.step`, the number of updates so far, e.g. for a schedule inside the loss). An
  experiment that needs the gradients themselves (per-group norms, a second variable updated
  from the metrics) writes its update_step from `jax.value_and_grad` and `apply_gradients`.
  """

  def update_step(state, batch: types.Batch):
    args = (state.step,) if with_step else ()
    # [INF] LoRA dropout (if any) draws from fold_in(key(0), update count): resumable.
    with lora.dropout_key(jax.random.fold_in(jax.random.key(0), state.step)):
      (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch, *args)
    state, grad_metrics = apply_gradients(state, grads, tx)
    return state, {**metrics, **grad_metrics}

  return update_step


def skip_nonfinite(update_step: Callable) -> Callable:
  """Wraps update_step(state, batch): a non-finite loss, `*grad_norm`, new params or optimizer
  state keeps the old state.

  Apply before `jax.jit(..., donate_argnames="state")`: the state is donated, so the choice
  between the old and the new state has to happen inside the compiled step. The returned
  metrics gain `skipped` (1.0 when the update was dropped).
  """

  def guarded(state, batch):
    new_state, metrics = update_step(state, batch)
    ok = jnp.isfinite(metrics["loss"])
    for key in metrics:  # grad_norm, and per-group norms such as PPO's value_grad_norm
      if key.endswith("grad_norm"):
        ok &= jnp.isfinite(metrics[key])
    # Finite gradients can still overflow in the optimizer (a huge Adam step, a bad moment).
    # Leaves passed through unchanged (a LoRA model's frozen base) need neither check nor select.
    for new, old in zip(jax.tree.leaves(new_state), jax.tree.leaves(state)):
      if new is not old and jnp.issubdtype(new.dtype, jnp.floating):
        ok &= jnp.all(jnp.isfinite(new))
    state = jax.tree.map(lambda new, old: old if new is old else jnp.where(ok, new, old),
                         new_state, state)
    return state, {**metrics, "skipped": (~ok).astype(jnp.float32)}

  return guarded


def _mean_metrics(per_update: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """Means over minibatch updates; `skipped` is summed (the number of dropped updates)."""
  host = jax.device_get(list(per_update))
  out = {}
  for key in host[0]:
    values = np.asarray([m[key] for m in host], np.float64)
    if key == "skipped":
      out[key] = float(values.sum())
    else:
      finite = values[np.isfinite(values)]
      out[key] = float(finite.mean()) if finite.size else math.nan
  return out




@dataclasses.dataclass
class Result:
  state: Any
  step: int
  records: list[dict[str, Any]]            # every metrics record of the run (resumed ones too)
  evals: dict[str, dict[str, float]]       # str(step) -> eval metrics, including step "0"
  wall_seconds: float                      # this process's wall time in `run`
  steps_run: int = 0                       # steps this process ran (0: it was already done)
  replay: str = ""                         # "RUN_DIR:STEP" of a replay (`replay`), else ""


# ---- When the loop stops a run: every update skipped, or a collapsed policy, for many steps.
# A diverged run or a collapsed one (a deterministic policy with an exactly zero gradient, which
# RL cannot move) only wastes compute; `run` counts consecutive such steps with `unhealthy`.


class TrainingStopped(RuntimeError):
  """The run diverged or collapsed; the message says why and which checkpoint to go back to."""


def unhealthy(record: Mapping[str, Any], updates: int, entropy_floor: float) -> str:
  """'' for a healthy step, else "skipped" (every update dropped) or "collapsed"."""
  if record.get("skipped", 0.0) >= updates:
    return "skipped"
  if record.get("grad_norm", 1.0) == 0.0 and record.get("entropy", math.inf) <= entropy_floor:
    return "collapsed"
  return ""


STOP_ADVICE = {
    "skipped": "every update of the last {n} steps was skipped for a non-finite loss, gradient "
               "or new state; lower optim.lr or check the reward",
    "collapsed": "for {n} steps the policy was deterministic (entropy <= {floor}) and the "
                 "gradient exactly 0, so RL cannot move it; raise the sampling temperature or "
                 "restart from an earlier checkpoint",
}


# ---- Splitting a scored batch into the update's minibatches.


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


def score_in_parts(score_fn, params, batch: types.Batch, num: int) -> tuple[types.Batch, dict]:
  """`score_fn(params, batch)` over `num` equal row parts in order, the scored parts joined
  back in row order and each metric the mean of the parts' (equal row counts)."""
  if num == 1:
    return score_fn(params, batch)
  scored = [score_fn(params, part) for part in minibatches(batch, num=num, rng=None)]
  joined = jax.tree.map(lambda *parts: jnp.concatenate(parts), *[b for b, _ in scored])
  metrics = {k: jnp.mean(jnp.stack([m[k] for _, m in scored])) for k in scored[0][1]}
  return joined, metrics


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


def run(state, *, rng: jax.Array, total_steps: int, workdir: str,
        rollout_fn: Callable[[Any, jax.Array, int], Rollout],
        score_fn: Callable[[Any, types.Batch], tuple[types.Batch, dict]],
        advantage_fn: Callable[[types.Batch, dict], tuple[types.Batch, dict]],
        update_fn: Callable[[Any, types.Batch], tuple[Any, dict]],
        epochs: int = 1, num_minibatches: int = 1, shuffle: bool = True,
        sort_by_length: bool = False, score_minibatches: int = 1,
        data: DataStream | None = None,
        evaluate: Callable[[Any], dict[str, float]] | None = None, eval_every: int = 0,
        save_every: int = 50, keep: int = 2, keep_period: int = 0, async_save: bool = True,
        tensorboard: bool = True, wandb: Mapping[str, Any] | None = None,
        console: bool = True, heartbeat_s: float = 30.0, stop_after_skipped: int = 10,
        stop_after_collapsed: int = 20, entropy_floor: float = 1e-3,
        rollout_input: Callable[[Any], Any] | None = None, max_staleness: int = 0,
        off_policy: str = "token_tis", off_policy_threshold: float = 2.0,
        trajectories: trajectories_lib.Settings | None = None, replay_batch: str = "",
        alarms: alarms_lib.Settings | None = None,
        host_state: HostState | None = None) -> Result:
  """Runs RL steps 1..total_steps from scratch or from the newest checkpoint in workdir/ckpt.

  Args:
    state: the initial train state (a pytree with `.params`; donated to `update_fn`).
    rng: base key; step s uses fold_in(rng, s) (rollout), and its children (minibatch order).
    rollout_fn: (params, key, step) -> Rollout; draws its prompts from `data`.
    score_fn: (params, batch) -> (batch with old_logp/ref_logp/values, metrics); jitted.
    advantage_fn: (batch, rollout extras) -> (batch with adv_BT/ret_BT, metrics); jitted.
    update_fn: the experiment's jitted update_step(state, minibatch) -> (state, metrics),
      wrapped in `skip_nonfinite` so a bad loss skips the update and is logged.
    epochs, num_minibatches: passes over each rollout batch and updates per pass.
    sort_by_length: form each pass's minibatches with `length_sorted_minibatches` (rows of
      similar length, each minibatch padded to its own bucket; visited in an order drawn from
      (step, epoch) when `shuffle`) when the rollout reports `lengths_B`; default: random
      equal splits of the rows at the batch's T.
    score_minibatches: score the batch in this many row parts, one forward's activations at
      a time (`score_in_parts`): what a pod-sized batch needs, where one forward over every
      row of the step runs out of memory (scripts/plan_pod.py).
    data: the prompt stream whose position is checkpointed.
    evaluate: params -> metrics (e.g. held-out greedy success), run before step 1, every
      `eval_every` steps and after the last; logged with an "eval/" prefix.
    console, heartbeat_s: print a progress line per step, and "<phase>: 30s so far" every
      heartbeat_s seconds while a phase (rollout, score, update, evaluation) runs.
    save_every, keep, keep_period, async_save: checkpoint cadence (the last step is always
      saved), how many of the newest to keep, and a period whose multiples are kept as well.
    stop_after_skipped, stop_after_collapsed: raise TrainingStopped after that many
      consecutive steps in which every update was skipped, or the gradient norm was exactly 0
      with the sampled tokens' entropy <= `entropy_floor` (0 disables either). Such steps are
      never checkpointed, so the last checkpoints hold the state from before the trouble.
    rollout_input: state -> rollout_fn's first argument (default: state.params), for a
      rollout that reads more of the train state (HAPO's entropy statistics).
    max_staleness: k; with k > 0 the rollouts of steps s+1..s+k are made in a background
      thread while step s trains, step t's from the params after max(0, t-1-k) updates
      (agentrl/train/overlap.py); 0 is the synchronous loop.
    off_policy, off_policy_threshold: with k > 0, the correction of the stale rows
      (`overlap.off_policy_correction`: token_tis, sequence_tis, token_mask, sequence_mask,
      none) and its threshold.
    trajectories: what to record of the record steps (agentrl/records/trajectories.py): a
      sample of rows for reading and the viewer, and the whole scored batch for replay; the
      checkpoint of the step before each record step is always saved, the state a replay
      starts from. None or every = 0: nothing.
    replay_batch: "RUN_DIR:STEP": instead of training, rerun step STEP's update of the run in
      RUN_DIR from its recorded batch and its checkpoint of step STEP - 1 (`replay`).
    alarms: the thresholds of the collapse and reward-hacking alarms
      (agentrl/records/alarms.py): each step's record gains `alarm/*` (1.0 while an alarm's
      condition holds) and each alarm prints one warning, with the evidence, the first time
      it fires (a resumed run re-reads the earlier records, so it neither repeats nor forgets
      one). None: no alarms.
    host_state: host-side state the rollout or advantage code updates (a replay buffer),
      saved and restored with each checkpoint; needs max_staleness = 0 (a rollout made ahead
      of its step would put a later step's state into the checkpoint).
  """
  if host_state is not None and max_staleness:
    raise ValueError(f"host_state needs max_staleness=0 (got {max_staleness}): rollouts made "
                     "ahead of training would checkpoint a later step's host state.")
  if replay_batch:
    return replay(state, replay_batch, update_fn, rng=rng, epochs=epochs,
                  num_minibatches=num_minibatches, shuffle=shuffle,
                  sort_by_length=sort_by_length, console=console, host_state=host_state)
  start = time.perf_counter()
  rec = trajectories if trajectories is not None and trajectories.every > 0 else None
  # The state a record step started from stays while its batch is on disk (replay's start).
  replay_start = None if rec is None or not rec.full_batch else (
      lambda s: trajectories_lib.is_record_step(s + 1, rec.every) and
      os.path.exists(trajectories_lib.batch_path(workdir, s + 1)))
  ckpt = checkpoint_lib.Checkpointer(f"{workdir}/ckpt", save_every=save_every, keep=keep,
                                     keep_period=keep_period, async_save=async_save,
                                     keep_if=replay_start)
  step, evals, k = 0, {}, max_staleness
  inputs_of = (lambda s: s.params) if rollout_input is None else rollout_input
  correct = jax.jit(overlap.off_policy_correction(off_policy, off_policy_threshold)) if k else None
  # Checkpoints hold what training changes: not a LoRA model's base, rebuilt by the caller.
  pending = None
  if ckpt.latest_step() is not None:
    template = {"state": lora.trainable(state), "rng": rng}
    if k:
      template["pending"] = overlap.pending_template(inputs_of(state), k)
    if host_state is not None:
      template["host"] = host_state.tree()
    tree, meta = ckpt.restore(template)
    if host_state is not None:
      host_state.restore(jax.tree.map(np.asarray, tree["host"]))
    state, rng, step, evals = (lora.combine(state, tree["state"]), tree["rng"], int(meta["step"]),
                               meta["evals"])
    if data is not None:
      data.restore(meta["data"])
    pending = (tree["pending"], meta["pending"]) if k else None
    print(f"Resumed from {ckpt.directory} at step {step}.", flush=True)
  if rec is not None and jax.process_index() == 0:
    trajectories_lib.truncate(workdir, step)  # a killed run's later records are rewritten
  producer = overlap.RolloutProducer(rollout_fn, rng=rng, max_staleness=k,
                                     total_steps=total_steps, data=data)
  if pending is not None:
    producer.restore(step, *pending, inputs_of(state))
  writer = metrics_lib.Writer(workdir, total_steps=total_steps, tensorboard=tensorboard,
                              wandb=wandb, console=console,
                              resume_step=step if step else None)
  monitor = None if alarms is None else alarms_lib.Monitor(alarms, run_dir=workdir)
  if monitor is not None and step:
    monitor.replay(metrics_lib.read_jsonl(writer.path), until=step)
  beat = metrics_lib.Heartbeat(heartbeat_s if console else 0.0)
  limits = {"skipped": stop_after_skipped, "collapsed": stop_after_collapsed}
  streak, last_saved, first_step = {"skipped": 0, "collapsed": 0}, step, step + 1
  interrupted = False
  try:
    with beat:
      if evaluate is not None and "0" not in evals:
        evals["0"] = _evaluate(evaluate, state.params, beat, "baseline evaluation")
        writer.write(0, evals["0"])  # the baseline point of every eval curve
        if monitor is not None:
          monitor.observe(0, evals["0"])  # held-out success before RL, for the divergence
      while step < total_steps:
        shutdown.check()  # an interrupt whose exception Python swallowed stops the run here
        step += 1
        state, record, batch, rollout = _step(
            state, step, rng, producer, score_fn, advantage_fn, update_fn,
            epochs=epochs, num_minibatches=num_minibatches, shuffle=shuffle,
            sort_by_length=sort_by_length, beat=beat, inputs_of=inputs_of, correct=correct,
            score_minibatches=score_minibatches)
        if evaluate is not None and (step == total_steps or
                                     (eval_every and step % eval_every == 0)):
          producer.drain()  # the rollout thread and evaluation share the engine
          evals[str(step)] = _evaluate(evaluate, state.params, beat, f"step {step}: evaluation")
          record.update(evals[str(step)])
        if monitor is not None:
          flags, warnings = monitor.observe(step, record)
          record.update(flags)
          for line in warnings:
            print(f"warning: {line}", file=sys.stderr, flush=True)
        writer.write(step, record, note="includes compilation" if step == first_step else "")
        if rec is not None and trajectories_lib.is_record_step(step, rec.every):
          trajectories_lib.record(workdir, step, batch, settings=rec,
                                  trajectories=rollout.trajectories,
                                  tokenizer=rollout.tokenizer, metrics=record)
        del batch, rollout
        trouble = unhealthy(record, epochs * num_minibatches, entropy_floor)
        streak = {k: streak[k] + 1 if k == trouble else 0 for k in streak}
        if trouble and limits[trouble] and streak[trouble] >= limits[trouble]:
          why = STOP_ADVICE[trouble].format(n=streak[trouble], floor=entropy_floor)
          where = (f"The last checkpoint is {ckpt.directory}/{last_saved}" if last_saved else
                   "No checkpoint was written.")
          raise TrainingStopped(f"stopped at step {step}: {why}. {where}")
        if not trouble:
          meta = {"step": step, "evals": evals, "data": data.state() if data is not None else {}}
          tree = {"state": lora.trainable(state), "rng": rng}
          if k:  # the pending rollouts' params and the stream position after step's rollout
            tree["pending"] = producer.pending_tree(step)
            meta.update(pending=producer.pending_meta(step), data=producer.data_state)
          if host_state is not None:
            tree["host"] = host_state.tree()
          with shutdown.deferred():  # an interrupt never leaves a save half-started
            # The step before a record step is a replay's starting state: always saved.
            starts = rec is not None and rec.full_batch and trajectories_lib.is_record_step(
                step + 1, rec.every)
            saved = ckpt.save(step, tree, meta, force=step == total_steps or starts)
          last_saved = step if saved else last_saved
  except KeyboardInterrupt:
    interrupted = True
    raise
  finally:
    _close(producer, ckpt, writer, interrupted=interrupted)
  return Result(state=state, step=step, records=metrics_lib.read_jsonl(writer.path),
                evals={k: {m: v for m, v in e.items() if m != "time/eval"}
                       for k, e in evals.items()},
                wall_seconds=time.perf_counter() - start, steps_run=step - first_step + 1)


class ReplayError(ValueError):
  """A replay that cannot run: a bad RUN_DIR:STEP, or its batch or checkpoint is missing."""


def parse_replay(spec: str) -> tuple[str, int]:
  """"RUN_DIR:STEP" -> (RUN_DIR, STEP); ReplayError naming the value otherwise."""
  run_dir, _, step = spec.rpartition(":")
  if not run_dir or not step.isdigit() or int(step) < 1:
    raise ReplayError(f"config.replay_batch={spec!r} must be RUN_DIR:STEP (a run directory and "
                      "a record step >= 1, e.g. /tmp/run:26)")
  return run_dir, int(step)


def replay(state, spec: str, update_fn, *, rng: jax.Array, epochs: int = 1,
           num_minibatches: int = 1, shuffle: bool = True, sort_by_length: bool = False,
           console: bool = True, host_state: HostState | None = None) -> Result:
  """Reruns step STEP's update of the run in RUN_DIR (`spec` = "RUN_DIR:STEP") without a
  rollout: the train state and rng of its checkpoint of step STEP - 1, the batch it recorded
  at STEP (tokens, log-probs, advantages: `trajectories.read_batch`), the same minibatches.

  Prints each update's loss and gradient norms beside the means the run logged for the step,
  and, when the run kept its checkpoint of STEP, the largest difference between the replayed
  params and those. Returns a Result whose one record holds the replayed update's means
  (`replay/param_max_abs_diff` too when compared). The update settings are the caller's: keep
  the run's to reproduce it, change the loss to see what another objective would have done.
  A run that kept a `host_state` is read with the same `host_state` (its tree is the template).
  """
  start = time.perf_counter()
  run_dir, step = parse_replay(spec)
  have = trajectories_lib.batch_steps(run_dir)
  if step not in have:
    raise ReplayError(f"{run_dir} has no recorded batch of step {step}; steps with one: "
                      f"{have or 'none'} (config.log.trajectories_every records them)")
  saved = checkpoint_lib.saved_steps(f"{run_dir}/ckpt")
  if step - 1 not in saved:
    raise ReplayError(f"{run_dir}/ckpt has no checkpoint of step {step - 1}, the state step "
                      f"{step}'s update started from; saved: {saved or 'none'}; replayable "
                      f"steps: {[s for s in have if s - 1 in saved] or 'none'}")
  ckpt = checkpoint_lib.Checkpointer(f"{run_dir}/ckpt", save_every=1, keep=None,
                                     async_save=False)
  template = {"state": lora.trainable(state), "rng": rng}
  if host_state is not None:
    template["host"] = host_state.tree()
  try:
    tree, _ = ckpt.restore(template, step=step - 1)
    after = ckpt.restore(template, step=step)[0] if step in saved else None
  finally:
    ckpt.close()
  state, rng = lora.combine(state, tree["state"]), tree["rng"]
  batch = trajectories_lib.to_batch(trajectories_lib.read_batch(run_dir, step))
  lengths_B = np.asarray(batch.input_mask_BT).sum(axis=1) if sort_by_length else None
  state, per_update = update_phase(state, batch, update_fn, step=step, rng=rng, epochs=epochs,
                                   num_minibatches=num_minibatches, shuffle=shuffle,
                                   lengths_B=lengths_B)
  host = jax.device_get(per_update)
  record = _mean_metrics(per_update)
  if after is not None:
    diffs = jax.tree.leaves(jax.tree.map(
        lambda a, b: float(jnp.max(jnp.abs(a.astype(jnp.float32) - b.astype(jnp.float32)))),
        lora.trainable(state).params, after["state"].params))
    record["replay/param_max_abs_diff"] = max(diffs, default=0.0)
  path = f"{run_dir}/metrics.jsonl"
  logged = next((r for r in metrics_lib.read_jsonl(path) if r.get("step") == step),
                {}) if os.path.exists(path) else {}
  if console:
    print(replay_table(step, host, record, logged), flush=True)
  return Result(state=state, step=step, records=[{"step": step, **record}], evals={},
                wall_seconds=time.perf_counter() - start, steps_run=0, replay=spec)


def replay_table(step: int, per_update: Sequence[Mapping[str, Any]], means: Mapping[str, float],
                 logged: Mapping[str, Any]) -> str:
  """The replay's printout: loss and gradient norms per update, their means, the run's."""
  keys = [k for k in per_update[0] if k == "loss" or k.endswith("grad_norm") or k == "skipped"]
  lines = [f"Replayed step {step}: {len(per_update)} update(s) on the recorded batch.",
           "update  " + "  ".join(f"{k:>14}" for k in keys)]
  for i, m in enumerate(per_update):
    lines.append(f"{i:>6}  " + "  ".join(f"{float(m[k]):>14.6g}" for k in keys))
  lines.append("  mean  " + "  ".join(f"{means[k]:>14.6g}" for k in keys))
  if logged:
    lines.append("logged  " + "  ".join(
        f"{logged[k]:>14.6g}" if isinstance(logged.get(k), (int, float)) else f"{'-':>14}"
        for k in keys))
  if "replay/param_max_abs_diff" in means:
    lines.append(f"params after the replay vs the run's checkpoint of step {step}: max |diff| = "
                 f"{means['replay/param_max_abs_diff']:.3g}")
  return "\n".join(lines)


def _close(producer, ckpt, writer, *, interrupted: bool) -> None:
  """Stops the rollout thread, finishes checkpoint writes and closes the metrics files.

  After Ctrl-C or SIGTERM the rollout being made in the background is abandoned rather than
  awaited (it can take minutes; its results would be dropped anyway), and a save the interrupt
  cut short is reported, not raised: its temporary directory is never read as a checkpoint.
  """
  producer.close(wait=not interrupted)
  try:
    ckpt.close()
  except Exception as e:  # pylint: disable=broad-except
    if not interrupted:
      raise
    print(f"warning: the checkpoint being saved when interrupted was not finished "
          f"({type(e).__name__}: {e}); resuming uses the last complete one.", file=sys.stderr)
  finally:
    writer.close()


def _evaluate(evaluate, params, beat, label: str) -> dict[str, float]:
  """evaluate(params) with an "eval/" prefix on its keys, plus its wall time as time/eval."""
  beat.phase(label)
  start = time.perf_counter()
  out = _prefixed(evaluate(params))
  beat.phase(None)
  return {**out, "time/eval": time.perf_counter() - start}


def _prefixed(scalars: Mapping[str, Any]) -> dict[str, float]:
  return {f"eval/{k}": float(v) for k, v in scalars.items()}


def _step(state, step, rng, producer, score_fn, advantage_fn, update_fn, *, epochs,
          num_minibatches, shuffle, beat, inputs_of, sort_by_length=False, correct=None,
          score_minibatches=1):
  """One RL step; returns (state, flat host metrics).

  Each phase is timed up to the moment its results are ready on the device (JAX dispatch is
  asynchronous), so time/rollout + time/score + time/update == time/step. Overlapped, the
  rollout phase is the wait for a rollout made in the background (time/rollout_busy: the
  time its making took).
  """
  marks = [time.perf_counter()]
  beat.phase(f"step {step}: rollout")
  rollout, busy = producer.take(step, inputs_of(state))
  marks.append(time.perf_counter())
  # Between the rollout's explicit device_put and the metrics' device_get everything stays on
  # device (docs/style.md C9); an accidental host round trip here fails loudly.
  beat.phase(f"step {step}: score")
  with jax.transfer_guard("disallow"):
    batch, score_metrics = score_in_parts(score_fn, state.params, rollout.batch,
                                          score_minibatches)
    batch, adv_metrics = advantage_fn(batch, rollout.extras)
    if correct is not None:
      batch, correction_metrics = correct(batch)
      adv_metrics = {**adv_metrics, **correction_metrics}
  score_metrics, adv_metrics = jax.device_get((score_metrics, adv_metrics))
  jax.block_until_ready(batch)
  marks.append(time.perf_counter())
  beat.phase(f"step {step}: update")
  state, per_update = update_phase(
      state, batch, update_fn, step=step, rng=rng, epochs=epochs,
      num_minibatches=num_minibatches, shuffle=shuffle,
      lengths_B=rollout.lengths_B if sort_by_length else None)
  # Every update of the step is dispatched before the one device_get: the next rollout needs
  # the new params anyway, so deferring the fetch further would buy no overlap.
  update_metrics = _mean_metrics(per_update)
  jax.block_until_ready(state)
  marks.append(time.perf_counter())
  beat.phase(None)
  times = {f"time/{name}": b - a for name, a, b in zip(("rollout", "score", "update"),
                                                        marks, marks[1:])}
  times["time/step"] = marks[-1] - marks[0]
  record = metrics_lib.merge_phases(
      rollout=rollout.metrics, score={k: float(v) for k, v in score_metrics.items()},
      advantage={k: float(v) for k, v in adv_metrics.items()}, update=update_metrics,
      times=times)
  if producer.k:
    record["time/rollout_busy"] = busy
    record["rollout/staleness"] = float(step - 1 - overlap.behaviour_version(step, producer.k))
  record["rollout/tokens_per_s"] = rollout.metrics.get("rollout/sampled_tokens", 0.0) / busy
  if "rollout/batch_tokens" in rollout.metrics:  # real (non-padding) tokens of the batch
    record["update/tokens_per_s"] = (epochs * rollout.metrics["rollout/batch_tokens"]
                                     / times["time/update"])
  return state, record, batch, rollout


def update_phase(state, batch: types.Batch, update_fn, *, step: int, rng: jax.Array,
                 epochs: int, num_minibatches: int, shuffle: bool,
                 lengths_B: np.ndarray | None = None) -> tuple[Any, list[dict]]:
  """Step `step`'s updates on its scored batch: (state, each update's device metrics).

  `epochs` passes of `num_minibatches` updates, the rows shuffled by keys drawn from
  (rng, step, epoch) when `shuffle`; with `lengths_B` (host, real tokens per row) the
  minibatches are `length_sorted_minibatches`. A replay (`replay`) calls it with the step's
  recorded batch and the run's rng to repeat the step's updates exactly.
  """
  shuffle_rng = jax.random.split(jax.random.fold_in(rng, step))[1]  # [0]: overlap.rollout_key
  if lengths_B is not None:
    parts = [mb for epoch in range(epochs) for mb in length_sorted_minibatches(
        batch, lengths_B, num=num_minibatches, seed=(step, epoch) if shuffle else None)]
  else:
    keys = [jax.random.fold_in(shuffle_rng, e) if shuffle else None for e in range(epochs)]
    parts = [mb for key in keys for mb in minibatches(batch, num=num_minibatches, rng=key)]
  per_update = []
  with jax.transfer_guard("disallow"):
    for part in parts:
      state, update_metrics = update_fn(state, part)
      per_update.append(update_metrics)
  return state, per_update
