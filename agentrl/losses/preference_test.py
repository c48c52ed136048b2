# pylint: disable=invalid-name
"""Tests for agentrl.losses.preference."""
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import preference

jax.config.update("jax_numpy_rank_promotion", "raise")


def np_log_sigmoid(x):
  return -np.logaddexp(0.0, -x)


def np_dpo(pc, pr, rc, rr, beta, eps):
  """float64 reference (Rafailov et al. 2023, eq. 7; cDPO label smoothing)."""
  h = (pc - rc) - (pr - rr)
  return -(1 - eps) * np_log_sigmoid(beta * h) - eps * np_log_sigmoid(-beta * h)


def fd_grad(fn, args, i, h=1e-6):
  """Central difference of an elementwise float64 function w.r.t. argument i."""
  up = list(args)
  down = list(args)
  up[i] = args[i] + h
  down[i] = args[i] - h
  return (fn(*up) - fn(*down)) / (2 * h)


class BradleyTerryTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    loss, metrics = self.variant(preference.bradley_terry)(jnp.array([1.0, 0.0]),
                                                            jnp.array([0.0, 0.0]))
    np.testing.assert_allclose(loss, [-np_log_sigmoid(1.0), np.log(2.0)], rtol=1e-6)
    np.testing.assert_allclose(metrics["accuracy"], 0.5)
    np.testing.assert_allclose(metrics["margin"], 0.5)
    with_margin, _ = self.variant(functools.partial(preference.bradley_terry, margin=1.0))(
        jnp.array([1.0, 0.0]), jnp.array([0.0, 0.0]))
    np.testing.assert_allclose(with_margin, [np.log(2.0), -np_log_sigmoid(-1.0)], rtol=1e-6)

  def test_against_float64_reference(self):
    rng = np.random.default_rng(0)
    chosen, rejected = rng.normal(size=(2, 8)) * 3
    fn = lambda c, r: -np_log_sigmoid(c - r - 0.5)
    loss_fn = lambda c, r: preference.bradley_terry(c, r, margin=0.5)[0].sum()
    c32, r32 = jnp.asarray(chosen, jnp.float32), jnp.asarray(rejected, jnp.float32)
    np.testing.assert_allclose(preference.bradley_terry(c32, r32, margin=0.5)[0],
                               fn(chosen, rejected), rtol=1e-5)
    grads = jax.grad(loss_fn, argnums=(0, 1))(c32, r32)
    for i in range(2):
      np.testing.assert_allclose(grads[i], fd_grad(fn, (chosen, rejected), i), rtol=1e-5,
                                 atol=1e-6)


class DpoTest(chex.TestCase):

  ARGS = (jnp.array([-1.0]), jnp.array([-2.0]), jnp.array([-1.5]), jnp.array([-1.5]))

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # h = (-1 + 1.5) - (-2 + 1.5) = 1.
    loss, metrics = self.variant(functools.partial(preference.dpo, beta=0.1))(*self.ARGS)
    np.testing.assert_allclose(loss, [-np_log_sigmoid(0.1)], rtol=1e-6)
    np.testing.assert_allclose(metrics["reward_chosen"], 0.05, rtol=1e-6)
    np.testing.assert_allclose(metrics["reward_rejected"], -0.05, rtol=1e-6)
    np.testing.assert_allclose(metrics["margin"], 0.1, rtol=1e-6)
    np.testing.assert_allclose(metrics["accuracy"], 1.0)
    smooth, _ = self.variant(functools.partial(preference.dpo, beta=0.1, label_smoothing=0.1))(
        *self.ARGS)
    np.testing.assert_allclose(
        smooth, [-0.9 * np_log_sigmoid(0.1) - 0.1 * np_log_sigmoid(-0.1)], rtol=1e-6)
    ipo, _ = self.variant(functools.partial(preference.dpo, beta=0.1, ipo=True))(*self.ARGS)
    np.testing.assert_allclose(ipo, [(1.0 - 5.0) ** 2], rtol=1e-6)

  def test_against_float64_reference(self):
    rng = np.random.default_rng(1)
    args = tuple(rng.normal(-20.0, 5.0, size=8) for _ in range(4))
    args32 = tuple(jnp.asarray(a, jnp.float32) for a in args)
    for eps in (0.0, 0.2):
      fn = lambda *a, e=eps: np_dpo(*a, beta=0.3, eps=e)
      loss_fn = lambda *a, e=eps: preference.dpo(*a, beta=0.3, label_smoothing=e)[0]
      np.testing.assert_allclose(loss_fn(*args32), fn(*args), rtol=1e-5, atol=1e-6)
      grads = jax.grad(lambda *a: loss_fn(*a).sum(), argnums=(0, 1))(*args32)
      for i in range(2):
        np.testing.assert_allclose(grads[i], fd_grad(fn, args, i), rtol=1e-5, atol=1e-6)

  def test_stable_for_large_margins(self):
    big = (jnp.array([0.0]), jnp.array([-1e5]), jnp.array([0.0]), jnp.array([0.0]))
    loss, _ = preference.dpo(*big, beta=1.0)
    np.testing.assert_allclose(loss, [0.0], atol=1e-30)
    loss, _ = preference.dpo(big[1], big[0], big[2], big[3], beta=1.0)  # chosen/rejected swapped
    np.testing.assert_allclose(loss, [1e5], rtol=1e-6)  # -log sigmoid(-x) = x, finite

  def test_zero_loss_gradient_sign(self):
    # At the reference (h = 0) the gradient raises the chosen and lowers the rejected log-prob.
    grads = jax.grad(lambda c, r: preference.dpo(c, r, jnp.zeros(1), jnp.zeros(1))[0].sum(),
                     argnums=(0, 1))(jnp.zeros(1), jnp.zeros(1))
    np.testing.assert_allclose(grads[0], [-0.05], rtol=1e-6)
    np.testing.assert_allclose(grads[1], [0.05], rtol=1e-6)

  def test_bad_arguments_raise(self):
    with self.assertRaisesRegex(ValueError, "label_smoothing=0.7"):
      preference.dpo(*self.ARGS, label_smoothing=0.7)
    with self.assertRaisesRegex(ValueError, "ipo=True"):
      preference.dpo(*self.ARGS, label_smoothing=0.1, ipo=True)


class SequenceLogpTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed_with_nan_padding(self):
    logp = jnp.array([[-1.0, -2.0, jnp.nan], [-0.5, -jnp.inf, -jnp.inf], [0.0, 0.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    np.testing.assert_array_equal(self.variant(preference.sequence_logp)(logp, mask),
                                  [-3.0, -0.5, 0.0])
    mean = self.variant(functools.partial(preference.sequence_logp, average=True))(logp, mask)
    np.testing.assert_array_equal(mean, [-1.5, -0.5, 0.0])
    grad = jax.grad(lambda x: preference.sequence_logp(x, mask).sum())(logp)
    np.testing.assert_array_equal(grad, mask)


def np_sigmoid(x):
  return 1.0 / (1.0 + np.exp(-x))


def np_kto(policy, ref, desirable, policy_kl, ref_kl, beta=0.1, wd=1.0, wu=1.0):
  """float64 transcription of TRL `KTOTrainer._compute_loss` (loss_type "kto")."""
  kl = max(np.mean(policy_kl - ref_kl), 0.0)
  r = policy - ref
  return np.where(desirable, wd * (1 - np_sigmoid(beta * (r - kl))),
                  wu * (1 - np_sigmoid(beta * (kl - r))))


class KtoTest(chex.TestCase):

  ARGS = (jnp.array([-1.0, -2.0]), jnp.array([-1.5, -1.5]), jnp.array([True, False]),
          jnp.array([-3.0, -3.2]), jnp.array([-3.5, -3.4]))

  @chex.variants(with_jit=True, without_jit=True)
  def test_hand_computed(self):
    # z0 = mean(0.5, 0.2) = 0.35; r = (0.5, -0.5).
    loss, metrics = self.variant(preference.kto)(*self.ARGS)
    np.testing.assert_allclose(loss, [1 - np_sigmoid(0.1 * 0.15), 1 - np_sigmoid(0.1 * 0.85)],
                               rtol=1e-6)
    np.testing.assert_allclose(metrics["kl"], 0.35, rtol=1e-6)
    np.testing.assert_allclose(metrics["reward_chosen"], 0.05, rtol=1e-6)
    np.testing.assert_allclose(metrics["reward_rejected"], -0.05, rtol=1e-6)
    weighted, _ = self.variant(functools.partial(preference.kto, desirable_weight=2.0,
                                                 undesirable_weight=0.5))(*self.ARGS)
    np.testing.assert_allclose(weighted, loss * jnp.array([2.0, 0.5]), rtol=1e-6)

  def test_reference_point_is_clamped_and_detached(self):
    args = list(self.ARGS)
    args[3] = jnp.array([-4.0, -4.0])  # a negative KL estimate: z0 = 0
    loss, metrics = preference.kto(*args)
    np.testing.assert_allclose(metrics["kl"], 0.0)
    np.testing.assert_allclose(loss, [1 - np_sigmoid(0.05), 1 - np_sigmoid(0.05)], rtol=1e-6)
    g_kl = jax.grad(lambda x: preference.kto(*self.ARGS[:3], x, self.ARGS[4])[0].sum())(
        self.ARGS[3])
    np.testing.assert_array_equal(g_kl, 0.0)

  def test_against_float64_reference(self):
    rng = np.random.default_rng(2)
    policy, ref, policy_kl, ref_kl = (rng.normal(-30.0, 4.0, size=8) for _ in range(4))
    desirable = rng.uniform(size=8) > 0.4
    args32 = [jnp.asarray(x, jnp.float32) for x in (policy, ref)]
    kl32 = [jnp.asarray(x, jnp.float32) for x in (policy_kl, ref_kl)]
    fn = lambda p, r: np_kto(p, r, desirable, policy_kl, ref_kl, beta=0.3, wd=1.0, wu=1.33)
    loss_fn = lambda p, r: preference.kto(p, r, jnp.asarray(desirable), *kl32, beta=0.3,
                                          undesirable_weight=1.33)[0]
    np.testing.assert_allclose(loss_fn(*args32), fn(policy, ref), rtol=1e-5, atol=1e-6)
    grads = jax.grad(lambda *a: loss_fn(*a).sum(), argnums=(0, 1))(*args32)
    for i in range(2):
      np.testing.assert_allclose(grads[i], fd_grad(fn, (policy, ref), i), rtol=1e-4, atol=1e-7)
    self.assertGreater(float(jnp.abs(grads[0]).max()), 1e-3)

  def test_one_sided_batches_and_bad_beta(self):
    loss, metrics = preference.kto(*self.ARGS[:2], jnp.array([True, True]), *self.ARGS[3:])
    self.assertEqual(float(metrics["reward_rejected"]), 0.0)
    self.assertTrue(np.all(np.isfinite(loss)))
    with self.assertRaisesRegex(ValueError, "beta"):
      preference.kto(*self.ARGS, beta=0.0)


if __name__ == "__main__":
  absltest.main()
