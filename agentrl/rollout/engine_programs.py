# pylint: disable=invalid-name
"""The device programs `engine.Engine` jits and schedules: prefill, chunked decode, compaction.

All are pure functions of (params, cache, host-chosen indices); the engine's scheduler
(`agentrl/rollout/engine.py`) decides which slots each call touches. `layers` is
`transformer.unstack_layers(params)` or None (see `Transformer.decode`).
"""
import functools

from flax import nnx
import jax
import jax.numpy as jnp

from agentrl.models import transformer
from agentrl.rollout import sampler as sampler_lib


def take(cache, rows):
  """The cache rows `rows` (a sub-batch of slots)."""
  b = transformer.kv_batch_axis(cache)
  kv = jax.tree.map(lambda x: jnp.take(x, rows, axis=b), (cache.k_LBGSK, cache.v_LBGSK))
  return transformer.KVCache(*kv, jnp.take(cache.valid_BS, rows, axis=0),
                             jnp.take(cache.pos_BS, rows, axis=0))


def prefill(graphdef, params, layers, cache, rows_R, reset_R, tokens_RN, pos_RN, mask_RN,
             dst_D, src_D, col):
  """Prefills sub-batch rows `rows_R` at columns [col, col + N), then writes sub-row src_D[j]
  into cache row dst_D[j] (out-of-range dst: dropped). `reset_R` rows start empty."""
  model = nnx.merge(graphdef, params)
  sub = take(cache, rows_R)
  sub = sub.replace(valid_BS=sub.valid_BS & ~reset_R[:, None])
  _, sub = model.decode(tokens_RN, pos_RN, mask_RN, sub, col, layers=layers)
  put = lambda x_full, x_sub, axis: x_full.at[(slice(None),) * axis + (dst_D,)].set(
      jnp.take(x_sub, src_D, axis=axis), mode="drop")
  b = transformer.kv_batch_axis(cache)
  kv = jax.tree.map(lambda full, part: put(full, part, b), (cache.k_LBGSK, cache.v_LBGSK),
                    (sub.k_LBGSK, sub.v_LBGSK))
  return transformer.KVCache(*kv, put(cache.valid_BS, sub.valid_BS, 0),
                             put(cache.pos_BS, sub.pos_BS, 0))


def fork(cache, src_D, dst_D, keep_D):
  """Row dst_D[j] becomes a copy of row src_D[j] that keeps only its first keep_D[j] valid
  columns (a prefix of its transcript); out-of-range dst: dropped. src may equal dst."""
  b = transformer.kv_batch_axis(cache)
  valid_DS = jnp.take(cache.valid_BS, src_D, axis=0)
  valid_DS = valid_DS & (jnp.cumsum(valid_DS, axis=1) <= keep_D[:, None])
  put = lambda x, axis: x.at[(slice(None),) * axis + (dst_D,)].set(
      jnp.take(x, src_D, axis=axis), mode="drop")
  kv = jax.tree.map(lambda x: put(x, b), (cache.k_LBGSK, cache.v_LBGSK))
  return transformer.KVCache(*kv, cache.valid_BS.at[dst_D].set(valid_DS, mode="drop"),
                             put(cache.pos_BS, 0))


def decode(graphdef, params, layers, cache, col, feed_B, pos_B, active_B, budget_B, keys_BK,
           turn_B, step0_B, greedy_B, force_B, stop_BK, rng, temperature, top_p, adaptive_6, *,
           num_steps, top_k, use_top_p, logp_mode, alternatives=0):
  """Up to num_steps decode steps of the active slots at columns col, col + 1, ...

  keys_BK: each slot's episode key as key data (`jax.random.key_data`) of `rng`'s kind.
  force_B: a token each slot takes at its first step instead of a draw (-1: none).
  alternatives: A > 0 also returns each step's A most likely tokens and log-probs.
  """
  model = nnx.merge(graphdef, params)
  B = feed_B.shape[0]
  fold = jax.vmap(jax.random.fold_in)
  impl = jax.random.key_impl(rng)
  turn_keys_B = jax.vmap(lambda k, u: jax.random.fold_in(
      jax.random.wrap_key_data(k, impl=impl), u))(keys_BK, turn_B)
  sample = functools.partial(sampler_lib.sample_tokens, greedy_B=greedy_B, temperature=temperature,
                             top_p=top_p, top_k=top_k, use_top_p=use_top_p, logp_mode=logp_mode,
                             adaptive_6=adaptive_6, alternatives=alternatives)
  A = max(alternatives, 1)   # the alternatives' buffers, unused (width 1) when A = 0

  def cond(carry):
    return (carry[0] < num_steps) & ~jnp.all(carry[-1])

  def body(carry):
    s, cache, feed_B, tokens_BK, logp_BK, alt_BKA, alt_logp_BKA, lengths_B, stopped_B, \
        done_B = carry
    live_B = ~done_B
    logits_B1V, cache = model.decode(feed_B[:, None], (pos_B + lengths_B)[:, None],
                                     live_B[:, None], cache, col + s, layers=layers)
    out = sample(logits_B1V[:, 0], fold(turn_keys_B, step0_B + lengths_B),
                 force_B=jnp.where(lengths_B == 0, force_B, -1))
    new_B, new_logp_B = out[:2]
    rows = jnp.arange(B)
    put = lambda buf, x, empty: buf.at[rows, lengths_B].set(
        jnp.where(live_B.reshape((B,) + (1,) * (x.ndim - 1)), x, empty), mode="drop")
    tokens_BK = put(tokens_BK, new_B, tokens_BK[rows, lengths_B])
    logp_BK = put(logp_BK, new_logp_B, 0.0)
    if alternatives:
      alt_BKA, alt_logp_BKA = put(alt_BKA, out[2], 0), put(alt_logp_BKA, out[3], 0.0)
    stopped_B = stopped_B | (live_B & jnp.any(new_B[:, None] == stop_BK, axis=-1))
    lengths_B = lengths_B + live_B.astype(jnp.int32)
    done_B = done_B | stopped_B | (lengths_B >= budget_B)
    return s + 1, cache, jnp.where(live_B, new_B, feed_B), tokens_BK, logp_BK, alt_BKA, \
        alt_logp_BKA, lengths_B, stopped_B, done_B

  carry = (jnp.int32(0), cache, feed_B, jnp.zeros((B, num_steps), jnp.int32),
           jnp.zeros((B, num_steps), jnp.float32), jnp.zeros((B, num_steps, A), jnp.int32),
           jnp.zeros((B, num_steps, A), jnp.float32), jnp.zeros((B,), jnp.int32),
           jnp.zeros((B,), bool), ~active_B | (budget_B <= 0))
  steps, cache, _, tokens_BK, logp_BK, alt_BKA, alt_logp_BKA, lengths_B, stopped_B, _ = \
      jax.lax.while_loop(cond, body, carry)
  return cache, tokens_BK, logp_BK, lengths_B, stopped_B, steps, alt_BKA, alt_logp_BKA


def compact(cache, live_B):
  """Drops dead rows and moves each live row's valid columns to the left, in order; returns
  (cache, columns used)."""
  valid_BS = cache.valid_BS & live_B[:, None]
  order_BS = jnp.argsort(~valid_BS, axis=1, stable=True)
  b = transformer.kv_batch_axis(cache)
  order = order_BS[(None,) * b + (slice(None), None, slice(None), None)]   # [(1,) B 1 S 1]
  kv = jax.tree.map(lambda x: jnp.take_along_axis(x, order, axis=b + 2),
                    (cache.k_LBGSK, cache.v_LBGSK))
  valid_BS = jnp.take_along_axis(valid_BS, order_BS, axis=1)
  cache = transformer.KVCache(*kv, valid_BS, jnp.take_along_axis(cache.pos_BS, order_BS, axis=1))
  return cache, jnp.max(jnp.sum(valid_BS, axis=1))
