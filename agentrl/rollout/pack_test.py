"""Tests for agentrl.rollout.pack (host numpy only, plus one device transfer)."""
from absl.testing import absltest
import jax
import numpy as np

from agentrl.rollout import agent_loop
from agentrl.rollout import pack

PAD = 0


def _traj(prompt_len, turns, *, reward=1.0, truncated=False):
  """A transcript: prompt, then (sampled, observation) lengths per turn."""
  tokens, mask, turn, logp = [], [], [], []
  tokens += list(range(10, 10 + prompt_len))
  mask += [0.0] * prompt_len
  turn += [-1] * prompt_len
  logp += [0.0] * prompt_len
  for u, (n_act, n_obs) in enumerate(turns):
    tokens += [100 + u] * n_act + [200 + u] * n_obs
    mask += [1.0] * n_act + [0.0] * n_obs
    turn += [u] * (n_act + n_obs)
    logp += [-0.5] * n_act + [0.0] * n_obs
  return agent_loop.Trajectory(
      tokens=np.asarray(tokens, np.int32), loss_mask=np.asarray(mask, np.float32),
      turn=np.asarray(turn, np.int32), sampler_logp=np.asarray(logp, np.float32),
      turn_rewards=[reward], reward=reward, done=not truncated, truncated=truncated,
      prompt_len=prompt_len)


class PackTest(absltest.TestCase):

  def test_shapes_masks_and_positions(self):
    trajs = [_traj(3, [(2, 2), (1, 0)], reward=1.0), _traj(2, [(3, 0)], reward=0.0)]
    b = pack.pack_numpy(trajs, max_len=64, pad_id=PAD)
    self.assertEqual(b.tokens_BT.shape, (2, 16))               # 8 tokens -> bucket 16
    np.testing.assert_array_equal(b.tokens_BT[0, :8], [10, 11, 12, 100, 100, 200, 200, 101])
    np.testing.assert_array_equal(b.tokens_BT[0, 8:], PAD)
    np.testing.assert_array_equal(b.input_mask_BT.sum(-1), [8, 5])
    np.testing.assert_array_equal(b.loss_mask_BT[0, :8], [0, 0, 0, 1, 1, 0, 0, 1])
    np.testing.assert_array_equal(b.loss_mask_BT[:, 8:], 0)
    np.testing.assert_array_equal(b.positions_BT[1, :5], np.arange(5))
    np.testing.assert_array_equal(b.turn_BT[0, :8], [-1, -1, -1, 0, 0, 0, 0, 1])
    np.testing.assert_array_equal(b.turn_BT[:, 8:], -1)
    np.testing.assert_array_equal(b.sampler_logp_BT[b.loss_mask_BT == 1], -0.5)
    np.testing.assert_array_equal(b.sampler_logp_BT[b.loss_mask_BT == 0], 0.0)
    np.testing.assert_array_equal(b.reward_B, [1.0, 0.0])
    np.testing.assert_array_equal(b.truncated_B, [False, False])
    self.assertEqual(b.tokens_BT.dtype, np.int32)
    self.assertEqual(b.loss_mask_BT.dtype, np.float32)

  def test_overlong_trajectory_is_cut_and_flagged(self):
    trajs = [_traj(4, [(10, 0)]), _traj(2, [(3, 0)]), _traj(2, [(1, 0)], truncated=True)]
    b = pack.pack_numpy(trajs, max_len=12, pad_id=PAD)
    self.assertEqual(b.tokens_BT.shape, (3, 12))                # cap, not the 16 bucket
    np.testing.assert_array_equal(b.truncated_B, [True, False, True])
    self.assertEqual(b.loss_mask_BT[0].sum(), 8)                # 4 prompt + first 8 actions
    self.assertEqual(b.input_mask_BT[0].sum(), 12)

  def test_buckets(self):
    self.assertEqual(pack.padded_length([5, 9], max_len=1024), 16)
    self.assertEqual(pack.padded_length([17], max_len=1024), 32)
    self.assertEqual(pack.padded_length([600], max_len=1000), 1000)
    # Four steps per octave: (128, 256] -> 160, 192, 224, 256 (SmolLM2 preset rows: ~172).
    quarter = lambda n, **kw: pack.padded_length([n], max_len=320, per_octave=4, **kw)
    self.assertEqual([quarter(n) for n in (5, 17, 128, 129, 172, 255, 300)],
                     [16, 20, 128, 160, 192, 256, 320])
    self.assertEqual(quarter(20, min_len=64), 64)
    with self.assertRaisesRegex(ValueError, "per_octave must be >= 1"):
      pack.padded_length([5], max_len=64, per_octave=0)

  def test_device_batch(self):
    b = pack.pack([_traj(3, [(2, 1)])], max_len=64, pad_id=PAD)
    self.assertIsInstance(b.tokens_BT, jax.Array)
    self.assertIsInstance(b.truncated_B, jax.Array)
    self.assertIsNone(b.adv_BT)

  def test_bad_input(self):
    bad = _traj(3, [(2, 1)])
    bad.turn = bad.turn[:-1]
    with self.assertRaisesRegex(ValueError, "trajectory 0 has per-token arrays"):
      pack.pack_numpy([bad], max_len=64, pad_id=PAD)
    with self.assertRaisesRegex(ValueError, "at least one"):
      pack.pack_numpy([], max_len=64, pad_id=PAD)


if __name__ == "__main__":
  absltest.main()
