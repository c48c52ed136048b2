# pylint: disable=invalid-name
"""experiments/agents/latr.py on hand-made trajectories: the brancher's forks and capacity, the
pruning with descendants, GRPO over variable groups, and the mix schedule's row counts."""
import importlib

from absl.testing import absltest
import numpy as np

from agentrl import configs
from agentrl.rollout import agent_loop
from agentrl.rollout import branching

latr = importlib.import_module("experiments.agents.latr")


def _traj(tokens, *, prompt=2, parent=-1, fork_at=0, probs=None, top=None, reward=0.0):
  """A one-turn trajectory: `prompt` prompt tokens, then sampled ones; probs/top: each
  sampled token's two most likely probabilities and ids."""
  T = len(tokens)
  mask = (np.arange(T) >= prompt).astype(np.float32)
  alt_logp = np.zeros((T, 2), np.float32)
  alt = np.zeros((T, 2), np.int32)
  if probs is not None:
    alt_logp[prompt:] = np.log(np.asarray(probs, np.float32))
    alt[prompt:] = top
  return agent_loop.Trajectory(
      tokens=np.asarray(tokens, np.int32), loss_mask=mask,
      turn=np.where(mask > 0, 0, -1).astype(np.int32), sampler_logp=np.zeros((T,), np.float32),
      turn_rewards=[reward], reward=reward, done=True, truncated=False, prompt_len=prompt,
      parent=parent, fork_at=fork_at, alternatives=alt, alternative_logp=alt_logp)


def _config(**latr_keys):
  config = latr.get_config()
  config.latr.update(latr_keys)
  return config.latr


class BrancherTest(absltest.TestCase):

  def _point(self, traj, root=0, turn_start=2):
    return branching.ForkPoint(kind="sampled", episode=root, root=root, depth=0, turn=0,
                               turn_start=turn_start, trajectory=traj)

  def test_qualifying_tokens_fork_with_the_alternative_within_capacity(self):
    # Tokens 2..5 sampled greedily; 3 and 5 qualify (p1 > .25, p0 - p1 < .15), 4 is too sure.
    probs = [[0.9, 0.05], [0.45, 0.35], [0.8, 0.1], [0.4, 0.3]]
    top = [[7, 8], [9, 10], [11, 12], [13, 14]]
    traj = _traj([1, 1, 7, 9, 11, 13], probs=probs, top=top)
    brancher, counts = latr.make_brancher(_config(), {0: 3})
    forks = brancher(self._point(traj))
    self.assertEqual(forks, [branching.Fork(at=3, token=10), branching.Fork(at=5, token=14)])
    self.assertEqual(counts, {"candidates": 2, "tokens": 4})
    # The tree is full (3 rows): a later turn forks nothing; another tree is not a LATR one.
    self.assertEqual(brancher(self._point(traj)), [])
    self.assertEqual(brancher(self._point(traj, root=1)), [])

  def test_a_branch_never_forks_at_or_before_its_forced_token(self):
    probs = [[0.4, 0.3]] * 4
    top = [[7, 8]] * 4
    branch = _traj([1, 1, 7, 8, 7, 7], probs=probs, top=top, parent=0, fork_at=3)
    brancher, _ = latr.make_brancher(_config(), {0: 8})
    self.assertEqual([f.at for f in brancher(self._point(branch))], [4, 5])
    # A sampled row that took the second token forks to the top one.
    self.assertEqual(latr.other_top(branch, 3), 7)


class PruneAndAdvantageTest(absltest.TestCase):

  def test_a_copying_branch_is_pruned_with_its_descendants(self):
    root = _traj([1, 1, 5, 6, 7, 8, 9, 10])
    close = _traj([1, 1, 5, 4, 7, 8, 9, 10], parent=0, fork_at=3)   # 1 edit in 4 tokens
    far = _traj([1, 1, 5, 4, 3, 2, 1, 0], parent=0, fork_at=3)      # 4 edits in 4 tokens
    child = _traj([1, 1, 5, 4, 7, 3, 3, 3], parent=1, fork_at=5)     # its parent is pruned
    short = _traj([1, 1, 5, 4, 7], parent=0, fork_at=3)              # window not reached
    unstarted = _traj([1, 1, 5], parent=0, fork_at=3)
    drop = latr.dropped_rows([root, close, far, child, short, unstarted],
                             _config(prune_steps="4"))
    np.testing.assert_array_equal(drop, [False, True, False, True, False, True])

  def test_grpo_over_kept_rows_and_lone_rows(self):
    reward = np.array([1.0, 0.0, 5.0, 0.5, 2.0, 7.0])
    group = np.array([0, 0, 0, 1, 1, 2])
    keep = np.array([True, True, False, True, False, True])
    adv = latr.group_advantages(reward, group, keep)
    # Group 0: (1, 0) -> +-0.5 / std 0.7071; group 1 and 2: one kept row each -> 0.
    np.testing.assert_allclose(adv, [0.70710576, -0.70710576, 0, 0, 0, 0], rtol=1e-5)

  def test_merge_runs_sums_counts_and_recomputes_means(self):
    a = [_traj([1, 1, 5, 6], reward=1.0)]
    b = [_traj([1, 1, 5, 6, 7, 8], reward=0.0)] * 3
    ma = {"rollout/sampled_tokens": 2.0, "rollout/turn_cut_frac": 1.0, "rollout/branches": 1.0}
    mb = {"rollout/sampled_tokens": 12.0, "rollout/turn_cut_frac": 0.0}
    trajs, m = latr.merge_runs((a, ma), (b, mb))
    self.assertLen(trajs, 4)
    self.assertEqual(m["rollout/sampled_tokens"], 14.0)
    self.assertEqual(m["rollout/branches"], 1.0)
    self.assertEqual(m["rollout/turn_cut_frac"], 0.25)   # 1 of 4 model turns
    self.assertEqual(m["rollout/reward_mean"], 0.25)


class ScheduleTest(absltest.TestCase):

  def test_rows_follow_the_mix_schedule(self):
    lc = _config()
    self.assertEqual(latr.mix_schedule(lc.mix_schedule)[80], 0.25)
    self.assertEqual(latr.shape(lc, 8, 1.0), (8, 0))
    self.assertEqual(latr.shape(lc, 8, 0.75), (6, 2))
    self.assertEqual(latr.rows_per_prompt(lc, 8), 8)
    for bad in ("1:1", "0:1,x:2", "0:1.5", "0:1,0:0.5"):
      with self.assertRaisesRegex(configs.ConfigError, "config.latr.mix_schedule"):
        latr.mix_schedule(bad)


if __name__ == "__main__":
  absltest.main()
