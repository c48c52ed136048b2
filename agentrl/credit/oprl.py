# pylint: disable=invalid-name
"""OPRL: online process reward learning for agents (Liu et al. 2025, arXiv 2509.19199).

An implicit process reward model pi_phi (a copy of the policy) is trained online, alternately
with the policy, by a trajectory-level DPO objective whose reference is the rollout policy
pi_old; its implicit step reward r_u = beta log pi_phi(a_u | h_u) / pi_old(a_u | h_u) turns the
trajectory preference into dense per-turn rewards that sum to the DPO score of the trajectory
(potential-based shaping). Turn advantages from these rewards are added to the episode
advantage from the outcome (docs/algorithms.md §5.6).

No official code was found. What the paper's abstract and third-party summaries state [abs]:
the DPO objective over (preferred, dispreferred) trajectory pairs built from outcome rewards,
the implicit step reward above (an action a_u is a whole turn, its log-prob the sum over the
turn's policy tokens), and "step-level advantages combined with episode-level advantages".
Reconstructed [INF], each a keyword: the pairs are every (i, j) of a prompt's group with
R_i > R_j; the episode advantage is GRPO's z-score; the step advantage z-scores the step
rewards over all turns of the prompt's G trajectories (a lone turn gets 0); the sum uses
weight `alpha` = 1. beta has no published default and must be given.
"""
import jax
import jax.numpy as jnp

from agentrl.advantages import estimators
from agentrl.credit import gigpo
from agentrl.losses import aggregation
from agentrl.losses import preference


def turn_sums(x_BT: jax.Array, turn_BT: jax.Array, loss_mask_BT: jax.Array, *,
              num_turns: int) -> tuple[jax.Array, jax.Array]:
  """Sum of x over each turn's policy tokens: (sums [B, U], turn mask [B, U])."""
  if x_BT.shape != turn_BT.shape or x_BT.shape != loss_mask_BT.shape or x_BT.ndim != 2:
    raise ValueError(f"turn_sums expects three [B, T] arrays; got {x_BT.shape}, "
                     f"{turn_BT.shape} and {loss_mask_BT.shape}.")
  turn_U = jnp.arange(num_turns)[None, None, :]
  in_turn_BTU = (turn_BT[:, :, None] == turn_U) & (loss_mask_BT > 0)[:, :, None]
  x_BT = jnp.where(loss_mask_BT > 0, x_BT.astype(jnp.float32), 0.0)
  sums_BU = jnp.einsum("bt,btu->bu", x_BT, in_turn_BTU.astype(jnp.float32))
  return sums_BU, in_turn_BTU.any(axis=1)


def implicit_step_reward(prm_logp_BT: jax.Array, old_logp_BT: jax.Array, turn_BT: jax.Array,
                         loss_mask_BT: jax.Array, *, num_turns: int,
                         beta: float) -> tuple[jax.Array, jax.Array]:
  """r_u = beta * sum over turn u's policy tokens of (log pi_phi - log pi_old): ([B, U], mask).

  The PRM's log-probs are data here (the reward is not differentiated).
  """
  diff_BT = jax.lax.stop_gradient(prm_logp_BT.astype(jnp.float32)) - old_logp_BT.astype(
      jnp.float32)
  sums_BU, mask_BU = turn_sums(diff_BT, turn_BT, loss_mask_BT, num_turns=num_turns)
  return beta * sums_BU, mask_BU


def preference_pairs(outcome_B: jax.Array, *,
                     group_size: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """All ordered pairs of a group with a strictly better first member [INF]: flat [B * G] each.

  Returns (chosen index, rejected index, valid); pair (i, j) of prompt p is entry
  p*G*G + i*G + j and is valid iff R_i > R_j. A group of equal outcomes has no pair.
  """
  if group_size < 1 or outcome_B.ndim != 1 or outcome_B.shape[0] % group_size:
    raise ValueError(f"Expected a [B] array with B divisible by group_size={group_size}; got "
                     f"shape {outcome_B.shape}.")
  G = group_size
  base_P11 = (jnp.arange(outcome_B.shape[0] // G) * G)[:, None, None]
  chosen_PGG = base_P11 + jnp.arange(G)[None, :, None] + jnp.zeros((1, 1, G), jnp.int32)
  rejected_PGG = base_P11 + jnp.arange(G)[None, None, :] + jnp.zeros((1, G, 1), jnp.int32)
  valid_PGG = outcome_B[chosen_PGG] > outcome_B[rejected_PGG]
  return chosen_PGG.reshape(-1), rejected_PGG.reshape(-1), valid_PGG.reshape(-1)


def prm_loss(prm_logp_BT: jax.Array, old_logp_BT: jax.Array, loss_mask_BT: jax.Array,
             outcome_B: jax.Array, *, group_size: int,
             beta: float) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Trajectory DPO loss of the PRM per pair, flat [B * G], 0 on non-pairs.

  -log sigmoid(beta [(log pi_phi - log pi_old)(tau+) - (log pi_phi - log pi_old)(tau-)]) with
  trajectory log-probs summed over policy tokens only (observation tokens are the
  environment's and cancel), via `losses.preference.dpo`. Reduce with
  `aggregation.masked_mean(loss_N, preference_pairs(...)[2])`.

  Returns:
    loss_N and metrics `prm_pairs` (number of pairs) and `prm_accuracy` (fraction of pairs
    whose preferred trajectory has the larger implicit reward).
  """
  chosen_N, rejected_N, valid_N = preference_pairs(outcome_B, group_size=group_size)
  policy_B = preference.sequence_logp(prm_logp_BT, loss_mask_BT)
  ref_B = jax.lax.stop_gradient(preference.sequence_logp(old_logp_BT, loss_mask_BT))
  loss_N, _ = preference.dpo(policy_B[chosen_N], policy_B[rejected_N], ref_B[chosen_N],
                             ref_B[rejected_N], beta=beta)
  margin_N = (policy_B - ref_B)[chosen_N] - (policy_B - ref_B)[rejected_N]
  metrics = {"prm_pairs": valid_N.sum().astype(jnp.float32),
             "prm_accuracy": aggregation.masked_mean((margin_N > 0).astype(jnp.float32),
                                                     valid_N)}
  return jnp.where(valid_N, loss_N, 0.0), jax.lax.stop_gradient(metrics)


def oprl_advantage(outcome_B: jax.Array, step_reward_BU: jax.Array, turn_mask_BU: jax.Array, *,
                   group_size: int, alpha: float = 1.0, step_norm: str = "group",
                   eps: float = 1e-6) -> jax.Array:
  """Per-turn advantage [B, U]: A_episode + alpha * A_step [INF form]; 0 on absent turns.

  A_episode is `estimators.grpo` of the outcome; A_step z-scores `step_reward_BU` (from
  `implicit_step_reward`), unbiased std, eps 1e-6, over the turns of one step group [INF]:
  `step_norm="group"` pools every valid turn of the prompt's group; `"turn"` pools one turn
  index of the prompt's group (GiGPO's and MatchTIR's (prompt, turn) groups), so a group of
  identical trajectories gets exactly zero. A turn alone in its step group gets 0.
  """
  B, U = step_reward_BU.shape
  if turn_mask_BU.shape != (B, U) or outcome_B.shape != (B,):
    raise ValueError(f"oprl_advantage shapes disagree: outcome {outcome_B.shape}, step reward "
                     f"{step_reward_BU.shape}, turn mask {turn_mask_BU.shape}.")
  if step_norm not in ("group", "turn"):
    raise ValueError(f"step_norm={step_norm!r}: use 'group' or 'turn'.")
  episode_B = estimators.grpo(outcome_B, group_size=group_size, eps=eps)
  prompt_BU = jnp.broadcast_to((jnp.arange(B) // group_size)[:, None], (B, U))
  segments = B // group_size
  if step_norm == "turn":
    prompt_BU, segments = prompt_BU * U + jnp.arange(U)[None, :], segments * U
  step_BU = gigpo.group_normalize(step_reward_BU.reshape(-1), prompt_BU.reshape(-1),
                                  turn_mask_BU.reshape(-1), num_segments=segments,
                                  norm_by_std=True, eps=eps, single="zero").reshape(B, U)
  return jnp.where(turn_mask_BU > 0, episode_B[:, None] + alpha * step_BU, 0.0)
