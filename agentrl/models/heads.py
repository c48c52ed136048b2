# pylint: disable=invalid-name
"""Scalar heads on a decoder: a per-token value (PPO critic), a sequence reward model and a
process reward model's per-step score.

Shared backbone: apply a head to the policy's hidden states,
  value_BT = value_head(policy.hidden(tokens_BT, positions_BT, input_mask_BT))
(wrap the hidden states in `jax.lax.stop_gradient` to keep critic gradients out of the policy).
Separate backbone: `ValueModel` / `RewardModel` / `ProcessRewardModel` hold their own
`transformer.Transformer` (e.g. loaded with `hf.load_model` and merged with a fresh head).

A process reward model (`StepHead`) scores each step at the step's last token (its index from
`rewards.process.step_ends`), the position whose hidden state has seen the whole step; one
warm-started from a policy is that policy's graph and params plus a step head
(`policy_step_head`, `policy_prm_logits`), so any decoder the policy loads serves.

The reward of a sequence is read at its last real token (the input mask's last 1), so left-
and right-padded batches give the same score, as in Ouyang et al. (2022) reward models.
"""
import jax
import jax.numpy as jnp
from flax import nnx

from agentrl.models import transformer


def last_token_index(input_mask_BT: jax.Array) -> jax.Array:
  """Int32 [B] index of the last position whose mask is set (T - 1 for an empty row)."""
  t = input_mask_BT.shape[1]
  return (t - 1 - jnp.argmax(input_mask_BT[:, ::-1].astype(bool), axis=1)).astype(jnp.int32)


class ValueHead(nnx.Module):
  """value_BT = h_BTD · w + b in float32; value at t is computed from tokens <= t."""

  def __init__(self, width: int, *, param_dtype=jnp.float32, rngs: nnx.Rngs | None = None):
    del rngs  # zero init: a fresh critic predicts 0 everywhere, and w still gets gradient h
    self.w_D = transformer.logical_param(jnp.zeros((width,), param_dtype), ("embed",))
    self.b = transformer.logical_param(jnp.zeros((), param_dtype), ())

  def __call__(self, h_BTD: jax.Array) -> jax.Array:
    value_BT = jnp.einsum("btd,d->bt", h_BTD.astype(jnp.float32),
                          self.w_D[...].astype(jnp.float32))
    return value_BT + self.b[...].astype(jnp.float32)


class RewardHead(nnx.Module):
  """reward_B = (h · w + b) at each row's last real token, float32."""

  def __init__(self, width: int, *, param_dtype=jnp.float32, rngs: nnx.Rngs | None = None):
    self.score = ValueHead(width, param_dtype=param_dtype, rngs=rngs)

  def __call__(self, h_BTD: jax.Array, input_mask_BT: jax.Array) -> jax.Array:
    idx_B = last_token_index(input_mask_BT)
    h_BD = jnp.take_along_axis(h_BTD, idx_B[:, None, None], axis=1)[:, 0]
    return self.score(h_BD[:, None])[:, 0]


class StepHead(nnx.Module):
  """Per-step PRM logits [B, U]: (h · w + b) at each step's last token; 0 on absent steps.

  The logit's sigmoid is the probability that the step is good (losses/process.py trains it
  with per-step cross-entropy or Bradley-Terry pairs).
  """

  def __init__(self, width: int, *, param_dtype=jnp.float32, rngs: nnx.Rngs | None = None):
    self.score = ValueHead(width, param_dtype=param_dtype, rngs=rngs)

  def __call__(self, h_BTD: jax.Array, step_end_BU: jax.Array,
               step_mask_BU: jax.Array) -> jax.Array:
    index_BU = jnp.clip(step_end_BU, 0, h_BTD.shape[1] - 1).astype(jnp.int32)
    h_BUD = jnp.take_along_axis(h_BTD, index_BU[:, :, None], axis=1)
    return jnp.where(step_mask_BU > 0, self.score(h_BUD), 0.0)


class ValueModel(nnx.Module):
  """A critic with its own backbone: tokens -> value_BT."""

  def __init__(self, cfg: transformer.Config, *, rngs: nnx.Rngs):
    self.backbone = transformer.Transformer(cfg, rngs=rngs)
    self.head = ValueHead(cfg.width, param_dtype=cfg.param_dtype, rngs=rngs)

  def __call__(self, tokens_BT, positions_BT, input_mask_BT=None) -> jax.Array:
    return self.head(self.backbone.hidden(tokens_BT, positions_BT, input_mask_BT))


class RewardModel(nnx.Module):
  """A reward model with its own backbone: tokens -> reward_B (at the last real token)."""

  def __init__(self, cfg: transformer.Config, *, rngs: nnx.Rngs):
    self.backbone = transformer.Transformer(cfg, rngs=rngs)
    self.head = RewardHead(cfg.width, param_dtype=cfg.param_dtype, rngs=rngs)

  def __call__(self, tokens_BT, positions_BT, input_mask_BT=None) -> jax.Array:
    if input_mask_BT is None:
      input_mask_BT = jnp.ones(tokens_BT.shape, bool)
    h_BTD = self.backbone.hidden(tokens_BT, positions_BT, input_mask_BT)
    return self.head(h_BTD, input_mask_BT)


class ProcessRewardModel(nnx.Module):
  """A PRM with its own backbone: tokens and step ends -> per-step logits [B, U]."""

  def __init__(self, cfg: transformer.Config, *, rngs: nnx.Rngs):
    self.backbone = transformer.Transformer(cfg, rngs=rngs)
    self.head = StepHead(cfg.width, param_dtype=cfg.param_dtype, rngs=rngs)

  def __call__(self, tokens_BT, positions_BT, step_end_BU, step_mask_BU,
               input_mask_BT=None) -> jax.Array:
    h_BTD = self.backbone.hidden(tokens_BT, positions_BT, input_mask_BT)
    return self.head(h_BTD, step_end_BU, step_mask_BU)


def policy_step_head(graphdef: nnx.GraphDef, params: nnx.State, *, seed: int = 0):
  """(graphdef, params) of a fresh `StepHead` sized to a policy's hidden width.

  With the policy's params as the backbone, {"backbone": params, "head": head params} is a
  PRM warm-started from the policy (`policy_prm_logits`); the width is read from an abstract
  forward, so any decoder the policy graph describes works.
  """
  token_BT = jnp.zeros((1, 1), jnp.int32)
  width = jax.eval_shape(lambda p: nnx.merge(graphdef, p).hidden(token_BT, token_BT),
                         params).shape[-1]
  return nnx.split(StepHead(width, rngs=nnx.Rngs(seed)))


def policy_prm_logits(graphdef: nnx.GraphDef, head_graphdef: nnx.GraphDef):
  """logits(params, tokens_BT, positions_BT, input_mask_BT, step_end_BU, step_mask_BU) -> [B, U]
  of a PRM whose params are {"backbone": policy params, "head": `policy_step_head` params}."""

  def logits(params, tokens_BT, positions_BT, input_mask_BT, step_end_BU, step_mask_BU):
    h_BTD = nnx.merge(graphdef, params["backbone"]).hidden(tokens_BT, positions_BT,
                                                           input_mask_BT)
    return nnx.merge(head_graphdef, params["head"])(h_BTD, step_end_BU, step_mask_BU)

  return logits
