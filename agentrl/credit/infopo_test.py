# pylint: disable=invalid-name
"""Tests for agentrl.credit.infopo against a NumPy transcription of the official loops
(kfq20/InfoPO@c26e93c2: verl/trainer/ppo/intrinsic_reward.py compute_intrinsic_rewards and
verl/trainer/ppo/core_algos.py compute_info_grpo_advantage), hand-computed values and the RL
invariants."""
import functools
import math

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.credit import infopo

jax.config.update("jax_numpy_rank_promotion", "raise")


def layout(rows, T):
  """rows: per trajectory a list of (action length, observation length) per turn, after a
  two-token prompt. Returns turn_BT (the turn index on actions and their observations, -1 on
  the prompt and padding), loss_mask_BT and each turn's action span."""
  turn = np.full((len(rows), T), -1, np.int32)
  mask = np.zeros((len(rows), T), np.float32)
  spans = []
  for b, turns in enumerate(rows):
    t, row_spans = 2, []
    for k, (n_act, n_obs) in enumerate(turns):
      turn[b, t:t + n_act + n_obs] = k
      mask[b, t:t + n_act] = 1.0
      row_spans.append((t, t + n_act, n_obs))
      t += n_act + n_obs
    spans.append(row_spans)
  return turn, mask, spans


def np_official(outcome, logp, cf_logp, mask, spans, G, weight=0.1, temp=0.05, eps=1e-6):
  """compute_intrinsic_rewards then compute_info_grpo_advantage (trajectory-level outcome;
  the launch's "Equalized"/"Sum" turn credits reduce to it), float64."""
  B, T = mask.shape
  intrinsic = np.zeros((B, T))
  for b in range(B):
    for k, (start, end, n_obs) in enumerate(spans[b]):
      if n_obs == 0 or k + 1 >= len(spans[b]) or end <= start:
        continue
      nxt_start, nxt_end, _ = spans[b][k + 1]
      kl = np.mean(logp[b, nxt_start:nxt_end] - cf_logp[b, nxt_start:nxt_end])
      intrinsic[b, start:end] = kl / (end - start)
  groups = [list(range(s, s + G)) for s in range(0, B, G)]
  adv_out, group_std = np.zeros(B), np.zeros(B)
  for rows in groups:
    scores = outcome[rows].astype(np.float64)
    mean, std = (0.0, 1.0) if G == 1 else (scores.mean(), scores.std(ddof=1))
    adv_out[rows] = (scores - mean) / (std + eps)
    group_std[rows] = std
  adv_out_bt = adv_out[:, None] * mask
  adv_int = np.zeros((B, T))
  for rows in groups:
    vals = [intrinsic[b, t] for b in rows for t in range(T) if mask[b, t] and intrinsic[b, t]]
    if not vals:
      continue
    mean, std = (vals[0], 1.0) if len(vals) == 1 else (np.mean(vals), np.std(vals, ddof=1))
    for b in rows:
      for t in range(T):
        if mask[b, t] and intrinsic[b, t]:
          adv_int[b, t] = (intrinsic[b, t] - mean) / (std + eps)
  outcome_std = adv_out_bt[mask > 0].std(ddof=1) + eps
  intrinsic_std = adv_int[mask > 0].std(ddof=1) + eps
  ratio = min(1.0, max(outcome_std, 1.0) / intrinsic_std)
  gate = 1.0 / (1.0 + np.exp(group_std / temp))
  return adv_out_bt + weight * gate[:, None] * ratio * adv_int


def random_case(rng, G, n_groups, T=40, U=4):
  B = G * n_groups
  rows = []
  for _ in range(B):
    n = rng.integers(1, U + 1)
    rows.append([(int(rng.integers(1, 4)), int(rng.integers(0, 3))) for _ in range(n)])
  turn, mask, spans = layout(rows, T)
  feedback = np.zeros((B, U), np.float32)
  for b, row in enumerate(rows):
    for k, (_, n_obs) in enumerate(row):
      feedback[b, k] = float(n_obs > 0)
  logp = -rng.uniform(0.0, 3.0, size=(B, T)).astype(np.float32)
  cf_logp = -rng.uniform(0.0, 3.0, size=(B, T)).astype(np.float32)
  outcome = rng.integers(0, 2, size=B).astype(np.float32)
  return outcome, logp, cf_logp, turn, mask, spans, feedback


class HelpersTest(absltest.TestCase):

  def test_fit_placeholder(self):
    self.assertEqual(infopo.fit_placeholder([5, 6, 7], 5), [5, 6, 7, 7, 7])
    self.assertEqual(infopo.fit_placeholder([5, 6, 7], 2), [5, 6])
    self.assertEqual(infopo.fit_placeholder([5, 6, 7], 0), [])
    with self.assertRaisesRegex(ValueError, "non-empty"):
      infopo.fit_placeholder([], 3)

  def test_bad_shapes(self):
    z = jnp.zeros((2, 5))
    with self.assertRaisesRegex(ValueError, r"\[B, T\]"):
      infopo.turn_information(z, jnp.zeros((2, 4)), z, z, jnp.ones((2, 3)))
    with self.assertRaisesRegex(ValueError, "disagree on B"):
      infopo.token_advantages(jnp.zeros(3), jnp.zeros((2, 3)), z, z, group_size=1)


class TurnInformationTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # Turn 0: 2 action tokens + 1 observation token; turn 1: 3 action tokens + observation;
    # turn 2: 1 action token. Shift = logp - counterfactual on each token.
    turn = jnp.array([[-1, 0, 0, 0, 1, 1, 1, 1, 2]])
    mask = jnp.array([[0, 1, 1, 0, 1, 1, 1, 0, 1]])
    logp = jnp.array([[0.0, -1.0, -1.0, -5.0, -0.2, -0.4, -0.3, -5.0, -0.1]])
    cf = jnp.array([[0.0, -1.0, -1.0, 9.0, -0.8, -1.0, -0.3, 9.0, -0.5]])
    fn = self.variant(infopo.turn_information)
    np.testing.assert_allclose(fn(logp, cf, turn, mask, jnp.array([[1, 1, 0]])),
                               [[(0.6 + 0.6 + 0.0) / 3, 0.4, 0.0]], rtol=1e-6)
    # No observation after turn 1: no information for it.
    np.testing.assert_allclose(fn(logp, cf, turn, mask, jnp.array([[1, 0, 0]])),
                               [[0.4, 0.0, 0.0]], rtol=1e-6)
    per_token = infopo.token_information(jnp.array([[0.3, 0.4, 0.0]]), turn, mask)
    np.testing.assert_allclose(per_token, [[0, 0.15, 0.15, 0, 0.4 / 3, 0.4 / 3, 0.4 / 3, 0, 0]],
                               rtol=1e-6)


class TokenAdvantagesTest(chex.TestCase):

  def test_matches_official_loops(self):
    rng = np.random.default_rng(0)
    for case, G in enumerate((3, 3, 4, 1)):
      outcome, logp, cf_logp, turn, mask, spans, feedback = random_case(rng, G, 2)
      if case == 1:
        outcome[:G] = 1.0  # a group with identical outcomes: gate 0.5
      info = infopo.turn_information(jnp.asarray(logp), jnp.asarray(cf_logp), jnp.asarray(turn),
                                     jnp.asarray(mask), jnp.asarray(feedback))
      got, metrics = infopo.token_advantages(jnp.asarray(outcome), info, jnp.asarray(turn),
                                             jnp.asarray(mask), group_size=G)
      want = np_official(outcome, logp, cf_logp, mask, spans, G)
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=f"case {case}")
      self.assertTrue(0.0 <= float(metrics["infopo_gate_mean"]) <= 0.5)

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_gate_and_ratio(self):
    # One group of 2, one policy token per turn, outcomes 1 and 0.96 (unbiased std
    # sqrt(0.0008), so the gate is sigmoid(-sqrt(0.0008) / 0.05) ~ 0.36).
    turn = jnp.array([[0, 1], [0, 1]])
    mask = jnp.ones((2, 2))
    outcome = jnp.array([1.0, 0.96])
    a = 0.02 / (math.sqrt(0.0008) + 1e-6)
    gate = 1 / (1 + math.exp(math.sqrt(0.0008) / 0.05))
    out_std = np.std([a, a, -a, -a], ddof=1) + 1e-6
    fn = self.variant(functools.partial(infopo.token_advantages, group_size=2,
                                        intrinsic_weight=0.5))
    # Normalised: intrinsic pool {0.2, 0.6} gives -+z; its std is below 1, so ratio = 1.
    adv, metrics = fn(outcome, jnp.array([[0.2, 0.0], [0.6, 0.0]]), turn, mask)
    z = 0.2 / (math.sqrt(0.08) + 1e-6)
    np.testing.assert_allclose(adv, [[a - 0.5 * gate * z, a], [-a + 0.5 * gate * z, -a]],
                               rtol=1e-5)
    np.testing.assert_allclose(metrics["infopo_magnitude_ratio"], 1.0)
    np.testing.assert_allclose(metrics["infopo_gate_mean"], gate, rtol=1e-5)
    # The code's ablation without normalisation: raw values 4 and -2 (std sqrt(19/3)) shrink.
    fn = self.variant(functools.partial(infopo.token_advantages, group_size=2,
                                        intrinsic_weight=0.5, normalize_intrinsic=False))
    adv, metrics = fn(outcome, jnp.array([[4.0, 0.0], [-2.0, 0.0]]), turn, mask)
    ratio = max(out_std, 1.0) / (math.sqrt(19 / 3) + 1e-6)
    np.testing.assert_allclose(metrics["infopo_magnitude_ratio"], ratio, rtol=1e-5)
    np.testing.assert_allclose(adv, [[a + 0.5 * gate * ratio * 4.0, a],
                                     [-a - 0.5 * gate * ratio * 2.0, -a]], rtol=1e-5)

  def test_reductions_to_grpo(self):
    rng = np.random.default_rng(1)
    outcome, logp, cf_logp, turn, mask, _, feedback = random_case(rng, 3, 2)
    info = infopo.turn_information(jnp.asarray(logp), jnp.asarray(cf_logp), jnp.asarray(turn),
                                   jnp.asarray(mask), jnp.asarray(feedback))
    grpo_BT = estimators.broadcast_to_tokens(estimators.grpo(jnp.asarray(outcome), group_size=3),
                                             jnp.asarray(mask))
    for weight, info_BU in ((0.0, info), (0.1, jnp.zeros_like(info))):
      got, _ = infopo.token_advantages(jnp.asarray(outcome), info_BU, jnp.asarray(turn),
                                       jnp.asarray(mask), group_size=3, intrinsic_weight=weight)
      np.testing.assert_array_equal(got, grpo_BT)
    got, _ = infopo.token_advantages(jnp.asarray(outcome), info, jnp.asarray(turn),
                                     jnp.asarray(mask), group_size=3)
    self.assertGreater(float(jnp.abs(got - grpo_BT).max()), 0.0)  # non-trivial side

  def test_invariants(self):
    rng = np.random.default_rng(2)
    outcome, logp, cf_logp, turn, mask, _, feedback = random_case(rng, 3, 2)
    args = [jnp.asarray(turn), jnp.asarray(mask)]
    info = infopo.turn_information(jnp.asarray(logp), jnp.asarray(cf_logp), *args,
                                   jnp.asarray(feedback))
    adv, _ = infopo.token_advantages(jnp.asarray(outcome), info, *args, group_size=3)
    self.assertTrue(np.all(np.asarray(adv)[mask == 0] == 0.0))  # prompt, observations, padding
    perm = np.array([2, 0, 1, 3, 5, 4])
    permuted, _ = infopo.token_advantages(jnp.asarray(outcome[perm]), info[perm],
                                          jnp.asarray(turn[perm]), jnp.asarray(mask[perm]),
                                          group_size=3)
    np.testing.assert_allclose(permuted, np.asarray(adv)[perm], rtol=1e-6, atol=1e-6)
    # Identical trajectories, uniform per-token information: exactly zero.
    turn1 = jnp.tile(jnp.array([[0, 0, 1, 1, 2]]), (3, 1))
    mask1 = jnp.tile(jnp.array([[1, 1, 1, 1, 0]]), (3, 1))
    info1 = jnp.tile(jnp.array([[0.4, 0.4, 0.0]]), (3, 1))
    adv, metrics = infopo.token_advantages(jnp.full((3,), 0.7), info1, turn1, mask1,
                                           group_size=3)
    np.testing.assert_array_equal(adv, 0.0)
    self.assertEqual(float(metrics["infopo_gate_mean"]), 0.5)
    # Identical trajectories whose turns carry different information: non-zero by design.
    adv, _ = infopo.token_advantages(jnp.full((3,), 0.7), info1.at[:, 1].set(0.1), turn1,
                                     mask1, group_size=3)
    self.assertGreater(float(jnp.abs(adv).min(where=mask1 > 0, initial=1.0)), 0.0)


if __name__ == "__main__":
  absltest.main()
