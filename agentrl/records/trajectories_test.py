# pylint: disable=invalid-name
"""Tests for agentrl.records.trajectories: row choice, token text, rows, files, batches."""
import gzip
import os
import shutil
import tempfile

from absl.testing import absltest
import jax.numpy as jnp
import numpy as np

from agentrl.records import trajectories
from agentrl.rollout import agent_loop
from agentrl import types


def _tmpdir(test) -> str:
  path = tempfile.mkdtemp()
  test.addCleanup(shutil.rmtree, path, ignore_errors=True)
  return path


def _bytes_decode(ids):
  """A byte-level tokenizer's decode: every id is one UTF-8 byte."""
  return bytes(ids).decode("utf-8", errors="replace")


def _batch():
  """Two rows of a 2-turn episode: prompt [5, 6], model [7, 8], env [9], model [10]."""
  tokens = np.array([[5, 6, 7, 8, 9, 10, 0], [5, 6, 7, 9, 9, 11, 1]], np.int32)
  return {
      "tokens_BT": tokens,
      "input_mask_BT": np.array([[1] * 6 + [0], [1] * 7], bool),
      "loss_mask_BT": np.array([[0, 0, 1, 1, 0, 1, 0], [0, 0, 1, 1, 0, 1, 1]], np.float32),
      "turn_BT": np.array([[-1, -1, 0, 0, 0, 1, 1], [-1, -1, 0, 0, 0, 1, 1]], np.int32),
      "reward_B": np.array([1.0, 0.0], np.float32),
      "adv_BT": np.array([[0, 0, 0.5, 0.5, 0, 0.25, 0], [0, 0, -0.5, -0.5, 0, -0.25, -0.25]],
                         np.float32),
      "sampler_logp_BT": np.full((2, 7), -1.0, np.float32),
      "old_logp_BT": np.array([[0, -1, -2, np.nan, -1, -1, 0]] * 2, np.float32),
      "version_B": np.array([3, 3], np.int32),
  }


class SelectRowsTest(absltest.TestCase):

  def test_best_and_worst_of_each_group_first(self):
    reward = np.array([0, 1, 0.5, 1, 0, 0, 0, 0])
    real = np.ones(8, bool)
    # Group 0 ranked by reward (ties by row): 1, 3, 2, 0 -> best 1, worst 0, then 3, 2.
    self.assertEqual(trajectories.select_rows(reward, real, group_size=4, rows_per_group=2,
                                              max_groups=4), [0, 1, 4, 7])
    self.assertEqual(trajectories.select_rows(reward, real, group_size=4, rows_per_group=3,
                                              max_groups=1), [0, 1, 3])

  def test_groups_are_spread_and_padding_rows_skipped(self):
    real = np.ones(12, bool)
    real[4:8] = False  # group 1 is padding
    rows = trajectories.select_rows(np.zeros(12), real, group_size=2, rows_per_group=1,
                                    max_groups=3)
    self.assertEqual(rows, [0, 8, 10])  # groups 0, 4, 5 of the real ones 0, 1, 4, 5


class PiecesTest(absltest.TestCase):

  def test_byte_level_characters_appear_on_the_token_that_completes_them(self):
    text = "héllo ✓!"
    ids = list(text.encode("utf-8"))
    got = trajectories.pieces(_bytes_decode, ids)
    self.assertEqual("".join(got), text)
    self.assertEqual(got[1:3], ["", "é"])  # é is two bytes
    self.assertEqual(got[7:10], ["", "", "✓"])  # ✓ is three

  def test_sentencepiece_word_starts_keep_their_space(self):
    vocab = {1: "\u2581a", 2: "\u2581bc", 3: "d"}

    def decode(ids):  # SentencePiece drops the leading space of the decoded text
      return "".join(vocab[i] for i in ids).replace("\u2581", " ").lstrip(" ")

    self.assertEqual(trajectories.pieces(decode, [1, 2, 3, 2]), ["a", " bc", "d", " bc"])


class RowsTest(absltest.TestCase):

  def test_rows_hold_roles_turns_text_and_per_token_values(self):
    traj = agent_loop.Trajectory(
        tokens=np.zeros(6, np.int32), loss_mask=np.array([0, 0, 1, 1, 0, 1], np.float32),
        turn=np.zeros(6, np.int32), sampler_logp=np.zeros(6, np.float32),
        turn_rewards=[0.0, 1.0], reward=1.0, done=True, truncated=False, prompt_len=2,
        infos=[{"error": ""}, {"success": True, "value": np.float32(2.5)}], parent=-1)
    row = trajectories.make_rows(_batch(), [0], group_size=2, trajectories=[traj],
                                 decode=lambda ids: "".join(chr(96 + i) for i in ids))[0]
    self.assertEqual(row["length"], 6)
    self.assertEqual(row["role"], ["prompt", "prompt", "model", "model", "env", "model"])
    self.assertEqual([(t["index"], t["role"], t["start"], t["end"], t["text"])
                      for t in row["turns"]],
                     [(-1, "prompt", 0, 2, "ef"), (0, "model", 2, 4, "gh"),
                      (0, "env", 4, 5, "i"), (1, "model", 5, 6, "j")])
    self.assertEqual(row["adv"], [0.0, 0.0, 0.5, 0.5, 0.0, 0.25])
    self.assertEqual(row["logp"][3], None)  # NaN
    self.assertEqual((row["success"], row["turn_rewards"], row["version"]), (True, [0.0, 1.0], 3))
    self.assertEqual(row["infos"][1]["value"], 2.5)
    self.assertNotIn("entropy", row)
    masked = {**_batch(), "loss_mask_BT": _batch()["loss_mask_BT"] * [1, 1, 1, 0, 1, 1, 1]}
    row = trajectories.make_rows(masked, [0], group_size=2, trajectories=[traj])[0]
    self.assertEqual(row["role"][3], "model")  # sampled, though the credit masked it
    self.assertEqual(row["loss_mask"][3], 0)

  def test_rows_without_trajectories_or_tokenizer(self):
    row = trajectories.make_rows(_batch(), [1], group_size=2)[0]
    self.assertEqual((row["group"], row["sample"], row["length"]), (0, 1, 7))
    self.assertIsNone(row["pieces"])
    self.assertNotIn("text", row["turns"][0])
    self.assertIsNone(row["success"])


class FilesTest(absltest.TestCase):

  def test_write_read_rotate_and_truncate(self):
    run_dir = _tmpdir(self)
    rows = trajectories.make_rows(_batch(), [0, 1], group_size=2)
    for step in (1, 3, 5, 7):
      trajectories.write_step(run_dir, step, rows, {"metrics": {"loss": np.float32(0.5)}},
                              batch=_batch(), keep=3)
    self.assertEqual(trajectories.steps(run_dir), [3, 5, 7])
    self.assertEqual(trajectories.batch_steps(run_dir), [3, 5, 7])
    header, back = trajectories.read_step(run_dir)
    self.assertEqual((header["step"], header["rows"], header["metrics"]), (7, 2, {"loss": 0.5}))
    self.assertEqual(back, rows)
    np.testing.assert_array_equal(trajectories.read_batch(run_dir, 5)["adv_BT"],
                                  _batch()["adv_BT"])
    trajectories.truncate(run_dir, 4)
    self.assertEqual(trajectories.steps(run_dir), [3])
    self.assertEqual(sorted(os.listdir(trajectories.directory(run_dir))),
                     ["batch_000003.npz", "step_000003.jsonl.gz"])

  def test_errors_name_the_file_and_what_exists(self):
    run_dir = _tmpdir(self)
    with self.assertRaisesRegex(trajectories.RecordsError, "recorded steps: none"):
      trajectories.read_step(run_dir)
    trajectories.write_step(run_dir, 2, [], {})
    with self.assertRaisesRegex(trajectories.RecordsError, r"step 4.*recorded steps: \[2\]"):
      trajectories.read_step(run_dir, 4)
    with self.assertRaisesRegex(trajectories.RecordsError, "steps with a batch: none"):
      trajectories.read_batch(run_dir, 2)
    with gzip.open(trajectories.step_path(run_dir, 2), "wt") as f:
      f.write('{"not": "a record"}\n')
    with self.assertRaisesRegex(trajectories.RecordsError, "not an agentrl trajectory record"):
      trajectories.read_step(run_dir, 2)

  def test_record_steps(self):
    self.assertEqual([s for s in range(1, 12) if trajectories.is_record_step(s, 5)], [1, 6, 11])
    self.assertFalse(trajectories.is_record_step(1, 0))


class BatchTest(absltest.TestCase):

  def test_host_batch_round_trips_with_aux(self):
    batch = types.Batch(tokens_BT=jnp.ones((2, 3), jnp.int32),
                        positions_BT=jnp.zeros((2, 3), jnp.int32),
                        input_mask_BT=jnp.ones((2, 3), bool), loss_mask_BT=jnp.ones((2, 3)),
                        reward_B=jnp.array([1.0, 0.0]), aux={"adv_B": jnp.array([0.5, -0.5])})
    arrays = trajectories.host_batch(batch)
    self.assertEqual(sorted(arrays), ["aux/adv_B", "input_mask_BT", "loss_mask_BT",
                                      "positions_BT", "reward_B", "tokens_BT"])
    back = trajectories.to_batch(arrays)
    np.testing.assert_array_equal(back.aux["adv_B"], [0.5, -0.5])
    self.assertIsNone(back.adv_BT)
    with self.assertRaisesRegex(trajectories.RecordsError, "not types.Batch fields"):
      trajectories.to_batch({**arrays, "bogus_BT": arrays["tokens_BT"]})


if __name__ == "__main__":
  absltest.main()
