# pylint: disable=invalid-name
"""SPO-chain: segment policy optimisation with probability cut points (Guo et al. 2025,
arXiv 2505.23564).

A response is cut into segments at low-probability tokens; the value V(s) of the state after
each cut is a Monte-Carlo estimate (the mean score of fresh rollouts from that prefix), and
every token of the segment that ends at cut k gets A_k = V(s_k) - V(s_{k-1}) (the last segment
ends at the response's score). The *probability mask* keeps the advantage, and the policy loss,
only on low-probability tokens, where the decisions are (docs/algorithms.md §5.5).

Official code: AIFrameResearch/SPO (read at commit b9fc6a2),
`src/treetune/episode_generators/math_episode_generator_with_mc_advantages.py` (cut points and
the token advantages) and `src/treetune/trainers/ppo_trainer.py` (`use_prob_mask`). Defaults
[code]: a token is low-probability when exp(logp) < 0.9, logp being the rollout policy's log-prob
as the trainer recomputes it (`types.Batch.old_logp_BT`, not the sampler's own); the cut
point is the position *before* it (the prefix up to the previous token is the MC state); every
`interval`-th candidate is kept (`cutpoint_interval`, 5 by default, the README's "int5"); no cap
on the number of cuts; 9 MC rollouts per cut (`samples: 9`, the caller's job); advantages are
then whitened (unbiased, eps 1e-8) over the probability-masked tokens; the first segment, which
has no value before it unless the very first token is a cut, gets advantage 0.

`cutpoints` is host code (it decides which MC requests to send); `chain_advantages` and
`probability_mask` are jax. Positions are column indices of the `[B, T]` arrays, so a cut at the
last prompt token stands for the state "prompt only" (the official -1).
"""
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.losses import aggregation


def probability_mask(logp_BT: jax.Array, loss_mask_BT: jax.Array, *,
                     prob_threshold: float = 0.9) -> jax.Array:
  """Bool [B, T]: policy tokens with probability < threshold (the official `prob_mask`).

  Use it as the policy loss mask: the official trainer multiplies the action mask by it, so
  token-mean aggregation divides by the number of low-probability tokens.
  """
  return (loss_mask_BT > 0) & (jnp.exp(logp_BT.astype(jnp.float32)) < prob_threshold)


def cutpoints(logp_BT: np.ndarray, loss_mask_BT: np.ndarray, *, prob_threshold: float = 0.9,
              interval: int = 5, max_cuts: int | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Cut positions (host side): (cut_BK int32, valid_BK bool), padded to K.

  For every policy token t with exp(logp_t) < prob_threshold the candidate cut is t - 1 (the
  state just before the low-probability token); every `interval`-th candidate is kept, starting
  with the first. The value to estimate at cut c is V(tokens[:c + 1]). K is the largest count
  in the batch, or `max_cuts`, which keeps the first `max_cuts` (an option the official code
  has commented out). Padding is -1 with valid False.
  """
  logp_BT, loss_mask_BT = np.asarray(logp_BT), np.asarray(loss_mask_BT)
  if logp_BT.shape != loss_mask_BT.shape or logp_BT.ndim != 2 or interval < 1:
    raise ValueError(f"cutpoints expects two [B, T] arrays and interval >= 1; got "
                     f"{logp_BT.shape}, {loss_mask_BT.shape}, interval={interval}.")
  low_BT = (loss_mask_BT > 0) & (np.exp(logp_BT.astype(np.float64)) < prob_threshold)
  rows = [(np.flatnonzero(low) - 1)[::interval] for low in low_BT]
  if max_cuts is not None:
    rows = [r[:max_cuts] for r in rows]
  K = max((len(r) for r in rows), default=0) if max_cuts is None else max_cuts
  cut_BK = np.full((len(rows), K), -1, np.int32)
  valid_BK = np.zeros((len(rows), K), bool)
  for b, r in enumerate(rows):
    cut_BK[b, :len(r)] = r
    valid_BK[b, :len(r)] = True
  return cut_BK, valid_BK


def _segment_advantage_row(value_K, cut_K, valid_K, score, T):
  """Per token of one row: V(next boundary) - V(previous cut), or 0 before the first cut."""
  big = jnp.iinfo(jnp.int32).max
  cut_K = jnp.where(valid_K, cut_K, big)  # padding sorts last
  t_T = jnp.arange(T)
  n_before_T = jnp.searchsorted(cut_K, t_T, side="left")  # cuts strictly before t
  n_valid = valid_K.sum()
  ext_K1 = jnp.concatenate([value_K.astype(jnp.float32), jnp.zeros((1,), jnp.float32)])
  end_T = jnp.where(n_before_T < n_valid, ext_K1[jnp.minimum(n_before_T, n_valid)], score)
  start_T = ext_K1[jnp.maximum(n_before_T - 1, 0)]
  return jnp.where(n_before_T > 0, end_T - start_T, 0.0)


def chain_advantages(value_BK: jax.Array, cut_BK: jax.Array, cut_valid_BK: jax.Array,
                     score_B: jax.Array, logp_BT: jax.Array, loss_mask_BT: jax.Array, *,
                     prob_threshold: float = 0.9, whiten: bool = True) -> jax.Array:
  """SPO-chain token advantages [B, T], nonzero only on `probability_mask` tokens.

  Args:
    value_BK: MC value estimate at each cut (mean score of the rollouts from that prefix).
    cut_BK, cut_valid_BK: `cutpoints` output (ascending within a row).
    score_B: the response's own score, the value at its last token.
    logp_BT: the log-probs that chose the cuts (`types.Batch.old_logp_BT`).
    loss_mask_BT: 1 on response tokens.
    prob_threshold: 0.9 [code].
    whiten: whiten over the probability-masked tokens of the batch (the official trainer's
      default, `whiten_advantages=True`, with the unbiased variance).
  """
  B, T = logp_BT.shape
  if value_BK.shape != cut_BK.shape or cut_BK.shape != cut_valid_BK.shape or (
      value_BK.shape[:1] != (B,) or score_B.shape != (B,) or loss_mask_BT.shape != (B, T)):
    raise ValueError(f"chain_advantages shapes disagree: value {value_BK.shape}, cut "
                     f"{cut_BK.shape}, valid {cut_valid_BK.shape}, score {score_B.shape}, logp "
                     f"{logp_BT.shape}, mask {loss_mask_BT.shape}; expected [B, K] x3, [B], "
                     "[B, T] x2.")
  adv_BT = jax.vmap(_segment_advantage_row, in_axes=(0, 0, 0, 0, None))(
      value_BK, cut_BK.astype(jnp.int32), cut_valid_BK > 0, score_B.astype(jnp.float32), T)
  keep_BT = probability_mask(logp_BT, loss_mask_BT, prob_threshold=prob_threshold)
  if whiten:
    return aggregation.masked_whiten(adv_BT, keep_BT)  # exactly 0 off the mask
  return jnp.where(keep_BT, adv_BT, 0.0)
