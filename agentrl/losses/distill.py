# pylint: disable=invalid-name
"""On-policy distillation (OPD) objectives on the student's own samples (docs/algorithms.md §14).

  * G-OPD / ExOPD (Yang et al., arXiv 2602.12125; RUCBM/G-OPD): the dense per-token reward
      r_t = λ (log π_T − log π_ref) − (log π_θ − log π_ref)
    on sampled tokens. λ = 1 is standard OPD, r_t = log π_T − log π_θ (π_ref cancels and is
    not read); λ > 1 extrapolates (ExOPD; the released scripts use λ = 1.25), 0 < λ < 1
    interpolates. `opd_advantage` gives r_t as a stop-gradient advantage for
    `policy.ppo_clip` (the official code replaces the GRPO advantage by it); `opd_loss` is
    the REINFORCE form −sg(r_t)·log π_θ (OPSD's "tinker loss").
  * Full-distribution KL: `distill_kl_loss` masks (and weights) the per-token KL that
    `kernels.logprob.kl.distill_kl` computes from both models' hidden states.
  * OPSD (Zhao et al., arXiv 2601.18734; siyan-zhao/OPSD): the teacher is the same model with
    privileged context (e.g. a reference solution) in its prompt. `privileged_teacher_inputs`
    builds the teacher's token/position/mask arrays from the student's rows and the context;
    `align_to_student` brings teacher-side per-token arrays back to the student's columns.
  * PW-OPSD (Liu et al., arXiv 2605.21606; SaFo-Lab/PW-OPSD): `position_weights`, an
    increasing weight of the token's relative position in its response.
  * KEPO (arXiv 2602.00400): distil only on rollouts whose reward reaches τ, or (the
    failed-rollout variant) only on the others: `quality_gate`, a row mask.
  * TCOD (Wang et al., arXiv 2604.24005; kokolerk/TCOD): the number of turns the student plays
    grows on a schedule (`tcod_turn_cap`; the backward variant's expert prefix:
    `tcod_b2f_start`).

Token functions take `[B, T]` arrays in the layout of `types.Batch` (column t scores token t)
and return exact zeros on masked tokens, whatever the masked entries hold. Losses return an
unreduced `[B, T]` loss and detached f32 metrics (docs/style.md C6); aggregate with
`aggregation.aggregate` (token-mean for OPD and OPSD, seq-mean-token-mean for PW-OPSD and TCOD,
as their code does).
"""
import math
from typing import NamedTuple

import chex
import jax
import jax.numpy as jnp

from agentrl.losses import common

Metrics = common.Metrics


def _reward(logp_BT, teacher_logp_BT, mask_BT, ref_logp_BT, lam):
  """r_t (unweighted, f32, detached, zero where masked) and the valid-token mask."""
  valid_BT = common.check(logp_BT, teacher_logp_BT, mask_BT)
  if not (isinstance(lam, (int, float)) and math.isfinite(lam)):
    raise ValueError(f"lam must be a finite Python number (static); got {lam!r}.")
  s_BT, t_BT = (jax.lax.stop_gradient(x).astype(jnp.float32) for x in (logp_BT, teacher_logp_BT))
  if lam == 1.0:
    # Standard OPD: the reference cancels exactly, so it is not read at all.
    r_BT = t_BT - s_BT
  else:
    if ref_logp_BT is None:
      raise ValueError(f"G-OPD with lam={lam} != 1 needs ref_logp_BT, the reference model's "
                       "log-probs of the sampled tokens (the student's initial weights; the "
                       "teacher's pre-RL base for the paper's reward correction).")
    chex.assert_equal_shape([logp_BT, ref_logp_BT])
    ref_BT = jax.lax.stop_gradient(ref_logp_BT).astype(jnp.float32)
    r_BT = lam * (t_BT - ref_BT) - (s_BT - ref_BT)
  return jnp.where(valid_BT, r_BT, 0.0), valid_BT


def _weighted(x_BT, weight_BT, valid_BT):
  if weight_BT is None:
    return x_BT
  chex.assert_equal_shape([x_BT, weight_BT])
  return jnp.where(valid_BT, x_BT * jax.lax.stop_gradient(weight_BT).astype(jnp.float32), 0.0)


def opd_advantage(logp_BT: jax.Array, teacher_logp_BT: jax.Array, mask_BT: jax.Array, *,
                  ref_logp_BT: jax.Array | None = None, lam: float = 1.0,
                  weight_BT: jax.Array | None = None) -> jax.Array:
  """G-OPD dense advantage `[B, T]`: `w_t · r_t` (module docstring), detached, 0 where masked.

  Args:
    logp_BT: the student's log-probs of its own sampled tokens. As a PPO advantage pass the
      rollout-time learner log-probs (`old_logp_BT`), as the official code does.
    teacher_logp_BT: the teacher's log-probs of the same tokens (for OPSD, aligned with
      `align_to_student`).
    mask_BT: loss mask (1 on policy tokens).
    ref_logp_BT: the reference's log-probs; needed only when lam != 1.
    lam: reward scale λ (static); 1 = OPD, 1.25 = the ExOPD runs.
    weight_BT: optional per-token weight (e.g. `position_weights`); detached.
  """
  r_BT, valid_BT = _reward(logp_BT, teacher_logp_BT, mask_BT, ref_logp_BT, lam)
  return _weighted(r_BT, weight_BT, valid_BT)


def opd_loss(logp_BT: jax.Array, teacher_logp_BT: jax.Array, mask_BT: jax.Array, *,
             ref_logp_BT: jax.Array | None = None, lam: float = 1.0,
             weight_BT: jax.Array | None = None) -> tuple[jax.Array, Metrics]:
  """On-policy G-OPD loss `L_t = −sg(w_t r_t) · log π_θ(y_t)` (`[B, T]`, 0 where masked).

  Its gradient is the REINFORCE estimate of ∇ E[Σ_t r_t] with r_t held fixed, which is how
  the G-OPD code (via PPO with ratio 1 on-policy) and OPSD's `use_tinker_loss` train. `logp_BT`
  is differentiated; r_t uses its detached value. Metrics: `opd_reward` (mean r_t over valid
  tokens, unweighted) and `opd_teacher_kl` (mean of log π_θ − log π_T: the sampled-token
  estimate of KL(π_θ || π_T)).
  """
  r_BT, valid_BT = _reward(logp_BT, teacher_logp_BT, mask_BT, ref_logp_BT, lam)
  adv_BT = _weighted(r_BT, weight_BT, valid_BT)
  loss_BT = jnp.where(valid_BT, -adv_BT * logp_BT.astype(jnp.float32), 0.0)
  gap_BT = logp_BT.astype(jnp.float32) - teacher_logp_BT.astype(jnp.float32)
  return loss_BT, {"opd_reward": common.stat_mean(r_BT, valid_BT),
                   "opd_teacher_kl": common.stat_mean(gap_BT, valid_BT)}


def distill_kl_loss(kl_BT: jax.Array, mask_BT: jax.Array, *,
                    weight_BT: jax.Array | None = None) -> tuple[jax.Array, Metrics]:
  """Full-distribution distillation loss `L_t = w_t · KL_t` (`[B, T]`, 0 where masked).

  `kl_BT` is `kernels.logprob.kl.distill_kl(...)` in the student's columns, laid out as
  `models.policy.token_logprobs` lays out log-probs: column t holds the KL of the
  distributions that predict token t (the student's hidden state at t − 1, the teacher's at
  `index_BT[:, t] − 1`), column 0 is 0. Forward KL for OPSD/PW-OPSD (β = 0), reverse for OPD;
  its gradient flows into the student. OPSD
  reduces with token-mean ("batchmean" over response tokens), PW-OPSD with
  seq-mean-token-mean. Metric: `distill_kl` (mean KL over valid tokens, unweighted).
  """
  chex.assert_rank(kl_BT, 2)
  chex.assert_equal_shape([kl_BT, mask_BT])
  valid_BT = mask_BT > 0
  kl_BT = jnp.where(valid_BT, kl_BT.astype(jnp.float32), 0.0)
  return _weighted(kl_BT, weight_BT, valid_BT), {"distill_kl": common.stat_mean(kl_BT,
                                                                                 valid_BT)}


def position_weights(mask_BT: jax.Array, *, w_min: float = 0.25, tau: float = 0.30,
                     s: float = 0.10) -> jax.Array:
  """PW-OPSD's per-token weight, f32 `[B, T]`, 0 where masked.

  SaFo-Lab/PW-OPSD `ea_opsd_trainer.py` (method pwopsd): with k the 1-based index of a token
  among its row's valid tokens and L their number, frac = max(k − 0.5, 0)/L and
  `w = w_min + (1 − w_min)·sigmoid((frac − tau)/max(s, 1e-6))`: late tokens keep weight ≈ 1,
  early ones fall to w_min. Defaults are the paper's "Moderate" schedule (0.25, 0.30, 0.10)
  of the released launchers. [INF]: in a multi-turn row, k and L count policy tokens only
  (the released code has one response per row), so tool/observation tokens do not shift it.
  """
  if not 0.0 <= w_min <= 1.0:
    raise ValueError(f"w_min must be in [0, 1]; got {w_min}.")
  chex.assert_rank(mask_BT, 2)
  m_BT = (mask_BT > 0).astype(jnp.float32)
  k_BT = jnp.cumsum(m_BT, axis=1) * m_BT
  frac_BT = jnp.maximum(k_BT - 0.5, 0.0) / jnp.maximum(m_BT.sum(1, keepdims=True), 1.0)
  w_BT = w_min + (1.0 - w_min) * jax.nn.sigmoid((frac_BT - tau) / max(s, 1e-6))
  return jnp.where(m_BT > 0, w_BT, 0.0)


def quality_gate(reward_B: jax.Array, *, tau: float = 1.0, keep: str = "success") -> jax.Array:
  """KEPO's row gate, f32 `[B]`: 1 where the rollout is distilled, else 0.

  keep="success": reward ≥ tau (KEPO's quality-gated distillation: dense teacher guidance
  only on high-quality rollouts); keep="failure": reward < tau (distil only where the student
  failed). Multiply the loss mask by `gate_B[:, None]`. [INF]: tau = 1.0 (no published value
  was found; with a 0/1 verifier it keeps exactly the correct rollouts).
  """
  if keep not in ("success", "failure"):
    raise ValueError(f"keep must be 'success' or 'failure'; got {keep!r}.")
  chex.assert_rank(reward_B, 1)
  passed_B = jnp.asarray(reward_B, jnp.float32) >= tau
  return (passed_B if keep == "success" else ~passed_B).astype(jnp.float32)


def tcod_turn_cap(step: int | jax.Array, *, every: int = 6, max_turns: int = 30) -> jax.Array:
  """TCOD-f2b: turns the student may play at training `step`, `min(1 + step // every, max)`.

  kokolerk/TCOD `TCOD_f2b_workflow._compute_distill_window`; the episode stops after that many
  turns (evaluation uses max_turns). Defaults: ALFWorld and ScienceWorld (every 6, 30 turns);
  WebShop uses every 4, 15 turns. Int32 scalar; `step` may be traced.
  """
  if every < 1 or max_turns < 1:
    raise ValueError(f"every and max_turns must be >= 1; got {every}, {max_turns}.")
  step = jnp.maximum(jnp.asarray(step, jnp.int32), 0)
  return jnp.minimum(1 + step // every, max_turns).astype(jnp.int32)


def tcod_b2f_start(step: int | jax.Array, num_expert_turns: int | jax.Array, *,
                   every: int = 5) -> jax.Array:
  """TCOD-b2f: expert turns replayed before the student takes over at `step`.

  `clip(E − 1 − step // every, 0, E − 1)` for an expert trajectory of E turns
  (kokolerk/TCOD `TCOD_b2f_workflow._linear_checkpoint_step`, every 5 for ALFWorld and
  ScienceWorld, 4 for WebShop): the student first plays only the last turn, then ever longer
  suffixes. 0 when E = 0. Int32; arguments may be traced.
  """
  if every < 1:
    raise ValueError(f"every must be >= 1; got {every}.")
  step = jnp.maximum(jnp.asarray(step, jnp.int32), 0)
  last = jnp.maximum(jnp.asarray(num_expert_turns, jnp.int32) - 1, 0)
  return jnp.clip(last - step // every, 0, last).astype(jnp.int32)


class TeacherInputs(NamedTuple):
  """The teacher's rows (width Tc + T) and their alignment with the student's columns."""
  tokens_BT: jax.Array       # int32: privileged context, then the student's kept tokens
  positions_BT: jax.Array    # int32: 0 at the first real token, 0 on padding
  input_mask_BT: jax.Array   # bool: real tokens
  index_BT: jax.Array        # int32 [B, T_student]: teacher column of each student column
  aligned_BT: jax.Array      # bool [B, T_student]: the student column has a teacher column


def privileged_teacher_inputs(tokens_BT: jax.Array, input_mask_BT: jax.Array,
                              response_start_B: jax.Array, context_BT: jax.Array,
                              context_mask_BT: jax.Array, *, keep_prompt: bool = True,
                              pad_id: int = 0) -> TeacherInputs:
  """OPSD's teacher view of the student's own trajectories (pure jnp; jit-able).

  Each teacher row is the row's privileged context (its `context_mask_BT` tokens, in order;
  left- or right-padded) followed by the student's tokens: the whole row with
  `keep_prompt=True` (privileged prefix + student prompt + response), or only the tokens
  from `response_start_B` on with `keep_prompt=False` (the context is the teacher's whole
  prompt, as OPSD's teacher prompt "problem + reference solution" replaces the student's).
  Student rows are right-padded (`types.Batch`); the response (with any tool/observation
  tokens) is copied unchanged, so the teacher scores exactly the student's tokens.

  Args:
    tokens_BT, input_mask_BT: the student's rows (`Batch.tokens_BT`, `Batch.input_mask_BT`).
    response_start_B: int32 column of each row's first response token (its prompt length,
      e.g. the first column with `turn_BT >= 0`).
    context_BT, context_mask_BT: the privileged tokens per row `[B, Tc]` and their mask.
    keep_prompt: keep the student's prompt after the context (see above).
    pad_id: token id written on padding.

  Returns:
    `TeacherInputs`. Teacher log-probs of the student's tokens: run the model on
    (tokens, positions, input_mask), then `align_to_student(logp, index_BT, aligned_BT)`.
    The teacher state predicting student token t is at teacher column `index_BT[:, t] − 1`.
  """
  chex.assert_rank([tokens_BT, input_mask_BT, context_BT, context_mask_BT], 2)
  chex.assert_equal_shape([tokens_BT, input_mask_BT])
  chex.assert_equal_shape([context_BT, context_mask_BT])
  B, T = tokens_BT.shape
  Tc = context_BT.shape[1]
  if Tc == 0:
    raise ValueError("context_BT has no columns: OPSD's teacher needs privileged context.")
  ctx_mask_BT = context_mask_BT.astype(bool)
  # Real context tokens first, in their order (a stable sort of the "is padding" flags).
  order_BT = jnp.argsort(~ctx_mask_BT, axis=1, stable=True)
  ctx_BT = jnp.take_along_axis(context_BT.astype(jnp.int32), order_BT, axis=1)
  c_B1 = ctx_mask_BT.sum(1, keepdims=True).astype(jnp.int32)
  n_B1 = input_mask_BT.astype(bool).sum(1, keepdims=True).astype(jnp.int32)
  lo_B1 = (jnp.zeros((B, 1), jnp.int32) if keep_prompt
           else jnp.asarray(response_start_B, jnp.int32).reshape(B, 1))
  offset_B1 = c_B1 - lo_B1
  # Teacher columns (width Tc + T): the context, then the student's kept tokens, then padding.
  tcol_1T = jnp.arange(Tc + T, dtype=jnp.int32)[None, :]
  from_ctx_BT = tcol_1T < c_B1
  src_BT = tcol_1T - offset_B1  # the student column each teacher column copies
  from_student_BT = ~from_ctx_BT & (src_BT >= lo_B1) & (src_BT < n_B1)
  copied_BT = jnp.take_along_axis(tokens_BT.astype(jnp.int32), jnp.clip(src_BT, 0, T - 1), 1)
  context_at_BT = jnp.take_along_axis(ctx_BT, jnp.clip(tcol_1T, 0, Tc - 1).repeat(B, 0), 1)
  teacher_tokens_BT = jnp.where(from_ctx_BT, context_at_BT,
                                jnp.where(from_student_BT, copied_BT, pad_id))
  teacher_mask_BT = from_ctx_BT | from_student_BT  # contiguous from column 0
  positions_BT = jnp.where(teacher_mask_BT, jnp.cumsum(teacher_mask_BT, axis=1) - 1, 0)
  col_1T = jnp.arange(T, dtype=jnp.int32)[None, :]
  aligned_BT = (col_1T >= lo_B1) & (col_1T < n_B1)
  index_BT = jnp.where(aligned_BT, col_1T + offset_B1, 0)
  return TeacherInputs(teacher_tokens_BT.astype(jnp.int32), positions_BT.astype(jnp.int32),
                       teacher_mask_BT, index_BT, aligned_BT)


def align_to_student(x_BT: jax.Array, index_BT: jax.Array, aligned_BT: jax.Array) -> jax.Array:
  """Gathers a teacher-layout array `[B, T_teacher, ...]` into the student's columns.

  Column t gets `x[:, index_BT[:, t]]` (pass `index_BT − 1` for arrays whose column j
  predicts token j + 1, e.g. hidden states); unaligned columns get exact zeros.
  """
  chex.assert_equal_shape([index_BT, aligned_BT])
  extra = (1,) * (x_BT.ndim - 2)
  idx = jnp.clip(index_BT, 0, x_BT.shape[1] - 1).reshape(index_BT.shape + extra)
  out = jnp.take_along_axis(x_BT, idx, axis=1)
  return jnp.where(aligned_BT.reshape(aligned_BT.shape + extra), out, jnp.zeros((), x_BT.dtype))
