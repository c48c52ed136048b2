# pylint: disable=invalid-name
"""Tests for agentrl.train.overlap's pieces; the overlapped loop itself is tested in
loop_test.py."""
from absl.testing import absltest
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.train import overlap
from agentrl import types

jax.config.update("jax_numpy_rank_promotion", "raise")

LN = np.log
# Row 0: pi_old / pi_behaviour = (3, 0.5, 1.5) on its policy tokens (column 0 is the prompt);
# row 1: (1.25, masked, 0.8).
MASK = jnp.array([[0., 1., 1., 1.], [0., 1., 0., 1.]])
SAMPLER = jnp.full((2, 4), -2.0)
OLD = jnp.asarray(-2.0 + np.array([[0., LN(3.), LN(.5), LN(1.5)], [0., LN(1.25), 7., LN(.8)]]),
                  jnp.float32)
ADV = jnp.array([[0., 2., 2., 2.], [0., -1., 5., -1.]])


def _batch():
  return types.Batch(tokens_BT=jnp.zeros((2, 4), jnp.int32), positions_BT=jnp.zeros((2, 4)),
                     input_mask_BT=jnp.ones((2, 4), bool), loss_mask_BT=MASK, adv_BT=ADV,
                     old_logp_BT=OLD, sampler_logp_BT=SAMPLER)


class CorrectionTest(absltest.TestCase):

  def test_truncated_importance_sampling(self):
    batch, m = jax.jit(overlap.off_policy_correction("token_tis", 2.0))(_batch())
    np.testing.assert_allclose(batch.adv_BT, [[0, 4, 1, 3], [0, -1.25, 0, -0.8]], rtol=1e-6)
    np.testing.assert_array_equal(batch.loss_mask_BT, MASK)
    self.assertAlmostEqual(float(m["offpolicy/weight"]), (2 + .5 + 1.5 + 1.25 + .8) / 5, 6)
    self.assertEqual(float(m["offpolicy/kept"]), 1.0)
    # Sequence level: row products 2.25 (truncated to 2) and 1.0.
    batch, _ = overlap.off_policy_correction("sequence_tis", 2.0)(_batch())
    np.testing.assert_allclose(batch.adv_BT, [[0, 4, 4, 4], [0, -1, 0, -1]], rtol=1e-6)

  def test_masked_importance_sampling(self):
    batch, m = overlap.off_policy_correction("token_mask", 2.0)(_batch())
    keep = np.array([[0, 0, 1, 1], [0, 1, 0, 1]], np.float32)  # 3 leaves [1/2, 2]
    np.testing.assert_array_equal(batch.loss_mask_BT, keep)
    np.testing.assert_allclose(batch.adv_BT, ADV * keep)
    self.assertAlmostEqual(float(m["offpolicy/kept"]), 4 / 5, 6)
    batch, _ = overlap.off_policy_correction("sequence_mask", 2.0)(_batch())  # 2.25 > 2
    np.testing.assert_array_equal(batch.loss_mask_BT, [[0, 0, 0, 0], [0, 1, 0, 1]])

  def test_fresh_rollout_is_unchanged_and_none_is_identity(self):
    fresh = _batch().replace(old_logp_BT=SAMPLER)
    for mode in ("token_tis", "sequence_tis", "token_mask", "sequence_mask"):
      batch, m = overlap.off_policy_correction(mode)(fresh)
      np.testing.assert_array_equal(batch.adv_BT, ADV * MASK, err_msg=mode)  # 0 off the mask
      self.assertEqual(float(m["offpolicy/weight"]), 1.0)
    batch, m = overlap.off_policy_correction("none")(_batch())
    self.assertIs(batch.adv_BT, ADV)
    self.assertEqual(m, {})

  def test_errors_name_the_problem(self):
    with self.assertRaisesRegex(ValueError, "unknown off-policy correction 'tis'"):
      overlap.off_policy_correction("tis")
    with self.assertRaisesRegex(ValueError, "sampler's log-probs"):
      overlap.off_policy_correction()(_batch().replace(sampler_logp_BT=None))
    with self.assertRaisesRegex(ValueError, "max_staleness must be >= 0"):
      overlap.RolloutProducer(lambda *a: None, rng=jax.random.key(0), max_staleness=-1,
                              total_steps=1)


class ScheduleTest(absltest.TestCase):

  def test_behaviour_version(self):
    self.assertEqual([overlap.behaviour_version(t, 0) for t in range(1, 5)], [0, 1, 2, 3])
    self.assertEqual([overlap.behaviour_version(t, 2) for t in range(1, 6)], [0, 0, 0, 1, 2])

  def test_rollout_key_is_the_synchronous_loops(self):
    rng = jax.random.key(3)
    np.testing.assert_array_equal(
        jax.random.key_data(overlap.rollout_key(rng, 5)),
        jax.random.key_data(jax.random.split(jax.random.fold_in(rng, 5))[0]))


if __name__ == "__main__":
  absltest.main()
