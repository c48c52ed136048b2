# pylint: disable=invalid-name
"""Multi-turn rollout engine: KV cache kept across turns, continuous batching, concurrent envs.

  engine = Engine(graphdef, pad_id=tok.pad_id, slots=8)
  trajs, metrics = engine.run(params, tok, envs, seeds, rng=key, max_turns=8,
                              max_new_tokens=32, max_len=1024, temperature=1.0)

`agent_loop.run` samples every turn with `Sampler.generate`, feeding each unfinished row's whole
transcript again (quadratic in turns), waiting for the slowest row of the batch, and stepping
the envs one after another while the device idles. This engine does none of that:

- **Slots and a shared cache.** `slots` rows decode together against one KV cache. Every
  program writes the same columns for all slots (one write pointer), with the attention mask
  marking a slot's column valid only where that slot had a token; the model's attention is
  causal by column and masked by validity, so holes cost nothing but space. When the pointer
  reaches the end, `compact` packs each slot's valid columns to the left (order kept), and the
  cache doubles only when the compacted transcripts fill more than half of it, so its size
  follows the transcripts' length.
- **Prefill only what is new.** A slot's cache holds its transcript up to the last token; a new
  turn prefills only the tokens appended since (the last sampled token and the observation).
- **Continuous batching.** Decoding runs in chunks of `chunk` steps; a slot whose turn ended
  (stop id or budget) leaves the batch at the next chunk boundary and its env step runs on a
  thread pool (`env_workers` in flight) while the others keep decoding; a slot whose
  observation is ready, or a new episode, joins at the next boundary.
- **Reproducible sampling.** Episode e's turn u, step s draws with
  fold_in(fold_in(fold_in(rng, e), u), s): the same rng and seeds give the same trajectories
  whatever the slot count, env latency or completion order. Greedy decoding gives the same
  tokens as `agent_loop.run`.

Token bookkeeping, SafeEnv wrapping, metrics and the Trajectory format are `agent_loop`'s.
"""
import collections
import concurrent.futures
import functools
from typing import Any, Sequence

from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.envs import safe
from agentrl.models import transformer
from agentrl.rollout import agent_loop
from agentrl.rollout import sampler as sampler_lib


def _prefill(graphdef, params, cache, tokens_BN, pos_BN, mask_BN, reset_B, col):
  """Writes new tokens of some slots at columns [col, col + N); clears `reset_B` slots first."""
  model = nnx.merge(graphdef, params)
  cache = cache.replace(valid_BS=cache.valid_BS & ~reset_B[:, None])
  _, cache = model.decode(tokens_BN, pos_BN, mask_BN, cache, col)
  return cache


def _decode(graphdef, params, cache, col, feed_B, pos_B, active_B, budget_B, keys_B, step0_B,
            greedy_B, stop_BK, temperature, *, num_steps):
  """Up to num_steps decode steps of the active slots at columns col, col + 1, ..."""
  model = nnx.merge(graphdef, params)
  B = feed_B.shape[0]
  sample = functools.partial(sampler_lib._sample, greedy_B=greedy_B,  # pylint: disable=protected-access
                             temperature=temperature, top_p=jnp.float32(1.0), top_k=0,
                             use_top_p=False, logp_mode="tempered")

  def cond(carry):
    s, _, _, _, _, _, _, done_B = carry
    return (s < num_steps) & ~jnp.all(done_B)

  def body(carry):
    s, cache, feed_B, tokens_BK, logp_BK, lengths_B, stopped_B, done_B = carry
    live_B = ~done_B
    logits_B1V, cache = model.decode(feed_B[:, None], (pos_B + lengths_B)[:, None],
                                     live_B[:, None], cache, col + s)
    keys = jax.vmap(jax.random.fold_in)(keys_B, step0_B + lengths_B)
    new_B, new_logp_B = sample(logits_B1V[:, 0], keys)
    tokens_BK = tokens_BK.at[jnp.arange(B), lengths_B].set(
        jnp.where(live_B, new_B, tokens_BK[jnp.arange(B), lengths_B]), mode="drop")
    logp_BK = logp_BK.at[jnp.arange(B), lengths_B].set(
        jnp.where(live_B, new_logp_B, 0.0), mode="drop")
    stopped_B = stopped_B | (live_B & jnp.any(new_B[:, None] == stop_BK, axis=-1))
    lengths_B = lengths_B + live_B.astype(jnp.int32)
    done_B = done_B | stopped_B | (lengths_B >= budget_B)
    return s + 1, cache, jnp.where(live_B, new_B, feed_B), tokens_BK, logp_BK, lengths_B, \
        stopped_B, done_B

  carry = (jnp.int32(0), cache, feed_B, jnp.zeros((B, num_steps), jnp.int32),
           jnp.zeros((B, num_steps), jnp.float32), jnp.zeros((B,), jnp.int32),
           jnp.zeros((B,), bool), ~active_B | (budget_B <= 0))
  steps, cache, _, tokens_BK, logp_BK, lengths_B, stopped_B, _ = jax.lax.while_loop(
      cond, body, carry)
  return cache, tokens_BK, logp_BK, lengths_B, stopped_B, steps


def _compact(cache):
  """Moves each slot's valid columns to the left, in order; returns (cache, used columns)."""
  order_BS = jnp.argsort(~cache.valid_BS, axis=1, stable=True)
  take = lambda x_LBSHK: jnp.take_along_axis(x_LBSHK, order_BS[None, :, :, None, None], axis=2)
  valid_BS = jnp.take_along_axis(cache.valid_BS, order_BS, axis=1)
  cache = transformer.KVCache(take(cache.k_LBSHK), take(cache.v_LBSHK), valid_BS,
                              jnp.take_along_axis(cache.pos_BS, order_BS, axis=1))
  return cache, jnp.max(jnp.sum(valid_BS, axis=1))


class _Slot:
  """Host state of one decode slot. Invariant while decoding: the cache holds every token of
  the row's transcript but the last, which is the next token to feed."""

  def __init__(self, episode=None):
    self.episode = episode   # index into the run's episodes, or None when free
    self.cached = 0          # transcript tokens already in the cache
    self.turn = 0            # the model turn being sampled
    self.turn_start = 0      # transcript length when the turn began
    self.budget = 0          # tokens this turn may sample
    self.pending = False     # new tokens to prefill before it can decode
    self.reset = episode is not None   # the cache row still holds a previous episode


class Engine:
  """Compiled prefill / decode / compact programs for one model graph, and the host scheduler."""

  def __init__(self, graphdef, *, pad_id: int, slots: int = 8, chunk: int = 16,
               env_workers: int = 8, cache_dtype=None):
    if slots < 1 or chunk < 1 or env_workers < 1:
      raise ValueError(f"need slots, chunk and env_workers >= 1; got {slots}, {chunk}, "
                       f"{env_workers}.")
    self.graphdef, self.pad_id, self.slots, self.chunk = graphdef, int(pad_id), slots, chunk
    self.env_workers, self.cache_dtype = env_workers, cache_dtype
    self._prefill = jax.jit(functools.partial(_prefill, graphdef), donate_argnums=(1,))
    self._decode = jax.jit(functools.partial(_decode, graphdef), donate_argnums=(1,),
                           static_argnames=("num_steps",))
    self._compact = jax.jit(_compact, donate_argnums=(0,))

  def run(self, params, tok, envs: Sequence[Any], seeds: Sequence[Any], *, rng: jax.Array,
          max_turns: int, max_new_tokens: int, max_len: int,
          greedy: bool | Sequence[bool] = False, chat_template: bool = True,
          system_prompt: str | None = None, temperature: float = 1.0
          ) -> tuple[list[agent_loop.Trajectory], dict[str, float]]:
    """Runs env i from reset(seeds[i]) for up to max_turns model turns; as `agent_loop.run`."""
    if len(envs) != len(seeds):
      raise ValueError(f"got {len(envs)} envs but {len(seeds)} seeds; pass one seed per env.")
    if max_turns < 1 or max_new_tokens < 1 or max_len < 2:
      raise ValueError(f"need max_turns >= 1, max_new_tokens >= 1, max_len >= 2; got "
                       f"{max_turns}, {max_new_tokens}, {max_len}.")
    if not temperature > 0:
      raise ValueError(f"temperature must be > 0, got {temperature}; use greedy=True.")
    flags = [bool(greedy)] * len(envs) if isinstance(greedy, bool) else [bool(g) for g in greedy]
    render = agent_loop._Renderer(tok, chat_template=chat_template,  # pylint: disable=protected-access
                                  system_prompt=system_prompt)
    safe_envs = [e if isinstance(e, safe.SafeEnv) else safe.SafeEnv(e) for e in envs]
    before = [dict(e.counters) for e in safe_envs]
    rows = [agent_loop._Row(env, g) for env, g in zip(safe_envs, flags)]  # pylint: disable=protected-access
    run = _Run(self, params, tok, rows, seeds, render, rng=rng, max_turns=max_turns,
               max_new_tokens=max_new_tokens, max_len=max_len, temperature=temperature)
    with concurrent.futures.ThreadPoolExecutor(self.env_workers) as pool:
      run.loop(pool)
    trajs = [r.trajectory() for r in rows]
    metrics = {f"rollout/{k}": float(v) for k, v in run.counts.items()}
    metrics["rollout/turn_cut_frac"] = run.cut_turns / max(run.model_turns, 1)
    for key in safe.COUNTERS:
      metrics[f"env/{key}"] = float(sum(e.counters[key] - b[key]
                                         for e, b in zip(safe_envs, before)))
    metrics.update(agent_loop._summary(trajs))  # pylint: disable=protected-access
    return trajs, metrics


class _Run:
  """One `Engine.run`: the scheduler's host state and the device cache."""

  def __init__(self, engine, params, tok, rows, seeds, render, *, rng, max_turns,
               max_new_tokens, max_len, temperature):
    self.e, self.params, self.tok, self.rows, self.seeds = engine, params, tok, rows, seeds
    self.render, self.max_turns, self.max_new, self.max_len = render, max_turns, max_new_tokens, \
        max_len
    self.temperature = np.float32(temperature)
    cfg = nnx.merge(engine.graphdef, params).cfg
    # The cache starts small and grows by doubling when compaction cannot make room: every
    # decode step attends over all `capacity` columns, so it tracks the transcripts' length,
    # not max_len. Each capacity is one compiled shape of the programs.
    self.capacity = 256
    self.cache = transformer.init_cache(cfg, engine.slots, self.capacity,
                                        dtype=engine.cache_dtype)
    self.col = 0
    self.slots = [_Slot() for _ in range(engine.slots)]
    self.waiting = list(range(len(rows)))[::-1]   # episodes not started, popped in order
    self.ep_keys = [jax.random.fold_in(rng, e) for e in range(len(rows))]
    stops = sorted({int(t) for t in tok.end_of_turn_ids} | {int(tok.eos_id)})
    self.stop_BK = np.tile(np.asarray(stops, np.int32), (engine.slots, 1))
    self.counts = collections.Counter(obs_overflow=0, prompt_overflow=0, sampled_tokens=0)
    self.cut_turns = self.model_turns = 0

  # ---- host work run on the env pool: one row per call, never shared between calls.
  def _start(self, e):
    local = collections.Counter()
    agent_loop._start(self.rows[e], self.seeds[e], self.render, self.max_len, local)  # pylint: disable=protected-access
    return local

  def _env_turn(self, e, ids, stopped, turn):
    local = collections.Counter()
    agent_loop._env_turn(self.rows[e], ids, stopped, turn, tok=self.tok,  # pylint: disable=protected-access
                         render=self.render, last_turn=turn == self.max_turns - 1,
                         max_len=self.max_len, counts=local)
    return local

  def loop(self, pool) -> None:
    futures = {}                                    # env future -> slot index
    while self.waiting or futures or any(s.episode is not None for s in self.slots):
      for i, slot in enumerate(self.slots):         # new episodes take free slots
        if slot.episode is None and self.waiting:
          self.slots[i] = _Slot(self.waiting.pop())
          futures[pool.submit(self._start, self.slots[i].episode)] = i
      ready = [i for i, s in enumerate(self.slots)
               if s.episode is not None and i not in futures.values()]
      if futures and not ready:                     # nothing to run on the device: wait
        concurrent.futures.wait(list(futures), return_when=concurrent.futures.FIRST_COMPLETED)
      for fut in [f for f in futures if f.done()]:
        i = futures.pop(fut)
        self.counts.update(fut.result())
        slot = self.slots[i]
        if self.rows[slot.episode].finished:
          slot.episode = None
        else:
          slot.pending = True
      self._prefill_pending(futures)
      decoding = [i for i, s in enumerate(self.slots)
                  if s.episode is not None and not s.pending and i not in futures.values()]
      if decoding:
        for i, ids, stopped in self._decode_chunk(decoding):
          slot = self.slots[i]
          futures[pool.submit(self._env_turn, slot.episode, ids, stopped, slot.turn)] = i
          slot.turn += 1

  def _room(self, width: int) -> None:
    """Makes columns [col, col + width) writable: compacts, and grows the cache if it must."""
    if self.col + width <= self.capacity:
      return
    self.cache, used = self._compact_cache()
    self.col = int(used)
    # Grow when the compacted transcripts fill more than half of the cache, so compactions
    # (a copy of the whole cache) stay rare.
    if 2 * (self.col + width) > self.capacity:
      new_capacity = sampler_lib.bucket(2 * (self.col + width))
      grow = new_capacity - self.capacity
      pad = lambda x, axis: jnp.pad(x, [(0, grow) if a == axis else (0, 0)
                                        for a in range(x.ndim)])
      self.cache = transformer.KVCache(pad(self.cache.k_LBSHK, 2), pad(self.cache.v_LBSHK, 2),
                                       pad(self.cache.valid_BS, 1), pad(self.cache.pos_BS, 1))
      self.capacity = new_capacity

  def _compact_cache(self):
    return self.e._compact(self.cache)  # pylint: disable=protected-access

  def _prefill_pending(self, futures) -> None:
    todo = [i for i, s in enumerate(self.slots)
            if s.episode is not None and s.pending and i not in futures.values()]
    if not todo:
      return
    new = {i: self.rows[self.slots[i].episode].tokens[self.slots[i].cached:-1] for i in todo}
    width = max(len(ids) for ids in new.values())
    if width:
      N = sampler_lib.bucket(width, 16)
      self._room(N)
      B = self.e.slots
      tokens = np.full((B, N), self.e.pad_id, np.int32)
      pos = np.zeros((B, N), np.int32)
      mask = np.zeros((B, N), bool)
      reset = np.zeros((B,), bool)
      for i, ids in new.items():
        n, start = len(ids), self.slots[i].cached
        tokens[i, N - n:] = ids
        pos[i, N - n:] = np.arange(start, start + n)
        mask[i, N - n:] = True
        reset[i] = self.slots[i].reset
      self.cache = self.e._prefill(self.params, self.cache, *jax.device_put(  # pylint: disable=protected-access
          (tokens, pos, mask, reset, np.int32(self.col))))
      self.col += N
    for i in todo:
      slot, row = self.slots[i], self.rows[self.slots[i].episode]
      if slot.reset and not new[i]:   # nothing written: the stale row must still be cleared
        self.cache = self.cache.replace(
            valid_BS=self.cache.valid_BS.at[i].set(False))
      slot.cached, slot.pending, slot.reset = len(row.tokens) - 1, False, False
      slot.turn_start = len(row.tokens)
      slot.budget = min(self.max_new, self.max_len - len(row.tokens))

  def _decode_chunk(self, decoding):
    """Decodes the slots for up to `chunk` steps; returns (slot, action ids, stopped) per
    slot whose turn ended."""
    B, K = self.e.slots, self.e.chunk
    self._room(K)
    feed, pos = np.zeros((B,), np.int32), np.zeros((B,), np.int32)
    active, budget = np.zeros((B,), bool), np.zeros((B,), np.int32)
    step0, greedy = np.zeros((B,), np.int32), np.zeros((B,), bool)
    keys = [jax.random.key(0)] * B
    for i in decoding:
      slot, row = self.slots[i], self.rows[self.slots[i].episode]
      done = len(row.tokens) - slot.turn_start
      feed[i], pos[i], active[i] = row.tokens[-1], len(row.tokens) - 1, True
      budget[i], step0[i], greedy[i] = slot.budget - done, done, row.greedy
      keys[i] = jax.random.fold_in(self.ep_keys[slot.episode], slot.turn)
    inputs = jax.device_put((np.int32(self.col), feed, pos, active, budget))
    self.cache, tokens, logp, lengths, stopped, steps = self.e._decode(  # pylint: disable=protected-access
        self.params, self.cache, *inputs, jnp.stack(keys), *jax.device_put(
            (step0, greedy, self.stop_BK, self.temperature)), num_steps=K)
    tokens, logp, lengths, stopped, steps = jax.device_get(
        (tokens, logp, lengths, stopped, steps))
    self.col += int(steps)
    ended = []
    for i in decoding:
      slot, row = self.slots[i], self.rows[self.slots[i].episode]
      n = int(lengths[i])
      row.append(tokens[i, :n], turn=slot.turn, logp=logp[i, :n])
      slot.cached += n
      self.counts["sampled_tokens"] += n
      sampled = len(row.tokens) - slot.turn_start
      if stopped[i] or sampled >= slot.budget:
        self.model_turns += 1
        self.cut_turns += not stopped[i]
        ids = row.tokens[slot.turn_start:]
        ended.append((i, ids[:-1] if stopped[i] else ids, bool(stopped[i])))
    return ended
