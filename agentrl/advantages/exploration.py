# pylint: disable=invalid-name
"""Exploration-driven reward and advantage shaping: G2RL and MSSR (docs/algorithms.md §13.9).

Neither paper has public code and only their abstracts were available: each abstract states
the mechanism, and every formula or default it does not give is ours, marked [INF] and a
keyword argument. Data for the loss, never differentiated.

- G2RL (Liang et al. 2025, arXiv 2512.15687, "Can LLMs Guide Their Own Exploration?
  Gradient-Guided RL for LLM Reasoning"): a sequence-level feature from the final layer's
  sensitivity, the gradient of the response's log-likelihood with respect to the unembedding
  (`g2rl_features`, sketched [INF]); its within-group cosine novelty (`g2rl_novelty`); a bounded
  multiplicative reward scaler (`g2rl_scale`), then GRPO's group advantage of the shaped reward
  (`g2rl_advantage`). alpha = 0 is exactly GRPO.
- MSSR (arXiv 2512.18215): single-rollout RLVR (G = 1) with a per-prompt Beta posterior of the
  success rate as the baseline (`BetaTable`, `beta_baseline`, `beta_update`) and an entropy-based
  advantage shaping (`mssr_advantage`). entropy_coef = 0 is the plain Beta-baseline advantage.
"""
import flax
import jax
import jax.numpy as jnp

from agentrl.advantages import estimators
from agentrl import types

REDUCTIONS = ("mean", "max")


# ---------------------------------------------------------------------------------------------
# G2RL: gradient-guided exploration.
# ---------------------------------------------------------------------------------------------
def g2rl_sketch(vocab: int, *, sketch_dim: int = 64, sketch_seed: int = 0) -> jax.Array:
  """The fixed Gaussian projection R [V, k] of the feature, entries N(0, 1/k) [INF].

  A function of (V, k, seed) only, so every step (and a resumed run) uses the same R.
  """
  key = jax.random.key(sketch_seed)
  return jax.random.normal(key, (vocab, sketch_dim), jnp.float32) / jnp.sqrt(sketch_dim)


def g2rl_features(h_BTD: jax.Array, unembed_DV: jax.Array, tokens_BT: jax.Array,
                  mask_BT: jax.Array, *, temperature: float = 1.0, softcap: float | None = None,
                  sketch_dim: int = 64, sketch_seed: int = 0,
                  sketch_VK: jax.Array | None = None, per_token: bool = True,
                  chunk_size: int = 1024) -> jax.Array:
  """G2RL's sequence feature [B, D*k]: the sketched unembedding gradient of each response.

  The gradient of a response's summed log-likelihood with respect to the unembedding W [D, V]
  is sum_t h_t (e_{y_t} - p_t)^T (times 1/temperature, which no cosine sees), p_t =
  softmax(logits_t / temperature). [INF] It is sketched by a fixed Gaussian R [V, k]
  (`g2rl_sketch`; k = `sketch_dim` = 64, seed `sketch_seed` = 0) into
  phi = sum_t h_t (x) R^T (e_{y_t} - p_t), flattened D-major to [D*k], and [INF] divided by the
  response's token count (`per_token`; False: the plain sum). Passing `sketch_VK` uses that R
  instead (R = identity: the exact gradient, flattened).

  h_BTD[:, t] is the final (normed) hidden state that predicts token t (`Transformer.hidden`
  shifted right by one, as `agentrl.models.policy.token_logprobs` pairs them: column 0 is never
  a response token); only tokens with mask_BT > 0 count, and a row without any gets 0. The
  softmax is computed in chunks of `chunk_size` token positions, so the [B*T, V] probabilities
  are never materialized at once. `softcap` (Gemma 2's final soft-cap) caps the logits before
  the softmax; [INF] the tanh's derivative is left out of the feature.
  """
  B, T, D = h_BTD.shape
  V = unembed_DV.shape[1]
  R_VK = (g2rl_sketch(V, sketch_dim=sketch_dim, sketch_seed=sketch_seed)
          if sketch_VK is None else jnp.asarray(sketch_VK, jnp.float32))
  h_ND = h_BTD.reshape(B * T, D)
  y_N = tokens_BT.reshape(B * T).astype(jnp.int32)
  N = B * T
  chunk = max(1, min(chunk_size, N))
  pad = -N % chunk
  h_CcD = jnp.pad(h_ND, ((0, pad), (0, 0))).reshape(-1, chunk, D)

  def sketched_probs(h_cD):
    logits_cV = jnp.einsum("cd,dv->cv", h_cD, unembed_DV.astype(h_cD.dtype),
                           preferred_element_type=jnp.float32)
    if softcap:
      logits_cV = softcap * jnp.tanh(logits_cV / softcap)
    p_cV = jax.nn.softmax(logits_cV / temperature, axis=-1)
    return p_cV @ R_VK                                      # R^T p_t, [c, k]

  pR_NK = jax.lax.map(sketched_probs, h_CcD).reshape(-1, R_VK.shape[1])[:N]
  u_BTK = (R_VK[y_N] - pR_NK).reshape(B, T, -1)             # R^T (e_y - p_t)
  w_BT = (mask_BT > 0).astype(jnp.float32)
  phi_BDK = jnp.einsum("btd,btk,bt->bdk", h_BTD.astype(jnp.float32), u_BTK, w_BT)
  if per_token:
    phi_BDK = phi_BDK / jnp.maximum(w_BT.sum(axis=1), 1.0)[:, None, None]
  return phi_BDK.reshape(B, -1)


def g2rl_novelty(phi_BF: jax.Array, *, group_size: int, reduce: str = "mean",
                 eps: float = 1e-12) -> jax.Array:
  """Within-group novelty [B] of G2RL's features: 1 - the cosine similarity to the others.

  Rows [i*G, (i+1)*G) are one group. reduce="mean" [INF]: n_i = 1 - mean_{j != i} cos(phi_i,
  phi_j); "max": 1 - max_{j != i} cos (novel only when far from every other response). A zero
  feature (no response token) has cosine 0 with everything. Needs G >= 2.
  """
  if reduce not in REDUCTIONS:
    raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}.")
  if group_size < 2:
    raise ValueError(f"G2RL's novelty compares the responses of a group: group_size must be "
                     f">= 2, got {group_size}.")
  B, F = phi_BF.shape
  if B % group_size:
    raise ValueError(f"batch of {B} rows is not a multiple of group_size={group_size}.")
  phi_PGF = phi_BF.astype(jnp.float32).reshape(-1, group_size, F)
  norm_PG1 = jnp.linalg.norm(phi_PGF, axis=-1, keepdims=True)
  unit_PGF = phi_PGF / jnp.maximum(norm_PG1, eps)
  cos_PGG = jnp.einsum("pif,pjf->pij", unit_PGF, unit_PGF)
  off_GG = ~jnp.eye(group_size, dtype=bool)
  if reduce == "mean":
    sim_PG = jnp.where(off_GG, cos_PGG, 0.0).sum(axis=-1) / (group_size - 1)
  else:
    sim_PG = jnp.where(off_GG, cos_PGG, -jnp.inf).max(axis=-1)
  return (1.0 - sim_PG).reshape(-1)


def g2rl_scale(novelty_B: jax.Array, *, group_size: int, alpha: float = 1.0,
               bound: float = 0.5) -> jax.Array:
  """G2RL's bounded multiplicative reward scaler [B].

  s_i = clip(1 + alpha (n_i - mean_group n), 1 - bound, 1 + bound) [INF: alpha 1, bound 0.5,
  centring on the group mean]. A group whose novelties are all equal (identical responses)
  gets exactly 1, and so does alpha = 0.
  """
  n_PG = types.grouped(novelty_B, group_size)
  s_PG = jnp.clip(1.0 + alpha * types.centre(n_PG), 1.0 - bound, 1.0 + bound)
  return s_PG.reshape(-1)


def g2rl_advantage(reward_B: jax.Array, phi_BF: jax.Array, *, group_size: int,
                   alpha: float = 1.0, bound: float = 0.5, reduce: str = "mean",
                   norm_by_std: bool = True) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(GRPO advantage [B] of the shaped reward r' = r s, the scaler s [B], the novelty n [B]).

  alpha = 0 gives s = 1 and exactly `estimators.grpo(reward_B)`.
  """
  novelty_B = g2rl_novelty(phi_BF, group_size=group_size, reduce=reduce)
  scale_B = g2rl_scale(novelty_B, group_size=group_size, alpha=alpha, bound=bound)
  shaped_B = reward_B.astype(jnp.float32) * scale_B
  adv_B = estimators.grpo(shaped_B, group_size=group_size, norm_by_std=norm_by_std)
  return adv_B, scale_B, novelty_B


# ---------------------------------------------------------------------------------------------
# MSSR: single-rollout RLVR with a Beta-conjugate baseline and entropy shaping.
# ---------------------------------------------------------------------------------------------
@flax.struct.dataclass
class BetaTable:
  """A Beta(a, b) posterior of each prompt slot's success rate (a pytree: keep it in the state).

  Slots come from the host (`length_rewards.PromptSlots`, or a training-set index); slot -1
  means "no slot": such rows read the prior mean and are never written.
  """
  a_N: jax.Array   # float32 [num_slots]
  b_N: jax.Array   # float32 [num_slots]

  @classmethod
  def create(cls, num_slots: int, *, prior: float = 1.0) -> "BetaTable":
    """Every slot at the prior Beta(prior, prior) [INF: 1, uniform]."""
    if num_slots < 1:
      raise ValueError(f"num_slots must be >= 1, got {num_slots}.")
    # Two buffers, not one shared: the train state that holds them is donated.
    return cls(a_N=jnp.full((num_slots,), prior, jnp.float32),
               b_N=jnp.full((num_slots,), prior, jnp.float32))


def beta_baseline(table: BetaTable, slot_B: jax.Array, *, prior: float = 1.0) -> jax.Array:
  """Posterior mean a / (a + b) [B] of each row's slot; the prior's mean (1/2) for slot -1.

  Read it before `beta_update` with the same batch: the baseline must not see its own reward.
  """
  valid_B = slot_B >= 0
  index_B = jnp.where(valid_B, slot_B, 0).astype(jnp.int32)
  a_B, b_B = table.a_N[index_B], table.b_N[index_B]
  return jnp.where(valid_B, a_B / (a_B + b_B), prior / (2.0 * prior))


def beta_update(table: BetaTable, slot_B: jax.Array, reward_B: jax.Array, *,
                decay: float = 1.0) -> BetaTable:
  """The conjugate update a <- decay a + sum r, b <- decay b + sum (1 - r) of the batch's slots.

  Rewards in [0, 1] (binary from the verifier; a fractional reward is a fractional count).
  [INF] `decay` = 1 (no forgetting) multiplies a and b of each slot the batch visits once per
  batch, before adding its rows' counts; slots the batch does not visit and rows with slot -1
  are left alone. A slot seen twice in one batch gets both rows' counts.
  """
  N = table.a_N.shape[0]
  valid_B = slot_B >= 0
  index_B = jnp.where(valid_B, slot_B, N).astype(jnp.int32)   # N: dropped by the scatter
  r_B = jnp.clip(reward_B.astype(jnp.float32), 0.0, 1.0)
  hit_N = jnp.zeros((N,), bool).at[index_B].set(True, mode="drop")
  ones_N = jnp.zeros((N,), jnp.float32)
  succ_N = ones_N.at[index_B].add(r_B, mode="drop")
  fail_N = ones_N.at[index_B].add(1.0 - r_B, mode="drop")
  keep_N = jnp.where(hit_N, decay, 1.0)
  return BetaTable(a_N=keep_N * table.a_N + succ_N, b_N=keep_N * table.b_N + fail_N)


def response_entropy_zscore(entropy_BT: jax.Array, mask_BT: jax.Array, *,
                            eps: float = 1e-6) -> jax.Array:
  """z [B]: the batch z-score of each response's mean token entropy (population std + eps).

  Rows without a response token get z = 0 and are left out of the mean and std.
  """
  w_BT = (mask_BT > 0).astype(jnp.float32)
  n_B = w_BT.sum(axis=1)
  has_B = n_B > 0
  mean_H_B = jnp.where(w_BT > 0, entropy_BT, 0.0).sum(axis=1) / jnp.maximum(n_B, 1.0)
  rows = jnp.maximum(has_B.sum(), 1)
  mu = jnp.where(has_B, mean_H_B, 0.0).sum() / rows
  var = jnp.where(has_B, jnp.square(mean_H_B - mu), 0.0).sum() / rows
  return jnp.where(has_B, (mean_H_B - mu) / (jnp.sqrt(var) + eps), 0.0)


def mssr_advantage(reward_B: jax.Array, baseline_B: jax.Array, entropy_BT: jax.Array,
                   mask_BT: jax.Array, *, entropy_coef: float = 0.1,
                   entropy_bound: float = 0.5, eps: float = 1e-6) -> jax.Array:
  """MSSR's token advantage [B, T]: A_i = r_i - b_i, shaped by the response's entropy.

  A'_{i,t} = A_i clip(1 + c z_i, 1 - m, 1 + m) on every response token, 0 elsewhere, with z_i
  the batch z-score of the response's mean token entropy under pi_old
  (`response_entropy_zscore`) [INF: the shaping's form, c = `entropy_coef` = 0.1,
  m = `entropy_bound` = 0.5]. c = 0 gives the plain Beta-baseline advantage r - b.
  """
  adv_B = reward_B.astype(jnp.float32) - baseline_B.astype(jnp.float32)
  z_B = response_entropy_zscore(entropy_BT, mask_BT, eps=eps)
  w_B = jnp.clip(1.0 + entropy_coef * z_B, 1.0 - entropy_bound, 1.0 + entropy_bound)
  return estimators.broadcast_to_tokens(adv_B * w_B, mask_BT)
