"""Tests for agentrl.rollout.collect's episode summaries."""
from absl.testing import absltest
import numpy as np

from agentrl.rollout import agent_loop
from agentrl.rollout import collect


def _episode(infos) -> agent_loop.Trajectory:
  n = 4
  return agent_loop.Trajectory(
      tokens=np.zeros(n, np.int32), loss_mask=np.ones(n, np.float32),
      turn=np.zeros(n, np.int32), sampler_logp=np.zeros(n, np.float32),
      turn_rewards=[float(i.get("reward", 0.0)) for i in infos],
      reward=sum(float(i.get("reward", 0.0)) for i in infos), done=True, truncated=False,
      prompt_len=1, infos=list(infos))


class EpisodeMetricsTest(absltest.TestCase):

  def test_success_turns_and_valid_turns(self):
    solved = _episode([{"error": ""}, {"error": "", "success": True, "reward": 1.0}])
    failed = _episode([{"error": "bad call"}, {"error": ""}, {"error": "no answer"}])
    got = collect.episode_metrics([solved, failed])
    self.assertEqual(got, {"success": 0.5, "turns": 2.5, "valid_turns": 3 / 5})
    self.assertEqual(collect.episode_metrics([_episode([])])["valid_turns"], 0.0)

  def test_a_branch_counts_only_the_tokens_it_sampled(self):
    root = _episode([{"error": ""}])
    branch = _episode([{"error": ""}])
    branch.parent, branch.fork_at = 0, 3    # its first 3 tokens are the root's
    self.assertEqual(collect.rollout_metrics([root, branch])["rollout/sampled_tokens"], 4 + 1)


if __name__ == "__main__":
  absltest.main()
