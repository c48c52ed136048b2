# pylint: disable=invalid-name
"""Tests for agentrl.loop on a 4-armed bandit "policy" (no transformer, compiles in ms).

Each row of a batch is one pull: token 1 of the row is the arm, its log-prob comes from a
softmax over 4 logits, and arm 3 pays 1. The shared driver must make the reward go up, skip
non-finite updates, and resume from a checkpoint to exactly the uninterrupted run's records.
"""
import io
import os
import shutil
import tempfile
from unittest import mock

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np
import optax

from agentrl import advantages
from agentrl import loop
from agentrl import types
from agentrl.data import generators
from agentrl.data import stream

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
    return loop.Rollout(batch=batch, metrics={"reward": float(reward_B.mean())})

  def score(self, params, batch):
    return batch.replace(old_logp_BT=_logp(params, batch)), {"entropy": jnp.float32(0.0)}

  @staticmethod
  def advantage(batch, extras):
    del extras
    adv_B = advantages.grpo(batch.reward_B, group_size=G)
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
        rollout_fn=self.rollout, score_fn=jax.jit(self.score),
        advantage_fn=jax.jit(self.advantage),
        update_fn=update, data=self.data, tensorboard=False,
        evaluate=lambda params: {"p_best": jax.nn.softmax(params["logits"])[3]},
        **{"console": False, **kwargs})


def _reproducible(records):
  return [{k: v for k, v in r.items() if k not in loop.TIMING_KEYS} for r in records]


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


if __name__ == "__main__":
  absltest.main()
