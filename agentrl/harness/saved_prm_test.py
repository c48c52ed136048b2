# pylint: disable=invalid-name
"""Tests for agentrl.harness.saved_prm: which PRM runs `check` refuses, and `step_scores` read at
each turn's end, chunk by chunk, against a stand-in PRM whose logit is w x the token id there."""
import json
import os
import shutil
import tempfile

from absl.testing import absltest
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl import configs
from agentrl.harness import saved_prm
from agentrl.rollout import agent_loop

# Prompt 0-1, turn 0 sampled at 2-3, the env's reply at 4, turn 1 sampled at 5-6, a reply at 7.
LOSS_MASK = [0, 0, 1, 1, 0, 1, 1, 0]
TURN = [-1, -1, 0, 0, 0, 1, 1, 1]


def _traj(tokens, turns: int = 2) -> agent_loop.Trajectory:
  n = 8 if turns == 2 else 5
  return agent_loop.Trajectory(
      tokens=np.asarray(tokens[:n], np.int32), loss_mask=np.asarray(LOSS_MASK[:n], np.float32),
      turn=np.asarray(TURN[:n], np.int32), sampler_logp=np.zeros(n, np.float32),
      turn_rewards=[0.0] * turns, reward=0.0, done=True, truncated=False, prompt_len=2)


def _logits(params, tokens_BT, positions_BT, input_mask_BT, step_end_BU, step_mask_BU):
  del positions_BT, input_mask_BT
  at_BU = jnp.take_along_axis(tokens_BT, step_end_BU, axis=1).astype(jnp.float32)
  return jnp.where(step_mask_BU > 0, params["w"] * at_BU, 0.0)


def _sigmoid(x):
  return 1.0 / (1.0 + np.exp(-np.asarray(x, np.float64)))


class StepScoresTest(absltest.TestCase):

  def test_each_turn_is_scored_at_its_last_sampled_token(self):
    trajs = [_traj([1, 1, 2, 3, 9, 4, 5, 9]), _traj([1, 1, 6, 2, 9], turns=1),
             _traj([1, 1, 3, 1, 9, 2, 4, 9])]
    w = 0.5
    expected = [[_sigmoid(w * 3), _sigmoid(w * 5)], [_sigmoid(w * 2), 0.0],
                [_sigmoid(w * 1), _sigmoid(w * 4)]]
    for batch_size in (1, 2, 5):   # chunks padded by repeating the last row give the same rows
      score_BU, mask_BU = saved_prm.step_scores(_logits, {"w": jnp.float32(w)}, trajs,
                                                max_steps=2, max_len=8, pad_id=0,
                                                batch_size=batch_size)
      np.testing.assert_allclose(score_BU, expected, rtol=1e-6, err_msg=str(batch_size))
      np.testing.assert_array_equal(mask_BU, [[1, 1], [1, 0], [1, 1]])

  def test_a_turn_past_max_len_is_masked(self):
    score_BU, mask_BU = saved_prm.step_scores(
        _logits, {"w": jnp.float32(1.0)}, [_traj([1, 1, 2, 3, 9, 4, 5, 9])], max_steps=2,
        max_len=6, pad_id=0, batch_size=4)
    np.testing.assert_array_equal(mask_BU, [[1, 0]])
    np.testing.assert_allclose(score_BU, [[_sigmoid(3.0), 0.0]], rtol=1e-6)

  def test_same_tokens(self):
    class Tok:
      def __init__(self, pieces):
        self.pieces, self.vocab_size = pieces, len(pieces)

      def decode(self, ids):
        return "".join(self.pieces[i] for i in ids)

    self.assertTrue(saved_prm.same_tokens(Tok(["a", "b"]), Tok(["a", "b"])))
    self.assertFalse(saved_prm.same_tokens(Tok(["a", "b"]), Tok(["b", "a"])))
    self.assertFalse(saved_prm.same_tokens(Tok(["a", "b"]), Tok(["a", "b", "c"])))


class CheckTest(absltest.TestCase):

  def _prm_run(self, model: dict, task: dict) -> str:
    path = tempfile.mkdtemp()
    self.addCleanup(shutil.rmtree, path, ignore_errors=True)
    os.makedirs(os.path.join(path, "prm"))
    with open(os.path.join(path, "config.json"), "w") as f:
      json.dump({"model": model, "task": task}, f)
    return path

  def test_refuses_a_missing_prm_and_another_model_naming_both(self):
    model = {"init": "hf", "path": "/models/a", "dtype": "bfloat16"}
    run = mlc.ConfigDict({"model": model, "task": {"name": "search"}})
    with self.assertRaisesRegex(configs.ConfigError, r"config\.prm is empty"):
      saved_prm.check("", run, flag="config.prm")
    with self.assertRaisesRegex(configs.ConfigError, r"config\.prm='/nowhere' has no prm/"):
      saved_prm.check("/nowhere", run, flag="config.prm")
    saved_prm.check(self._prm_run(model, {"name": "search"}), run, flag="config.prm")
    other = self._prm_run(dict(model, path="/models/b"), {"name": "search"})
    with self.assertRaisesRegex(configs.ConfigError,
                                r"config\.prm='.*' was trained with another model or tokenizer "
                                r"than runs/x: model\.path '/models/b' \(PRM\) vs '/models/a' "
                                r"\(runs/x\)"):
      saved_prm.check(other, run, flag="config.prm", run="runs/x")


if __name__ == "__main__":
  absltest.main()
