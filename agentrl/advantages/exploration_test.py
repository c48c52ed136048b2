# pylint: disable=invalid-name
"""Tests for agentrl.advantages.exploration (G2RL features, novelty and scaler; MSSR's Beta
baseline).

References: a float64 NumPy transcription of the full [D, V] gradient sum_t h_t (e_y - p_t)^T
projected by the same R; jax.grad of the summed log-likelihood with respect to the unembedding
of a tiny `Transformer`; golden values by hand for the Beta posterior.
"""
from absl.testing import absltest
import chex
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.advantages import exploration
from agentrl.models import policy as policy_lib
from agentrl.models import transformer

jax.config.update("jax_numpy_rank_promotion", "raise")


def np_features(h, W, tokens, mask, R, temperature=1.0, per_token=True):
  """sum_t h_t (e_{y_t} - p_t)^T [D, V], projected: (.) @ R -> [D, k], flattened."""
  h, W, R = (np.asarray(x, np.float64) for x in (h, W, R))
  out = []
  for b in range(h.shape[0]):
    grad = np.zeros(W.shape)
    n = 0
    for t in range(h.shape[1]):
      if mask[b, t] <= 0:
        continue
      z = h[b, t] @ W / temperature
      p = np.exp(z - z.max())
      p /= p.sum()
      e = np.zeros(W.shape[1])
      e[tokens[b, t]] = 1.0
      grad += np.outer(h[b, t], e - p)
      n += 1
    if per_token:
      grad /= max(n, 1)
    out.append((grad @ R).reshape(-1))
  return np.stack(out)


def _tiny_model(vocab=11):
  cfg = transformer.Config(vocab=vocab, width=8, depth=1, heads=2, kv_heads=2, head_dim=4,
                           mlp=16, tie_embeddings=False, dtype=jnp.float32)
  return transformer.Transformer(cfg, rngs=nnx.Rngs(0))


class G2RLFeatureTest(absltest.TestCase):

  def test_sketch_is_fixed_gaussian(self):
    R = exploration.g2rl_sketch(500, sketch_dim=64, sketch_seed=0)
    chex.assert_shape(R, (500, 64))
    np.testing.assert_array_equal(R, exploration.g2rl_sketch(500, sketch_dim=64, sketch_seed=0))
    self.assertFalse(np.allclose(R, exploration.g2rl_sketch(500, sketch_dim=64, sketch_seed=1)))
    self.assertAlmostEqual(float(jnp.var(R)), 1 / 64, delta=0.1 / 64)

  def test_sketched_feature_matches_numpy_full_gradient(self):
    B, T, D, V, k = 3, 7, 5, 13, 4
    rng = np.random.default_rng(0)
    h = rng.normal(size=(B, T, D)).astype(np.float32)
    W = rng.normal(size=(D, V)).astype(np.float32)
    tokens = rng.integers(0, V, size=(B, T))
    mask = (rng.random((B, T)) < 0.6).astype(np.float32)
    mask[:, 0] = 0.0
    mask[2] = 0.0  # a row with no response token: feature 0
    R = np.asarray(exploration.g2rl_sketch(V, sketch_dim=k, sketch_seed=3))
    for temperature, per_token, chunk in ((1.0, True, 1024), (0.7, True, 4), (1.0, False, 5)):
      got = exploration.g2rl_features(h, W, tokens, mask, temperature=temperature,
                                      sketch_dim=k, sketch_seed=3, per_token=per_token,
                                      chunk_size=chunk)
      chex.assert_shape(got, (B, D * k))
      want = np_features(h, W, tokens, mask, R, temperature, per_token)
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(got[2], 0.0)

  def test_identity_sketch_is_the_exact_unembedding_gradient(self):
    model = _tiny_model()
    V = model.cfg.vocab
    rng = np.random.default_rng(1)
    tokens = jnp.asarray(rng.integers(0, V, size=(2, 6)), jnp.int32)
    positions = jnp.broadcast_to(jnp.arange(6), (2, 6))
    mask = jnp.asarray([[0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1]], jnp.float32)
    graphdef, params = nnx.split(model)

    def summed_logp(params, row):
      m = nnx.merge(graphdef, params)
      logp = policy_lib.token_logprobs(m, tokens[row:row + 1], positions[row:row + 1],
                                       impl="xla")
      return jnp.sum(logp * mask[row:row + 1])

    h = model.hidden(tokens, positions)
    h = jnp.pad(h[:, :-1], ((0, 0), (1, 0), (0, 0)))  # h at t - 1 predicts token t
    phi = exploration.g2rl_features(h, model.unembed_DV(), tokens, mask,
                                    sketch_VK=jnp.eye(V), per_token=False, chunk_size=3)
    for row in range(2):
      grad = jax.grad(summed_logp)(params, row)["lm_head_DV"][...]
      np.testing.assert_allclose(phi[row], np.asarray(grad).reshape(-1), rtol=1e-4, atol=1e-6)


class G2RLScaleTest(absltest.TestCase):

  def _phi(self, B=8, F=6, seed=0):
    return jnp.asarray(np.random.default_rng(seed).normal(size=(B, F)), jnp.float32)

  def test_novelty_golden(self):
    phi = jnp.asarray([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    c = 1 / np.sqrt(2)
    np.testing.assert_allclose(exploration.g2rl_novelty(phi, group_size=3),
                               [1 - c / 2, 1 - c / 2, 1 - c], rtol=1e-6)
    np.testing.assert_allclose(exploration.g2rl_novelty(phi, group_size=3, reduce="max"),
                               [1 - c, 1 - c, 1 - c], rtol=1e-6)
    with self.assertRaisesRegex(ValueError, "reduce"):
      exploration.g2rl_novelty(phi, group_size=3, reduce="min")
    with self.assertRaisesRegex(ValueError, "group_size must be >= 2"):
      exploration.g2rl_novelty(phi, group_size=1)

  def test_identical_rows_get_equal_novelty_and_all_equal_group_scale_one(self):
    phi = self._phi(B=8)
    phi = phi.at[1].set(phi[0])                         # two identical rows in group 0
    phi = phi.at[4:8].set(jnp.broadcast_to(phi[4], (4, 6)))  # group 1: all identical
    for reduce in ("mean", "max"):
      n = exploration.g2rl_novelty(phi, group_size=4, reduce=reduce)
      np.testing.assert_allclose(n[0], n[1], rtol=1e-6)
      s = exploration.g2rl_scale(n, group_size=4)
      np.testing.assert_allclose(s[0], s[1], rtol=1e-6)
      np.testing.assert_array_equal(s[4:], 1.0)
    reward = jnp.asarray([1.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.5])
    adv, scale, _ = exploration.g2rl_advantage(reward, phi, group_size=4)
    np.testing.assert_array_equal(scale[4:], 1.0)       # r' = r in the all-equal group
    np.testing.assert_array_equal(adv[4:], estimators.grpo(reward, group_size=4)[4:])

  def test_alpha_zero_is_grpo(self):
    phi, reward = self._phi(), jnp.asarray([1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 1.0, 0.0])
    adv, scale, _ = exploration.g2rl_advantage(reward, phi, group_size=4, alpha=0.0)
    np.testing.assert_array_equal(scale, 1.0)
    np.testing.assert_array_equal(adv, estimators.grpo(reward, group_size=4))

  def test_scale_within_bounds(self):
    n = jnp.asarray(np.random.default_rng(2).normal(size=32) * 5, jnp.float32)
    for alpha, bound in ((1.0, 0.5), (10.0, 0.2), (3.0, 0.9)):
      s = exploration.g2rl_scale(n, group_size=4, alpha=alpha, bound=bound)
      self.assertGreaterEqual(float(s.min()), 1 - bound - 1e-7)
      self.assertLessEqual(float(s.max()), 1 + bound + 1e-7)
    s = exploration.g2rl_scale(jnp.asarray([0.1, 0.3, 0.2, 0.2]), group_size=4)
    np.testing.assert_allclose(s, [0.9, 1.1, 1.0, 1.0], rtol=1e-6)  # alpha 1: centred n

  def test_group_permutation_equivariance(self):
    phi, reward = self._phi(), jnp.asarray([1.0, 0.0, 1.0, 1.0, 0.5, 0.0, 1.0, 1.0])
    perm = np.array([2, 0, 3, 1, 7, 4, 6, 5])  # within each group of 4
    for reduce in ("mean", "max"):
      adv, scale, nov = exploration.g2rl_advantage(reward, phi, group_size=4, reduce=reduce)
      adv_p, scale_p, nov_p = exploration.g2rl_advantage(reward[perm], phi[perm],
                                                         group_size=4, reduce=reduce)
      np.testing.assert_allclose(nov_p, nov[perm], rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(scale_p, scale[perm], rtol=1e-5, atol=1e-6)
      np.testing.assert_allclose(adv_p, adv[perm], rtol=1e-5, atol=1e-5)


class MSSRTest(absltest.TestCase):

  def test_golden_baseline_advantage_and_update(self):
    table = exploration.BetaTable(a_N=jnp.asarray([3.0, 1.0]), b_N=jnp.asarray([1.0, 1.0]))
    slot, reward = jnp.asarray([0, 1, -1]), jnp.asarray([1.0, 0.0, 1.0])
    base = exploration.beta_baseline(table, slot)
    np.testing.assert_allclose(base, [0.75, 0.5, 0.5])
    mask = jnp.ones((3, 4))
    adv = exploration.mssr_advantage(reward, base, jnp.zeros((3, 4)), mask, entropy_coef=0.1)
    np.testing.assert_allclose(adv[:, 0], [0.25, -0.5, 0.5])
    new = exploration.beta_update(table, slot, reward)
    np.testing.assert_allclose(new.a_N, [4.0, 1.0])
    np.testing.assert_allclose(new.b_N, [1.0, 2.0])

  def test_prior_and_duplicates(self):
    table = exploration.BetaTable.create(3, prior=2.0)
    np.testing.assert_allclose(exploration.beta_baseline(table, jnp.asarray([0, -1]), prior=2.0),
                               [0.5, 0.5])
    new = exploration.beta_update(table, jnp.asarray([1, 1, 2]), jnp.asarray([1.0, 1.0, 0.0]))
    np.testing.assert_allclose(new.a_N, [2.0, 4.0, 2.0])
    np.testing.assert_allclose(new.b_N, [2.0, 2.0, 3.0])

  def test_decay(self):
    table = exploration.BetaTable(a_N=jnp.asarray([4.0, 2.0]), b_N=jnp.asarray([2.0, 6.0]))
    new = exploration.beta_update(table, jnp.asarray([0]), jnp.asarray([1.0]), decay=0.5)
    np.testing.assert_allclose(new.a_N, [0.5 * 4 + 1, 2.0])   # the unvisited slot is kept
    np.testing.assert_allclose(new.b_N, [0.5 * 2, 6.0])

  def test_entropy_coef_zero_is_reward_minus_mean(self):
    rng = np.random.default_rng(0)
    reward = jnp.asarray([1.0, 0.0, 1.0, 0.0])
    base = jnp.asarray([0.75, 0.2, 0.5, 0.9])
    entropy = jnp.asarray(rng.random((4, 5)), jnp.float32)
    mask = jnp.asarray(rng.random((4, 5)) < 0.7, jnp.float32)
    adv = exploration.mssr_advantage(reward, base, entropy, mask, entropy_coef=0.0)
    np.testing.assert_array_equal(adv, estimators.broadcast_to_tokens(reward - base, mask))

  def test_entropy_shaping_golden_and_masked_tokens_zero(self):
    reward, base = jnp.asarray([1.0, 1.0, 0.0]), jnp.asarray([0.5, 0.5, 0.5])
    entropy = jnp.asarray([[9.0, 1.0, 1.0], [9.0, 2.0, 2.0], [9.0, 3.0, 3.0]])
    mask = jnp.asarray([[0, 1, 1], [0, 1, 1], [0, 1, 0]], jnp.float32)
    z = np.array([-1.0, 0.0, 1.0]) / np.sqrt(2 / 3)
    w = np.clip(1 + 0.1 * z, 0.5, 1.5)
    adv = exploration.mssr_advantage(reward, base, entropy, mask)
    np.testing.assert_allclose(adv[:, 1], np.array([0.5, 0.5, -0.5]) * w, rtol=1e-5)
    self.assertTrue(np.all(np.asarray(adv)[np.asarray(mask) == 0] == 0.0))
    big = exploration.mssr_advantage(reward, base, entropy, mask, entropy_coef=10.0,
                                     entropy_bound=0.5)
    np.testing.assert_allclose(big[:, 1], [0.25, 0.5, -0.75], rtol=1e-5)  # clipped to [.5, 1.5]

  def test_table_round_trips_through_a_state_pytree(self):
    table = exploration.beta_update(exploration.BetaTable.create(4),
                                    jnp.asarray([0, 2]), jnp.asarray([1.0, 0.0]), decay=0.9)
    leaves, treedef = jax.tree.flatten({"step": jnp.int32(3), "table": table})
    back = jax.tree.unflatten(treedef, [np.asarray(x) for x in leaves])["table"]
    self.assertIsInstance(back, exploration.BetaTable)
    np.testing.assert_array_equal(back.a_N, table.a_N)
    np.testing.assert_array_equal(back.b_N, table.b_N)
    jitted = jax.jit(exploration.beta_update)(back, jnp.asarray([1]), jnp.asarray([1.0]))
    np.testing.assert_allclose(jitted.a_N, [1.9, 2.0, 0.9, 1.0], rtol=1e-6)


if __name__ == "__main__":
  absltest.main()
