"""Tests for agentrl.rollout.purify: golden interference scores, k = ⌈γ·n⌉, the top-k set with
its tie rule and eligibility, nothing deleted at π_θ = π_ref, the task span, the purified
text, and the transfer pairs. (The engine run is tests/lens_experiment_test.py's.)"""
from absl.testing import absltest
import numpy as np

from agentrl.rollout import purify


class CharTokenizer:
  """Ids: 0 pad, 1 bos, 2 eos; a character c is 3 + ord(c) - 32 (printable ASCII)."""
  pad_id, bos_id, eos_id = 0, 1, 2

  def encode(self, text, add_bos=False):
    return ([self.bos_id] if add_bos else []) + [3 + ord(c) - 32 for c in text]

  def decode(self, ids):
    return "".join(chr(int(t) - 3 + 32) for t in ids if int(t) >= 3)


class ScoreTest(absltest.TestCase):

  def test_golden_scores(self):
    logp, ref = [0.0, -1.0, -2.0, -0.5], [0.0, -1.5, -1.0, -0.5]
    np.testing.assert_array_equal(purify.interference_scores(logp, ref), [0, 0.5, 1.0, 0])
    np.testing.assert_array_equal(purify.interference_scores(logp, ref, absolute=False),
                                  [0, 0.5, -1.0, 0])

  def test_deletion_count(self):
    # ⌈γ·n⌉ over the eligible tokens: 8 tokens at 5% -> 1; 21 -> ⌈1.05⌉ = 2; 3% of 100 is 3
    # (not 4 from 3.0000000000000004); nothing to delete from nothing.
    for n, gamma, k in [(8, 0.05, 1), (20, 0.05, 1), (21, 0.05, 2), (100, 0.03, 3),
                        (0, 0.05, 0), (10, 0.0, 0), (10, 1.0, 10)]:
      self.assertEqual(purify.deletion_count(n, gamma), k, (n, gamma))
    with self.assertRaisesRegex(ValueError, "gamma"):
      purify.deletion_count(5, 1.5)


class InterferenceSetTest(absltest.TestCase):

  def test_golden_top_k_with_ties_and_eligibility(self):
    # Position 0 (a BOS, the largest score) is not eligible; n = 6, γ = 0.34 -> k = ⌈2.04⌉ = 3:
    # position 5 (5.0), then the tie at 0.7 (positions 2, 3, 6) goes to the earlier 2 and 3.
    scores = [9.0, 0.3, 0.7, 0.7, 0.1, 5.0, 0.7]
    eligible = [False, True, True, True, True, True, True]
    got = purify.interference_set(scores, eligible, gamma=0.34)
    np.testing.assert_array_equal(got, [0, 0, 1, 1, 0, 1, 0])

  def test_nothing_is_deleted_at_the_reference(self):
    # π_θ = π_ref (step 1 from the warm start): every S_I is exactly 0, so even γ = 1 deletes
    # nothing (only scores above min_score = 0 are candidates), and no prompt is resampled.
    logp = np.array([0.0, -1.2, -0.3, -2.5])
    scores = purify.interference_scores(logp, logp.copy())
    got = purify.interference_set(scores, [True] * 4, gamma=1.0)
    self.assertFalse(got.any())

  def test_min_score_leaves_fewer_than_k(self):
    got = purify.interference_set([0.0, 0.2, 0.05, 0.3], [True] * 4, gamma=1.0, min_score=0.1)
    np.testing.assert_array_equal(got, [0, 1, 0, 1])

  def test_shape_mismatch_is_refused(self):
    with self.assertRaisesRegex(ValueError, "shapes"):
      purify.interference_set([0.1, 0.2], [True], gamma=0.5)


class PromptTest(absltest.TestCase):

  def test_task_span_is_the_last_occurrence(self):
    self.assertEqual(purify.task_span([1, 10, 11, 3, 10, 11, 12], [10, 11]), (4, 6))
    with self.assertRaisesRegex(ValueError, "do not occur"):
      purify.task_span([1, 2, 3], [4])

  def test_template_tokens_are_never_deleted(self):
    # "<s>" + task + "</s>" stands for a chat template around the task text: the template's
    # characters score highest but only the task text's 6 tokens are eligible, k = ⌈0.3·6⌉ = 2:
    # the '+' (score 4) and the '3' (score 3) go.
    tok = CharTokenizer()
    task = "12+34="
    prompt = tok.encode("<s>", add_bos=True) + tok.encode(task) + tok.encode("</s>")
    scores = np.full(len(prompt), 50.0)
    start = 4
    scores[start:start + 6] = [0.5, 1.0, 4.0, 3.0, 0.0, 2.0]
    text, n = purify.purify_prompt(tok, prompt, task, scores, gamma=0.3)
    self.assertEqual((text, n), ("124=", 2))
    # At the reference nothing goes.
    self.assertEqual(purify.purify_prompt(tok, prompt, task, np.zeros(len(prompt)), gamma=0.3),
                     (task, 0))


class TransferTest(absltest.TestCase):

  def test_pairs(self):
    # Purified 3/4 > original 1/4: the three purified successes replace the three failures.
    self.assertEqual(purify.transfer_pairs([0, 1, 0, 0], [1, 0, 1, 1]),
                     [(0, 0), (2, 2), (3, 3)])
    # More purified successes than failures: only the failures are replaced.
    self.assertEqual(purify.transfer_pairs([1, 0], [1, 1]), [(1, 0)])
    # No improvement (equal rates), or no successes: nothing moves.
    self.assertEqual(purify.transfer_pairs([0, 1], [1, 0]), [])
    self.assertEqual(purify.transfer_pairs([0, 0], [0, 0]), [])
    # Different group sizes (num_purified != G): rates compare.
    self.assertEqual(purify.transfer_pairs([0, 0, 0, 1], [1, 0]), [(0, 0)])


if __name__ == "__main__":
  absltest.main()
