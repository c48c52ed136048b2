# pylint: disable=invalid-name
"""COPO's blended surrogate: a local (GRPO) and a global (consistency) PPO term per row.

COPO (arXiv 2508.04138; code hijih/copo-code `verl/trainer/ppo/core_algos.py`
`compute_policy_loss_with_global`, commit c15c75f; docs/algorithms.md §13.5). The advantages
come from `agentrl.advantages.shaping`: the local one is GRPO's, the global one
`shaping.copo_global_advantage`, the weight `shaping.copo_local_weight`. Inputs, masks and
metric names follow the `agentrl.losses.policy` conventions.
"""
import jax
import jax.numpy as jnp

from agentrl.losses import common
from agentrl.losses import policy

Metrics = common.Metrics


def copo_ppo(logp_BT: jax.Array, old_logp_BT: jax.Array, adv_BT: jax.Array, mask_BT: jax.Array,
             *, global_adv_B: jax.Array, local_weight_B: jax.Array, eps_low: float = 0.2,
             eps_high: float = 0.2, dual_clip: float | None = 3.0) -> tuple[jax.Array, Metrics]:
  """L_t = (1 - w_i) PPO(A_global_i) + w_i PPO(A_local_t), per token [B, T].

  Both terms are verl's dual-clip PPO surrogate (`policy.ppo_clip`) on the same ratio; the
  losses are blended, not the advantages (with clipping the two differ). w_i =
  `shaping.copo_local_weight(...)` is data (detached). Defaults: eps 0.2 / 0.2 (run_copo.sh),
  dual clip c = 3 (verl's default clip_ratio_c, always on in the reference); run_copo.sh
  aggregates with seq-mean-token-mean. w = 1 ("no-global") is `policy.ppo_clip` on the local
  advantage exactly. Metrics: the local term's PPO metrics, `global_clipfrac` and
  `local_weight_mean` (over rows with a policy token).
  """
  valid_BT = common.check(logp_BT, old_logp_BT, mask_BT)
  B = mask_BT.shape[0]
  if global_adv_B.shape != (B,) or local_weight_B.shape != (B,):
    raise ValueError(f"global_adv_B and local_weight_B must have shape ({B},); got "
                     f"{global_adv_B.shape} and {local_weight_B.shape}.")
  kw = dict(eps_low=eps_low, eps_high=eps_high, dual_clip=dual_clip)
  local_BT, metrics = policy.ppo_clip(logp_BT, old_logp_BT, adv_BT, mask_BT, **kw)
  global_BT, global_metrics = policy.ppo_clip(logp_BT, old_logp_BT, global_adv_B[:, None],
                                              mask_BT, **kw)
  w_B1 = jax.lax.stop_gradient(local_weight_B.astype(jnp.float32))[:, None]
  loss_BT = jnp.where(valid_BT, (1.0 - w_B1) * global_BT + w_B1 * local_BT, 0.0)
  metrics.update(global_clipfrac=global_metrics["clipfrac"],
                 local_weight_mean=common.stat_mean(w_B1[:, 0], valid_BT.any(-1)))
  return loss_BT, metrics
