# pylint: disable=invalid-name
"""Test helpers for the surrogate losses (policy_test, sequence_test, covariance_test).

A hand-made golden batch, a random masked batch, finite differences, and the RL invariants
of docs/algorithms.md §7 written once as checks that raise AssertionError, so each test file runs
them over its own functions.
"""
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import aggregation
from agentrl.losses import policy as pg

LN = np.log
# Row 0: ratios (2, 0.5, 1.5), A = +1. Row 1: ratios (1.25, <masked>, 0.75), A = -1; its masked
# token carries a garbage log-prob. old_logp = -1 everywhere, so logp = -1 + ℓ.
MASK = jnp.array([[1., 1., 1.], [1., 0., 1.]])
ELL = np.array([[LN(2.), -LN(2.), LN(1.5)], [LN(1.25), 0., LN(0.75)]])
OLD = jnp.full((2, 3), -1.0)
LOGP = jnp.asarray(np.where(np.asarray(MASK) > 0, -1.0 + ELL, 40.0), jnp.float32)
ADV_B = jnp.array([1.0, -1.0])
ADV_BT = ADV_B[:, None]
RATIO_MEAN = 1.2  # mean of (2, 0.5, 1.5, 1.25, 0.75)
PPO_KL = -0.06818532


def random_batch(seed=0, scale=0.3, on_policy=False, garbage=7.0):
  """[4, 6] batch: holes (tool tokens), a masked prompt prefix, a fully masked row.

  Returns (logp, old, adv_BT, adv_B, mask), f32.
  """
  rng = np.random.default_rng(seed)
  mask = np.array([[1, 1, 0, 1, 1, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1],
                   [0, 1, 1, 0, 0, 1]], np.float32)
  old = -rng.uniform(0.1, 3.0, mask.shape)
  logp = old if on_policy else old + rng.normal(0.0, scale, mask.shape)
  logp = np.where(mask > 0, logp, garbage)
  adv_BT = rng.normal(0.0, 1.0, mask.shape)
  adv_B = rng.normal(0.0, 1.0, mask.shape[:1])
  return (jnp.asarray(logp, jnp.float32), jnp.asarray(old, jnp.float32),
          jnp.asarray(adv_BT, jnp.float32), jnp.asarray(adv_B, jnp.float32), jnp.asarray(mask))


def agg(loss, mask_BT, mode):
  """Aggregates a [B, T] loss, or a [B] loss over non-empty rows for mode "seq-mean"."""
  if mode == "seq-mean":
    return aggregation.aggregate(loss, mask_BT.sum(-1) > 0, "seq-mean")
  return aggregation.aggregate(loss, mask_BT, mode)


def grad(fn, logp, old, adv, mask, mode, **kw):
  """d aggregate(fn(logp, ...)) / d logp."""
  return jax.grad(lambda lp: agg(fn(lp, old, adv, mask, **kw)[0], mask, mode))(logp)


def jit_loss_and_grad(fn, mode, **kw):
  """One compiled (loss, aggregate, d aggregate/d logp): cheaper than eager on a new shape."""
  def f(logp, old, adv, mask):
    total = lambda lp: agg(fn(lp, old, adv, mask, **kw)[0], mask, mode)
    return fn(logp, old, adv, mask, **kw)[0], total(logp), jax.grad(total)(logp)
  return jax.jit(f)


def np_agg(loss, m, mode):
  """Float64 NumPy aggregation for the modes the references use."""
  rows = m.sum(-1) > 0
  if mode == "token-mean":
    return (loss * m).sum() / max(m.sum(), 1)
  if mode == "seq-mean-token-mean":
    return ((loss * m).sum(-1) / np.maximum(m.sum(-1), 1))[rows].sum() / max(rows.sum(), 1)
  return loss[rows].sum() / max(rows.sum(), 1)  # seq-mean


def fd_grad(f, x, h=1e-6):
  """Central finite differences of a float64 scalar function."""
  g = np.zeros_like(x)
  for idx in np.ndindex(*x.shape):
    e = np.zeros_like(x)
    e[idx] = h
    g[idx] = (f(x + e) - f(x - e)) / (2 * h)
  return g


def _require(cond, msg):
  if not cond:
    raise AssertionError(msg)


def check_against_reference(fn, np_fn, mode, seq_adv=False, frozen=False, np_kw=None, **kw):
  """JAX (f32) vs a float64 NumPy reference: per-element loss and the aggregated gradient.

  References with a stop-gradient split take `frozen` (the value of logp inside sg); finite
  differences with `frozen` held fixed then give the gradient the split defines.
  """
  logp, old, adv_BT, adv_B, mask = random_batch(seed=1)
  adv = adv_B if seq_adv else adv_BT
  loss, _ = fn(logp, old, adv, mask, **kw)
  g = grad(fn, logp, old, adv, mask, mode, **kw)
  lp, o, a, m = (np.asarray(x, np.float64) for x in (logp, old, adv, mask))
  np_kw = np_kw or {}
  ref = (lambda x, fz: np_fn(x, fz, o, a, m, **np_kw)) if frozen else (
      lambda x, fz: np_fn(x, o, a, m, **np_kw))
  np.testing.assert_allclose(loss, ref(lp, lp), rtol=1e-5, atol=1e-6)
  g_ref = fd_grad(lambda x: np_agg(ref(x, lp), m, mode), lp)
  np.testing.assert_allclose(g, g_ref, rtol=1e-5, atol=2e-7)
  _require(np.abs(g_ref).max() > 1e-3, "the comparison is between zeros")


def advantage(kind, adv_BT, adv_B):
  """The fixture advantage for `kind`: "token" [B, T], "seq" [B], "seq_bcast" [B, 1]."""
  return {"token": adv_BT, "seq": adv_B, "seq_bcast": adv_B[:, None]}[kind]


def check_masked_tokens_get_exactly_zero_gradient(fn, kind, mode, kw):
  """Garbage (NaN, −inf, huge) log-probs on masked tokens: gradient exactly 0 there."""
  for on_policy in (False, True):
    logp, old, adv_BT, adv_B, mask = random_batch(on_policy=on_policy)
    logp = logp.at[1, 0].set(jnp.nan).at[0, 2].set(-jnp.inf).at[3, 0].set(1e4)  # masked
    g = np.asarray(grad(fn, logp, old, advantage(kind, adv_BT, adv_B), mask, mode, **kw))
    mask_np = np.asarray(mask)
    np.testing.assert_array_equal(g[mask_np == 0], 0.0)
    _require(np.all(np.isfinite(g)), "non-finite gradient")
    if on_policy:  # nothing is clipped on-policy, so every policy token moves
      _require(np.all(g[mask_np == 1] != 0.0), "a policy token got no gradient on-policy")


def check_on_policy_gradient_is_reinforce(fn, kind, mode, kw):
  """At ratio 1 the gradient is REINFORCE's under the method's aggregation (seq-mean: per row)."""
  logp, old, adv_BT, adv_B, mask = random_batch(on_policy=True)
  adv = advantage(kind, adv_BT, adv_B)
  ref_adv = adv_B[:, None] if kind == "seq" else adv
  ref_mode = "seq-mean-token-mean" if mode == "seq-mean" else mode
  want = grad(pg.vanilla_pg, logp, old, ref_adv, mask, ref_mode)
  got = grad(fn, logp, old, adv, mask, mode, **kw)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
  _require(np.abs(np.asarray(want)).max() > 1e-2, "the comparison is between zeros")


def check_tool_token_insertion_changes_nothing(fn, mode, kw):
  """Two masked tool tokens inserted mid-response change neither the loss nor the gradient."""
  logp, old, _, _, _ = random_batch()
  p_logp, p_old, p_mask = logp[2:3, :4], old[2:3, :4], jnp.ones((1, 4))
  ins = lambda x, fill: jnp.concatenate([x[:, :2], jnp.full((1, 2), fill), x[:, 2:]], axis=1)
  i_logp, i_old, i_mask = ins(p_logp, 3.0), ins(p_old, -8.0), jnp.array([[1., 1., 0, 0, 1, 1]])
  keep = np.array([0, 1, 4, 5])
  adv = jnp.array([0.7]) if mode == "seq-mean" else jnp.array([[0.7]])
  run = jit_loss_and_grad(fn, mode, **kw)
  _, ref, g_ref = run(p_logp, p_old, adv, p_mask)
  _, got, g_got = run(i_logp, i_old, adv, i_mask)
  np.testing.assert_allclose(got, ref, rtol=1e-6)
  np.testing.assert_allclose(g_got[:, keep], g_ref, rtol=1e-6)
  np.testing.assert_array_equal(g_got[:, 2:4], 0.0)
  _require(np.abs(np.asarray(g_ref)).max() > 0.0, "the comparison is between zeros")
