# pylint: disable=invalid-name
"""SPA-RL: stepwise progress attribution (Wang et al. 2025, arXiv 2505.20732).

A progress estimator predicts a contribution c_u for every turn of a trajectory, trained so that
the contributions add up to the outcome; the dense reward of a turn is then c_u plus a grounding
signal (did the action execute), used with PPO after an SFT warm start (docs/algorithms.md §5.3).

Official code: WangHanLinHenry/SPA-RL-Agent (read at commit ed20087):
- `prm/train_our_progress_model.py` (`prm_model`): the estimator is the SFT policy with a
  `nn.Linear(vocab_size, 1)` on the LM *logits* at the last token of each assistant turn; the
  prediction of a trajectory is the sum of its turn values and the loss is `nn.MSELoss` against
  the final reward (`agent_final_reward`), i.e. the batch mean of (sum_u c_u - R)^2.
- `prm/rl_data_org.py`: grounding value 0.5 for a turn whose next observation does not contain
  "Nothing happens" (ALFWorld's failed-action message), 0 otherwise, and 0.5 for the last turn
  (it has no next observation); the PPO reward of a turn is its contribution + grounding value.

Here the head is any per-token scalar: `agentrl.models.heads.ValueHead(vocab)` applied to the
logits reproduces the official `Linear(V, 1)`; a head on the hidden states (width D) is the
cheaper variant [INF]. `turn_end_values` reads it at each turn's last policy token.
"""
import jax
import jax.numpy as jnp


def turn_end_values(x_BT: jax.Array, turn_BT: jax.Array, loss_mask_BT: jax.Array, *,
                    num_turns: int) -> tuple[jax.Array, jax.Array]:
  """x at the last policy token of each turn: (values [B, U], turn mask [B, U]).

  A turn's tokens are those with `turn_BT == u` and loss mask 1 (`types.Batch.turn_BT`; the
  official code finds the same positions as the ends of runs of unmasked assistant labels).
  Turns without policy tokens get value 0 and mask 0.
  """
  if x_BT.shape != turn_BT.shape or x_BT.shape != loss_mask_BT.shape or x_BT.ndim != 2:
    raise ValueError(f"turn_end_values expects three [B, T] arrays; got {x_BT.shape}, "
                     f"{turn_BT.shape} and {loss_mask_BT.shape}.")
  T = x_BT.shape[1]
  valid_BT = loss_mask_BT > 0
  in_turn_BTU = (turn_BT[:, :, None] == jnp.arange(num_turns)[None, None, :]) & (
      valid_BT[:, :, None])
  last_BU = jnp.where(in_turn_BTU, jnp.arange(T)[None, :, None], -1).max(axis=1)
  values_BU = jnp.take_along_axis(x_BT.astype(jnp.float32), jnp.maximum(last_BU, 0), axis=1)
  mask_BU = last_BU >= 0
  return jnp.where(mask_BU, values_BU, 0.0), mask_BU


def progress_loss(contribution_BU: jax.Array, turn_mask_BU: jax.Array,
                  outcome_B: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Per-trajectory estimator loss [B]: (sum_u m_u c_u - R)^2 (the official MSE, unreduced).

  The official loss is the batch mean of this (`nn.MSELoss`); aggregate with a mean over rows.
  Absent turns contribute nothing and get zero gradient.

  Returns:
    loss_B and metrics `progress_mae` (mean |sum c - R|) and `progress_within_0.1` (fraction
    of rows with |sum c - R| <= 0.1), the official evaluation's statistics.
  """
  if contribution_BU.shape != turn_mask_BU.shape or outcome_B.shape != contribution_BU.shape[:1]:
    raise ValueError(f"progress_loss shapes disagree: contribution {contribution_BU.shape}, "
                     f"turn_mask {turn_mask_BU.shape}, outcome {outcome_B.shape}; expected "
                     "[B, U], [B, U], [B].")
  total_B = jnp.where(turn_mask_BU > 0, contribution_BU.astype(jnp.float32), 0.0).sum(axis=1)
  err_B = total_B - outcome_B.astype(jnp.float32)
  metrics = {"progress_mae": jnp.abs(err_B).mean(),
             "progress_within_0.1": (jnp.abs(err_B) <= 0.1).astype(jnp.float32).mean()}
  return jnp.square(err_B), jax.lax.stop_gradient(metrics)


def dense_reward(contribution_BU: jax.Array, grounded_BU: jax.Array, turn_mask_BU: jax.Array, *,
                 grounding_weight: float = 0.5, contribution_weight: float = 1.0,
                 last_turn_grounded: bool = True) -> jax.Array:
  """SPA's per-turn reward [B, U]: w_c c_u + w_g g_u on valid turns, 0 elsewhere.

  Args:
    contribution_BU: the estimator's contributions (data here: not differentiated).
    grounded_BU: 1 where the turn's action executed in the environment, else 0 (the official
      ALFWorld check: the next observation is not "Nothing happens").
    turn_mask_BU: 1 on turns that happened (a prefix of each row).
    grounding_weight: 0.5 [code].
    contribution_weight: 1.0 [code].
    last_turn_grounded: the official code gives the last turn the grounding value
      unconditionally (no next observation to check); False uses `grounded_BU` there too.
  """
  if not contribution_BU.shape == grounded_BU.shape == turn_mask_BU.shape:
    raise ValueError(f"dense_reward expects three [B, U] arrays; got {contribution_BU.shape}, "
                     f"{grounded_BU.shape} and {turn_mask_BU.shape}.")
  valid_BU = turn_mask_BU > 0
  ground_BU = grounded_BU.astype(jnp.float32)
  if last_turn_grounded:
    U = valid_BU.shape[1]
    last_B = U - 1 - jnp.argmax(valid_BU[:, ::-1], axis=1)
    ground_BU = jnp.where(jnp.arange(U)[None, :] == last_B[:, None], 1.0, ground_BU)
  reward_BU = (contribution_weight * jax.lax.stop_gradient(contribution_BU.astype(jnp.float32))
               + grounding_weight * ground_BU)
  return jnp.where(valid_BU, reward_BU, 0.0)
