# pylint: disable=invalid-name
"""experiments/agents/arpo.py and spear.py on hand-made host batches: ARPO's splice of a stored
success into a failed group and its storing of successes; SPEAR's stale eviction, storing by
advantage, appended replay rows with (R - median)+, and GRPO over the sampled rows only."""
import importlib

from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from agentrl import types
from agentrl.train import replay_buffer as rb

arpo = importlib.import_module("experiments.agents.arpo")
spear = importlib.import_module("experiments.agents.spear")

T = 4


def _host(rewards, *, version=0, offset=0):
  """A packed host batch: row i's tokens offset + 10 i + (0..3), the last one padding."""
  b = len(rewards)
  ids = (offset + 10 * np.arange(b)[:, None] + np.arange(T)).astype(np.int32)
  mask = np.ones((b, T), bool)
  mask[:, -1] = False
  return types.Batch(tokens_BT=ids, positions_BT=rb.positions(mask), input_mask_BT=mask,
                     loss_mask_BT=mask.astype(np.float32), turn_BT=np.zeros((b, T), np.int32),
                     reward_B=np.asarray(rewards, np.float32),
                     sampler_logp_BT=np.full((b, T), -0.5 - version, np.float32),
                     truncated_B=np.zeros((b,), bool),
                     version_B=np.full((b,), version, np.int32))


class ArpoTest(absltest.TestCase):

  def test_failed_group_gets_its_stored_success(self):
    pc = arpo.get_config("smoke").replay
    buf = rb.empty(8, T)
    # Step 1: prompt 3 succeeds once (row 1), prompt 4 never.
    success = np.array([False, True, False, False])
    _, buf, m = arpo.replay_step(buf, _host([0.2, 1.0, 0.0, 0.0]), np.array([3, 4]), success,
                                 pc, G=2, version=0, seed=0)
    self.assertEqual(m, {"replay/size": 1.0, "replay/replayed_rows": 0.0,
                         "replay/failed_groups": 0.5})
    # Step 2: both prompts fail; only prompt 3 (now rows 2-3) has a stored success.
    host = _host([0.0, 0.1, 0.3, 0.0], version=1, offset=100)
    batch, buf, m = arpo.replay_step(buf, host, np.array([4, 3]), np.zeros(4, bool), pc, G=2,
                                     version=1, seed=5)
    self.assertEqual(m["replay/replayed_rows"], 1.0)
    self.assertEqual(m["replay/failed_groups"], 1.0)
    row = int(np.flatnonzero(batch.aux["keep_logp_B"])[0])
    self.assertIn(row, (2, 3))                       # prompt 3's group
    np.testing.assert_array_equal(batch.tokens_BT[row], [10, 11, 12, 13])
    np.testing.assert_array_equal(batch.sampler_logp_BT[row], -0.5)   # its stored pi_old
    self.assertEqual(batch.reward_B[row], 1.0)
    self.assertEqual(batch.version_B[row], 0)
    others = np.delete(np.arange(4), row)
    np.testing.assert_array_equal(batch.tokens_BT[others], host.tokens_BT[others])
    self.assertEqual(m["replay/size"], 1.0)          # no new success to store

  def test_recompute_leaves_no_row_kept(self):
    pc = arpo.get_config("smoke").replay
    pc.keep_stored_logp = False
    _, buf, _ = arpo.replay_step(rb.empty(8, T), _host([1.0, 0.0]), np.array([4]),
                                 np.array([True, False]), pc, G=2, version=0, seed=0)
    batch, _, m = arpo.replay_step(buf, _host([0.0, 0.0]), np.array([4]), np.zeros(2, bool),
                                   pc, G=2, version=1, seed=0)
    self.assertEqual(m["replay/replayed_rows"], 1.0)
    np.testing.assert_array_equal(batch.aux["keep_logp_B"], 0.0)


class SpearTest(absltest.TestCase):

  def test_store_draw_and_recalibrate(self):
    sc = spear.get_config("smoke").spear
    sc.update(rows=3, threshold=0.5, max_age=2)
    buf = rb.empty(8, T, history=16)
    # Step 1 (version 0): GRPO over [1, 0] and [0, 0]: row 0's advantage 1/sqrt(2) > 0.5.
    batch, buf, m = spear.replay_step(buf, _host([1.0, 0.0, 0.0, 0.0]), np.repeat([3, 4], 2),
                                      sc, G=2, version=0, seed=0)
    self.assertEqual(batch.tokens_BT.shape, (7, T))
    np.testing.assert_array_equal(batch.aux["replay_B"], 0.0)   # nothing stored before
    np.testing.assert_array_equal(batch.loss_mask_BT[4:], 0.0)
    self.assertEqual(m["replay/size"], 1.0)
    # Step 2 (version 1): the stored row is drawn; baseline = median of 8 rewards = 0.
    batch, buf, m = spear.replay_step(buf, _host([0.0] * 4, version=1, offset=100),
                                      np.repeat([5, 6], 2), sc, G=2, version=1, seed=0)
    np.testing.assert_array_equal(batch.aux["replay_B"], [0, 0, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(batch.aux["sil_adv_B"], [0, 0, 0, 0, 1, 0, 0])
    np.testing.assert_array_equal(batch.tokens_BT[4], [0, 1, 2, 3])
    self.assertEqual(m["replay/sil_active_frac"], 1.0)
    self.assertEqual(m["replay/baseline"], 0.0)
    # Step 3 (version 2): the row from version 0 is max_age = 2 versions old: dropped.
    batch, buf, m = spear.replay_step(buf, _host([0.0] * 4, version=2), np.repeat([7, 8], 2),
                                      sc, G=2, version=2, seed=0)
    self.assertEqual(m["replay/size"], 0.0)
    self.assertEqual(m["replay/replayed_rows"], 0.0)

  def test_grpo_over_the_sampled_rows_only(self):
    config = spear.get_config("smoke")
    config.rollout.group_size, config.spear.rows = 2, 2
    batch = jax.tree.map(jnp.asarray, _host([1.0, 0.0, 0.5, 0.5, 1.0, 1.0]))
    batch, metrics = jax.jit(spear.make_advantage_fn(config))(batch, {})
    adv_B = np.asarray(batch.adv_BT[:, 0])
    np.testing.assert_allclose(adv_B[:2], [0.5**0.5, -0.5**0.5], atol=1e-4)  # unbiased std
    np.testing.assert_array_equal(adv_B[2:], 0.0)
    self.assertEqual(float(metrics["groups_with_signal"]), 0.5)


if __name__ == "__main__":
  absltest.main()
