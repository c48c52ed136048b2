# pylint: disable=invalid-name
"""Tests for agentrl.credit.spo_tree: hand-computed segment advantages, the jax token step
against a NumPy reference, the chain limits (independent samples; SPO-chain's segments), equal
outcomes and leaf order."""
import functools

from absl.testing import absltest
import chex
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.credit import spo
from agentrl.credit import spo_tree
from agentrl.credit import tree

jax.config.update("jax_numpy_rank_promotion", "raise")

# The hand tree of tree_test.py (n1 [0,3) r0 > n2 [3,4) r0 > {n3 [4,7) r0 > {n4 leaf 0,
# n7 leaf 2}, n5 [4,6) r1 > {n6 leaf 1, n8 leaf 3}}, n1 > n9 leaf 4).
PARENT, FORK, LENGTH = [-1, 0, 0, 1, 1], [0, 4, 7, 6, 3], [10, 8, 9, 9, 6]
REWARD = [1.0, 0.0, 0.0, 1.0, 0.0]
T = 12


def np_token_advantages(adv, keep, logp, mask, threshold=0.9, whiten=True):
  """NumPy reference: keep p < threshold on kept sampled tokens, whiten there (unbiased)."""
  on = (mask * keep > 0) & (np.exp(logp) < threshold)
  if not whiten:
    return np.where(on, adv, 0.0)
  x = adv[on]
  return np.where(on, (adv - x.mean()) / np.sqrt(x.var(ddof=1) + 1e-8), 0.0)


class NodeAdvantagesTest(absltest.TestCase):

  def test_hand_tree(self):
    t = tree.build(PARENT, FORK, LENGTH)
    # V by children: n3 = (1 + 0)/2, n5 = (0 + 1)/2, n2 = (.5 + .5)/2, n9 = 0,
    # n1 = (.5 + 0)/2 = .25, root = .25 (one child). A = V - V(parent):
    # n1 0, n2 .25, n3 0, n4 1 - .5, n5 0, n6 0 - .5, n7 -.5, n8 .5, n9 0 - .25.
    np.testing.assert_allclose(spo_tree.node_advantages(t, REWARD),
                               [0, 0, .25, 0, .5, 0, -.5, -.5, .5, -.25])
    # "grpo": / (population std of the parent's children + 1e-8): n1's children (.5, 0) have
    # std .25, n3's (1, 0) and n5's (0, 1) .5, n2's (.5, .5) 0, the root's single child 0.
    np.testing.assert_allclose(spo_tree.node_advantages(t, REWARD, adv_method="grpo"),
                               [0, 0, 1, 0, 1, 0, -1, -1, 1, -1], rtol=1e-6)

  def test_segments_train_once_and_zero_edges_drop(self):
    t = tree.build(PARENT, FORK, LENGTH)
    adv, keep = spo_tree.segment_advantages(t, REWARD, T)
    # Owned tokens less the zero-advantage nodes n1, n3, n5.
    want_keep = {0: [3, 7, 8, 9], 1: [6, 7], 2: [7, 8], 3: [6, 7, 8], 4: [3, 4, 5]}
    for b, cols in want_keep.items():
      np.testing.assert_array_equal(np.flatnonzero(keep[b]), cols)
    np.testing.assert_allclose(adv[0], [0, 0, 0, .25, 0, 0, 0, .5, .5, .5, 0, 0])
    np.testing.assert_allclose(adv[4, 3:6], [-.25] * 3)
    _, keep_all = spo_tree.segment_advantages(t, REWARD, T, drop_zero=False)
    np.testing.assert_array_equal(keep_all, tree.owned_mask(t, T))


class TokenAdvantagesTest(chex.TestCase):

  @chex.variants(with_jit=True, without_jit=True)
  def test_against_numpy(self):
    t = tree.build(PARENT, FORK, LENGTH)
    adv, keep = spo_tree.segment_advantages(t, REWARD, T)
    rng = np.random.default_rng(0)
    probs = np.where(rng.random((5, T)) < 0.6, rng.uniform(0.05, 0.89, (5, T)), 0.95)
    logp = np.log(probs).astype(np.float32)
    mask = (np.arange(T)[None, :] >= 2).astype(np.float32) * np.ones((5, 1), np.float32)
    for whiten in (True, False):
      fn = self.variant(functools.partial(spo_tree.token_advantages, whiten=whiten))
      got = fn(jnp.asarray(adv), jnp.asarray(keep), jnp.asarray(logp), jnp.asarray(mask))
      np.testing.assert_allclose(got, np_token_advantages(adv, keep, logp, mask, whiten=whiten),
                                 rtol=1e-5, atol=1e-6)

  def test_chain_with_mc_branches_matches_spo_chain(self):
    # SPO-chain on row 0 (prompt 0..1, response 2..11): cuts c = 3 and 7 are the states
    # tokens[:4] and tokens[:8]; in the tree, M = 2 Monte-Carlo branches fork at 4 and at 8.
    # With V(s_k) = the tree's value of the node ending at the cut, SPO-chain's segment
    # advantages V(s_k) - V(s_{k-1}) (score at the end, 0 before the first cut) are SPO-tree's.
    parent, fork = [-1, 0, 0, 0, 0], [0, 4, 4, 8, 8]
    reward = [1.0, 0.0, 1.0, 0.0, 0.0]
    t = tree.build(parent, fork, [12] * 5)
    value = tree.child_mean(t, reward)
    n_first, n_mid = t.path(0)[1], t.path(0)[2]   # row 0's [0,4) and [4,8)
    logp = np.log(np.r_[1.0, 1.0, np.tile([0.5, 0.95], 5)])[None, :].astype(np.float32)
    mask = (np.arange(T) >= 2)[None, :].astype(np.float32)
    chain = spo.chain_advantages(
        jnp.asarray([[value[n_first], value[n_mid]]], jnp.float32), jnp.array([[3, 7]]),
        jnp.array([[True, True]]), jnp.array([reward[0]]), jnp.asarray(logp),
        jnp.asarray(mask), whiten=False)
    adv, keep = spo_tree.segment_advantages(t, reward, T, drop_zero=False)
    got = spo_tree.token_advantages(jnp.asarray(adv[:1]), jnp.asarray(keep[:1]),
                                    jnp.asarray(logp), jnp.asarray(mask), whiten=False)
    np.testing.assert_allclose(got, chain, atol=1e-6)
    self.assertGreater(np.abs(np.asarray(chain)).sum(), 0)


class InvariantsTest(absltest.TestCase):

  def test_independent_samples(self):
    # No branch: the group root's children are the G leaves, A = r - mean (rloo) or
    # (r - mean) / (population std + 1e-8) (grpo); groups stay apart.
    reward = np.array([1.0, 0.0, 0.5, 0.0, 1.0, 1.0, 0.0, 0.25])
    t = tree.build([-1] * 8, [0] * 8, [3] * 8, group_B=[0] * 4 + [1] * 4)
    r = reward.reshape(2, 4)
    centred = (r - r.mean(1, keepdims=True)).reshape(-1)
    leaf = t.leaf_B
    np.testing.assert_allclose(spo_tree.node_advantages(t, reward)[leaf], centred)
    np.testing.assert_allclose(spo_tree.node_advantages(t, reward, adv_method="grpo")[leaf],
                               centred / (np.repeat(r.std(1), 4) + 1e-8))

  def test_identical_subtree_gets_zero_and_is_not_trained(self):
    t = tree.build(PARENT, FORK, LENGTH)
    reward = [1.0, 0.0, 0.0, 0.0, 1.0]   # n5's leaves 1 and 3 agree
    adv_N = spo_tree.node_advantages(t, reward)
    # Below n5 every value is 0: n6 and n8 get nothing; n5 itself still differs from n2.
    np.testing.assert_array_equal(adv_N[[6, 8]], 0.0)
    self.assertAlmostEqual(adv_N[5], -0.25)   # 0 - (.5 + 0)/2
    _, keep = spo_tree.segment_advantages(t, reward, T)
    np.testing.assert_array_equal(np.flatnonzero(keep[1]), [4, 5])   # n5 only
    self.assertFalse(keep[3].any())
    np.testing.assert_array_equal(spo_tree.node_advantages(t, [.3] * 5), 0.0)

  def test_leaf_order_does_not_matter(self):
    t = tree.build(PARENT, FORK, LENGTH)
    want = spo_tree.segment_advantages(t, REWARD, T)
    perm = np.array([3, 0, 4, 2, 1])
    inv = np.argsort(perm)
    parent = [int(inv[PARENT[p]]) if PARENT[p] >= 0 else -1 for p in perm]
    tp = tree.build(parent, np.asarray(FORK)[perm], np.asarray(LENGTH)[perm])
    got = spo_tree.segment_advantages(tp, np.asarray(REWARD)[perm], T)
    for g, w in zip(got, want):
      np.testing.assert_array_equal(g, w[perm])

  def test_bad_arguments(self):
    t = tree.build(PARENT, FORK, LENGTH)
    with self.assertRaisesRegex(ValueError, "adv_method"):
      spo_tree.node_advantages(t, REWARD, adv_method="ppo")
    with self.assertRaisesRegex(ValueError, "shapes differ"):
      spo_tree.token_advantages(jnp.zeros((1, 3)), jnp.zeros((1, 3), bool), jnp.zeros((1, 3)),
                                jnp.zeros((1, 4)))


if __name__ == "__main__":
  absltest.main()
