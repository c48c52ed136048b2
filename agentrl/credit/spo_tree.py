# pylint: disable=invalid-name
"""SPO-tree: segment advantages from a tree of continuations (Guo et al. 2025, arXiv 2505.23564).

The tree variant of segment policy optimisation: a node's value is the mean of its children's
values (a leaf's is its score), and every token of a segment gets its node's value minus its
parent's, V(child) - V(parent): the segment's progress over the state it started from. Each
segment trains once, conditioned on its parent's text (`tree.owned_mask`), and like SPO-chain
only on its low-probability tokens, whitened (docs/algorithms.md §5.9; SPO-chain §5.5).

Official code: AIFrameResearch/SPO (read at commit b9fc6a2),
`src/treetune/inference_strategies/hybrid_inference_strategy.py` (`_construct_tree`: node
reward = mean of the children's rewards, reward_std = their population std),
`src/treetune/episode_generators/tree_episode_generator.py` (`extract_edges_from_tree`: one
training sample per edge), `src/treetune/episode_generators/hybrid_episode_generator.py`
(defaults `adv_method="rloo"`, `only_adv_greater_than_zero=True`),
`src/treetune/trainers/ppo_trainer.py` (`use_prob_mask`, `whiten_advantages`) and the launches
`configs/polIter_*_spo_tree_*.jsonnet`. Defaults [code]:
  * tree 6-6-6: 6 children per node at depths 0, 1, 2, a node is M more tokens (M = 30 for
    RhoMath-1.1B on GSM8K, 100 Qwen-0.5B GSM8K, 600 Qwen-1.5B MATH); the last level runs to
    the end (the rollout schedule: the caller's job);
  * `adv_method="rloo"`: A = V(child) - V(parent); "grpo" divides by the population std of
    the parent's children's values + 1e-8;
  * an edge whose advantage is exactly 0 is not trained (`only_adv_greater_than_zero`, which
    drops A + (BoK(V_c) - BoK(V_p)) == 0, the same edges for rewards in [0, 1]);
  * probability mask p < 0.9 (`use_prob_mask: true` in the tree launches, inherited from the
    chain configs) and whitening over the kept tokens (unbiased, 1e-8), as SPO-chain;
  * an on-policy replay buffer (edges up to 8 iterations old, at most 32 edges per question per
    iteration) selects the training edges: not reproduced (every edge of the batch trains).
"""
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.credit import spo
from agentrl.credit import tree as tree_lib
from agentrl.losses import aggregation

ADV_METHODS = ("rloo", "grpo")


def node_advantages(tree: tree_lib.Tree, reward_B, *, adv_method: str = "rloo",
                    eps: float = 1e-8) -> np.ndarray:
  """float64 [N]: V(n) - V(parent(n)) with V = `tree.child_mean` (0 at the group roots).

  `adv_method="grpo"` divides by std(V over the parent's children) + eps (population std).
  """
  if adv_method not in ADV_METHODS:
    raise ValueError(f"spo_tree: adv_method {adv_method!r}; choose one of {ADV_METHODS}.")
  value_N = tree_lib.child_mean(tree, reward_B)
  parent_N = tree.node_parent_N
  safe_parent_N = np.maximum(parent_N, 0)
  adv_N = np.where(parent_N >= 0, value_N - value_N[safe_parent_N], 0.0)
  if adv_method == "grpo":
    std_N = np.zeros(tree.num_nodes)
    for n in range(tree.num_nodes):
      kids = tree.children(n)
      if kids.size:
        std_N[n] = value_N[kids].std()
    adv_N = adv_N / (std_N[safe_parent_N] + eps)
  return adv_N


def segment_advantages(tree: tree_lib.Tree, reward_B, T: int, *, adv_method: str = "rloo",
                       drop_zero: bool = True) -> tuple[np.ndarray, np.ndarray]:
  """(adv_BT float32, keep_BT bool), host side: each owned token gets its node's advantage.

  keep_BT is the owned tokens (every segment trains once, on its owner row), less the
  segments whose advantage is exactly 0 with `drop_zero` [code]. adv_BT is 0 off keep_BT.
  """
  adv_BT = tree_lib.to_tokens(tree, node_advantages(tree, reward_B, adv_method=adv_method), T)
  keep_BT = tree_lib.owned_mask(tree, T)
  if drop_zero:
    keep_BT &= adv_BT != 0.0
  return np.where(keep_BT, adv_BT, 0.0).astype(np.float32), keep_BT


def token_advantages(adv_BT: jax.Array, keep_BT: jax.Array, logp_BT: jax.Array,
                     loss_mask_BT: jax.Array, *, prob_threshold: float = 0.9,
                     whiten: bool = True) -> jax.Array:
  """SPO-tree token advantages [B, T] (jax), nonzero only on the trained tokens.

  The trained tokens are `spo.probability_mask(logp_BT, loss_mask_BT * keep_BT)`: kept
  segments' sampled tokens with p < prob_threshold; use that mask as the policy loss mask.
  Whitening (unbiased, eps 1e-8) runs over the same tokens [code].

  Args:
    adv_BT, keep_BT: `segment_advantages`.
    logp_BT: the rollout policy's log-probs as the trainer recomputes them (`old_logp_BT`).
    loss_mask_BT: 1 on sampled tokens.
    prob_threshold: 0.9 [code].
    whiten: the trainer's `whiten_advantages=True` [code].
  """
  if not adv_BT.shape == keep_BT.shape == logp_BT.shape == loss_mask_BT.shape:
    raise ValueError(f"spo_tree.token_advantages: shapes differ: adv {adv_BT.shape}, keep "
                     f"{keep_BT.shape}, logp {logp_BT.shape}, mask {loss_mask_BT.shape}.")
  mask_BT = spo.probability_mask(logp_BT, loss_mask_BT * keep_BT.astype(loss_mask_BT.dtype),
                                 prob_threshold=prob_threshold)
  if whiten:
    return aggregation.masked_whiten(adv_BT, mask_BT)
  return jnp.where(mask_BT, adv_BT.astype(jnp.float32), 0.0)
