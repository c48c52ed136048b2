"""Device pytrees shared across agentrl, and the shape-letter legend.

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
Rows [i*G, (i+1)*G) of a grouped batch share a prompt.
"""
from typing import Any

import flax
import jax


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
