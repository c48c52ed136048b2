"""Device pytrees shared across agentrl, the shape-letter legend and the group layout.

Shape letters used across agentrl (array names end in _<LETTERS>):

  B  rows in a batch (= P * G for grouped sampling)   P  prompts
  G  samples per prompt                               T  token positions
  V  vocabulary                                       D  model width
  H  attention heads                                  K  head dim
  F  MLP width                                        L  layers
  N  flattened rows (B*T) in kernels and chunked ops  S  KV-cache slots
  U  turns of a multi-turn trajectory

Inside a shard_map body, use lowercase (logits_btv) for per-device (local) extents.

Alignment: per-token arrays cover the whole sequence (prompt + response), and
`logp_BT[:, t] = log pi(tokens[:, t] | tokens[:, <t])` with column 0 set to 0.
Rows [i*G, (i+1)*G) of a grouped batch share a prompt (`grouped`, `centre`).
"""
from typing import Any

import flax
import jax
import jax.numpy as jnp


@flax.struct.dataclass
class Batch:
  """One fixed-shape training batch, built on the host by `agentrl.rollout.pack`.

  Fields that an experiment does not use may be None (e.g. `value_BT` without a critic).
  """
  tokens_BT: jax.Array                   # int32 token ids, right-padded
  positions_BT: jax.Array                # int32 rotary positions (0 at the first real token)
  input_mask_BT: jax.Array               # bool, 1 on every real token (prompt, response, tool)
  loss_mask_BT: jax.Array                # float32, 1 only on policy-sampled tokens
  turn_BT: jax.Array | None = None       # int32 turn index of each token (-1 on the prompt)
  reward_B: jax.Array | None = None      # float32 final (outcome) reward per trajectory
  adv_BT: jax.Array | None = None        # float32 advantages (sequence ones broadcast)
  old_logp_BT: jax.Array | None = None   # behaviour log-probs (trainer recompute at rollout)
  ref_logp_BT: jax.Array | None = None   # frozen reference log-probs (KL anchor)
  sampler_logp_BT: jax.Array | None = None  # log-probs reported by the sampler
  value_BT: jax.Array | None = None      # critic values at rollout time (PPO)
  ret_BT: jax.Array | None = None        # value targets (PPO / GAE returns)
  truncated_B: jax.Array | None = None   # bool, trajectory hit a length/turn budget
  entropy_BT: jax.Array | None = None    # float32 entropy of pi_old per token (score step)
  version_B: jax.Array | None = None     # int32 updates applied to the policy that sampled it
  # A method's per-row data for its loss ({name: [B, ...] array}, e.g. COPO's global
  # advantage): it travels with the rows through minibatching, like every field here.
  aux: dict[str, jax.Array] | None = None


@flax.struct.dataclass
class TrainState:
  """Small pure-data training state; functions (apply, tx) live in closures, not here."""
  step: jax.Array                        # int32 scalar; also the RNG fold-in index
  params: Any                            # nnx.State of the policy (and value head, if any)
  opt_state: Any                         # optax.OptState


def grouped(x_BX: jax.Array, group_size: int) -> jax.Array:
  """[B, ...] -> [P, G, ...] float32, with a readable error for a batch that does not split.

  Every group estimator and shaping rule reads its batch this way: rows [i*G, (i+1)*G) hold
  prompt i's G samples.
  """
  if group_size < 1 or x_BX.ndim < 1 or x_BX.shape[0] % group_size:
    raise ValueError(f"Expected a leading axis B divisible by group_size={group_size}; got "
                     f"shape {x_BX.shape}. Rows [i*G, (i+1)*G) must hold prompt i's samples.")
  return x_BX.astype(jnp.float32).reshape(-1, group_size, *x_BX.shape[1:])


def centre(x_PG: jax.Array) -> jax.Array:
  """x - mean over each group; exactly 0 for an all-equal group."""
  # Shifting by the group min first makes equal rewards give d = 0 exactly (x - mean(x) can be
  # one ulp off in float32) and keeps large reward offsets from costing precision.
  d_PG = x_PG - x_PG.min(axis=1, keepdims=True)
  return d_PG - d_PG.mean(axis=1, keepdims=True)
