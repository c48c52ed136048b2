# pylint: disable=invalid-name
"""Tests for agentrl.rewards.length_rewards: transcriptions of the official reward code,
hand-computed golden numbers and the neutral settings (docs/algorithms.md §12.1-§12.3)."""
import functools
import math

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.rewards import length_rewards as lr

MAX_LEN = 100000  # HAPO's "undefined" sentinel


# ---------------------------------------------------------------------------------------------
# Transcriptions. HAPO: HCY123902/HAPO at commit c91ae3b62dc0aef7427989e73bc46b996db8f180,
# utils.py (compute_len_reward, compute_len_reward_linear) and grpo_trainer.py
# (combined_reward_func's history update).

def official_hapo_cosine(history_len, seq_len, is_corr, w_lr=1.0):
  if MAX_LEN > history_len > 0:
    r = math.cos((seq_len / history_len) * (math.pi / 2)) if seq_len < 2 * history_len else -1.0
    r = max(-0.7, r) if is_corr else min(0, r)
  else:
    r = 0
  return r * w_lr


def official_hapo_linear(history_len, seq_len, is_corr, tolerance_ratio=0.1, w_lr=1.0):
  if not MAX_LEN > history_len > 0:
    return 0.0
  over = -1.0 * ((seq_len - (1 + tolerance_ratio) * history_len) / history_len)
  if is_corr:
    if seq_len < history_len:
      r = 1.0 - seq_len / history_len
    elif seq_len < (1 + tolerance_ratio) * history_len:
      r = 0
    else:
      r = max(-0.7, over)
  else:
    r = 0 if seq_len < (1 + tolerance_ratio) * history_len else max(-1.0, over)
  return r * w_lr


def official_history_update(lens, counts, prompt_idx, seq_lens, corrects, mode):
  """The loop after the rewards in combined_reward_func (one process)."""
  batch = {i: [] for i in prompt_idx}
  for i, L, c in zip(prompt_idx, seq_lens, corrects):
    if c:
      batch[i].append(L)
  for i in prompt_idx:
    if not batch[i]:
      continue
    if mode == "min":
      lens[i] = min(min(batch[i]), lens[i])
    else:
      mean = sum(batch[i]) / len(batch[i])
      if counts[i] <= 0:
        lens[i] = mean
      else:
        ratio = len(batch[i]) / (counts[i] + len(batch[i]))
        lens[i] = ratio * mean + (1 - ratio) * lens[i]
      counts[i] += len(batch[i])


# HBPO: ZJU-REAL/HBPO at commit 5c8991d66483202d8c30b6f76e2aff7a7d561351,
# rllm/rewards/math_reward.py, the branch of a correct answer with a matched budget.
def official_hbpo_correct(valid_response_length, number):
  if valid_response_length > 4096:
    return 0.0                                       # falls through to incorrect_reward
  result = 4 * np.cos(3.1416 * valid_response_length / 8192)
  standard = 4 * np.cos(3.1416 * number / 8192)
  return min(result - 1 / 4096 * abs(number - valid_response_length), standard)


# ---------------------------------------------------------------------------------------------

class HapoRewardTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_cosine_hand_computed(self):
    # h = 100: L = 50 -> cos(pi/4); L = 150 -> cos(3pi/4) = -0.707 (correct: clamped at -0.7);
    # L = 250 >= 2h -> -1 (correct: -0.7); an incorrect short answer gets min(0, r) = 0.
    fn = self.variant(lr.hapo_length_reward)
    L = jnp.array([50, 150, 250, 50, 150, 250, 50])
    correct = jnp.array([1, 1, 1, 0, 0, 0, 1])
    h = jnp.array([100.0] * 6 + [jnp.inf])
    c = math.cos(math.pi / 4)
    np.testing.assert_allclose(fn(L, correct, h), [c, -0.7, -0.7, 0.0, -c, -1.0, 0.0],
                               rtol=1e-6)

  def test_matches_the_official_functions(self):
    rng = np.random.default_rng(0)
    L = rng.integers(1, 400, 200)
    h = rng.choice([0.0, 37.0, 100.0, 211.0, MAX_LEN], 200)
    correct = rng.integers(0, 2, 200)
    h_ours = np.where((h > 0) & (h < MAX_LEN), h, np.inf)
    for kind, ref in (("cosine", official_hapo_cosine), ("linear", official_hapo_linear)):
      got = lr.hapo_length_reward(jnp.asarray(L), jnp.asarray(correct), jnp.asarray(h_ours),
                                  w=0.5, kind=kind)
      want = [ref(hh, ll, bool(cc), w_lr=0.5) for hh, ll, cc in zip(h, L, correct)]
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=kind)

  def test_total_reward_and_w_zero_is_the_correctness_reward(self):
    L, correct, h = jnp.array([50, 300, 80]), jnp.array([1, 0, 1]), jnp.array([100.0] * 3)
    np.testing.assert_array_equal(lr.hapo_reward(correct, L, h, w=0.0), [1.0, 0.0, 1.0])
    np.testing.assert_allclose(lr.hapo_reward(correct, L, h),
                               [1 + math.cos(math.pi / 4), -1.0, 1 + math.cos(0.4 * math.pi)],
                               rtol=1e-6)

  def test_every_correct_response_beats_every_incorrect_one(self):
    L = jnp.arange(1, 1000)
    h = jnp.full(L.shape, 100.0)
    worst_correct = lr.hapo_reward(jnp.ones_like(L), L, h).min()
    best_incorrect = lr.hapo_reward(jnp.zeros_like(L), L, h).max()
    self.assertGreater(float(worst_correct), float(best_incorrect))


class LengthHistoryTest(chex.TestCase):

  def test_matches_the_official_update_over_several_batches(self):
    rng = np.random.default_rng(1)
    for mode in ("min", "mean"):
      lens, counts = [float(MAX_LEN)] * 6, [0] * 6
      hist = lr.LengthHistory.create(6)
      update = jax.jit(functools.partial(lr.update_history, mode=mode))
      for _ in range(5):
        idx = rng.integers(0, 6, 8)
        seq = rng.integers(10, 500, 8)
        corr = rng.integers(0, 2, 8)
        # The rewards of a batch read the table before the batch's update.
        want = [official_hapo_cosine(lens[i], s, bool(c)) for i, s, c in zip(idx, seq, corr)]
        got = lr.hapo_length_reward(jnp.asarray(seq), jnp.asarray(corr),
                                    hist.lookup(jnp.asarray(idx)))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        official_history_update(lens, counts, list(idx), list(seq), list(corr), mode)
        hist = update(hist, jnp.asarray(idx), jnp.asarray(seq), jnp.asarray(corr))
        np.testing.assert_allclose(np.where(np.isinf(hist.h_N), MAX_LEN, hist.h_N), lens,
                                   rtol=1e-5, err_msg=mode)

  @chex.variants(with_jit=True, without_jit=True)
  def test_min_update_hand_computed_and_ignored_rows(self):
    fn = self.variant(lr.update_history)
    hist = lr.LengthHistory(h_N=jnp.array([jnp.inf, 40.0, jnp.inf]),
                            count_N=jnp.array([0.0, 1.0, 0.0]))
    # Slot 0: correct 30 and 20 -> 20; slot 1: 50 > 40 keeps 40; slot 2: only incorrect rows;
    # the row with slot -1 (correct, 5) changes nothing (no wrap-around to the last slot).
    new = fn(hist, jnp.array([0, 0, 1, 2, -1]), jnp.array([30, 20, 50, 7, 5]),
             jnp.array([1, 1, 1, 0, 1]))
    np.testing.assert_array_equal(new.h_N, [20.0, 40.0, np.inf])
    np.testing.assert_array_equal(new.count_N, [4.0, 2.0, 0.0])   # + rows x correct
    np.testing.assert_array_equal(new.lookup(jnp.array([1, -1])), [40.0, np.inf])

  def test_history_is_a_pytree_of_fixed_shape(self):
    hist = lr.LengthHistory.create(4)
    leaves = jax.tree.leaves(hist)
    self.assertLen(leaves, 2)
    new = lr.update_history(hist, jnp.array([1]), jnp.array([9]), jnp.array([1]))
    chex.assert_trees_all_equal_shapes_and_dtypes(hist, new)

  def test_prompt_slots_assign_restore_and_fill(self):
    slots = lr.PromptSlots(3)
    np.testing.assert_array_equal(slots(["b", "a", "b"]), [0, 1, 0])
    restored = lr.PromptSlots(3, keys=slots.keys())
    np.testing.assert_array_equal(restored(["a", "c", "b"]), [1, 2, 0])
    with self.assertRaisesRegex(ValueError, "full"):
      restored(["d"])


class HbpoRewardTest(chex.TestCase):

  def test_matches_the_released_reward(self):
    for b in (512, 1024, 2048, 2560):
      L = np.arange(1, 4200, 7)
      got = lr.hbpo_reward(jnp.ones(L.shape), jnp.asarray(L), jnp.full(L.shape, b))
      want = [official_hbpo_correct(int(l), b) for l in L]
      np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=str(b))

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_and_the_other_cases(self):
    fn = self.variant(functools.partial(lr.hbpo_reward, within_budget="flat"))
    f = lambda n: 4 * math.cos(3.1416 * n / 8192)
    got = fn(jnp.array([1, 1, 0, 1, 1]), jnp.array([300, 1000, 300, 5000, 300]),
             jnp.array([512, 512, 512, 512, 512]),
             formatted_B=jnp.array([1, 1, 1, 1, 0]))
    # Inside the budget: f2(512); beyond: f1 = 4 cos(pi L / 8192) - |L - b| / 4096;
    # incorrect: 0; longer than L_max: 0; unformatted: -1.
    want = [f(512), f(1000) - 488 / 4096, 0.0, 0.0, -1.0]
    np.testing.assert_allclose(got, want, rtol=1e-6)

  def test_piecewise_shape_and_budget_ordering(self):
    L = jnp.arange(1, 4097)
    for mode in ("min", "flat"):
      r = {b: np.asarray(lr.hbpo_reward(jnp.ones(L.shape), L, jnp.full(L.shape, b),
                                        within_budget=mode)) for b in (512, 2560)}
      for b, rb in r.items():
        self.assertTrue(np.all(np.diff(rb[:b]) >= -1e-6), f"{mode} {b}: inside not monotone")
        self.assertTrue(np.all(np.diff(rb[b - 1:]) < 0), f"{mode} {b}: beyond not decreasing")
      # Short answers favour the short budget, long ones the long budget (paper §3.2).
      self.assertGreater(r[512][99], r[2560][99])
      self.assertGreater(r[2560][3999], r[512][3999])


class GeometricDiscountTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    fn = self.variant(functools.partial(lr.geometric_length_discount, gamma=0.5))
    np.testing.assert_allclose(fn(jnp.array([1.0, 0.0, 2.0]), jnp.array([3, 5, 0]),
                                  undiscounted_B=jnp.array([0.1, 0.1, 0.0])),
                               [0.225, 0.1, 2.0], rtol=1e-6)

  def test_gamma_one_is_the_reward(self):
    r = jnp.array([1.0, -0.5, 0.0])
    np.testing.assert_array_equal(
        lr.geometric_length_discount(r, jnp.array([10, 1000, 3]), gamma=1.0), r)
    with self.assertRaisesRegex(ValueError, "gamma"):
      lr.geometric_length_discount(r, jnp.array([1, 1, 1]), gamma=0.0)


if __name__ == "__main__":
  absltest.main()
