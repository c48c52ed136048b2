# pylint: disable=invalid-name
"""Preference losses: the Bradley-Terry reward-model loss, DPO / cDPO / IPO and KTO.

- Bradley-Terry (Bradley & Terry 1952; Ouyang et al. 2022, eq. 1): a reward model is trained
  so that P(chosen > rejected) = sigmoid(r_c - r_r); the optional margin is Llama 2's
  (Touvron et al. 2023, eq. 2): -log sigmoid(r_c - r_r - m).
- DPO (Rafailov et al. 2023, eq. 7): with h = [log pi(y_c) - log pi_ref(y_c)]
  - [log pi(y_r) - log pi_ref(y_r)] (sequence log-probs), L = -log sigmoid(beta * h).
  Conservative DPO (Mitchell 2023, "A note on DPO with noisy preferences") assumes labels are
  flipped with probability eps: L = -(1 - eps) log sigmoid(beta h) - eps log sigmoid(-beta h).
  IPO (Azar et al. 2023, arXiv 2310.12036): L = (h - 1 / (2 beta))^2, with beta playing IPO's
  tau; TRL's IPO uses length-averaged log-probs, i.e. `sequence_logp(..., average=True)`.
- KTO (Ethayarajh et al. 2024, arXiv 2402.01306, eq. 7), unpaired: each example is desirable
  or undesirable, and its value is measured against a reference point z0, the detached batch
  estimate of KL(pi || pi_ref) from mismatched (prompt, completion) pairs; as TRL's
  `KTOTrainer` (loss_type "kto", docs/algorithms.md §8).

All losses are per pair (KTO: per example), shape [B] (reduce with a mean or
`aggregate(..., "seq-mean")`), computed in float32 with `jax.nn.log_sigmoid` or
`jax.nn.sigmoid`, which are stable for large |x|.
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


def kto(policy_logp_B: jax.Array, ref_logp_B: jax.Array, desirable_B: jax.Array,
        policy_kl_logp_B: jax.Array, ref_kl_logp_B: jax.Array, *, beta: float = 0.1,
        desirable_weight: float = 1.0,
        undesirable_weight: float = 1.0) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Per-example KTO loss [B], as TRL's `KTOTrainer._compute_loss` (loss_type "kto").

  With r = log pi(y|x) - log pi_ref(y|x) (sequence sums, `sequence_logp`) and the reference
  point z0 = max(0, mean_B(policy_kl_logp - ref_kl_logp)), detached:
    desirable:    desirable_weight   * (1 - sigmoid(beta (r - z0)))
    undesirable:  undesirable_weight * (1 - sigmoid(beta (z0 - r)))
  TRL averages the per-example losses (`losses.nanmean()`), i.e. `loss_B.mean()` here.
  The KL pairs are the batch's prompts with mismatched completions: TRL shifts the
  completions by one within the batch (y'_i = y_{i-1}, y'_0 = y_last), scores them under
  the policy and the reference, and averages the difference over the batch (and over
  devices). Defaults are TRL's KTOConfig: beta 0.1, both weights 1 (the KTO paper
  recommends weights with desirable_weight * n_D / (undesirable_weight * n_U) in [1, 4/3]).

  Args:
    policy_logp_B: log pi(y|x) of each example's completion (differentiated).
    ref_logp_B: log pi_ref(y|x) (data).
    desirable_B: bool, True for desirable examples.
    policy_kl_logp_B: log pi(y'|x) of the mismatched pairs (only its detached mean is used).
    ref_kl_logp_B: log pi_ref(y'|x) of the mismatched pairs.
    beta, desirable_weight, undesirable_weight: as TRL.

  Returns:
    loss_B and metrics: `kl` (z0), `reward_chosen` / `reward_rejected` (mean beta r over the
    desirable / undesirable examples, 0 if there are none).
  """
  if beta <= 0:
    raise ValueError(f"kto beta={beta} must be > 0.")
  chex.assert_equal_shape([policy_logp_B, ref_logp_B, desirable_B])
  chex.assert_rank(policy_logp_B, 1)
  chex.assert_equal_shape([policy_kl_logp_B, ref_kl_logp_B])
  f32 = lambda x: x.astype(jnp.float32)
  z0 = jax.lax.stop_gradient(
      jnp.maximum(jnp.mean(f32(policy_kl_logp_B) - f32(ref_kl_logp_B)), 0.0))
  logratio_B = f32(policy_logp_B) - f32(ref_logp_B)
  desirable_B = jnp.asarray(desirable_B).astype(bool)
  loss_B = jnp.where(desirable_B,
                     desirable_weight * (1.0 - jax.nn.sigmoid(beta * (logratio_B - z0))),
                     undesirable_weight * (1.0 - jax.nn.sigmoid(beta * (z0 - logratio_B))))
  side_mean = lambda side_B: jnp.where(side_B, beta * logratio_B, 0.0).sum() / jnp.maximum(
      side_B.sum(), 1)
  metrics = {"kl": z0, "reward_chosen": side_mean(desirable_B),
             "reward_rejected": side_mean(~desirable_B)}
  return loss_B, jax.lax.stop_gradient(metrics)
