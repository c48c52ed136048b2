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

`cutpoints`, `mc_requests` (the Monte-Carlo prefix batch) and `mc_values` are host code (they
decide which MC rollouts to sample and average their scores); `chain_advantages` and
`probability_mask` are jax. Positions are column indices of the `[B, T]` arrays, so a cut at the
last prompt token stands for the state "prompt only" (the official -1).
"""
from collections.abc import Sequence
import dataclasses

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


@dataclasses.dataclass(frozen=True)
class MCRequests:
  """The Monte-Carlo prefix batch: N = M x (valid cuts) continuations to sample."""
  contexts: list[list[int]]   # row b's tokens[:c + 1]; the M copies of a cut are adjacent
  row_N: np.ndarray           # int32: the batch row (response) each context continues
  slot_N: np.ndarray          # int32: the cut's column k in cut_BK
  budget_N: np.ndarray        # int32: tokens the continuation may sample


def mc_requests(tokens: Sequence[Sequence[int]], cut_BK: np.ndarray, cut_valid_BK: np.ndarray,
                *, num_samples: int, end_B: Sequence[int]) -> MCRequests:
  """M continuation requests per valid cut (host), row-major over (b, k).

  The value of cut c is the mean score of M responses that share row b's first c + 1 tokens,
  so each request is the prefix tokens[b][:c + 1]. A continuation must finish the response
  under the response's own token budget: `end_B[b]` is the transcript length row b's response
  could reach (its prompt length + max_new_tokens, capped at max_len), and the request's
  budget is end_B[b] - (c + 1) (>= 1, since token c + 1 was sampled within the budget).
  Adjacent identical prefixes let the rollout engine prefill each one once.
  """
  cut_BK, cut_valid_BK = np.asarray(cut_BK), np.asarray(cut_valid_BK, bool)
  if cut_BK.shape != cut_valid_BK.shape or cut_BK.shape[0] != len(tokens) or (
      len(end_B) != len(tokens)) or num_samples < 1:
    raise ValueError(f"mc_requests expects [B, K] cuts and validity, B token rows and end_B "
                     f"entries and num_samples >= 1; got {cut_BK.shape}, {cut_valid_BK.shape}, "
                     f"{len(tokens)}, {len(end_B)}, num_samples={num_samples}.")
  b_N, k_N = np.nonzero(cut_valid_BK)   # row-major: a row's cuts in ascending order
  c_N = cut_BK[b_N, k_N]
  budget_N = np.asarray(end_B, np.int64)[b_N] - (c_N + 1)
  if np.any(budget_N < 1) or np.any(c_N + 1 > np.asarray([len(tokens[b]) for b in b_N],
                                                           np.int64)):
    raise ValueError("mc_requests: a cut lies past its row's tokens or budget (end_B).")
  contexts = [[int(t) for t in tokens[b][:c + 1]] for b, c in zip(b_N, c_N)
              for _ in range(num_samples)]
  rep = lambda x: np.repeat(x, num_samples).astype(np.int32)
  return MCRequests(contexts, rep(b_N), rep(k_N), rep(budget_N))


def mc_values(scores_N: np.ndarray, requests: MCRequests, shape: tuple[int, int]) -> np.ndarray:
  """float32 [B, K]: the mean score of each cut's continuations (V(s_k)); 0 at padding."""
  scores_N = np.asarray(scores_N, np.float64)
  if scores_N.shape != requests.row_N.shape:
    raise ValueError(f"mc_values: got scores of shape {scores_N.shape} for "
                     f"{requests.row_N.size} requests.")
  total, count = np.zeros(shape), np.zeros(shape)
  np.add.at(total, (requests.row_N, requests.slot_N), scores_N)
  np.add.at(count, (requests.row_N, requests.slot_N), 1.0)
  return (total / np.maximum(count, 1.0)).astype(np.float32)


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
