# pylint: disable=invalid-name
"""SIOP: self-induced outcome potentials, turn rewards without a gold answer (arXiv 2605.04984).

"Self-Induced Outcome Potential" clusters the final answers of a prompt's G rollouts into
outcome modes, turns their frequencies into a target distribution q, and rewards each turn by
how much it raises the policy's likelihood of its own mode's answers. Everything follows the
authors' code, dl-m9/SIOP at commit a871ef90: `verl/utils/siop/siop_process_reward.py`
(`siop_cluster_pass`, `compute_siop_process_rewards`), `verl/utils/siop/nli_clustering.py`
and `verl/trainer/ppo/core_algos.py` (`compute_siop_turn_level_advantage`). Math and
defaults: docs/algorithms.md §5.

Host side (Python/NumPy, before packing): `answer_clusters` (one group's answers -> mode ids),
`cluster_references` (each rollout's reference answers and weights alpha), `target_distribution`
(each rollout's q(c)). Device side (JAX): `turn_rewards`, `turn_advantages`.

Clustering [INF: an offline substitute]: SIOP decides that two answers are the same mode by
bidirectional NLI entailment with microsoft/deberta-v2-xlarge-mnli (question prepended). That
model is not available offline, so the default here is exact match after SIOP's own answer
normalisation (`normalize_answer`, from its EM metric); pass `equivalent=` to use an NLI
judge. The greedy assignment is the official one whichever judge is used.

Defaults are the authors' launch settings (`train_siop.sh`): lambda = 0.5, eta = 1.0 (the
code's fallback is 0.0: no reliability calibration), 3 references per mode, gamma = 1.0.
"""
from collections.abc import Callable, Sequence
import math
import re
import string

import jax
import jax.numpy as jnp
import numpy as np

from agentrl.advantages import estimators
from agentrl.credit import pooling


def normalize_answer(text: str) -> str:
  """SIOP's EM normalisation: lower case, punctuation to spaces, whitespace collapsed."""
  text = text.lower()
  for punct in string.punctuation:
    text = text.replace(punct, " ")
  return re.sub(r"\s+", " ", text).strip()


def _same_normalized(a: str, b: str) -> bool:
  return normalize_answer(a) == normalize_answer(b)


def answer_clusters(answers: Sequence[str | None], *,
                    equivalent: Callable[[str, str], bool] | None = None) -> np.ndarray:
  """Outcome-mode ids [G] for one prompt's answers; -1 for a missing or empty answer.

  The official greedy pass: the first unassigned answer opens mode k (k = 0, 1, ... in order
  of appearance) and every later unassigned answer `equivalent` to it joins. The default
  `equivalent` is exact match after `normalize_answer`; SIOP's is bidirectional NLI
  entailment of "question answer" pairs, which a caller can pass in.
  """
  equivalent = equivalent or _same_normalized
  ids = np.full(len(answers), -1, np.int32)
  valid = [i for i, a in enumerate(answers) if a and a.strip()]
  next_id = 0
  for pos, i in enumerate(valid):
    if ids[i] >= 0:
      continue
    ids[i] = next_id
    for j in valid[pos + 1:]:
      if ids[j] < 0 and equivalent(answers[i], answers[j]):
        ids[j] = next_id
    next_id += 1
  return ids


def cluster_references(answers: Sequence[str | None], cluster_ids: np.ndarray, *,
                       num_refs: int = 3) -> tuple[list[list[str]], np.ndarray]:
  """Each rollout's reference answers and their weights alpha [B, num_refs] (one group).

  As `_pick_refs`: up to `num_refs` distinct (stripped) answers of the rollout's own mode, in
  rollout order, each with weight 1 / (number picked); a rollout without an answer gets none
  (weights 0). Score each reference's mean token log-prob for `turn_rewards`.
  """
  refs, weight_BR = [], np.zeros((len(answers), num_refs), np.float32)
  for i, cid in enumerate(cluster_ids):
    picked = []
    for j, other in enumerate(cluster_ids):
      text = (answers[j] or "").strip()
      if cid >= 0 and other == cid and text and text not in picked and len(picked) < num_refs:
        picked.append(text)
    refs.append(picked)
    weight_BR[i, :len(picked)] = 1.0 / len(picked) if picked else 0.0
  return refs, weight_BR


def _mode_evidence(evidence: np.ndarray, members: np.ndarray) -> float:
  """r_c: the mean evidence of the mode's rollouts that have one, 0 if none has."""
  values = evidence[members]
  values = values[np.isfinite(values)]
  return float(values.mean()) if values.size else 0.0


def target_distribution(cluster_ids: np.ndarray, *, group_size: int,
                        evidence: np.ndarray | None = None, eta: float = 1.0) -> np.ndarray:
  """q(c) of each rollout's mode [B]: the reliability-aware target distribution; 0 if no answer.

  Per prompt, with K the number of rollouts that gave an answer and m_c = |c| / K:
  q(c) = softmax_c(log(m_c + 1e-12) + eta * r_c), where r_c is the mean `evidence` of the
  mode's rollouts that have one (NaN = none; r_c = 0 if no member has one). SIOP's evidence
  for a rollout is the mean NLI entailment probability of its mode's reference answer
  (hypothesis) given each of its tool observations (premise, first 2000 characters).
  Without evidence, with eta = 0 or with a single mode, q(c) = m_c (the official code skips
  the calibration then). `cluster_ids` is [B], grouped.
  """
  ids = np.asarray(cluster_ids).reshape(-1)
  if group_size < 1 or ids.size % group_size:
    raise ValueError(f"target_distribution: {ids.size} rollouts do not split into groups of "
                     f"{group_size}.")
  evid = None if evidence is None else np.asarray(evidence, np.float64).reshape(-1)
  q = np.zeros(ids.size, np.float32)
  for start in range(0, ids.size, group_size):
    group = ids[start:start + group_size]
    modes = sorted({int(c) for c in group if c >= 0})
    members = {c: start + np.nonzero(group == c)[0] for c in modes}
    mass = {c: len(members[c]) / int((group >= 0).sum()) for c in modes}
    if evid is not None and eta > 0 and len(modes) > 1:
      logit = {c: math.log(mass[c] + 1e-12) + eta * _mode_evidence(evid, members[c])
               for c in modes}
      top = max(logit.values())
      norm = sum(math.exp(v - top) for v in logit.values())
      mass = {c: math.exp(logit[c] - top) / norm for c in modes}
    for c in modes:
      q[members[c]] = mass[c]
  return q


def _mixture_likelihood(ref_logp_XR: jax.Array, weight_BR: jax.Array) -> tuple[jax.Array,
                                                                               jax.Array]:
  """p_hat = sum_r alpha_r exp(mean log-prob_r) over the finite weighted entries, and whether
  there was one (the official code skips NaN/inf scores without renormalising alpha)."""
  shape = weight_BR.shape[:1] + (1,) * (ref_logp_XR.ndim - 2) + weight_BR.shape[1:]
  weight_XR = jnp.broadcast_to(weight_BR.reshape(shape), ref_logp_XR.shape)
  use_XR = jnp.isfinite(ref_logp_XR) & (weight_XR > 0)
  terms_XR = jnp.where(use_XR, jnp.exp(jnp.where(use_XR, ref_logp_XR, 0.0)), 0.0)
  return (terms_XR * weight_XR).sum(-1), use_XR.any(-1)


def turn_rewards(prompt_logp_BR: jax.Array, ref_logp_BUR: jax.Array, ref_weight_BR: jax.Array,
                 target_B: jax.Array, turn_mask_BU: jax.Array, *, lam: float = 0.5,
                 eps: float = 1e-8) -> jax.Array:
  """SIOP process rewards [B, U]: q(c) times the turn's log-likelihood gain, plus the terminal.

  Inputs are mean per-token log-probs of each reference answer r of the rollout's mode
  (`cluster_references`; scored as SIOP's pseudo-response "\\nNow there's enough information
  to answer\\n</think>\\n<answer>\\n{ref}\\n</answer><|im_end|>", the mean over the reference
  tokens only): `prompt_logp_BR` given the prompt alone (the k = -1 baseline),
  `ref_logp_BUR[:, k]` given the prompt and the response up to the end of assistant turn k
  (its tool call included, the observation that follows it excluded). With
  p_k = sum_r alpha_r exp(logp_{k,r}) (`ref_weight_BR`) and q = `target_B`:

    r_k = q (log(p_k + eps) - log(p_{k-1} + eps)),   r_last += (1 - lam) q.

  A rollout with a single turn gets only (1 - lam) q; a rollout without an answer (q = 0, no
  references) gets 0. As in the official code, a NaN/inf score is skipped (alpha is not
  renormalised) and a turn whose p_k or p_{k-1} has no finite term gets 0 before the terminal
  bonus. Invalid turns get 0.
  """
  if (turn_mask_BU.ndim != 2 or ref_logp_BUR.ndim != 3
      or ref_logp_BUR.shape[:2] != turn_mask_BU.shape
      or ref_weight_BR.shape != ref_logp_BUR.shape[::2]
      or prompt_logp_BR.shape != ref_weight_BR.shape or target_B.shape != turn_mask_BU.shape[:1]):
    raise ValueError(f"siop.turn_rewards shapes disagree: prompt_logp {prompt_logp_BR.shape}, "
                     f"ref_logp {ref_logp_BUR.shape}, ref_weight {ref_weight_BR.shape}, target "
                     f"{target_B.shape}, turn_mask {turn_mask_BU.shape}; expected [B, R], "
                     "[B, U, R], [B, R], [B], [B, U].")
  valid_BU = turn_mask_BU > 0
  U = turn_mask_BU.shape[1]
  weight_BR = ref_weight_BR.astype(jnp.float32)
  p_BU, ok_BU = _mixture_likelihood(ref_logp_BUR.astype(jnp.float32), weight_BR)
  p0_B, ok0_B = _mixture_likelihood(prompt_logp_BR.astype(jnp.float32), weight_BR)
  prev_BU = jnp.concatenate([p0_B[:, None], p_BU[:, :-1]], axis=1)
  prev_ok_BU = jnp.concatenate([ok0_B[:, None], ok_BU[:, :-1]], axis=1)
  # A rollout with no reference is skipped by the official code: no reward at all.
  q_B1 = jnp.where(weight_BR.sum(axis=1) > 0, target_B.astype(jnp.float32), 0.0)[:, None]
  gain_BU = q_B1 * (jnp.log(p_BU + eps) - jnp.log(prev_BU + eps))
  multi_turn_B1 = valid_BU.sum(axis=1, keepdims=True) >= 2
  gain_BU = jnp.where(ok_BU & prev_ok_BU & multi_turn_B1 & jnp.isfinite(gain_BU), gain_BU, 0.0)
  is_last_BU = jnp.arange(U)[None, :] == valid_BU.sum(axis=1, keepdims=True) - 1
  reward_BU = gain_BU + jnp.where(is_last_BU, (1.0 - lam) * q_B1, 0.0)
  return jnp.where(valid_BU, reward_BU, 0.0)


def turn_advantages(turn_reward_BU: jax.Array, turn_mask_BU: jax.Array, *, group_size: int,
                    gamma: float = 1.0, norm_by_std: bool = True,
                    eps: float = 1e-6) -> jax.Array:
  """SIOP advantages per turn [B, U]: one z-score over all of a group's turns, then returns.

  All valid (rollout, turn) rewards of a prompt's G rollouts form one pool: mean and unbiased
  std; a std below eps is replaced by 1; a pool of at most one reward gives the whole group 0.
  Then A_k = r~_k + gamma * A_{k+1} over the row's turns (every assistant turn is a boundary,
  zero rewards included). Broadcast with `agentrl.advantages.estimators.broadcast_turn_to_tokens`.
  """
  if (turn_reward_BU.ndim != 2 or turn_mask_BU.shape != turn_reward_BU.shape or group_size < 1
      or turn_reward_BU.shape[0] % group_size):
    raise ValueError(f"siop.turn_advantages expects matching [B, U] arrays with B a multiple of "
                     f"group_size={group_size}; got {turn_reward_BU.shape} and "
                     f"{turn_mask_BU.shape}.")
  B, U = turn_reward_BU.shape
  shape_PN = (B // group_size, group_size * U)
  centred_PN, count_P1, sumsq_P1 = pooling.centre(turn_reward_BU.reshape(shape_PN),
                                                  (turn_mask_BU > 0).reshape(shape_PN))
  if norm_by_std:
    std_P1 = jnp.sqrt(sumsq_P1 / jnp.maximum(count_P1 - 1.0, 1.0))
    centred_PN = centred_PN / (jnp.where(std_P1 < eps, 1.0, std_P1) + eps)
  normed_BU = jnp.where(count_P1 > 1, centred_PN, 0.0).reshape(B, U)
  return estimators.discounted_turn_returns(normed_BU, turn_mask_BU, gamma=gamma)
