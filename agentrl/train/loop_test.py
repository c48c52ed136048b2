# pylint: disable=invalid-name
"""Tests for agentrl.train.loop on a 4-armed bandit "policy" (no transformer, compiles in ms).

Each row of a batch is one pull: token 1 of the row is the arm, its log-prob comes from a
softmax over 4 logits, and arm 3 pays 1. The shared driver must make the reward go up, skip
non-finite updates, and resume from a checkpoint to exactly the uninterrupted run's records.
The score step's own test uses a one-layer transformer of width 16.
"""
import dataclasses
import functools
import io
import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl.advantages import estimators
from agentrl.data import generators
from agentrl.data import stream
from agentrl.losses import aggregation
from agentrl.models import policy as policy_lib
from agentrl.models import testing
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import pack as pack_lib
from agentrl import checkpoint
from agentrl.records import alarms
from agentrl.records import metrics as metrics_lib
from agentrl.records import trajectories
from agentrl.train import loop
from agentrl.train import replay_buffer
from agentrl import types

jax.config.update("jax_numpy_rank_promotion", "raise")

P, G, T = 4, 4, 2
B = P * G


def _tmpdir(test) -> str:
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def _logp(params, batch):
  logp_V = jax.nn.log_softmax(params["logits"])
  arm_logp_B = logp_V[batch.tokens_BT[:, 1]]
  return jnp.stack([jnp.zeros_like(arm_logp_B), arm_logp_B], axis=1)


class _Bandit:
  """rollout/score/advantage/update functions of a softmax bandit, plus a data stream."""

  def __init__(self, nan_at_step: int | None = None, nan_from_step: int | None = None,
               reward: float | None = None):
    self.data = stream.PromptStream(generators.GeneratorSource(lambda s: {"prompt": str(s)}),
                                    shuffle=False)
    self.nan_at_step, self.nan_from_step, self.reward = nan_at_step, nan_from_step, reward
    self.tx = optax.sgd(0.5)

  def rollout(self, params, rng, step):
    seeds = [entry["seed"] for entry in self.data.take(P)]
    key = jax.random.fold_in(rng, seeds[0])
    arms_B = jax.random.categorical(key, params["logits"], shape=(B,))
    tokens_BT = jnp.stack([jnp.zeros(B, jnp.int32), arms_B.astype(jnp.int32)], axis=1)
    reward_B = (arms_B == 3).astype(jnp.float32)
    if self.reward is not None:  # a constant reward: no advantage, no gradient
      reward_B = jnp.full((B,), self.reward)
    if step == self.nan_at_step or (self.nan_from_step and step >= self.nan_from_step):
      reward_B = reward_B * jnp.nan
    batch = types.Batch(tokens_BT=tokens_BT, positions_BT=jnp.zeros((B, T), jnp.int32),
                        input_mask_BT=jnp.ones((B, T), bool),
                        loss_mask_BT=jnp.array([[0.0, 1.0]] * B), reward_B=reward_B)
    batch = batch.replace(sampler_logp_BT=_logp(params, batch))  # the behaviour policy's
    return loop.Rollout(batch=batch, metrics={"reward": float(reward_B.mean())})

  def score(self, params, batch):
    return batch.replace(old_logp_BT=_logp(params, batch)), {"entropy": jnp.float32(0.0)}

  @staticmethod
  def advantage(batch, extras):
    del extras
    adv_B = estimators.grpo(batch.reward_B, group_size=G)
    return batch.replace(adv_BT=adv_B[:, None] * batch.loss_mask_BT), {}

  def update_step(self, state, batch):
    def loss_fn(params, batch):
      logp_BT = _logp(params, batch)
      loss = -(batch.adv_BT * logp_BT * batch.loss_mask_BT).sum() / batch.loss_mask_BT.sum()
      return loss, {"loss": loss}

    return loop.gradient_step(loss_fn, self.tx)(state, batch)

  def init_state(self):
    params = {"logits": jnp.zeros(4)}
    return types.TrainState(step=jnp.int32(0), params=params, opt_state=self.tx.init(params))

  def run(self, workdir, total_steps, **kwargs):
    update = jax.jit(loop.skip_nonfinite(self.update_step), donate_argnames="state")
    return loop.run(
        self.init_state(), rng=jax.random.key(0), total_steps=total_steps, workdir=workdir,
        score_fn=jax.jit(self.score), advantage_fn=jax.jit(self.advantage),
        update_fn=update, data=self.data, tensorboard=False,
        evaluate=lambda params: {"p_best": jax.nn.softmax(params["logits"])[3]},
        **{"console": False, "rollout_fn": self.rollout, **kwargs})


def _reproducible(records):
  return [{k: v for k, v in r.items() if k not in metrics_lib.TIMING_KEYS} for r in records]


class RunTest(absltest.TestCase):

  def test_reward_rises_and_evals_are_recorded(self):
    result = _Bandit().run(_tmpdir(self), total_steps=8, num_minibatches=2, epochs=2)
    self.assertEqual(result.step, 8)
    # Step 0 holds the baseline evaluation, so every eval curve starts before RL.
    self.assertEqual([r["step"] for r in result.records], list(range(0, 9)))
    self.assertEqual(set(result.records[0]), {"step", "eval/p_best", "time/eval"})
    self.assertAlmostEqual(result.evals["0"]["eval/p_best"], 0.25, places=6)
    self.assertAlmostEqual(result.records[0]["eval/p_best"], 0.25, places=6)
    self.assertGreater(result.evals["8"]["eval/p_best"], 0.9)
    self.assertEqual(result.records[-1]["eval/p_best"], result.evals["8"]["eval/p_best"])
    self.assertEqual(int(result.state.step), 8 * 2 * 2)  # optimizer updates
    self.assertEqual(result.steps_run, 8)
    for key in ("loss", "grad_norm", "skipped", "entropy", "time/rollout",
                "rollout/tokens_per_s"):
      self.assertIn(key, result.records[1])

  def test_a_metric_logged_by_two_phases_is_refused(self):
    bandit = _Bandit()
    score = bandit.score

    def score_with_loss(params, batch):  # "loss" is also an update metric
      batch, metrics = score(params, batch)
      return batch, {**metrics, "loss": jnp.float32(0.0)}

    bandit.score = score_with_loss
    with self.assertRaisesRegex(ValueError, "'loss' is logged by both the score and the update"):
      bandit.run(_tmpdir(self), total_steps=1)

  def test_phase_times_sum_to_the_step_time(self):
    result = _Bandit().run(_tmpdir(self), total_steps=3)
    for r in result.records[1:]:
      phases = r["time/rollout"] + r["time/score"] + r["time/update"]
      self.assertAlmostEqual(phases, r["time/step"], delta=1e-9 * r["time/step"] + 1e-12)
      self.assertGreater(r["time/update"], 0.0)

  def test_progress_line_and_heartbeat(self):
    out = io.StringIO()
    with mock.patch("sys.stdout", out):
      _Bandit().run(_tmpdir(self), total_steps=2, console=True, heartbeat_s=1e-3)
    lines = out.getvalue().splitlines()
    steps = [l for l in lines if l.startswith("step ")]
    self.assertLen(steps, 3)  # the baseline evaluation (step 0), steps 1 and 2
    self.assertTrue(steps[1].endswith("(includes compilation)"), steps[1])
    self.assertNotIn("compilation", steps[2])
    self.assertIn(" = step ", steps[1])
    # The heartbeat reports the phases of long steps (here every phase is "long").
    self.assertTrue(any(l.startswith("  step 1: ") and "so far" in l for l in lines), lines)

  def test_nonfinite_update_is_skipped_and_logged(self):
    result = _Bandit(nan_at_step=2).run(_tmpdir(self), total_steps=3)
    by_step = {r["step"]: r for r in result.records}
    self.assertEqual(by_step[2]["skipped"], 1.0)
    self.assertIsNone(by_step[2]["loss"])     # NaN is written as null
    self.assertEqual(by_step[1]["skipped"], 0.0)
    self.assertTrue(np.all(np.isfinite(result.state.params["logits"])))
    self.assertEqual(int(result.state.step), 2)  # the skipped update did not count

  def test_diverged_run_stops_and_keeps_the_last_good_checkpoint(self):
    workdir = _tmpdir(self)
    with self.assertRaisesRegex(loop.TrainingStopped,
                                r"stopped at step 5: every update of the last 3 steps was "
                                r"skipped.*The last checkpoint is .*/ckpt/2$"):
      _Bandit(nan_from_step=3).run(workdir, total_steps=10, save_every=1, keep=2,
                                   stop_after_skipped=3)
    self.assertEqual(sorted(os.listdir(os.path.join(workdir, "ckpt"))), ["1", "2"])

  def test_collapsed_policy_stops(self):
    # The bandit's score step reports entropy 0; a constant reward gives a zero gradient.
    with self.assertRaisesRegex(loop.TrainingStopped, r"stopped at step 2: for 2 steps the "
                                r"policy was deterministic.*No checkpoint was written"):
      _Bandit(reward=1.0).run(_tmpdir(self), total_steps=5, save_every=1,
                              stop_after_collapsed=2)
    result = _Bandit(reward=1.0).run(_tmpdir(self), total_steps=3, stop_after_collapsed=0)
    self.assertEqual(result.step, 3)  # 0 disables the check

  def test_resume_reproduces_uninterrupted_records(self):
    full = _Bandit().run(_tmpdir(self), total_steps=6, save_every=2, num_minibatches=2)
    workdir = _tmpdir(self)
    first = _Bandit().run(workdir, total_steps=3, save_every=2, num_minibatches=2)
    self.assertEqual(first.step, 3)
    # The "crash" happened after step 3 was logged but only step 2's checkpoint counts.
    shutil.rmtree(f"{workdir}/ckpt/3")
    resumed = _Bandit().run(workdir, total_steps=6, save_every=2, num_minibatches=2)
    self.assertEqual(_reproducible(resumed.records), _reproducible(full.records))
    self.assertEqual(resumed.evals, full.evals)
    np.testing.assert_array_equal(resumed.state.params["logits"], full.state.params["logits"])


class _ReplayBandit(_Bandit):
  """The bandit with a replay buffer its rollout fills and reads (a `loop.HostState`)."""

  def __init__(self):
    super().__init__()
    self.holder = replay_buffer.Holder(replay_buffer.empty(6, T, history=8))

  def rollout(self, params, rng, step):
    out = super().rollout(params, rng, step)
    b = jax.device_get(out.batch)
    buf = replay_buffer.add(
        self.holder.buffer, prompt_B=np.repeat(np.arange(P) + step % 3, G),
        tokens_BT=b.tokens_BT, input_mask_BT=b.input_mask_BT, loss_mask_BT=b.loss_mask_BT,
        old_logp_BT=b.sampler_logp_BT, reward_B=b.reward_B, version=step, per_prompt_cap=2)
    self.holder.buffer = buf
    picked = replay_buffer.sample(buf, 3, seed=step)
    return dataclasses.replace(out, metrics={
        **out.metrics, "replay/size": float(replay_buffer.size(buf)),
        "replay/baseline": replay_buffer.baseline(buf),
        "replay/picked": float(picked.sum() + buf.old_logp_CT[picked].sum())})


class HostStateTest(absltest.TestCase):

  def test_resume_restores_the_replay_buffer_exactly(self):
    full = _ReplayBandit()
    full_result = full.run(_tmpdir(self), total_steps=5, save_every=2,
                           host_state=full.holder)
    workdir = _tmpdir(self)
    first = _ReplayBandit()
    first.run(workdir, total_steps=3, save_every=2, host_state=first.holder)
    shutil.rmtree(f"{workdir}/ckpt/3")  # resume from step 2's checkpoint
    again = _ReplayBandit()
    resumed = again.run(workdir, total_steps=5, save_every=2, host_state=again.holder)
    self.assertEqual(_reproducible(resumed.records), _reproducible(full_result.records))
    for want, got in zip(jax.tree.leaves(full.holder.buffer), jax.tree.leaves(again.holder.buffer)):
      np.testing.assert_array_equal(got, want)

  def test_host_state_needs_the_synchronous_loop(self):
    bandit = _ReplayBandit()
    with self.assertRaisesRegex(ValueError, "host_state needs max_staleness=0"):
      bandit.run(_tmpdir(self), total_steps=1, host_state=bandit.holder, max_staleness=1)


class RecordsAndReplayTest(absltest.TestCase):

  def test_record_steps_keep_their_start_checkpoint_and_replay_equals_the_update(self):
    workdir = _tmpdir(self)
    rec = trajectories.Settings(every=2, rows_per_group=2, max_groups=2, prompts_per_step=P)
    run = _Bandit().run(workdir, total_steps=5, save_every=10, num_minibatches=2, epochs=2,
                        trajectories=rec)
    self.assertEqual(trajectories.steps(workdir), [1, 3, 5])
    self.assertEqual(trajectories.batch_steps(workdir), [1, 3, 5])
    # Step 2, the state step 3 started from, is saved although save_every is 10.
    self.assertIn(2, checkpoint.saved_steps(f"{workdir}/ckpt"))
    header, rows = trajectories.read_step(workdir, 3)
    self.assertEqual((header["rows_in_batch"], header["group_size"], len(rows)), (B, G, 4))
    self.assertEqual(header["metrics"]["loss"], run.records[3]["loss"])
    self.assertEqual({r["group"] for r in rows}, {0, P - 1})
    self.assertEqual(rows[0]["adv"][1], round(rows[0]["adv"][1], 5))
    replay_dir = _tmpdir(self)
    with mock.patch("sys.stdout", new_callable=io.StringIO) as out:
      replayed = _Bandit().run(replay_dir, total_steps=5, num_minibatches=2, epochs=2,
                               replay_batch=f"{workdir}:5", console=True)
    logged = run.records[5]
    self.assertEqual(replayed.replay, f"{workdir}:5")
    for key in ("loss", "grad_norm"):
      self.assertEqual(replayed.records[0][key], logged[key])
    self.assertEqual(replayed.records[0]["replay/param_max_abs_diff"], 0.0)
    np.testing.assert_array_equal(replayed.state.params["logits"], run.state.params["logits"])
    self.assertIn("Replayed step 5: 4 update(s)", out.getvalue())
    self.assertFalse(os.path.exists(f"{replay_dir}/metrics.jsonl"))  # a replay trains nothing

  def test_replay_errors_name_what_exists(self):
    workdir = _tmpdir(self)
    rec = trajectories.Settings(every=2, prompts_per_step=P)
    _Bandit().run(workdir, total_steps=3, save_every=10, trajectories=rec)
    with self.assertRaisesRegex(loop.ReplayError, r"no recorded batch of step 2.*\[1, 3\]"):
      _Bandit().run(_tmpdir(self), total_steps=3, replay_batch=f"{workdir}:2")
    with self.assertRaisesRegex(loop.ReplayError, "no checkpoint of step 0.*replayable steps: "
                                r"\[3\]"):
      _Bandit().run(_tmpdir(self), total_steps=3, replay_batch=f"{workdir}:1")
    with self.assertRaisesRegex(loop.ReplayError, "must be RUN_DIR:STEP"):
      _Bandit().run(_tmpdir(self), total_steps=3, replay_batch=workdir)

  def test_resume_rewrites_the_records_after_its_checkpoint(self):
    workdir = _tmpdir(self)
    rec = trajectories.Settings(every=1, prompts_per_step=P)
    _Bandit().run(workdir, total_steps=3, save_every=2, trajectories=rec)
    first = trajectories.read_step(workdir, 3)[1]
    shutil.rmtree(f"{workdir}/ckpt/3")  # killed after step 3 wrote its records
    self.assertEqual(trajectories.steps(workdir), [1, 2, 3])
    with mock.patch.object(trajectories, "truncate", wraps=trajectories.truncate) as cut:
      _Bandit().run(workdir, total_steps=3, save_every=2, trajectories=rec)
    cut.assert_called_once_with(workdir, 2)
    self.assertEqual(trajectories.read_step(workdir, 3)[1], first)


class AlarmsTest(absltest.TestCase):

  def test_divergence_warns_once_is_logged_and_survives_a_resume(self):
    bandit = _Bandit()

    def hacked_rollout(params, rng, step):  # the reward rises while success falls
      rollout = bandit.rollout(params, rng, step)
      return dataclasses.replace(rollout, metrics={"reward": 0.1 * step,
                                                   "success": 1.0 - 0.1 * step})

    settings = alarms.Settings(divergence_window=3)
    workdir = _tmpdir(self)
    with mock.patch("sys.stderr", new_callable=io.StringIO) as err:
      result = bandit.run(workdir, total_steps=5, save_every=1, keep=5,
                          rollout_fn=hacked_rollout, alarms=settings)
    self.assertEqual([r.get("alarm/reward_divergence") for r in result.records],
                     [None, 0.0, 0.0, 1.0, 1.0, 1.0])
    self.assertEqual(err.getvalue().count("reward-success divergence"), 1)
    self.assertIn("warning: step 3: reward-success divergence", err.getvalue())
    shutil.rmtree(f"{workdir}/ckpt/5")
    shutil.rmtree(f"{workdir}/ckpt/4")
    with mock.patch("sys.stderr", new_callable=io.StringIO) as err:
      resumed = bandit.run(workdir, total_steps=6, save_every=1, keep=5,
                           rollout_fn=hacked_rollout, alarms=settings)
    self.assertEqual(resumed.records[-1]["alarm/reward_divergence"], 1.0)
    self.assertEqual(err.getvalue(), "")  # every alarm fired before the resume


class OverlapTest(absltest.TestCase):
  """max_staleness = k > 0: rollouts made in a background thread on a fixed schedule."""

  def test_rollouts_follow_the_staleness_schedule(self):
    for k in (1, 2):
      bandit, starts, used = _Bandit(), [], {}
      rollout = bandit.rollout

      def recording_rollout(params, rng, step, rollout=rollout, used=used):
        used[step] = np.asarray(params["logits"])
        return rollout(params, rng, step)

      def version_score(params, batch, score=bandit.score):
        batch, metrics = score(params, batch)
        return batch, {**metrics, "version": batch.version_B.mean()}

      bandit.rollout, bandit.score = recording_rollout, version_score
      result = bandit.run(_tmpdir(self), total_steps=5, max_staleness=k,
                          rollout_input=lambda s, starts=starts: (
                              starts.append(np.asarray(s.params["logits"])) or s.params))
      self.assertLen(starts, 5)  # the params at the start of each step
      for t in range(1, 6):
        version = max(0, t - 1 - k)  # the rollout of step t samples from theta_version
        np.testing.assert_array_equal(used[t], starts[version], err_msg=f"k={k} step {t}")
        record = result.records[t]
        self.assertEqual(record["version"], version)
        self.assertEqual(record["rollout/staleness"], t - 1 - version)
        self.assertIn("offpolicy/weight", record)
        self.assertGreater(record["time/rollout_busy"], 0.0)
      self.assertSameElements(used, range(1, 6))  # nothing past total_steps was made
      self.assertGreater(result.evals["5"]["eval/p_best"], 0.4)  # from 0.25: stale rollouts learn

  def test_resume_reproduces_uninterrupted_records(self):
    for k in (1, 2):
      kw = dict(save_every=2, num_minibatches=2, max_staleness=k)
      full = _Bandit().run(_tmpdir(self), total_steps=6, **kw)
      workdir = _tmpdir(self)
      first = _Bandit().run(workdir, total_steps=3, **kw)
      self.assertEqual(first.step, 3)
      shutil.rmtree(f"{workdir}/ckpt/3")  # killed after step 3 was logged, before its save
      resumed = _Bandit().run(workdir, total_steps=6, **kw)
      self.assertEqual(_reproducible(resumed.records), _reproducible(full.records), f"k={k}")
      np.testing.assert_array_equal(resumed.state.params["logits"], full.state.params["logits"])
      # Resuming the finished run's last checkpoint with more steps matches too.
      longer = _Bandit().run(_tmpdir(self), total_steps=8, **kw)
      extended = _Bandit().run(workdir, total_steps=8, **kw)
      # (The 6-step run's final evaluation is the only extra field of step 6.)
      no_eval = lambda records: [{m: v for m, v in r.items() if not m.startswith("eval/")}
                                 for r in _reproducible(records)]
      self.assertEqual(no_eval(extended.records), no_eval(longer.records), f"k={k}")
      np.testing.assert_array_equal(extended.state.params["logits"],
                                    longer.state.params["logits"])

  def test_rollout_thread_runs_under_the_callers_mesh(self):
    bandit, meshes = _Bandit(), []
    rollout = bandit.rollout

    def recording_rollout(params, rng, step):
      meshes.append(jax.sharding.get_abstract_mesh().axis_names)
      return rollout(params, rng, step)

    bandit.rollout = recording_rollout
    mesh = jax.make_mesh((1,), ("data",))
    with jax.set_mesh(mesh):
      bandit.run(_tmpdir(self), total_steps=3, max_staleness=1)
    self.assertEqual(meshes, [("data",)] * 3)

  def test_staleness_change_on_resume_is_refused(self):
    workdir = _tmpdir(self)
    _Bandit().run(workdir, total_steps=2, max_staleness=1)
    with self.assertRaisesRegex(Exception, "does not match this run's state"):
      _Bandit().run(workdir, total_steps=4, max_staleness=2)


class HelpersTest(absltest.TestCase):

  def test_minibatches_partition_the_rows(self):
    batch = types.Batch(tokens_BT=jnp.arange(8 * 2).reshape(8, 2),
                        positions_BT=jnp.zeros((8, 2)), input_mask_BT=jnp.ones((8, 2)),
                        loss_mask_BT=jnp.ones((8, 2)))
    parts = loop.minibatches(batch, num=4, rng=jax.random.key(1))
    rows = np.concatenate([np.asarray(p.tokens_BT[:, 0]) for p in parts])
    self.assertEqual(sorted(rows.tolist()), list(range(0, 16, 2)))
    self.assertNotEqual(rows.tolist(), list(range(0, 16, 2)))  # shuffled
    in_order = loop.minibatches(batch, num=2, rng=None)
    np.testing.assert_array_equal(in_order[1].tokens_BT[:, 0], [8, 10, 12, 14])
    with self.assertRaisesRegex(ValueError, "minibatches=3 must divide the batch size 8"):
      loop.minibatches(batch, num=3, rng=None)

  def test_score_in_parts_equals_one_forward(self):
    cfg = transformer.Config.named("tiny")
    graphdef, params = testing.random_params(cfg)
    tokens_BT = jax.random.randint(jax.random.key(3), (8, 6), 0, cfg.vocab)
    batch = types.Batch(tokens_BT=tokens_BT, positions_BT=jnp.tile(jnp.arange(6), (8, 1)),
                        input_mask_BT=jnp.ones((8, 6), bool), loss_mask_BT=jnp.ones((8, 6)),
                        sampler_logp_BT=jnp.full((8, 6), -2.0), aux={"row_B": jnp.arange(8)})
    score = jax.jit(loop.make_score_step(graphdef, temperature=1.0, with_ref=True))
    score_fn = lambda p, b: score(p, p, b)
    whole, whole_metrics = score_fn(params, batch)
    parts, part_metrics = loop.score_in_parts(score_fn, params, batch, 4)
    np.testing.assert_array_equal(parts.aux["row_B"], np.arange(8))   # rows in order
    np.testing.assert_allclose(parts.old_logp_BT, whole.old_logp_BT, atol=1e-6)
    np.testing.assert_allclose(parts.ref_logp_BT, whole.ref_logp_BT, atol=1e-6)
    self.assertEqual(set(part_metrics), {"entropy", "logp_mismatch", "kl"})
    for key, value in whole_metrics.items():   # every row has 6 tokens: equal-weight parts
      np.testing.assert_allclose(part_metrics[key], value, rtol=1e-5, atol=1e-7)

  def test_minibatches_carry_entropy_and_aux_with_their_rows(self):
    rows_B = jnp.arange(8)
    batch = types.Batch(tokens_BT=jnp.stack([rows_B, rows_B], 1), positions_BT=jnp.zeros((8, 2)),
                        input_mask_BT=jnp.ones((8, 2)), loss_mask_BT=jnp.ones((8, 2)),
                        entropy_BT=jnp.stack([rows_B, -rows_B], 1).astype(jnp.float32),
                        aux={"x_B": 10 * rows_B, "y_BT": jnp.stack([rows_B, rows_B], 1)})
    for part in loop.minibatches(batch, num=4, rng=jax.random.key(2)):
      row_B = np.asarray(part.tokens_BT[:, 0])
      np.testing.assert_array_equal(part.aux["x_B"], 10 * row_B)
      np.testing.assert_array_equal(part.aux["y_BT"][:, 1], row_B)
      np.testing.assert_array_equal(part.entropy_BT[:, 1], -row_B)




  def test_skip_nonfinite_checks_the_new_state(self):
    def update_step(state, batch):  # finite loss and gradient, but the step overflows
      return {"w": state["w"] * batch}, {"loss": jnp.float32(1.0), "grad_norm": jnp.float32(1.0)}

    guarded = jax.jit(loop.skip_nonfinite(update_step))
    new, metrics = guarded({"w": jnp.full(2, 1e30)}, jnp.float32(1e30))
    np.testing.assert_array_equal(new["w"], np.float32(1e30))
    self.assertEqual(float(metrics["skipped"]), 1.0)

  def test_gradient_step_is_one_optimizer_step(self):
    tx = optax.adam(0.1)
    params = {"w": jnp.array([1.0, -2.0])}
    state = types.TrainState(step=jnp.int32(3), params=params, opt_state=tx.init(params))
    seen = []

    def loss_fn(params, batch, step):
      seen.append(step)
      loss = ((params["w"] - batch) ** 2).sum()
      return loss, {"loss": loss}

    target = jnp.array([0.0, 0.0])
    new, metrics = loop.gradient_step(loss_fn, tx, with_step=True)(state, target)
    grads = {"w": 2 * (params["w"] - target)}
    updates, _ = tx.update(grads, state.opt_state, params)
    np.testing.assert_allclose(new.params["w"], optax.apply_updates(params, updates)["w"])
    self.assertEqual(int(new.step), 4)
    self.assertEqual(int(seen[0]), 3)  # the loss saw the step before the update
    np.testing.assert_allclose(metrics["grad_norm"], np.sqrt(2.0**2 + 4.0**2), rtol=1e-6)
    np.testing.assert_allclose(metrics["loss"], 5.0)
    # Without with_step the loss takes (params, batch) only.
    plain = loop.gradient_step(lambda p, b: loss_fn(p, b, None), tx)
    np.testing.assert_allclose(plain(state, target)[0].params["w"], new.params["w"])


  def test_skip_nonfinite_checks_every_grad_norm(self):
    state = {"w": jnp.ones(2)}

    def update_step(state, bad):
      new = {"w": state["w"] + 1.0}
      return new, {"loss": jnp.float32(1.0), "grad_norm": jnp.float32(1.0),
                   "value_grad_norm": jnp.where(bad, jnp.nan, 1.0)}

    guarded = jax.jit(loop.skip_nonfinite(update_step))
    new, metrics = guarded(state, jnp.bool_(True))
    np.testing.assert_array_equal(new["w"], 1.0)
    self.assertEqual(float(metrics["skipped"]), 1.0)
    new, metrics = guarded(state, jnp.bool_(False))
    np.testing.assert_array_equal(new["w"], 2.0)
    self.assertEqual(float(metrics["skipped"]), 0.0)


class ScoreStepTest(absltest.TestCase):

  def test_score_step_stores_the_entropy_of_pi_old(self):
    cfg = transformer.Config.named("tiny", vocab=16, width=16, depth=1, heads=2, kv_heads=2,
                                   head_dim=8, mlp=32)
    graphdef, params = testing.random_params(cfg)
    tokens_BT = jax.random.randint(jax.random.key(0), (2, 6), 0, 16)
    batch = types.Batch(tokens_BT=tokens_BT, positions_BT=jnp.broadcast_to(jnp.arange(6), (2, 6)),
                        input_mask_BT=jnp.ones((2, 6), bool),
                        loss_mask_BT=jnp.ones((2, 6)).at[:, :3].set(0.0))
    logp_BT, entropy_BT = policy_lib.token_logprobs(
        nnx.merge(graphdef, params), batch.tokens_BT, batch.positions_BT, batch.input_mask_BT,
        temperature=0.7, return_entropy=True, impl="xla")
    kept, _ = loop.make_score_step(graphdef, temperature=0.7, logprob_impl="xla")(
        params, None, batch)
    np.testing.assert_allclose(kept.entropy_BT, entropy_BT, rtol=1e-6)
    np.testing.assert_allclose(kept.old_logp_BT, logp_BT, rtol=1e-6)
    self.assertGreater(float(entropy_BT[:, 3:].min()), 0.0)

  def test_sampler_score_takes_pi_old_from_the_rollout(self):
    sampler_logp_BT = -jnp.arange(12.0).reshape(2, 6) / 10
    batch = types.Batch(tokens_BT=jnp.zeros((2, 6), jnp.int32),
                        positions_BT=jnp.broadcast_to(jnp.arange(6), (2, 6)),
                        input_mask_BT=jnp.ones((2, 6), bool), loss_mask_BT=jnp.ones((2, 6)),
                        sampler_logp_BT=sampler_logp_BT)
    scored, metrics = jax.jit(loop.sampler_score)({"w": jnp.ones(())}, batch)
    np.testing.assert_array_equal(scored.old_logp_BT, sampler_logp_BT)
    self.assertEqual(metrics, {})


def _trajectory(rng, n: int, reward: float) -> agent_loop.Trajectory:
  """n tokens: a 3-token prompt, a sampled run, a 2-token observation, a sampled run."""
  mask = np.ones(n, np.float32)
  mask[:3] = 0.0
  mask[n // 2:n // 2 + 2] = 0.0   # environment tokens: context, not actions
  return agent_loop.Trajectory(
      tokens=rng.integers(1, 32, n).astype(np.int32), loss_mask=mask,
      turn=np.zeros(n, np.int32), sampler_logp=np.zeros(n, np.float32), turn_rewards=[reward],
      reward=reward, done=True, truncated=False, prompt_len=3)


def _pg_losses(graphdef, params, batch):
  """{mode: -A·logp aggregated with mode}; "seq-mean" aggregates per-sequence sums [B]."""
  logp_BT = policy_lib.token_logprobs(nnx.merge(graphdef, params), batch.tokens_BT,
                                      batch.positions_BT, batch.input_mask_BT, impl="xla")
  mask_BT = batch.loss_mask_BT
  loss_BT = -batch.reward_B[:, None] * logp_BT
  return {
      "token-mean": aggregation.aggregate(loss_BT, mask_BT, "token-mean"),
      "seq-mean-token-mean": aggregation.aggregate(loss_BT, mask_BT, "seq-mean-token-mean"),
      "seq-mean-token-sum-norm": aggregation.aggregate(
          loss_BT, mask_BT, "seq-mean-token-sum-norm", seq_norm_const=48.0),
      "seq-mean": aggregation.aggregate((loss_BT * mask_BT).sum(-1), mask_BT.sum(-1) > 0,
                                        "seq-mean")}


class LengthBucketTest(absltest.TestCase):
  """Power-of-two buckets and length-sorted minibatches cut padding only: every real token's
  log-prob, and every loss over the same rows, is the fixed-length batch's (float32 rounding)."""

  @classmethod
  def setUpClass(cls):
    super().setUpClass()
    cfg = transformer.Config.named("tiny", vocab=32, width=16, depth=2, heads=2, kv_heads=1,
                                   head_dim=8, mlp=32)
    cls.graphdef, cls.params = nnx.split(transformer.Transformer(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    cls.lengths = [9, 40, 13, 21, 6, 33, 18, 11]
    trajs = [_trajectory(rng, n, r) for n, r in zip(cls.lengths, rng.normal(size=8))]
    cls.fixed = pack_lib.pack(trajs, max_len=96, pad_id=0, min_len=96)   # the old packing
    cls.bucketed = pack_lib.pack(trajs, max_len=96, pad_id=0)
    cls.logp = staticmethod(jax.jit(lambda p, b: policy_lib.token_logprobs(
        nnx.merge(cls.graphdef, p), b.tokens_BT, b.positions_BT, b.input_mask_BT, impl="xla")))
    cls.losses = staticmethod(jax.jit(functools.partial(_pg_losses, cls.graphdef)))

  def test_bucketed_batch_scores_and_losses_match_the_fixed_length_batch(self):
    self.assertEqual(self.fixed.tokens_BT.shape, (8, 96))
    self.assertEqual(self.bucketed.tokens_BT.shape, (8, 64))      # longest row 40 -> 64
    real_BT = np.asarray(self.bucketed.input_mask_BT)
    np.testing.assert_allclose(np.asarray(self.logp(self.params, self.bucketed))[real_BT],
                               np.asarray(self.logp(self.params, self.fixed))[:, :64][real_BT],
                               rtol=1e-5, atol=1e-6)
    fixed, bucketed = self.losses(self.params, self.fixed), self.losses(self.params,
                                                                          self.bucketed)
    for mode in fixed:
      self.assertGreater(abs(float(fixed[mode])), 1e-3, mode)      # a loss that can differ
      np.testing.assert_allclose(bucketed[mode], fixed[mode], rtol=1e-5, err_msg=mode)
    grad = jax.jit(jax.grad(lambda p, b: _pg_losses(self.graphdef, p, b)["token-mean"]))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6),
                 grad(self.params, self.bucketed), grad(self.params, self.fixed))

  def test_length_sorted_layout(self):
    # Sorted: rows 4 (6), 0 (9), 7 (11), 2 (13) | 6 (18), 3 (21), 5 (33), 1 (40).
    layout = pack_lib.length_sorted_layout(self.lengths, num=2, max_len=64)
    self.assertEqual([(rows.tolist(), T) for rows, T in layout],
                     [([0, 2, 4, 7], 16), ([1, 3, 5, 6], 64)])
    four = pack_lib.length_sorted_layout(self.lengths, num=4, max_len=64, min_len=8)
    self.assertEqual([T for _, T in four], [16, 16, 32, 64])
    shuffled = pack_lib.length_sorted_layout(self.lengths, num=4, max_len=64, min_len=8,
                                             seed=(3, 0))
    self.assertCountEqual([(r.tolist(), T) for r, T in shuffled],
                          [(r.tolist(), T) for r, T in four])
    with self.assertRaisesRegex(ValueError, "num=3 minibatches must divide the batch size 8"):
      pack_lib.length_sorted_layout(self.lengths, num=3, max_len=64)

  def test_length_sorted_minibatches_keep_each_rows_values(self):
    parts = loop.length_sorted_minibatches(self.bucketed, self.lengths, num=2)
    self.assertEqual([p.tokens_BT.shape for p in parts], [(4, 16), (4, 64)])
    real = sum(self.lengths)
    pad = {"fixed": 1 - real / (8 * 96), "bucketed": 1 - real / (8 * 64),
           "sorted": 1 - real / (4 * 16 + 4 * 64)}
    self.assertLess(pad["sorted"], pad["bucketed"])
    self.assertLess(pad["bucketed"], pad["fixed"])
    fixed_logp_BT = np.asarray(self.logp(self.params, self.fixed))
    for part, (rows, T) in zip(parts, pack_lib.length_sorted_layout(self.lengths, num=2,
                                                                   max_len=64)):
      same_rows = jax.tree.map(lambda x, r=rows: x[r], self.fixed)
      np.testing.assert_array_equal(part.tokens_BT, same_rows.tokens_BT[:, :T])
      np.testing.assert_array_equal(part.reward_B, same_rows.reward_B)
      real_BT = np.asarray(part.input_mask_BT)
      np.testing.assert_allclose(np.asarray(self.logp(self.params, part))[real_BT],
                                 fixed_logp_BT[rows][:, :T][real_BT], rtol=1e-5, atol=1e-6)
      got, want = self.losses(self.params, part), self.losses(self.params, same_rows)
      for mode in want:
        np.testing.assert_allclose(got[mode], want[mode], rtol=1e-5, err_msg=mode)

  def test_run_sorts_minibatches_by_length_when_asked(self):
    lengths_B = np.array([3, 30, 5, 20])
    batch = types.Batch(tokens_BT=jnp.zeros((4, 32), jnp.int32),
                        positions_BT=jnp.zeros((4, 32), jnp.int32),
                        input_mask_BT=jnp.arange(32)[None] < lengths_B[:, None],
                        loss_mask_BT=jnp.ones((4, 32)), reward_B=jnp.arange(4.0))
    for sort, want in ((True, [(2, 16), (2, 32)]), (False, [(2, 32), (2, 32)])):
      shapes = []

      def update(state, minibatch, shapes=shapes):
        shapes.append(minibatch.tokens_BT.shape)
        return state, {"loss": 0.0, "grad_norm": 1.0}

      loop.run(types.TrainState(step=jnp.int32(0), params={"w": jnp.zeros(1)}, opt_state=()),
               rng=jax.random.key(0), total_steps=1, workdir=_tmpdir(self),
               rollout_fn=lambda p, k, s: loop.Rollout(batch, {}, lengths_B=lengths_B),
               score_fn=lambda p, b: (b, {}), advantage_fn=lambda b, e: (b, {}),
               update_fn=update, num_minibatches=2, sort_by_length=sort, tensorboard=False,
               console=False)
      self.assertCountEqual(shapes, want)


if __name__ == "__main__":
  absltest.main()
