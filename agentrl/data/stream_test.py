"""Tests for agentrl.data.stream: determinism per seed and exact resumption."""
import json

from absl.testing import absltest
from absl.testing import parameterized

from agentrl.data import stream

SOURCE = [{"prompt": f"p{i}", "i": i} for i in range(7)]


def _ids(entries):
  return [e["i"] for e in entries]


class PromptStreamTest(parameterized.TestCase):

  def test_each_epoch_is_a_seeded_permutation(self):
    s = stream.PromptStream(SOURCE, seed=3)
    epochs = [_ids(s.take(7)) for _ in range(3)]
    for order in epochs:
      self.assertEqual(sorted(order), list(range(7)))
    self.assertNotEqual(epochs[0], epochs[1])  # reshuffled every epoch
    self.assertEqual(s.epoch, 3)

  def test_deterministic_per_seed(self):
    a = _ids(stream.PromptStream(SOURCE, seed=1).take(20))
    self.assertEqual(a, _ids(stream.PromptStream(SOURCE, seed=1).take(20)))
    self.assertNotEqual(a, _ids(stream.PromptStream(SOURCE, seed=2).take(20)))

  @parameterized.parameters((0, True), (5, True), (7, True), (16, True), (9, False))
  def test_resume_continues_identically(self, k, shuffle):
    reference = _ids(stream.PromptStream(SOURCE, seed=9, shuffle=shuffle).take(k + 15))
    first = stream.PromptStream(SOURCE, seed=9, shuffle=shuffle)
    head = _ids(first.take(k))
    state = json.loads(json.dumps(first.state()))  # survives a checkpoint round trip
    resumed = stream.PromptStream(SOURCE, seed=9, shuffle=shuffle)
    resumed.restore(state)
    self.assertEqual(head + _ids(resumed.take(15)), reference)
    fresh = stream.PromptStream(SOURCE, seed=9, shuffle=shuffle)
    if k % 7:  # a fresh stream restarts at the beginning, so the resume is not vacuous
      self.assertNotEqual(_ids(fresh.take(15)), reference[k:])

  def test_unshuffled_order_and_num_epochs(self):
    s = stream.PromptStream(SOURCE, shuffle=False, num_epochs=2)
    self.assertEqual(_ids(list(s)), list(range(7)) * 2)
    self.assertEqual(s.take(3), [])

  def test_restore_rejects_mismatched_state(self):
    s = stream.PromptStream(SOURCE, seed=1)
    state = s.state()
    with self.assertRaisesRegex(ValueError, "seed=1"):
      stream.PromptStream(SOURCE, seed=2).restore(state)
    with self.assertRaisesRegex(ValueError, "size=7"):
      stream.PromptStream(SOURCE[:6], seed=1).restore(state)
    with self.assertRaisesRegex(ValueError, r"missing \['index'\]"):
      s.restore({k: v for k, v in state.items() if k != "index"})
    with self.assertRaisesRegex(ValueError, "out of range"):
      s.restore({**state, "index": 7})

  def test_bad_construction(self):
    with self.assertRaisesRegex(ValueError, "empty"):
      stream.PromptStream([])
    with self.assertRaisesRegex(ValueError, "shuffle=False"):
      stream.PromptStream(range(stream.MAX_SHUFFLE_SIZE + 1))
    with self.assertRaisesRegex(ValueError, "num_epochs"):
      stream.PromptStream(SOURCE, num_epochs=0)


if __name__ == "__main__":
  absltest.main()
