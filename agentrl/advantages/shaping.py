# pylint: disable=invalid-name
"""Advantage and reward reshaping of the seed methods: data for the loss, never differentiated.

Grouped functions take rows [i*G, (i+1)*G) as prompt i's G samples, as
`agentrl.advantages.estimators` does; masked tokens are never read, and an all-equal group gives
exactly 0 (never NaN) except where the method gives it a signal on purpose (COPO's global term,
ProGRPO's re-weighting of groups with a success). Sources and formulas: docs/algorithms.md §13.

- HAPO (Liu et al. 2025, arXiv 2509.16591; code starriver030515/HAPO): the token-level group
  average, `hapo_group_token_advantage`. Its loss side is `losses.trust_region.hapo_ppo`.
- COPO (arXiv 2508.04138; code hijih/copo-code `verl/trainer/ppo/core_algos.py`): the answer
  entropy of a group (`answer_entropy`), the batch-standardised global consistency advantage
  (`copo_global_advantage`) and the entropy gate (`copo_local_weight`); the blended loss is
  `losses.consistency.copo_ppo`.
- RiskPO (Ren et al. 2025, arXiv 2510.00911; code RTkenny/RiskPO): the bundled mixed
  value-at-risk advantage, `riskpo_advantage`.
- ProGRPO / ARM (Li et al. 2026, arXiv 2602.05281; formula from a third-party review):
  `arm_advantage` with `lowest_fraction_mean` for the low-probability-token confidence.
- FAPO (Ding et al. 2025, arXiv 2510.22543; code volcengine/verl `recipe/fapo/reward_fn.py`):
  `fapo_reward`.
- ETR (arXiv 2601.03723): the group reward variance its trust region scales with,
  `group_reward_variance`.
"""
import math

import jax
import jax.numpy as jnp

from agentrl.advantages import estimators
from agentrl.losses import selection
from agentrl import types


def _per_row(x_P1: jax.Array, like_PG: jax.Array) -> jax.Array:
  return jnp.broadcast_to(x_P1, like_PG.shape).reshape(-1)


def group_reward_variance(reward_B: jax.Array, *, group_size: int) -> jax.Array:
  """Population variance of each row's group rewards, [B]: p (1 - p) for 0/1 rewards.

  ETR's macro-level signal (`losses.trust_region.etr_ppo(group_var_B=...)`); an all-equal
  group gives exactly 0.
  """
  r_PG = types.grouped(reward_B, group_size)
  d_PG = r_PG - r_PG.min(axis=1, keepdims=True)  # an all-equal group gives exactly 0
  var_P1 = jnp.square(d_PG - d_PG.mean(axis=1, keepdims=True)).mean(axis=1, keepdims=True)
  return _per_row(var_P1, r_PG)


# ---------------------------------------------------------------------------------------------
# HAPO: token-level group average.
# ---------------------------------------------------------------------------------------------
def hapo_group_token_advantage(reward_B: jax.Array, mask_BT: jax.Array, *, group_size: int,
                               norm_by_std: bool = True, eps: float = 1e-6,
                               fallback_threshold: float = 5.0,
                               count_padding: bool = False) -> jax.Array:
  """HAPO token-level group average advantage [B] (`compute_hapo_outcome_advantage`).

  Every response token carries its response's score, and the group is normalised over its
  tokens: with L_i the response length, mean = sum_i L_i R_i / sum_i L_i and std the
  population (ddof = 0) standard deviation over the tokens, A_i = (R_i - mean) / (std + eps)
  (no std with norm_by_std=False), so long responses weigh more, as in a token-mean loss.
  If any |A_i| of the group reaches `fallback_threshold` (5), the whole group falls back to
  GRPO's advantage (`estimators.grpo`, unbiased std). A group of one response gets 0 (its
  score is its own mean). Broadcast with `adv_B[:, None]`.

  [INF] deviation kept optional: the released check also sees the padding positions of the
  group's [G, T] block as score-0 tokens ((0 - mean) / (std + eps)), so whether a group
  falls back depends on the batch's padded width; `count_padding=True` reproduces that
  (a row has padding when L_i < T), the default checks response tokens only.
  """
  reward_PG = types.grouped(reward_B, group_size)
  if mask_BT.ndim != 2 or mask_BT.shape[0] != reward_B.shape[0]:
    raise ValueError(f"mask_BT must be [B, T] with B = {reward_B.shape[0]}; got {mask_BT.shape}.")
  length_PG = types.grouped((mask_BT > 0).sum(-1), group_size)
  total_P1 = jnp.maximum(length_PG.sum(axis=1, keepdims=True), 1.0)
  low_P1 = reward_PG.min(axis=1, keepdims=True)
  d_PG = reward_PG - low_P1  # exact zeros for an all-equal group
  mean_P1 = (length_PG * d_PG).sum(axis=1, keepdims=True) / total_P1
  centred_PG = d_PG - mean_P1
  std_P1 = jnp.sqrt((length_PG * jnp.square(centred_PG)).sum(axis=1, keepdims=True) / total_P1)
  scale_P1 = std_P1 + eps if norm_by_std else jnp.ones_like(std_P1)
  normed_PG = centred_PG / scale_P1
  too_big_PG = (length_PG > 0) & (jnp.abs(normed_PG) >= fallback_threshold)
  if count_padding:
    padded_PG = length_PG < mask_BT.shape[1]
    pad_value_P1 = jnp.abs(-(mean_P1 + low_P1) / scale_P1)
    too_big_PG |= padded_PG & (pad_value_P1 >= fallback_threshold)
  fallback_P1 = too_big_PG.any(axis=1, keepdims=True)
  grpo_PG = estimators.grpo(reward_B, group_size=group_size, norm_by_std=norm_by_std,
                            eps=eps).reshape(reward_PG.shape)
  adv_PG = jnp.where(fallback_P1, grpo_PG, normed_PG)
  return jnp.where(length_PG > 0, adv_PG, 0.0).reshape(-1)


# ---------------------------------------------------------------------------------------------
# COPO: global consistency reward and the entropy gate.
# ---------------------------------------------------------------------------------------------
def answer_entropy(answer_id_B: jax.Array, *, group_size: int) -> jax.Array:
  """Entropy in bits of each group's final-answer distribution, per row [B].

  `answer_id_B` are integer answer classes (equal ids = the same answer; build them on the host,
  e.g. with `agentrl.rewards.label_free.cluster_ids`; COPO counts a missing answer as one more
  class, the empty string). H = -sum_a p_a log2 p_a = -(1/G) sum_i log2(c_i / G), c_i the count
  of row i's answer in its group. COPO's `compute_entropy` adds 1e-8 inside the log, below
  float32 resolution at these values, so it is left out. 0 when all answers agree, log2 G
  when all differ.
  """
  if answer_id_B.ndim != 1 or group_size < 1 or answer_id_B.shape[0] % group_size:
    raise ValueError(f"Expected a [B] array with B divisible by group_size={group_size}; got "
                     f"shape {answer_id_B.shape}.")
  id_PG = answer_id_B.reshape(-1, group_size)
  count_PG = (id_PG[:, :, None] == id_PG[:, None, :]).sum(-1).astype(jnp.float32)
  h_P1 = -jnp.log2(count_PG / group_size).mean(axis=1, keepdims=True)
  return _per_row(h_P1, count_PG)


def copo_global_advantage(reward_B: jax.Array, answer_id_B: jax.Array, *, group_size: int,
                          entropy_coef: bool = False, norm_by_std: bool = True,
                          eps: float = 1e-6) -> jax.Array:
  """COPO's global advantage [B] (`compute_grpo_outcome_advantage_with_global`).

  Each prompt's global reward is its group's mean reward (the pass rate for 0/1 rewards),
  times (1 - lam H) with lam = (1 - 1/G) / log2 G when `entropy_coef` (the launchers'
  reward_coef_flg=false leaves it off); it is standardised across the prompts of the batch,
  (g - mean_P g) / (std_P g + eps) with the unbiased std, and copied to the prompt's rows.
  So a prompt whose G rollouts all agree still gets a signal relative to the other prompts.
  With one prompt the official code divides by a NaN std; here that gives 0.
  """
  reward_PG = types.grouped(reward_B, group_size)
  g_P = reward_PG.mean(axis=1)
  if entropy_coef and group_size > 1:
    lam = (1.0 - 1.0 / group_size) / math.log2(group_size)
    g_P = g_P * (1.0 - lam * answer_entropy(answer_id_B, group_size=group_size)[::group_size])
  if g_P.shape[0] == 1:
    return jnp.zeros_like(reward_B, dtype=jnp.float32)
  adv_P = estimators.grpo(g_P, group_size=g_P.shape[0], norm_by_std=norm_by_std, eps=eps)
  return _per_row(adv_P[:, None], reward_PG)


COPO_MODES = ("soft-with-zero", "only-soft", "only-zero", "only-global", "no-global")


def copo_local_weight(entropy_B: jax.Array, reward_B: jax.Array, *, k: float = 5.0,
                      b: float = 1.0, mode: str = "soft-with-zero") -> jax.Array:
  """COPO's per-row weight w of the local (GRPO) loss; the global loss gets 1 - w. [B].

  `global_flg` of `compute_policy_loss_with_global`: "soft-with-zero" (COPO, run_copo.sh)
  w = sigmoid(k (H - b)) [R != 0], so consistent groups (low answer entropy H, in bits) lean
  on the global term and a response with reward 0 uses the global term only; "only-soft" the
  sigmoid alone; "only-zero" [R != 0]; "only-global" 0; "no-global" 1 (GRPO). Defaults
  k = 5, b = 1 are run_copo.sh's (the function's own are 1 and 0.5). The official code reads
  R from `local_reward`, which it fills only when norm_adv_by_std_in_grpo is on (zeros
  otherwise); here R is always the reward passed.
  """
  if mode not in COPO_MODES:
    raise ValueError(f"Unknown COPO mode {mode!r}; use one of {COPO_MODES}.")
  soft_B = jax.nn.sigmoid(k * (entropy_B.astype(jnp.float32) - b))
  nonzero_B = (reward_B != 0).astype(jnp.float32)
  return {"soft-with-zero": lambda: soft_B * nonzero_B, "only-soft": lambda: soft_B,
          "only-zero": lambda: nonzero_B, "only-global": lambda: jnp.zeros_like(soft_B),
          "no-global": lambda: jnp.ones_like(soft_B)}[mode]()


# ---------------------------------------------------------------------------------------------
# RiskPO: bundled mixed value-at-risk advantage.
# ---------------------------------------------------------------------------------------------
RISKPO_CREDITS = ("uniform", "score", "std", "sum-mean")


def _linear_quantile(sorted_NG: jax.Array, level: float) -> jax.Array:
  """torch.quantile's default (linear) interpolation on sorted rows, [N, 1]."""
  pos = level * (sorted_NG.shape[1] - 1)
  lo, hi = math.floor(pos), math.ceil(pos)
  return (sorted_NG[:, lo] + (pos - lo) * (sorted_NG[:, hi] - sorted_NG[:, lo]))[:, None]


def _unbiased_std(x_NG: jax.Array) -> jax.Array:
  if x_NG.shape[1] == 1:
    return jnp.full(x_NG.shape[:1] + (1,), jnp.nan, jnp.float32)  # torch.std of one value
  return jnp.std(x_NG - x_NG.min(axis=1, keepdims=True), axis=1, ddof=1, keepdims=True)


def riskpo_advantage(reward_B: jax.Array, *, group_size: int, bundle_size: int = 5,
                     alpha_down: float = 0.2, alpha_up: float = 0.8, w_mix: float = 1.5,
                     mix_cvar: bool = True, natural_baseline: bool = False,
                     norm_by_std: bool = True, credit: str = "sum-mean",
                     eps: float = 1e-6) -> jax.Array:
  """RiskPO advantage [B] (`compute_grpo_bundle_rvar_outcome_advantage_quantile_tracking`).

  Consecutive `bundle_size` prompts form a bundle (the trainer's bundle_uid); "paper" g of a
  bundle is the g-th response to each of its questions and scores S = the sum of their
  rewards. Over the bundle's G papers: the alpha_down and alpha_up quantiles q_d, q_u (linear
  interpolation) and the unbiased std s (q_d = q_u = S, s = 1 for G = 1). Each paper gets
    a_RVaR = [(S - q_d)+ - (S - q_u)+ (+ q_d - q_u if natural_baseline)]
             / (alpha_up - alpha_down + eps),
    a = (w_mix a_CVaR + a_RVaR) / (w_mix + 1), a_CVaR = -(q_d - S)+ / (alpha_down + eps)
  (a = a_RVaR without `mix_cvar`), divided by s + eps when `norm_by_std`, and is assigned to
  its responses by `credit`: "uniform" (each gets a), "score" (0.5 a if R > 0 else 1.5 a),
  "std" (a / (s_q + eps), s_q the question's unbiased reward std, 1 if <= 1e-3) or
  "sum-mean" (a (R - mean_q R) / sum over the paper of (R - mean_q R), or a / bundle_size when
  that sum is within 1e-6 of 0).

  Defaults are run_qwen2.5_1.5b_MVaR_dapomath.sh (the paper's quantile levels 0.2 / 0.8,
  bundle 5, w_mix 1.5, sum-mean credit, no natural baseline); the MATH launcher uses
  alpha_up 0.9, credit "std" and natural_baseline=True. The released trainer also tracks
  quantiles by SGD, but only after the advantage step (for logging), so the advantage always
  uses the batch quantiles above. The number of prompts must be a multiple of bundle_size
  (the code lets a last bundle be smaller). An all-equal bundle gets exactly 0.
  """
  if credit not in RISKPO_CREDITS:
    raise ValueError(f"Unknown RiskPO credit {credit!r}; use one of {RISKPO_CREDITS}.")
  if not 0.0 <= alpha_down < alpha_up <= 1.0:
    raise ValueError(f"Need 0 <= alpha_down < alpha_up <= 1; got {alpha_down}, {alpha_up}.")
  reward_PG = types.grouped(reward_B, group_size)
  if bundle_size < 1 or reward_PG.shape[0] % bundle_size:
    raise ValueError(f"The number of prompts ({reward_PG.shape[0]}) must be a multiple of "
                     f"bundle_size={bundle_size}.")
  r_NQG = reward_PG.reshape(-1, bundle_size, group_size)
  paper_NG = r_NQG.sum(axis=1)
  if group_size == 1:
    q_down_N1 = q_up_N1 = paper_NG
    std_N1 = jnp.ones_like(paper_NG)
  else:
    sorted_NG = jnp.sort(paper_NG, axis=1)
    q_down_N1 = _linear_quantile(sorted_NG, alpha_down)
    q_up_N1 = _linear_quantile(sorted_NG, alpha_up)
    std_N1 = _unbiased_std(paper_NG)
  adv_NG = jnp.maximum(paper_NG - q_down_N1, 0.0) - jnp.maximum(paper_NG - q_up_N1, 0.0)
  if natural_baseline:
    adv_NG = adv_NG + q_down_N1 - q_up_N1
  adv_NG = adv_NG / (alpha_up - alpha_down + eps)
  if mix_cvar:
    cvar_NG = -jnp.maximum(q_down_N1 - paper_NG, 0.0) / (alpha_down + eps)
    adv_NG = (w_mix * cvar_NG + adv_NG) / (w_mix + 1.0)
  if norm_by_std:
    adv_NG = adv_NG / (std_N1 + eps)
  adv_NQG = jnp.broadcast_to(adv_NG[:, None, :], r_NQG.shape)
  if credit == "score":
    adv_NQG = adv_NQG * jnp.where(r_NQG > 0, 0.5, 1.5)
  elif credit == "std":
    q_std_NQ1 = _unbiased_std(r_NQG.reshape(-1, group_size)).reshape(r_NQG.shape[:2] + (1,))
    q_std_NQ1 = jnp.where(q_std_NQ1 > 1e-3, q_std_NQ1, 1.0)  # NaN (G = 1) also becomes 1
    adv_NQG = adv_NQG / (q_std_NQ1 + eps)
  elif credit == "sum-mean":
    dev_NQG = r_NQG - r_NQG.mean(axis=2, keepdims=True)
    total_N1G = dev_NQG.sum(axis=1, keepdims=True)
    share_NQG = dev_NQG / jnp.where(jnp.abs(total_N1G) > 1e-6, total_N1G, 1.0)
    adv_NQG = adv_NQG * jnp.where(jnp.abs(total_N1G) > 1e-6, share_NQG, 1.0 / bundle_size)
  return adv_NQG.reshape(-1)


# ---------------------------------------------------------------------------------------------
# ProGRPO (ARM) and FAPO.
# ---------------------------------------------------------------------------------------------
def lowest_fraction_mean(logp_BT: jax.Array, mask_BT: jax.Array, *,
                         fraction: float = 0.2) -> jax.Array:
  """Per-row mean log-prob over the ceil(fraction n_i) lowest-probability valid tokens, [B].

  ProGRPO's "low-probability token length normalisation" computes confidences on about the
  20% least likely positions [3P]; that this is the mean log-prob of those tokens is [INF].
  Rows without valid tokens give 0.
  """
  keep_BT = selection.top_fraction_mask(-logp_BT.astype(jnp.float32), mask_BT,
                                        fraction=fraction, scope="row")
  total_B = jnp.where(keep_BT > 0, logp_BT.astype(jnp.float32), 0.0).sum(-1)
  return total_B / jnp.maximum(keep_BT.sum(-1), 1.0)


def arm_advantage(adv_B: jax.Array, reward_B: jax.Array, prompt_conf_B: jax.Array,
                  answer_conf_B: jax.Array, *, group_size: int, alpha: float) -> jax.Array:
  """ProGRPO's Advantage Re-weighting Mechanism [B] (arXiv 2602.05281).

  A~_i = A_i if the group's rewards sum to 0, else A_i + alpha (c(q) - c(o_i | q)) [3P: a
  third-party review of the paper; no code was found]: rollouts the policy is already
  confident about lose advantage and under-explored ones gain. The confidences are inputs
  (e.g. `lowest_fraction_mean` of the prompt's and the answer's log-probs; their exact form is
  [INF]); alpha has no published default. alpha = 0 returns A (GRPO).
  """
  reward_PG = types.grouped(reward_B, group_size)
  for name, x in (("adv_B", adv_B), ("prompt_conf_B", prompt_conf_B),
                  ("answer_conf_B", answer_conf_B)):
    if x.shape != reward_B.shape:
      raise ValueError(f"{name} must have shape {reward_B.shape}; got {x.shape}.")
  silent_B = _per_row(reward_PG.sum(axis=1, keepdims=True) == 0, reward_PG)
  bonus_B = alpha * (prompt_conf_B.astype(jnp.float32) - answer_conf_B.astype(jnp.float32))
  return jnp.where(silent_B, adv_B.astype(jnp.float32), adv_B.astype(jnp.float32) + bonus_B)


def fapo_reward(correct_B: jax.Array, flawed_B: jax.Array, *, penalty: float = 1.0) -> jax.Array:
  """FAPO reward [B]: 1 for a correct answer, 1 - penalty for a flawed positive, -1 otherwise.

  As verl's recipe/fapo/reward_fn.py (`compute_score_fapo`, FLAWED_REWARD_PENALTY = 1.0): a
  generative reward model flags a correct rollout as a flawed positive when it locates an
  erroneous step. The penalty is "parameter-free" because group normalisation does the
  scheduling: with the default the flawed positive scores 0, above the group mean (reinforced)
  while wrong rollouts outnumber fully correct ones and below it (suppressed) afterwards.
  penalty = 0 is the plain +-1 verifiable reward. `flawed_B` is ignored where incorrect.
  """
  correct_B = jnp.asarray(correct_B).astype(bool)
  flawed_B = jnp.asarray(flawed_B).astype(bool)
  if correct_B.shape != flawed_B.shape or correct_B.ndim != 1:
    raise ValueError(f"fapo_reward expects two [B] arrays; got {correct_B.shape} and "
                     f"{flawed_B.shape}.")
  return jnp.where(correct_B, 1.0 - penalty * flawed_B.astype(jnp.float32), -1.0)
