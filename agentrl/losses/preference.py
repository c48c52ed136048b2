# pylint: disable=invalid-name
"""Preference losses: the Bradley-Terry reward-model loss and DPO / cDPO / IPO.

- Bradley-Terry (Bradley & Terry 1952; Ouyang et al. 2022, eq. 1): a reward model is trained
  so that P(chosen > rejected) = sigmoid(r_c - r_r); the optional margin is Llama 2's
  (Touvron et al. 2023, eq. 2): -log sigmoid(r_c - r_r - m).
- DPO (Rafailov et al. 2023, eq. 7): with h = [log pi(y_c) - log pi_ref(y_c)]
  - [log pi(y_r) - log pi_ref(y_r)] (sequence log-probs), L = -log sigmoid(beta * h).
  Conservative DPO (Mitchell 2023, "A note on DPO with noisy preferences") assumes labels are
  flipped with probability eps: L = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h).
  IPO (Azar et al. 2023, arXiv 2310.12036): L = (h - 1 / (2 beta))^2, with beta playing IPO's
  tau; TRL's IPO uses length-averaged log-probs, i.e. `sequence_logp(..., average=True)`.

All losses are per pair, shape [B] (reduce with a mean or `aggregate(..., "seq-mean")`),
computed in float32 with `jax.nn.log_sigmoid`, which is stable for large |x|.
"""
import chex
import jax
import jax.numpy as jnp


def sequence_logp(logp_BT: jax.Array, mask_BT: jax.Array, *, average: bool = False) -> jax.Array:
  """Sum (or, with average=True, mean) of per-token log-probs over unmasked tokens; [B].

  Fully masked rows give 0. Masked entries are excluded with `where`, so NaN or -inf there
  (e.g. padding) reaches neither the value nor the gradient.
  """
  chex.assert_equal_shape([logp_BT, mask_BT])
  total_B = jnp.where(mask_BT > 0, logp_BT.astype(jnp.float32), 0.0).sum(-1)
  if average:
    return total_B / jnp.maximum((mask_BT > 0).sum(-1).astype(jnp.float32), 1.0)
  return total_B


def bradley_terry(chosen_reward_B: jax.Array, rejected_reward_B: jax.Array, *,
                  margin: jax.Array | float = 0.0) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Per-pair reward-model loss -log sigmoid(r_c - r_r - margin).

  Returns:
    loss_B and metrics: `accuracy` (fraction with r_c > r_r) and `margin` (mean r_c - r_r).
  """
  chex.assert_equal_shape([chosen_reward_B, rejected_reward_B])
  chex.assert_rank(chosen_reward_B, 1)
  diff_B = chosen_reward_B.astype(jnp.float32) - rejected_reward_B.astype(jnp.float32)
  loss_B = -jax.nn.log_sigmoid(diff_B - margin)
  metrics = {"accuracy": (diff_B > 0).astype(jnp.float32).mean(), "margin": diff_B.mean()}
  return loss_B, jax.lax.stop_gradient(metrics)


def dpo(policy_chosen_logp_B: jax.Array, policy_rejected_logp_B: jax.Array,
        ref_chosen_logp_B: jax.Array, ref_rejected_logp_B: jax.Array, *, beta: float = 0.1,
        label_smoothing: float = 0.0,
        ipo: bool = False) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Per-pair DPO loss (sigmoid form; cDPO with label_smoothing > 0; IPO with ipo=True).

  Args:
    policy_chosen_logp_B: sequence log-prob of the chosen response under the policy
      (`sequence_logp` of the response tokens); differentiated.
    policy_rejected_logp_B: same for the rejected response.
    ref_chosen_logp_B: chosen response under the frozen reference (data).
    ref_rejected_logp_B: rejected response under the reference (data).
    beta: DPO's beta (IPO's tau when ipo=True). Default 0.1 as in the DPO paper's experiments.
    label_smoothing: cDPO's assumed label-flip probability eps, in [0, 0.5).
    ipo: use the IPO squared loss instead (label_smoothing must then be 0).

  Returns:
    loss_B and metrics: `reward_chosen` / `reward_rejected` (mean implicit rewards
    beta * (log pi - log pi_ref)), `accuracy` (fraction with the chosen reward higher) and
    `margin` (mean reward difference).
  """
  if not 0.0 <= label_smoothing < 0.5:
    raise ValueError(f"dpo label_smoothing={label_smoothing} must be in [0, 0.5).")
  if ipo and label_smoothing:
    raise ValueError("dpo: label_smoothing applies to the sigmoid loss only; set it to 0 "
                     "when ipo=True.")
  if beta <= 0:
    raise ValueError(f"dpo beta={beta} must be > 0.")
  chex.assert_equal_shape([policy_chosen_logp_B, policy_rejected_logp_B, ref_chosen_logp_B,
                           ref_rejected_logp_B])
  chex.assert_rank(policy_chosen_logp_B, 1)
  f32 = lambda x: x.astype(jnp.float32)
  chosen_B = f32(policy_chosen_logp_B) - f32(ref_chosen_logp_B)
  rejected_B = f32(policy_rejected_logp_B) - f32(ref_rejected_logp_B)
  h_B = chosen_B - rejected_B
  if ipo:
    loss_B = jnp.square(h_B - 1.0 / (2.0 * beta))
  else:
    loss_B = (-(1.0 - label_smoothing) * jax.nn.log_sigmoid(beta * h_B)
              - label_smoothing * jax.nn.log_sigmoid(-beta * h_B))
  metrics = {"reward_chosen": beta * chosen_B.mean(), "reward_rejected": beta * rejected_B.mean(),
             "accuracy": (h_B > 0).astype(jnp.float32).mean(), "margin": beta * h_B.mean()}
  return loss_B, jax.lax.stop_gradient(metrics)
