# pylint: disable=invalid-name
"""Tests for agentrl.advantages.efficiency: transcriptions of the official code, hand-computed
golden numbers and the invariants of docs/algorithms.md §7 and §12."""
import collections
import functools

from absl.testing import absltest
import chex
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import efficiency as ab
from agentrl.advantages import estimators

RTOL, ATOL = 1e-5, 1e-6


# ---------------------------------------------------------------------------------------------
# Float64 transcriptions of the official loops. BRPO: sail-sg/AnytimeReasoner
# verl/verl/trainer/ppo/brpo.py at commit 7e3f5bb3e0617dbc8c3c522937bab1974b444982
# (sample_partial_cot, compute_cot_advantage, compute_summary_advantage,
# get_grpo_metrics_dict, compute_token_level_advantage).

def official_partial_lens(L, budgets):
  """sample_partial_cot: (plen, count) of each distinct cut, sorted, for a thinking of length L."""
  counts = collections.defaultdict(int)
  for plen in budgets:
    counts[plen if L > plen else L] += 1
  return [(plen, counts[plen]) for plen in sorted(counts)]


def official_split_ids(L, budgets, A):
  ids = []
  for i, (_, num) in enumerate(official_partial_lens(L, budgets)):
    ids += [i] * (num * A)
  return ids


def official_cot_advantage(cot_budget_scores, budget_probs, variance_reduction="brpo"):
  scores = np.asarray(cot_budget_scores, np.float64)      # [B, G, S]
  B, G, S = scores.shape
  p = np.asarray(budget_probs, np.float64)
  p = p / p.sum()
  discount_probs = 2.0 ** np.arange(S)
  adv = np.zeros_like(scores)
  for b in range(B):
    for g in range(G):
      for s in range(S):
        cot_return = (scores[b, g, s:] * p[s:]).sum()
        avg_return = 0.0
        if G > 1:
          avg_return = (scores[b, :, s:] * p[s:]).sum(axis=-1).mean()
        last_cot_return = 0.0
        if s > 0:
          prev = (scores[b, g, :s] * discount_probs[:s]).sum() / discount_probs[:s].sum()
          last_cot_return = prev * p[s:].sum()
        baseline = {"brpo": (s * last_cot_return + (S - s) * avg_return) / S,
                    "v1only": last_cot_return, "v2only": avg_return,
                    "none": 0.0}[variance_reduction]
        adv[b, g, s] = cot_return - baseline
  return adv.reshape(B * G, S)


def official_summary_advantage(summary_scores, split_id, G, S, method="brpo"):
  summary_scores = np.asarray(summary_scores, np.float64)  # [B*G, S*A]
  BG, SA = summary_scores.shape
  A = SA // S
  reshaped = summary_scores.reshape(BG // G, G, S, A)
  id2score = collections.defaultdict(lambda: collections.defaultdict(list))
  for i in range(BG):
    for j in range(SA):
      id2score[i][int(split_id[i][j])].append(summary_scores[i, j])
  id2mean = {i: {sid: (0.0 if len(v) == 1 else np.mean(v)) for sid, v in d.items()}
             for i, d in id2score.items()}
  adv = np.zeros_like(summary_scores)
  for i in range(BG):
    for j in range(SA):
      sid = int(split_id[i][j])
      baseline = reshaped[i // G, :, j, 0].mean() if A == 1 else id2mean[i][sid]
      if method == "grpo":
        adv[i, j] = summary_scores[i, j] - baseline if j == SA - 1 else 0.0
      else:
        adv[i, j] = summary_scores[i, j] - baseline
  return adv


def official_thinking_tokens(cot_adv_row, L, budgets):
  """compute_token_level_advantage on one row's thinking tokens (positions 0..L-1)."""
  out, last_valid_len = np.zeros(L), 0
  for i, (plen, _) in enumerate(official_partial_lens(L, budgets)):
    valid_len = plen if L > plen else L
    out[last_valid_len:valid_len] = cot_adv_row[i]
    last_valid_len = valid_len
  return out


# HBPO: ZJU-REAL/HBPO verl/trainer/ppo/core_algos.py compute_grpo_outcome_advantage at commit
# 5c8991d66483202d8c30b6f76e2aff7a7d561351 (aintra is added inside the if and once more after
# it; groups of size > 1 only, where the stale-variable path of size-1 groups is not taken).
def official_hbpo(scores, budgets, group_size, eps=1e-6):
  scores = np.asarray(scores, np.float64)
  out = np.zeros_like(scores)
  for start in range(0, len(scores), group_size):
    rows = slice(start, start + group_size)
    s, b = scores[rows], np.asarray(budgets[rows])
    mean, std = s.mean(), s.std(ddof=1)
    submean = {v: s[b == v].mean() for v in np.unique(b)}
    for k in range(group_size):
      aintra = submean[b[k]] - 4 * np.cos(3.1416 * b[k] / 8192)
      out[start + k] = (s[k] - mean) / (std + eps) + aintra + aintra
  return out


# DECS: pixas/DECS src_valid/valid_ray_trainer.py compute_grpo_proc_length_advantage_return at
# commit 0d12e5362fa658fb3cfce8a646dfe9bf9c22e5ec (response-only [B, T] arrays as in verl).
def official_decs(score, chunk_aware_adv, response_mask, group_size, beta):
  response_mask = np.asarray(response_mask, np.float64)
  B, T = response_mask.shape
  L = response_mask.sum(-1).astype(int)
  final = np.repeat(np.asarray(score, np.float64)[:, None], T, axis=1) * (1 + beta)
  for i in range(B):
    if score[i] > 0:
      length_reward = np.zeros(T)
      length_reward[:L[i]] = (1 - L[i] / T) * beta
      neg = np.nonzero(np.asarray(chunk_aware_adv[i]) < 0)[0]
      if len(neg):
        final[i, neg[0]:neg[-1] + 1] = score[i] + length_reward[neg[0]:neg[-1] + 1]
  adv = np.zeros_like(final)
  for start in range(0, B, group_size):
    g = final[start:start + group_size]
    mean, std = (0.0, 1.0) if group_size == 1 else (g.mean(0), g.std(0, ddof=1))
    adv[start:start + group_size] = (g - mean) / (std + 1e-6)
  return adv * response_mask


# ---------------------------------------------------------------------------------------------

class BrpoThinkingTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # G = 2, S = 2, p = (0.5, 0.5), R = [[0, 1], [1, 1]]: Ret = [[.5, .5], [1, .5]],
    # V2 = (.75, .5), V1(s=1) = (0, .5) * .5 = (0, .25) ... b(s=1) = (V1 + V2) / 2.
    fn = self.variant(functools.partial(ab.brpo_thinking, group_size=2,
                                        budget_probs=(0.5, 0.5)))
    np.testing.assert_allclose(fn(jnp.array([[0.0, 1.0], [1.0, 1.0]])),
                               [[-0.25, 0.25], [0.25, 0.0]], atol=1e-7)

  def test_matches_the_official_loop(self):
    rng = np.random.default_rng(0)
    for G, S, mode, probs in [(4, 4, "brpo", "linear"), (3, 4, "brpo", "uniform"),
                              (4, 4, "v1only", "linear"), (4, 2, "v2only", "uniform"),
                              (2, 3, "none", "linear"), (1, 4, "brpo", "linear"),
                              (4, 4, "brpo", "base")]:
      budgets = np.arange(1, S + 1) * (8000 // S)
      p = {"linear": budgets / budgets.sum(), "uniform": np.full(S, 1.0 / S),
           "base": np.eye(S)[-1]}[probs]
      scores = rng.integers(0, 5, size=(2, G, S)) / 4.0    # means of A = 4 binary summaries
      want = official_cot_advantage(scores, p, mode)
      got = ab.brpo_thinking(jnp.asarray(scores.reshape(-1, S)), group_size=G, budget_probs=p,
                             variance_reduction=mode)
      np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL, err_msg=f"{G} {S} {mode}")

  def test_one_budget_is_dr_grpo(self):
    reward = jnp.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    got = ab.brpo_thinking(reward[:, None], group_size=3, budget_probs=[1.0])
    np.testing.assert_allclose(got[:, 0], estimators.grpo(reward, group_size=3,
                                                          norm_by_std=False), atol=1e-7)

  def test_identical_trajectories_with_constant_scores_give_exactly_zero(self):
    # ("v1only" is not among them: at s = 0 its baseline is 0, so A = Ret there.)
    scores = jnp.full((4, 4), 0.1)                        # 0.1 is not exact in binary
    for mode in ("brpo", "v2only"):
      got = ab.brpo_thinking(scores, group_size=4, budget_probs=(1, 2, 3, 4),
                             variance_reduction=mode)
      self.assertEqual(float(jnp.abs(got).max()), 0.0, mode)

  def test_group_permutation_invariance(self):
    scores = jnp.asarray(np.random.default_rng(1).random((6, 4)))
    perm = np.array([2, 0, 1, 4, 5, 3])
    fn = functools.partial(ab.brpo_thinking, group_size=3, budget_probs=(0.1, 0.2, 0.3, 0.4))
    np.testing.assert_allclose(fn(scores[perm]), fn(scores)[perm], rtol=RTOL, atol=ATOL)

  def test_bad_arguments_raise(self):
    with self.assertRaisesRegex(ValueError, "variance_reduction"):
      ab.brpo_thinking(jnp.zeros((2, 2)), group_size=2, budget_probs=(1, 1),
                       variance_reduction="v3")
    with self.assertRaisesRegex(ValueError, "budget_probs has 3"):
      ab.brpo_thinking(jnp.zeros((2, 2)), group_size=2, budget_probs=(1, 1, 1))
    with self.assertRaisesRegex(ValueError, "divisible by group_size"):
      ab.brpo_thinking(jnp.zeros((3, 2)), group_size=2, budget_probs=(1, 1))


class BrpoSummaryAndTokensTest(chex.TestCase):

  def test_cut_index_matches_sample_partial_cot(self):
    budgets = [2000, 4000, 6000, 8000]
    lengths = [1, 1999, 2000, 2001, 3000, 4000, 4001, 7999, 8000]
    got = ab.brpo_cut_index(jnp.array(lengths), budgets=budgets)
    for L, row in zip(lengths, np.asarray(got)):
      self.assertEqual(list(row), official_split_ids(L, budgets, A=1), L)

  def test_summary_matches_the_official_loop(self):
    rng = np.random.default_rng(2)
    budgets = [4, 8, 12, 16]
    for A, method in [(1, "brpo"), (4, "brpo"), (1, "grpo"), (3, "grpo")]:
      G, S = 4, 4
      lengths = rng.integers(1, 17, size=2 * G)
      split = np.array([official_split_ids(int(L), budgets, A) for L in lengths])
      scores = rng.integers(0, 2, size=(2 * G, S * A)).astype(np.float64)
      want = official_summary_advantage(scores, split, G, S, method)
      cut = ab.brpo_cut_index(jnp.asarray(lengths), budgets=budgets)
      got = ab.brpo_summary(jnp.asarray(scores.reshape(-1, S, A)), cut, group_size=G,
                            summary_method=method)
      np.testing.assert_allclose(np.asarray(got).reshape(2 * G, S * A), want, rtol=RTOL,
                                 atol=ATOL, err_msg=f"A={A} {method}")

  def test_summaries_of_one_cut_scoring_alike_give_exactly_zero(self):
    scores = jnp.full((2, 2, 3), 0.1)
    cut = ab.brpo_cut_index(jnp.array([5, 50]), budgets=[10, 20])
    self.assertEqual(float(jnp.abs(ab.brpo_summary(scores, cut, group_size=2)).max()), 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_thinking_tokens_hand_computed(self):
    # Row 0: 2 prompt tokens, 5 thinking tokens, 1 summary token; budgets (2, 4): segments
    # [0, 2) -> A_0, [2, 4) -> A_1, the 5th thinking token is past the last budget -> 0.
    mask = jnp.array([[0, 0, 1, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0, 0, 0]])
    adv = jnp.array([[1.0, 2.0], [3.0, 4.0]])
    fn = self.variant(functools.partial(ab.brpo_thinking_tokens, budgets=(2, 4)))
    np.testing.assert_array_equal(fn(adv, mask), [[0, 0, 1, 1, 2, 2, 0, 0],
                                                  [0, 3, 3, 4, 0, 0, 0, 0]])

  def test_thinking_tokens_match_compute_token_level_advantage(self):
    budgets, rng = [3, 6, 9, 12], np.random.default_rng(3)
    for L in [1, 3, 4, 7, 11, 12]:
      cot_adv = rng.standard_normal(4)
      mask = np.zeros((1, 20))
      mask[0, 5:5 + L] = 1                                # 5 prompt tokens first
      got = ab.brpo_thinking_tokens(jnp.asarray(cot_adv[None]), jnp.asarray(mask),
                                    budgets=budgets)
      np.testing.assert_allclose(np.asarray(got)[0, 5:5 + L],
                                 official_thinking_tokens(cot_adv, L, budgets), rtol=RTOL)
      self.assertEqual(float(jnp.abs(got[0, :5]).max() + jnp.abs(got[0, 5 + L:]).max()), 0.0)


class HbpoTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # One group of 4, budgets (512, 512, 1024, 1024), rewards (3, 1, 2, 2): mean 2, std
    # sqrt(2/3); mu = (2, 2); f2(b) = 4 cos(3.1416 b / 8192).
    fn = self.variant(functools.partial(ab.hbpo, group_size=4))
    got = fn(jnp.array([3.0, 1.0, 2.0, 2.0]), jnp.array([512, 512, 1024, 1024]))
    std = np.sqrt(2.0 / 3.0)
    f2 = 4 * np.cos(3.1416 * np.array([512, 512, 1024, 1024]) / 8192)
    want = np.array([1.0, -1.0, 0.0, 0.0]) / (std + 1e-6) + 2.0 - f2
    np.testing.assert_allclose(got, want, rtol=RTOL)

  def test_intra_coef_two_is_the_released_code(self):
    rng = np.random.default_rng(4)
    budgets = np.tile(np.repeat([512, 1024, 2048, 2560], 4), 3)   # 4 subgroups of 4
    scores = rng.random(48) * 4
    got = ab.hbpo(jnp.asarray(scores), jnp.asarray(budgets), group_size=16, intra_coef=2.0)
    np.testing.assert_allclose(got, official_hbpo(scores, budgets, 16), rtol=1e-4, atol=1e-5)

  def test_no_intra_term_is_grpo_and_size_one_groups_are_grpo(self):
    r, b = jnp.array([1.0, 0.0, 3.5, 2.0]), jnp.array([512, 1024, 512, 1024])
    np.testing.assert_allclose(ab.hbpo(r, b, group_size=2, intra_coef=0.0),
                               estimators.grpo(r, group_size=2), rtol=1e-6)
    np.testing.assert_allclose(ab.hbpo(r, b, group_size=1), estimators.grpo(r, group_size=1))

  def test_group_permutation_invariance(self):
    r = jnp.asarray(np.random.default_rng(5).random(8))
    b = jnp.array([512, 512, 1024, 1024] * 2)
    perm = np.array([3, 1, 0, 2, 6, 7, 5, 4])
    np.testing.assert_allclose(ab.hbpo(r[perm], b[perm], group_size=4),
                               ab.hbpo(r, b, group_size=4)[perm], rtol=1e-5, atol=1e-6)


class DecsTest(chex.TestCase):

  def _case(self, seed=6, G=4, P=2, T=12):
    rng = np.random.default_rng(seed)
    L = rng.integers(4, T + 1, size=P * G)
    mask = (np.arange(T)[None, :] < L[:, None]).astype(np.float32)
    score = rng.integers(0, 2, size=P * G).astype(np.float32)
    chunk_adv = np.zeros((P * G, T))
    for i in range(P * G):          # a redundant tail after the first correct chunk
      start = rng.integers(1, L[i])
      chunk_adv[i, :start] = 0.001
      chunk_adv[i, start:L[i]] = -0.001
    chunk_adv *= score[:, None]     # the reward manager zeroes incorrect rows
    return score, chunk_adv, mask

  def test_matches_the_official_loop(self):
    for G, beta in [(4, 0.1), (4, 0.5), (1, 0.1)]:
      score, chunk_adv, mask = self._case(G=G)
      want = official_decs(score, chunk_adv, mask, G, beta)
      got = ab.decs(jnp.asarray(score), jnp.asarray(chunk_adv < 0), jnp.asarray(mask),
                    group_size=G, max_response_len=mask.shape[1], beta=beta)
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"G={G}")

  def test_prompt_columns_do_not_change_the_response_advantages(self):
    score, chunk_adv, mask = self._case()
    pad = lambda x: np.concatenate([np.zeros((x.shape[0], 3)), x], axis=1)
    got = ab.decs(jnp.asarray(score), jnp.asarray(pad(chunk_adv) < 0), jnp.asarray(pad(mask)),
                  group_size=4, max_response_len=mask.shape[1])
    want = official_decs(score, chunk_adv, mask, 4, 0.1)
    np.testing.assert_allclose(np.asarray(got)[:, 3:], want, rtol=1e-4, atol=1e-5)
    self.assertEqual(float(jnp.abs(got[:, :3]).max()), 0.0)

  @chex.variants(with_jit=True, without_jit=True)
  def test_token_rewards_hand_computed(self):
    # L = 4 of T = 8, beta = 0.1; tokens 2..3 redundant: 1 + 0.1 (1 - 4/8) = 1.05 there, 1.1
    # elsewhere (padding included); an incorrect row is 0 everywhere, marked or not.
    fn = self.variant(functools.partial(ab.decs_token_rewards, max_response_len=8))
    mask = jnp.array([[1, 1, 1, 1, 0, 0, 0, 0]] * 2)
    redundant = jnp.array([[0, 0, 1, 1, 0, 0, 0, 0]] * 2)
    np.testing.assert_allclose(fn(jnp.array([1.0, 0.0]), redundant, mask),
                               [[1.1, 1.1, 1.05, 1.05, 1.1, 1.1, 1.1, 1.1], [0.0] * 8],
                               rtol=1e-6)

  def test_beta_zero_is_grpo_and_equal_rows_give_zero(self):
    score, chunk_adv, mask = self._case()
    got = ab.decs(jnp.asarray(score), jnp.asarray(chunk_adv < 0), jnp.asarray(mask),
                  group_size=4, max_response_len=12, beta=0.0)
    want = estimators.broadcast_to_tokens(estimators.grpo(jnp.asarray(score), group_size=4),
                                          jnp.asarray(mask))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    same = ab.decs(jnp.ones(4), jnp.zeros((4, 6)), jnp.ones((4, 6)), group_size=4,
                   max_response_len=6)
    self.assertEqual(float(jnp.abs(same).max()), 0.0)


class TruncatedGaeTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # Truncated row, r = 0, V = (.5, .6, .7), V(s_trunc) = .8, gamma .9, lam .8:
    # delta = (.04, .03, .72 - .7); A_1 = .03 + .72 * .02; A_0 = .04 + .72 * A_1.
    fn = self.variant(functools.partial(ab.truncated_gae, gamma=0.9, lam=0.8))
    adv, ret, vmask = fn(jnp.zeros((1, 4)), jnp.array([[0.5, 0.6, 0.7, 9.0]]),
                         jnp.array([[1.0, 1.0, 1.0, 0.0]]), jnp.array([True]),
                         jnp.array([0.8]))
    np.testing.assert_allclose(adv, [[0.071968, 0.0444, 0.02, 0.0]], rtol=1e-5)
    np.testing.assert_allclose(ret, [[0.571968, 0.6444, 0.72, 0.0]], rtol=1e-5)
    np.testing.assert_array_equal(vmask, [[0, 0, 0, 0]])

  def test_finished_rows_are_plain_gae(self):
    rng = np.random.default_rng(7)
    reward, value = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    mask = np.array([[0, 1, 1, 0, 1, 1], [0, 0, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]], np.float32)
    truncated = jnp.array([False, True, False])
    adv, ret, vmask = ab.truncated_gae(jnp.asarray(reward), jnp.asarray(value),
                                       jnp.asarray(mask), truncated, jnp.array([5.0, 0.0, 5.0]),
                                       gamma=0.95, lam=0.9)
    want_adv, want_ret = estimators.gae(jnp.asarray(reward), jnp.asarray(value),
                                        jnp.asarray(mask), gamma=0.95, lam=0.9)
    # Rows 0 and 2 are finished; row 1 is truncated with V(s_trunc) = 0: all plain GAE.
    np.testing.assert_allclose(adv, want_adv, rtol=1e-6)
    np.testing.assert_allclose(ret, want_ret, rtol=1e-6)
    np.testing.assert_array_equal(vmask, mask * np.array([[1], [0], [1]]))
    self.assertEqual(float(jnp.abs(jnp.where(mask == 0, adv, 0.0)).max()), 0.0)


if __name__ == "__main__":
  absltest.main()
