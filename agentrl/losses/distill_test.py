# pylint: disable=invalid-name
"""Tests for agentrl.losses.distill (docs/algorithms.md §14)."""
import functools

from absl.testing import absltest
from absl.testing import parameterized
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import aggregation
from agentrl.losses import distill
from agentrl.losses import policy
from kernels.logprob import kl

jax.config.update("jax_numpy_rank_promotion", "raise")

# Row 0: three policy tokens; row 1: a masked (tool) token with garbage in every input.
MASK = jnp.array([[1.0, 1.0, 1.0], [1.0, 0.0, 1.0]])
S = jnp.array([[-1.0, -2.0, -0.5], [-1.5, 40.0, -3.0]])   # student log-probs
T = jnp.array([[-0.5, -2.5, -0.5], [-1.0, jnp.nan, -1.0]])  # teacher
R = jnp.array([[-2.0, -1.0, -1.5], [-1.5, jnp.inf, -2.0]])  # reference


def _np_official_reward(s, t, r, lam):
  """RUCBM/G-OPD dp_actor.py, single teacher: adv = −((S − R) − (T − R)·λ); λ = 1: T − S."""
  if lam == 1.0:
    return t - s
  return -((s - r) - (t - r) * lam)


class OpdRewardTest(chex.TestCase, parameterized.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  @parameterized.parameters(1.0, 1.25, 0.5)
  def test_golden_matches_official_formula(self, lam):
    fn = self.variant(functools.partial(distill.opd_advantage, lam=lam))
    adv = fn(S, T, MASK, ref_logp_BT=R)
    want = np.where(np.asarray(MASK) > 0, _np_official_reward(
        np.asarray(S), np.asarray(T), np.asarray(R), lam), 0.0)
    np.testing.assert_allclose(adv, want, rtol=1e-6)
    self.assertEqual(float(adv[1, 1]), 0.0)  # garbage (40, NaN, inf) never leaks

  def test_hand_computed_exopd(self):
    # S = −1, T = −0.5, R = −2, λ = 1.25: 1.25·(1.5) − 1 = 0.875; OPD (λ = 1): 0.5.
    args = (jnp.array([[-1.0]]), jnp.array([[-0.5]]), jnp.ones((1, 1)))
    self.assertAlmostEqual(float(distill.opd_advantage(*args, lam=1.25,
                                                       ref_logp_BT=jnp.array([[-2.0]]))[0, 0]),
                           0.875, places=6)
    self.assertEqual(float(distill.opd_advantage(*args)[0, 0]), 0.5)

  @parameterized.parameters(0.0, 1e30, -1e30, np.nan, np.inf)
  def test_lam_one_cancels_reference_exactly(self, ref_value):
    plain = distill.opd_advantage(S, T, MASK)
    with_ref = distill.opd_advantage(S, T, MASK, ref_logp_BT=jnp.full_like(S, ref_value),
                                     lam=1.0)
    np.testing.assert_array_equal(with_ref, plain)
    np.testing.assert_array_equal(plain, np.where(np.asarray(MASK) > 0, T - S, 0.0))

  @parameterized.parameters((1.0, False), (1.25, True))
  def test_teacher_equal_to_student_gives_zero_reward_and_gradient(self, lam, ref_is_student):
    # OPD: any reference. G-OPD with λ != 1 rewards (λ − 1)·log(π_θ/π_ref), zero only when the
    # reference is the student too (the paper's default reference is the student's init).
    logp = jnp.where(MASK > 0, S, 0.0)
    ref = logp if ref_is_student else R
    loss_fn = lambda lp: aggregation.aggregate(
        distill.opd_loss(lp, lp, MASK, ref_logp_BT=ref, lam=lam)[0], MASK, "token-mean")
    loss, grad = jax.value_and_grad(loss_fn)(logp)
    self.assertEqual(float(loss), 0.0)
    np.testing.assert_array_equal(grad, 0.0)
    np.testing.assert_array_equal(distill.opd_advantage(logp, logp, MASK, ref_logp_BT=ref,
                                                        lam=lam), 0.0)

  def test_loss_gradient_is_minus_reward_and_zero_when_masked(self):
    logp = jnp.where(MASK > 0, S, 0.0)
    grad = jax.grad(lambda lp: distill.opd_loss(lp, T, MASK, lam=1.0)[0].sum())(logp)
    np.testing.assert_allclose(grad, -distill.opd_advantage(logp, T, MASK), rtol=1e-6)
    self.assertEqual(float(grad[1, 1]), 0.0)

  def test_advantage_is_detached(self):
    grad = jax.grad(lambda lp, t: distill.opd_advantage(lp, t, MASK).sum(), (0, 1))(S, T)
    for g in grad:
      np.testing.assert_array_equal(g, 0.0)

  def test_reduces_to_ppo_with_the_opd_advantage(self):
    # On-policy PPO (old = current) with the G-OPD advantage has the loss's gradient (the
    # official code feeds the reward to PPO as the advantage).
    rng = np.random.default_rng(0)
    logp = jnp.asarray(-rng.uniform(0.1, 3.0, (4, 6)), jnp.float32)
    teacher = logp + jnp.asarray(rng.normal(0, 0.5, (4, 6)), jnp.float32)
    ref = logp + jnp.asarray(rng.normal(0, 0.5, (4, 6)), jnp.float32)
    mask = jnp.asarray(rng.integers(0, 2, (4, 6)), jnp.float32)
    adv = distill.opd_advantage(logp, teacher, mask, ref_logp_BT=ref, lam=1.25)
    ppo = jax.grad(lambda lp: aggregation.aggregate(
        policy.ppo_clip(lp, jax.lax.stop_gradient(lp), adv, mask)[0], mask, "token-mean"))(logp)
    opd = jax.grad(lambda lp: aggregation.aggregate(
        distill.opd_loss(lp, teacher, mask, ref_logp_BT=ref, lam=1.25)[0], mask,
        "token-mean"))(logp)
    np.testing.assert_allclose(ppo, opd, rtol=1e-5, atol=1e-7)

  def test_row_permutation_equivariance(self):
    perm = jnp.array([1, 0])
    adv = distill.opd_advantage(S, T, MASK, ref_logp_BT=R, lam=1.25)
    np.testing.assert_array_equal(
        distill.opd_advantage(S[perm], T[perm], MASK[perm], ref_logp_BT=R[perm], lam=1.25),
        adv[perm])

  def test_metrics_and_weights(self):
    w = distill.position_weights(MASK)
    loss, metrics = distill.opd_loss(S, T, MASK, weight_BT=w)
    r = np.asarray(T - S)[np.asarray(MASK) > 0]
    np.testing.assert_allclose(metrics["opd_reward"], r.mean(), rtol=1e-6)
    np.testing.assert_allclose(metrics["opd_teacher_kl"], -r.mean(), rtol=1e-6)
    np.testing.assert_allclose(loss, np.where(np.asarray(MASK) > 0,
                                              -np.asarray(w) * np.asarray(T - S) * S, 0.0),
                               rtol=1e-6)

  def test_bad_arguments_raise(self):
    with self.assertRaisesRegex(ValueError, "needs ref_logp_BT"):
      distill.opd_advantage(S, T, MASK, lam=1.25)
    with self.assertRaisesRegex(ValueError, "lam"):
      distill.opd_advantage(S, T, MASK, lam=jnp.float32(1.0))
    with self.assertRaises(AssertionError):  # chex shape check
      distill.opd_advantage(S, T[:, :2], MASK)


class DistillKLLossTest(absltest.TestCase):

  def test_masks_weights_and_reports_the_mean(self):
    kl_BT = jnp.array([[0.1, 0.2, 0.3], [0.4, jnp.nan, 0.6]])
    w = jnp.array([[1.0, 0.5, 2.0], [1.0, 1.0, 0.0]])
    loss, metrics = distill.distill_kl_loss(kl_BT, MASK, weight_BT=w)
    np.testing.assert_allclose(loss, [[0.1, 0.1, 0.6], [0.4, 0.0, 0.0]], rtol=1e-6)
    np.testing.assert_allclose(metrics["distill_kl"], (0.1 + 0.2 + 0.3 + 0.4 + 0.6) / 5,
                               rtol=1e-6)

  def test_fused_kl_of_identical_models_gives_zero_loss_and_gradient(self):
    # The OPSD teacher is the student itself; with identical inputs the KL and its gradient
    # through the fused op vanish exactly.
    k = jax.random.split(jax.random.key(0), 2)
    h_BTD = jax.random.normal(k[0], (2, 3, 8))
    w_DV = jax.random.normal(k[1], (8, 50)) / 4

    def loss(h, w):
      h_ND = h.reshape(6, 8)
      kl_BT = kl.distill_kl(h_ND, w, h_ND, w, impl="xla").reshape(2, 3)
      return aggregation.aggregate(distill.distill_kl_loss(kl_BT, MASK)[0], MASK, "token-mean")

    value, grads = jax.value_and_grad(loss, (0, 1))(h_BTD, w_DV)
    self.assertEqual(float(value), 0.0)
    for g in grads:
      np.testing.assert_array_equal(g, 0.0)


class PositionWeightsTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_golden_official_schedule(self):
    # SaFo-Lab/PW-OPSD ea_opsd_trainer.py (w_min, tau, s) = (0.25, 0.30, 0.10): for L = 4,
    # frac = (k − 0.5)/4 = 0.125, 0.375, 0.625, 0.875 and w = 0.25 + 0.75·σ((frac − 0.3)/0.1).
    mask = jnp.array([[1.0, 1.0, 1.0, 1.0, 0.0], [0.0, 1.0, 0.0, 1.0, 0.0]])
    w = self.variant(distill.position_weights)(mask)
    np.testing.assert_allclose(w[0, :4], [0.3610354, 0.7593840, 0.9720048, 0.9976205],
                               rtol=1e-6)
    # Holes (tool tokens) are skipped: the second row has L = 2, frac = 0.25, 0.75.
    np.testing.assert_allclose(w[1], [0.0, 0.5331555, 0.0, 0.9917598, 0.0], rtol=1e-6)
    self.assertEqual(float(w[0, 4]), 0.0)

  def test_increasing_and_empty_rows(self):
    mask = jnp.zeros((2, 64)).at[0].set(1.0)
    w = distill.position_weights(mask)
    self.assertTrue(np.all(np.diff(np.asarray(w[0])) >= 0))
    np.testing.assert_array_equal(w[1], 0.0)
    np.testing.assert_allclose(distill.position_weights(mask, w_min=1.0)[0], 1.0)
    with self.assertRaisesRegex(ValueError, "w_min"):
      distill.position_weights(mask, w_min=1.5)


class GatesAndSchedulesTest(parameterized.TestCase):

  def test_quality_gate(self):
    reward = jnp.array([1.0, 0.0, 0.5, 1.2])
    np.testing.assert_array_equal(distill.quality_gate(reward), [1.0, 0.0, 0.0, 1.0])
    np.testing.assert_array_equal(distill.quality_gate(reward, keep="failure"),
                                  [0.0, 1.0, 1.0, 0.0])
    np.testing.assert_array_equal(distill.quality_gate(reward, tau=0.5), [1.0, 0.0, 1.0, 1.0])
    with self.assertRaisesRegex(ValueError, "keep"):
      distill.quality_gate(reward, keep="all")

  def test_gated_rows_get_no_gradient(self):
    gate = distill.quality_gate(jnp.array([1.0, 0.0]))
    mask = MASK * gate[:, None]
    logp = jnp.where(MASK > 0, S, 0.0)
    grad = jax.grad(lambda lp: distill.opd_loss(lp, T, mask)[0].sum())(logp)
    np.testing.assert_array_equal(grad[1], 0.0)
    np.testing.assert_allclose(grad[0], -(T - S)[0], rtol=1e-6)

  @parameterized.parameters((0, 1), (5, 1), (6, 2), (173, 29), (174, 30), (10_000, 30))
  def test_tcod_turn_cap(self, step, want):
    # kokolerk/TCOD TCOD_f2b_workflow: 1 + step // checkpoint_steps, capped at max_env_steps.
    self.assertEqual(int(distill.tcod_turn_cap(step)), want)

  def test_tcod_schedules_traced_and_webshop(self):
    caps = jax.jit(jax.vmap(lambda s: distill.tcod_turn_cap(s, every=4, max_turns=15)))(
        jnp.arange(0, 80, 8))
    np.testing.assert_array_equal(caps, [1, 3, 5, 7, 9, 11, 13, 15, 15, 15])
    # TCOD_b2f_workflow._linear_checkpoint_step, 8 expert turns, checkpoint_steps 5.
    starts = [int(distill.tcod_b2f_start(s, 8)) for s in (0, 4, 5, 34, 35, 500)]
    self.assertEqual(starts, [7, 7, 6, 1, 0, 0])
    self.assertEqual(int(distill.tcod_b2f_start(3, 0)), 0)
    with self.assertRaisesRegex(ValueError, "every"):
      distill.tcod_turn_cap(1, every=0)


class PrivilegedTeacherInputsTest(parameterized.TestCase):
  # Row 0: prompt [11, 12], response [21, 22, 23]; row 1: prompt [13], response [24, 25 (tool),
  # 26]. Contexts: [91, 92] and [93] (left-padded in the second row).
  TOKENS = jnp.array([[11, 12, 21, 22, 23, 0], [13, 24, 25, 26, 0, 0]])
  INPUT_MASK = TOKENS > 0
  START = jnp.array([2, 1])
  CONTEXT = jnp.array([[91, 92], [0, 93]])

  def _build(self, keep_prompt):
    return jax.jit(functools.partial(distill.privileged_teacher_inputs, keep_prompt=keep_prompt,
                                     pad_id=0))(self.TOKENS, self.INPUT_MASK, self.START,
                                                self.CONTEXT, self.CONTEXT > 0)

  @parameterized.parameters(True, False)
  def test_rows_positions_and_alignment(self, keep_prompt):
    out = self._build(keep_prompt)
    if keep_prompt:
      want = [[91, 92, 11, 12, 21, 22, 23, 0], [93, 13, 24, 25, 26, 0, 0, 0]]
    else:
      want = [[91, 92, 21, 22, 23, 0, 0, 0], [93, 24, 25, 26, 0, 0, 0, 0]]
    np.testing.assert_array_equal(out.tokens_BT, want)
    np.testing.assert_array_equal(out.input_mask_BT, np.asarray(want) > 0)
    lengths = (np.asarray(want) > 0).sum(1)
    for b in range(2):
      np.testing.assert_array_equal(out.positions_BT[b, :lengths[b]], np.arange(lengths[b]))
      np.testing.assert_array_equal(out.positions_BT[b, lengths[b]:], 0)
    # Every aligned student column sees the same token, after context + the kept prefix.
    tokens, teacher = np.asarray(self.TOKENS), np.asarray(out.tokens_BT)
    context = [[91, 92], [93]]
    for b in range(2):
      lo = 0 if keep_prompt else int(self.START[b])
      for t in range(tokens.shape[1]):
        if not out.aligned_BT[b, t]:
          self.assertTrue(t < lo or tokens[b, t] == 0)
          continue
        j = int(out.index_BT[b, t])
        self.assertEqual(teacher[b, j], tokens[b, t])
        np.testing.assert_array_equal(teacher[b, :j], context[b] + list(tokens[b, lo:t]))

  def test_align_to_student(self):
    out = self._build(False)
    aligned = distill.align_to_student(out.tokens_BT, out.index_BT, out.aligned_BT)
    np.testing.assert_array_equal(aligned, np.where(out.aligned_BT, self.TOKENS, 0))
    # Rank 3 (hidden states): the state predicting token t sits at column index − 1.
    h_BTD = jnp.arange(2 * 8 * 3, dtype=jnp.float32).reshape(2, 8, 3)
    got = distill.align_to_student(h_BTD, out.index_BT - 1, out.aligned_BT)
    self.assertEqual(got.shape, (2, 6, 3))
    np.testing.assert_array_equal(got[0, 2], h_BTD[0, 1])  # first response token: context end
    np.testing.assert_array_equal(got[0, :2], 0.0)

  def test_no_context_raises(self):
    with self.assertRaisesRegex(ValueError, "privileged context"):
      distill.privileged_teacher_inputs(self.TOKENS, self.INPUT_MASK, self.START,
                                        jnp.zeros((2, 0), jnp.int32), jnp.zeros((2, 0), bool))


if __name__ == "__main__":
  absltest.main()
