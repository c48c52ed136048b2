# pylint: disable=invalid-name
"""experiments/preference/prm.py: its brancher, its Monte-Carlo step labels on a hand-made tree
from a stand-in engine, and its held-out figures; experiments/agents/prm_rl.py's turn rewards.

Golden tree (one prompt per root): roots 0 and 1, row 2 forked from row 0 after its first env
reply (fork_at 5, the transcript's length then). Prompt tokens 0-1, turn 1 sampled at 2-3, the
env's reply at 4, turn 2 sampled at 5-6, the reply at 7. Row 0 succeeds, rows 1 and 2 fail.
Row 0's step 0 has two continuations (row 0 itself and row 2), one a success: hard label 1,
soft 0.5; its step 1 only itself: 1. Row 1's steps: 0. Row 2 shares row 0's step 0 (its
counts) and its own step 1 fails: 0.
"""
import importlib
import types as pytypes

from absl.testing import absltest
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl.rollout import agent_loop
from agentrl.rollout import branching

prm = importlib.import_module("experiments.preference.prm")
prm_rl = importlib.import_module("experiments.agents.prm_rl")

LOSS_MASK = np.array([0, 0, 1, 1, 0, 1, 1, 0], np.float32)
TURN = np.array([-1, -1, 0, 0, 0, 1, 1, 1], np.int32)


def _traj(tokens, success, parent=-1, fork_at=0):
  return agent_loop.Trajectory(
      tokens=np.asarray(tokens, np.int32), loss_mask=LOSS_MASK.copy(), turn=TURN.copy(),
      sampler_logp=np.zeros(8, np.float32), turn_rewards=[0.0, float(success)],
      reward=float(success), done=True, truncated=False, prompt_len=2,
      infos=[{}, {"success": success}], parent=parent, fork_at=fork_at)


def _tree():
  return [_traj([1, 2, 3, 4, 5, 6, 7, 8], True), _traj([1, 2, 9, 9, 5, 9, 9, 8], False),
          _traj([1, 2, 3, 4, 5, 3, 3, 8], False, parent=0, fork_at=5)]


class FakeEngine:
  """Returns the golden tree and records what the experiment asked for."""

  def run(self, params, tok, envs, seeds, **kwargs):
    del params, tok
    self.envs, self.seeds, self.kwargs = envs, seeds, kwargs
    return _tree(), {"rollout/branches": 1.0}


def _point(kind, depth, length=5):
  traj = _traj(list(range(length)) + [0] * (8 - length), True)
  return branching.ForkPoint(kind=kind, episode=0, root=0, depth=depth, turn=1, turn_start=0,
                             trajectory=pytypes.SimpleNamespace(tokens=traj.tokens[:length]))


class PrmExperimentTest(absltest.TestCase):

  def test_brancher_forks_roots_after_each_env_reply(self):
    brancher = prm.make_brancher(3)
    self.assertEqual(brancher(_point("stepped", 0)), [branching.Fork(at=5, n=3)])
    self.assertEqual(brancher(_point("stepped", 1)), [])   # a continuation does not fork
    self.assertEqual(brancher(_point("sampled", 0)), [])
    self.assertEqual(brancher(_point("finished", 0)), [])

  def test_step_labels_golden_tree(self):
    for mode, first in (("hard", 1.0), ("soft", 0.5)):
      end_BU, step_mask_BU, labels_BU, mask_BU = prm.step_labels(
          _tree(), max_steps=3, max_len=8, mode=mode)
      np.testing.assert_array_equal(end_BU, [[3, 6, 0]] * 3)
      np.testing.assert_array_equal(step_mask_BU, [[1, 1, 0]] * 3)
      np.testing.assert_array_equal(mask_BU, [[1, 1, 0]] * 3)
      np.testing.assert_allclose(labels_BU, [[first, 1, 0], [0, 0, 0], [first, 0, 0]])

  def test_labelled_roots_keeps_the_roots_only(self):
    config = mlc.ConfigDict(dict(
        rollout=dict(max_new_tokens=2, max_len=8, temperature=1.0),
        prm=dict(continuations=1, labels="soft"), task=dict(chat_template=False)))
    engine = FakeEngine()
    data, stats = prm.labelled_roots(config, engine, pytypes.SimpleNamespace(pad_id=0),
                                     lambda: pytypes.SimpleNamespace(max_turns=2), None,
                                     [10, 11], rng=None)
    self.assertEqual(engine.seeds, [10, 11])
    self.assertEqual(engine.kwargs["max_turns"], 2)
    self.assertEqual(data["tokens_BT"].shape, (2, 8))
    np.testing.assert_allclose(data["label_BU"], [[0.5, 1], [0, 0]])
    np.testing.assert_array_equal(data["step_end_BU"], [[3, 6], [3, 6]])
    self.assertEqual(stats, {"rows": 3.0, "branches": 1.0, "success": 0.5,
                             "labelled_steps": 4.0, "label_mean": 0.375})

  def test_roc_auc_and_held_out_figures(self):
    # Positives 0.9 and 0.3 against negatives 0.8 and 0.1: 3 of 4 pairs ordered.
    self.assertEqual(prm.roc_auc([0.9, 0.8, 0.3, 0.1], [1, 0, 1, 0]), 0.75)
    self.assertEqual(prm.roc_auc([0.5, 0.5], [1, 0]), 0.5)    # a tie counts half
    self.assertEqual(prm.roc_auc([0.2, 0.7], [1, 1]), 0.5)    # one class only
    figures = prm.held_out_figures(np.array([[0.9, 0.8], [0.3, 0.1]]),
                                   np.array([[1.0, 0.0], [0.75, 0.0]]),
                                   np.array([[1, 1], [1, 0]]))
    self.assertEqual(figures, {"prm/held_out_step_accuracy": 1 / 3, "prm/held_out_auc": 0.5,
                               "prm/held_out_base_rate": 2 / 3})

  def test_prm_rl_turn_rewards_by_hand(self):
    rc = prm_rl.get_config().reward
    score_BU = jnp.array([[0.9, 0.2, 0.8], [0.9, 0.9, 0.0]])
    mask_BU, outcome_B = jnp.ones((2, 3)), jnp.array([1.0, 0.5])
    success_B = jnp.array([False, True])
    # min (default): returns min_{j>=k} s_j + o; rewards are their differences.
    np.testing.assert_allclose(prm_rl.turn_rewards(rc, score_BU, outcome_B, success_B, mask_BU),
                               [[0.0, -0.6, 1.8], [0.0, 0.0, 0.5]], atol=1e-6)
    rc.form = "sum"   # s_k, plus o on the last turn
    np.testing.assert_allclose(prm_rl.turn_rewards(rc, score_BU, outcome_B, success_B, mask_BU),
                               [[0.9, 0.2, 1.8], [0.9, 0.9, 0.5]], atol=1e-6)
    rc.form = "vppo"  # row 0 fails with its first error at turn 1: returns 0.5, 0, 0
    np.testing.assert_allclose(prm_rl.turn_rewards(rc, score_BU, outcome_B, success_B, mask_BU),
                               [[0.5, 0.0, 0.0], [0.0, 0.0, 1.0]], atol=1e-6)


if __name__ == "__main__":
  absltest.main()
