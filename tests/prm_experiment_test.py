# pylint: disable=invalid-name
"""experiments/preference/prm.py: its brancher, its Monte-Carlo and checked step labels on a
hand-made tree from a stand-in engine, its Bradley-Terry pairs and batches, and its held-out
figures; experiments/agents/prm_rl.py's turn rewards, from the PRM or from the env's checks.

Golden tree (one prompt per root): roots 0 and 1, row 2 forked from row 0 after its first env
reply (fork_at 5, the transcript's length then). Prompt tokens 0-1, turn 1 sampled at 2-3, the
env's reply at 4, turn 2 sampled at 5-6, the reply at 7. Row 0 succeeds, rows 1 and 2 fail.
Row 0's step 0 has two continuations (row 0 itself and row 2), one a success: hard label 1,
soft 0.5; its step 1 only itself: 1. Row 1's steps: 0. Row 2 shares row 0's step 0 (its
counts) and its own step 1 fails: 0. Sibling steps: row 0's step 1 and row 2's (both after
row 0's step 0), labels 1 and 0: the one Bradley-Terry pair, flat indices (1, 5) at U = 2.
"""
import importlib
import types as pytypes

from absl.testing import absltest
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl.envs import hidden_rule
from agentrl.rollout import agent_loop
from agentrl.rollout import branching

prm = importlib.import_module("experiments.preference.prm")
prm_rl = importlib.import_module("experiments.agents.prm_rl")

LOSS_MASK = np.array([0, 0, 1, 1, 0, 1, 1, 0], np.float32)
TURN = np.array([-1, -1, 0, 0, 0, 1, 1, 1], np.int32)


def _traj(tokens, success, parent=-1, fork_at=0, checked=()):
  infos = [{}, {"success": success}]
  for info, ok in zip(infos, checked):
    info["step_ok"] = ok
  return agent_loop.Trajectory(
      tokens=np.asarray(tokens, np.int32), loss_mask=LOSS_MASK.copy(), turn=TURN.copy(),
      sampler_logp=np.zeros(8, np.float32), turn_rewards=[0.0, float(success)],
      reward=float(success), done=True, truncated=False, prompt_len=2,
      infos=infos, parent=parent, fork_at=fork_at)


def _tree():
  return [_traj([1, 2, 3, 4, 5, 6, 7, 8], True), _traj([1, 2, 9, 9, 5, 9, 9, 8], False),
          _traj([1, 2, 3, 4, 5, 3, 3, 8], False, parent=0, fork_at=5)]


class FakeEngine:
  """Returns `trajs` (the golden tree) and records what the experiment asked for."""

  def __init__(self, trajs=None):
    self.trajs = _tree() if trajs is None else trajs

  def run(self, params, tok, envs, seeds, **kwargs):
    del params, tok
    self.envs, self.seeds, self.kwargs = envs, seeds, kwargs
    return self.trajs, {"rollout/branches": float(len(self.trajs) - len(seeds))}


def _labelled(labels, loss, trajs=None):
  config = mlc.ConfigDict(dict(
      rollout=dict(max_new_tokens=2, max_len=8, temperature=1.0),
      prm=dict(continuations=1, labels=labels, loss=loss), task=dict(chat_template=False)))
  engine = FakeEngine(trajs)
  data, stats = prm.labelled_rows(config, engine, pytypes.SimpleNamespace(pad_id=0),
                                  lambda: pytypes.SimpleNamespace(max_turns=2), None,
                                  [10, 11], rng=None)
  return engine, data, stats


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

  def test_labelled_rows_keeps_the_roots_only_for_bce(self):
    engine, data, stats = _labelled("soft", "bce")
    self.assertIsNotNone(engine.kwargs["brancher"])
    self.assertEqual(engine.seeds, [10, 11])
    self.assertEqual(engine.kwargs["max_turns"], 2)
    self.assertEqual(data["tokens_BT"].shape, (2, 8))
    np.testing.assert_allclose(data["label_BU"], [[0.5, 1], [0, 0]])
    np.testing.assert_array_equal(data["step_end_BU"], [[3, 6], [3, 6]])
    self.assertEqual(stats, {"rows": 3.0, "branches": 1.0, "success": 0.5,
                             "labelled_steps": 4.0, "label_mean": 0.375})
    self.assertEqual(set(data), set(prm.ROW_KEYS))

  def test_checked_labels_come_from_the_env_without_forks(self):
    # Row 0: a correct step then a mistake; row 1: an unchecked step 0, a correct step 1.
    roots = [_traj([1, 2, 3, 4, 5, 6, 7, 8], True, checked=(1.0, 0.0)),
             _traj([1, 2, 9, 9, 5, 9, 9, 8], False, checked=(None, 1.0))]
    del roots[1].infos[0]["step_ok"]
    engine, data, stats = _labelled("checked", "bce", trajs=roots)
    self.assertIsNone(engine.kwargs["brancher"])
    np.testing.assert_array_equal(data["label_BU"], [[1, 0], [0, 1]])
    np.testing.assert_array_equal(data["mask_BU"], [[1, 1], [0, 1]])
    self.assertAlmostEqual(stats.pop("label_mean"), 2 / 3, places=6)
    self.assertEqual(stats, {"rows": 2.0, "branches": 0.0, "success": 0.5,
                             "labelled_steps": 3.0})
    # A step past the pack cut (max_len 6: row 0's step 1 ends at 6) is unlabelled.
    _, _, labels_BU, mask_BU = prm.checked_labels(roots, max_steps=2, max_len=6)
    np.testing.assert_array_equal(mask_BU, [[1, 0], [0, 0]])
    np.testing.assert_array_equal(labels_BU, [[1, 0], [0, 0]])

  def test_bradley_terry_keeps_every_row_and_its_sibling_groups(self):
    _, data, stats = _labelled("hard", "bradley_terry")
    self.assertEqual(data["tokens_BT"].shape, (3, 8))
    np.testing.assert_array_equal(data["group_BU"], [[0, 1], [2, 3], [-1, 1]])
    np.testing.assert_array_equal(data["root_B"], [1, 1, 0])
    np.testing.assert_array_equal(data["label_BU"], [[1, 1], [0, 0], [1, 0]])
    self.assertEqual(stats["pairs"], 1.0)
    chosen_N, rejected_N = prm.sibling_pairs_of(data)
    np.testing.assert_array_equal((chosen_N, rejected_N), ([1], [5]))
    batch = prm.pair_batch(data, np.array([1, 5]), np.array([5, 2]))
    # Rows 0, 2 (chosen), then 2, 1 (rejected); the pairs index this batch's [4 * 2].
    np.testing.assert_array_equal(batch["tokens_BT"][:, 5], [6, 3, 3, 9])
    np.testing.assert_array_equal(batch["chosen_N"], [1, 3])
    np.testing.assert_array_equal(batch["rejected_N"], [5, 6])
    np.testing.assert_array_equal(batch["pair_mask_N"], [1, 1])
    self.assertEqual(set(batch) - set(prm.ROW_KEYS), {"chosen_N", "rejected_N", "pair_mask_N"})
    data["label_BU"][2, 1] = 1.0   # siblings with equal labels: nothing to pair
    with self.assertRaisesRegex(Exception, "no sibling steps"):
      prm.sibling_pairs_of(data)

  def test_root_of_and_pair_figures(self):
    np.testing.assert_array_equal(prm.root_of(np.array([-1, -1, 0, 2, 1])), [0, 1, 0, 0, 1])
    prob_BU = np.array([[0.9, 0.4], [0.4, 0.1]])
    self.assertEqual(prm.pair_figures(prob_BU, np.array([0, 1, 3]), np.array([2, 2, 0])),
                     {"prm/held_out_pair_accuracy": (1 + 0.5 + 0) / 3,
                      "prm/held_out_pairs": 3.0})
    self.assertEqual(prm.pair_figures(prob_BU, np.array([], int), np.array([], int)),
                     {"prm/held_out_pair_accuracy": 0.5, "prm/held_out_pairs": 0.0})

  def test_checked_labels_need_a_checked_family_and_bce(self):
    config = prm.get_config("smoke")
    prm.check_labels(config)                      # MC labels: any task
    config.prm.labels = "checked"
    prm.check_labels(config)                      # the guess game checks its steps
    config.prm.loss = "bradley_terry"
    with self.assertRaisesRegex(Exception, "no forks"):
      prm.check_labels(config)
    config.prm.loss, config.task.family = "bce", "cipher"
    with self.assertRaisesRegex(Exception, "prm.labels=checked"):
      prm.check_labels(config)

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

  def test_prm_rl_vppo_from_the_env_checks(self):
    # Four compact guess episodes (secret 37, 3 turns) played in the real env.
    env = hidden_rule.HiddenRuleEnv("guess", max_turns=3, style="compact")
    seed = next(s for s in range(2000) if env.reset(s) and env.answer == "37")

    def play(*actions):
      env.reset(seed)
      infos = [env.step(a)[3] for a in actions]
      return pytypes.SimpleNamespace(infos=infos), infos[-1]["success"]

    played = [play("guess 50", "guess 60", "guess 25"),   # 60 was ruled out: error at 1
              play("guess 50", "guess 37"),               # solved in two turns
              play("dance", "guess 50", "guess 25"),      # an invalid turn: error at 0
              play("guess 50", "guess 25", "guess 30")]   # no error, but not solved
    trajs, success = zip(*played)
    score_BU = prm_rl.env_scores(trajs, max_steps=3)
    np.testing.assert_array_equal(score_BU, [[1, 0, 1], [1, 1, 1], [0, 1, 1], [1, 1, 1]])
    mask_BU = jnp.array([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]], jnp.float32)
    rc = prm_rl.get_config().reward
    rc.form, rc.verifier = "vppo", "env"
    # Failed rows' returns: 0.5 before the first error, 0 from it (none: 0.5 throughout).
    r_BU = prm_rl.turn_rewards(rc, jnp.asarray(score_BU), jnp.zeros(4), jnp.array(success),
                               mask_BU)
    np.testing.assert_allclose(r_BU, [[0.5, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0.5]])
    unchecked = pytypes.SimpleNamespace(infos=[{"success": False}])   # not an error
    np.testing.assert_array_equal(prm_rl.env_scores([unchecked], max_steps=2), [[1, 1]])

  def test_prm_rl_env_verifier_needs_vppo_and_a_checked_family(self):
    config = prm_rl.get_config("smoke")
    config.reward.verifier = "env"
    with self.assertRaisesRegex(Exception, "only VPPO's first error"):
      prm_rl.check_verifier(config)
    config.reward.form = "vppo"
    prm_rl.check_verifier(config)    # no reward.prm needed
    config.task.family = "mixed"
    with self.assertRaisesRegex(Exception, "task.family in"):
      prm_rl.check_verifier(config)
    config.reward.verifier, config.task.family = "prm", "guess"
    with self.assertRaisesRegex(Exception, "reward.prm is empty"):
      prm_rl.check_verifier(config)


if __name__ == "__main__":
  absltest.main()
