# pylint: disable=invalid-name
"""Tests for agentrl.train.replay_buffer: bounds, eviction, sampling, ARPO splicing, resume."""
import tempfile

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from agentrl import checkpoint
from agentrl import types
from agentrl.advantages import estimators
from agentrl.losses import policy as pg
from agentrl.train import replay_buffer as rb

T = 3


def _add(buf, prompts, rewards, *, version=0, keep=None, cap=2, evict="oldest"):
  b = len(prompts)
  ids = np.arange(b * T, dtype=np.int32).reshape(b, T) + 100 * version
  return rb.add(buf, prompt_B=np.array(prompts), tokens_BT=ids,
                input_mask_BT=np.ones((b, T), bool), loss_mask_BT=np.ones((b, T), np.float32),
                old_logp_BT=-ids.astype(np.float32) / 10, reward_B=np.array(rewards),
                version=version, keep_B=keep, per_prompt_cap=cap, evict=evict)


class BufferTest(absltest.TestCase):

  def test_add_is_pure_and_stores_kept_rows(self):
    buf = rb.empty(4, T, history=8)
    new = _add(buf, [7, 7, 8], [1.0, 0.0, 1.0], keep=[True, False, True])
    self.assertEqual(rb.size(buf), 0)
    self.assertEqual(rb.size(new), 2)
    np.testing.assert_array_equal(new.prompt_C[new.filled_C], [7, 8])
    np.testing.assert_array_equal(new.tokens_CT[0], [0, 1, 2])
    np.testing.assert_array_equal(new.old_logp_CT[1], np.float32([-0.6, -0.7, -0.8]))
    # Every row's reward reaches the history, stored or not.
    self.assertEqual(int(new.recent_n), 3)
    self.assertEqual(rb.baseline(new), 1.0)

  def test_per_prompt_cap_evicts_oldest_of_that_prompt(self):
    buf = _add(rb.empty(8, T), [7, 7, 8], [1.0, 2.0, 3.0], version=0, cap=2)
    buf = _add(buf, [7], [0.5], version=1, cap=2)
    live = rb.slots(buf, 7)
    np.testing.assert_array_equal(buf.reward_C[live], np.float32([0.5, 2.0]))  # newest first
    self.assertEqual(rb.size(buf), 3)

  def test_lowest_reward_eviction_keeps_the_best(self):
    buf = _add(rb.empty(8, T), [7, 7], [1.0, 2.0], cap=2, evict="lowest_reward")
    kept = _add(buf, [7], [0.5], version=1, cap=2, evict="lowest_reward")
    np.testing.assert_array_equal(np.sort(kept.reward_C[rb.slots(kept, 7)]), [1.0, 2.0])
    better = _add(buf, [7], [3.0], version=1, cap=2, evict="lowest_reward")
    np.testing.assert_array_equal(np.sort(better.reward_C[rb.slots(better, 7)]), [2.0, 3.0])

  def test_global_cap_evicts_globally_oldest(self):
    buf = _add(rb.empty(2, T), [1, 2], [1.0, 1.0], version=0, cap=5)
    buf = _add(buf, [3], [1.0], version=1, cap=5)
    self.assertEqual(rb.size(buf), 2)
    self.assertCountEqual(buf.prompt_C[buf.filled_C].tolist(), [2, 3])

  def test_evict_stale(self):
    buf = _add(rb.empty(4, T), [1], [1.0], version=0)
    buf = _add(buf, [2], [1.0], version=5)
    fresh = rb.evict_stale(buf, version=10, max_age=10)
    self.assertEqual(fresh.prompt_C[fresh.filled_C].tolist(), [2])

  def test_sample_deterministic_and_filtered(self):
    buf = _add(rb.empty(8, T), [1, 2, 3, 4, 5], [1.0, 0.0, 1.0, 1.0, 1.0], cap=5)
    a = rb.sample(buf, 3, seed=11, min_reward=0.5)
    np.testing.assert_array_equal(a, rb.sample(buf, 3, seed=11, min_reward=0.5))
    self.assertLen(set(a.tolist()), 3)
    self.assertNotIn(1, a.tolist())  # slot 1 holds the failure
    self.assertLen(rb.sample(buf, 10, seed=0, min_reward=0.5), 4)

  def test_errors(self):
    with self.assertRaisesRegex(ValueError, "evict="):
      _add(rb.empty(2, T), [1], [1.0], evict="random")
    with self.assertRaisesRegex(ValueError, r"\[B, 3\]"):
      rb.add(rb.empty(2, T), prompt_B=[1], tokens_BT=np.zeros((1, 4), np.int32),
             input_mask_BT=None, loss_mask_BT=None, old_logp_BT=None, reward_B=[1.0],
             version=0, per_prompt_cap=1)
    with self.assertRaisesRegex(ValueError, "baseline"):
      rb.baseline(rb.empty(2, T))

  def test_prompt_key_stable(self):
    self.assertEqual(rb.prompt_key("abc"), rb.prompt_key("abc"))
    self.assertLess(rb.prompt_key("abc"), 2**31)


class ArpoTest(absltest.TestCase):

  def test_plan_and_splice(self):
    # Prompt 7 has a stored success; prompt 8 has none; prompt 9's group already succeeds.
    buf = _add(rb.empty(4, T), [7, 7, 9], [1.0, 0.0, 1.0], version=2, keep=[True, False, True])
    reward_B = np.float32([0, 0, 0, 0, 1, 0])
    slot_P, row_P = rb.arpo_plan(buf, reward_B, [7, 8, 9], group_size=2, seed=3)
    self.assertEqual(slot_P.tolist()[1:], [-1, -1])
    self.assertIn(row_P[0], (0, 1))
    batch = {"tokens_BT": np.full((6, T), -1, np.int32), "reward_B": reward_B,
             "old_logp_BT": np.zeros((6, T), np.float32), "version_B": np.full((6,), 5)}
    out, replayed_B = rb.splice(batch, buf, slot_P, row_P)
    r = row_P[0]
    np.testing.assert_array_equal(replayed_B, np.arange(6) == r)
    np.testing.assert_array_equal(out["tokens_BT"][r], [200, 201, 202])
    np.testing.assert_array_equal(out["old_logp_BT"][r], np.float32([-20.0, -20.1, -20.2]))
    self.assertEqual((out["reward_B"][r], out["version_B"][r]), (1.0, 2))
    self.assertEqual((batch["tokens_BT"] == -1).all(), True)  # input untouched
    np.testing.assert_array_equal(np.delete(out["tokens_BT"], r, 0), -1)

  def test_plan_is_permutation_equivariant_in_groups(self):
    buf = _add(rb.empty(4, T), [7, 8], [1.0, 1.0])
    s1, r1 = rb.arpo_plan(buf, np.zeros(4), [7, 8], group_size=2, seed=0)
    s2, _ = rb.arpo_plan(buf, np.zeros(4), [8, 7], group_size=2, seed=0)
    np.testing.assert_array_equal(s1, s2[::-1])
    self.assertTrue(((r1 >= 0) & (r1 < 4)).all())


class ArpoLossTest(absltest.TestCase):
  """ARPO end to end: splice a stored success into a failed group, GRPO, PPO clip (0.2, 0.3)."""

  def _batch(self, keep_stored_logp):
    stored = np.float32([[-1.0, -2.0, -3.0]])
    buf = rb.add(rb.empty(2, T), prompt_B=[7], tokens_BT=np.ones((1, T), np.int32),
                 input_mask_BT=np.ones((1, T), bool),
                 loss_mask_BT=np.float32([[1, 1, 0]]), old_logp_BT=stored, reward_B=[1.0],
                 version=0, per_prompt_cap=1)
    slot_P, row_P = rb.arpo_plan(buf, np.zeros(2), [7], group_size=2, seed=0)
    batch = {"reward_B": np.zeros(2, np.float32), "loss_mask_BT": np.ones((2, T), np.float32),
             "old_logp_BT": np.full((2, T), -0.5, np.float32)}
    out, replayed_B = rb.splice(batch, buf, slot_P, row_P, keep_stored_logp=keep_stored_logp)
    r = int(row_P[0])
    # The current policy: the replayed row's log-probs moved by (0.5, 0.1, 0.7) since storing.
    logp = np.full((2, T), -0.5, np.float32)
    logp[r] = stored[0] + np.float32([0.5, 0.1, 0.7])
    return out, replayed_B, r, jnp.asarray(logp)

  def test_golden_importance_clip(self):
    out, replayed_B, r, logp = self._batch(keep_stored_logp=True)
    self.assertTrue(replayed_B[r])
    adv_B = estimators.grpo(jnp.asarray(out["reward_B"]), group_size=2)
    np.testing.assert_allclose(adv_B[r], 1 / np.sqrt(2), rtol=1e-5)  # (1 − ½) / std_ddof1
    loss_fn = lambda lp: pg.ppo_clip(lp, jnp.asarray(out["old_logp_BT"]), adv_B[:, None],
                                     jnp.asarray(out["loss_mask_BT"]), eps_high=0.3)[0]
    loss = loss_fn(logp)
    # r = e^0.5 = 1.649 > 1.3 with A > 0: clipped, −A · 1.3; r = e^0.1 inside: −A e^0.1; the
    # third token is not the policy's (loss mask 0); the fresh row is on-policy: −A · 1.
    a = 1 / np.sqrt(2)
    np.testing.assert_allclose(loss[r], [-a * 1.3, -a * np.exp(0.1), 0.0], rtol=1e-5)
    np.testing.assert_allclose(loss[1 - r], [a, a, a], rtol=1e-5)
    g = jax.grad(lambda lp: loss_fn(lp).sum())(logp)
    self.assertEqual(float(g[r, 0]), 0.0)  # the clipped token
    self.assertEqual(float(g[r, 2]), 0.0)  # the masked token
    self.assertNotEqual(float(g[r, 1]), 0.0)

  def test_recomputed_logp_is_plain_grpo(self):
    # Without the stored log-probs the score step's recompute stands (here: the current
    # policy), the ratio is 1 and the loss is plain GRPO's −A on every policy token.
    out, _, r, logp = self._batch(keep_stored_logp=False)
    np.testing.assert_array_equal(out["old_logp_BT"], -0.5)
    adv_B = estimators.grpo(jnp.asarray(out["reward_B"]), group_size=2)
    loss, _ = pg.ppo_clip(logp, logp, adv_B[:, None], jnp.asarray(out["loss_mask_BT"]),
                          eps_high=0.3)
    np.testing.assert_allclose(
        loss, -np.asarray(adv_B)[:, None] * np.asarray(out["loss_mask_BT"]), rtol=1e-6)
    self.assertEqual(float(out["loss_mask_BT"][r, 2]), 0.0)


class CheckpointTest(absltest.TestCase):

  def _host_batch(self, b=4):
    ids = np.arange(b * T, dtype=np.int32).reshape(b, T) + 500
    mask = np.ones((b, T), bool)
    mask[:, -1] = False
    return types.Batch(tokens_BT=ids, positions_BT=rb.positions(mask), input_mask_BT=mask,
                       loss_mask_BT=mask.astype(np.float32), turn_BT=np.zeros((b, T), np.int32),
                       reward_B=np.zeros((b,), np.float32),
                       sampler_logp_BT=np.full((b, T), -9.0, np.float32),
                       truncated_B=np.ones((b,), bool), version_B=np.full((b,), 5, np.int32))

  def _score(self, batch):
    """A fake score step: π_old recomputed as -1 everywhere, then the stored ones kept."""
    batch = jax.tree.map(jnp.asarray, batch)
    score_step = lambda params, ref, b: (b.replace(old_logp_BT=jnp.full(b.tokens_BT.shape, -1.0)),
                                         {})
    return jax.jit(rb.stored_logp_score(score_step))(None, batch)[0]

  def test_splice_batch_keeps_stored_logp_in_score(self):
    buf = _add(rb.empty(4, T), [7, 8], [1.0, 1.0], version=2)
    slot_P, row_P = np.array([1, -1]), np.array([1, -1])   # prompt 8's success into row 1
    batch, replayed_B = rb.splice_batch(self._host_batch(), buf, slot_P, row_P)
    np.testing.assert_array_equal(replayed_B, [False, True, False, False])
    np.testing.assert_array_equal(batch.tokens_BT[1], buf.tokens_CT[1])
    np.testing.assert_array_equal(batch.version_B, [5, 2, 5, 5])
    np.testing.assert_array_equal(batch.positions_BT[1], [0, 1, 2])
    self.assertFalse(batch.truncated_B[1])
    scored = self._score(batch)
    np.testing.assert_array_equal(scored.old_logp_BT[1], buf.old_logp_CT[1])
    np.testing.assert_array_equal(np.delete(np.asarray(scored.old_logp_BT), 1, 0), -1.0)
    # The authors' recompute: every row's π_old is the score step's.
    batch, _ = rb.splice_batch(self._host_batch(), buf, slot_P, row_P, keep_stored_logp=False)
    np.testing.assert_array_equal(self._score(batch).old_logp_BT, -1.0)
    np.testing.assert_array_equal(batch.tokens_BT[1], buf.tokens_CT[1])

  def test_append_batch_pads_and_keeps_stored_logp(self):
    buf = _add(rb.empty(4, T), [7, 8], [1.0, 0.5], version=3)
    batch = rb.append_batch(self._host_batch(2), buf, np.array([1]), 3,
                            adv_B=np.array([0.25, 0.0, 0.0]))
    self.assertEqual(batch.tokens_BT.shape, (5, T))
    np.testing.assert_array_equal(batch.tokens_BT[2], buf.tokens_CT[1])
    np.testing.assert_array_equal(batch.aux["replay_B"], [0, 0, 1, 0, 0])
    np.testing.assert_array_equal(batch.aux["adv_B"], [0, 0, 0.25, 0, 0])
    np.testing.assert_array_equal(batch.loss_mask_BT[3:], 0.0)   # padding trains nothing
    np.testing.assert_array_equal(batch.reward_B, [0, 0, 0.5, 0, 0])
    np.testing.assert_array_equal(batch.version_B, [5, 5, 3, 5, 5])
    scored = self._score(batch)
    np.testing.assert_array_equal(scored.old_logp_BT[2], buf.old_logp_CT[1])
    np.testing.assert_array_equal(np.delete(np.asarray(scored.old_logp_BT), 2, 0), -1.0)
    with self.assertRaisesRegex(ValueError, "do not fit"):
      rb.append_batch(self._host_batch(2), buf, np.array([0, 1]), 1)

  def test_round_trip_is_bit_exact(self):
    buf = _add(rb.empty(4, T, history=5), [7, 7, 8], [1.0, 0.25, -1.5], version=3)
    buf = _add(buf, [9, 9], [0.5, 2.0], version=4, keep=[False, True])
    with tempfile.TemporaryDirectory() as d:
      mgr = checkpoint.Checkpointer(d, save_every=1)
      mgr.save(4, {"replay": buf}, {"step": 4})
      mgr.wait()
      restored, _ = mgr.restore({"replay": rb.empty(4, T, history=5)})
      mgr.close()
    got = restored["replay"]
    for want_x, got_x in zip(jax.tree.leaves(buf), jax.tree.leaves(got)):
      self.assertEqual(np.asarray(got_x).dtype, want_x.dtype)
      np.testing.assert_array_equal(np.asarray(got_x), want_x)
    # Resume exactness: the restored buffer samples and evolves as the original.
    got = jax.tree.map(np.asarray, got)
    np.testing.assert_array_equal(rb.sample(got, 2, seed=5), rb.sample(buf, 2, seed=5))
    a, b = _add(buf, [7], [3.0], version=5), _add(got, [7], [3.0], version=5)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
      np.testing.assert_array_equal(x, y)


if __name__ == "__main__":
  absltest.main()
