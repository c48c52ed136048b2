"""Tests for agentrl.rollout.collect's episode and rollout metrics."""
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


def _turns(turns, infos, fork_at=0) -> agent_loop.Trajectory:
  """A trajectory of a 1-token prompt, then per model turn its sampled ids and a 1-token
  observation."""
  tokens, mask, turn = [0], [0.0], [-1]
  for u, ids in enumerate(turns):
    tokens += list(ids) + [0]
    mask += [1.0] * len(ids) + [0.0]
    turn += [u] * (len(ids) + 1)
  n = len(tokens)
  return agent_loop.Trajectory(
      tokens=np.asarray(tokens, np.int32), loss_mask=np.asarray(mask, np.float32),
      turn=np.asarray(turn, np.int32), sampler_logp=np.zeros(n, np.float32),
      turn_rewards=[0.0] * len(infos), reward=0.0, done=True, truncated=False, prompt_len=1,
      infos=list(infos), parent=0 if fork_at else -1, fork_at=fork_at)


class RepetitionTest(absltest.TestCase):

  def test_repeated_ngram_rate(self):
    # 1 2 3 1 2 3 1 2: bigrams 12 23 31 12 23 31 12: 3 distinct of 7.
    self.assertAlmostEqual(collect.repeated_ngram_rate([1, 2, 3, 1, 2, 3, 1, 2], 2), 1 - 3 / 7)
    self.assertEqual(collect.repeated_ngram_rate(np.arange(9), 4), 0.0)
    self.assertAlmostEqual(collect.repeated_ngram_rate([5] * 9, 4), 1 - 1 / 6)
    self.assertEqual(collect.repeated_ngram_rate([1, 2], 4), 0.0)

  def test_fraction_judges_only_turns_of_at_least_2n_tokens(self):
    loop_ids, fresh = [7, 8] * 6, list(range(12))   # rep-4 of the loop: 1 - 2 / 9
    short = [7] * 7                                  # repetitive, but shorter than 2n = 8
    got = collect.repetitive_turn_fraction([loop_ids, fresh, short])
    self.assertEqual(got, 0.5)
    self.assertEqual(collect.repetitive_turn_fraction([short]), 0.0)
    self.assertEqual(collect.repetitive_turn_fraction([loop_ids], threshold=0.8), 0.0)


class RolloutMetricsTest(absltest.TestCase):

  def test_repetition_and_invalid_turns_count_a_branch_own_turns_only(self):
    loop_ids, fresh = [7, 8] * 6, list(range(1, 13))
    root = _turns([loop_ids, fresh], [{"error": "bad command"}, {"error": ""}])
    # Forked inside turn 1 (token 1 + 13 + 3): turn 0 and its env step are the root's; turn 1
    # is the branch's own, judged whole.
    branch = _turns([loop_ids, loop_ids], [{"error": "bad command"}, {"error": "no number"}],
                    fork_at=17)
    got = collect.rollout_metrics([root, branch])
    self.assertEqual(got["rollout/repetition"], 2 / 3)      # root: loop, fresh; branch: loop
    self.assertEqual(got["rollout/invalid_turns"], 2 / 3)   # root: error, ok; branch: error
    self.assertEqual(got["rollout/sampled_tokens"], 24 + 12 - 3)
    # Without env steps (a failed reset): no invalid turn.
    self.assertEqual(collect.rollout_metrics([_turns([], [])])["rollout/invalid_turns"], 0.0)


if __name__ == "__main__":
  absltest.main()
