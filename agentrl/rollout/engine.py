# pylint: disable=invalid-name
"""The rollout engine: KV cache kept across turns, continuous batching, concurrent env steps.

  engine = Engine(graphdef, pad_id=tok.pad_id, slots=64)
  trajs, metrics = engine.run(params, tok, envs, seeds, rng=key, max_turns=8,
                              max_new_tokens=32, max_len=1024, temperature=1.0)

Every rollout of the library goes through `Engine.run` (single-turn tasks are one-turn
episodes); `agent_loop.run_per_turn` is the simple per-turn reference it is tested against.

- **Slots and a shared cache.** Up to `slots` rows decode together against one KV cache. Every
  program writes the same columns for all slots (one write pointer), with the attention mask
  marking a slot's column valid only where that slot had a token; attention is causal by
  column and masked by validity, so holes cost nothing but space. When the pointer reaches the
  end, `engine_programs.compact` packs each live slot's valid columns to the left (order
  kept) and drops the rows of finished episodes; the cache doubles only when the compacted
  transcripts fill more than half of it, so its size follows the transcripts' length, not
  max_len.
- **Prefill only what is new, once per distinct prompt.** A slot's cache holds its transcript
  up to the last token; a new turn prefills only the tokens appended since (the last sampled
  token and the observation). Prefill runs on the pending slots only, and new episodes whose
  first prompts are identical (the G samples of a GRPO group) prefill one row whose keys and
  values are then copied into the others: prefill work is divided by G.
- **Continuous batching.** Decoding runs in chunks of `chunk` steps; a slot whose turn ended
  (stop id or budget) leaves the batch at the next chunk boundary and its env step runs on a
  thread pool (`env_workers` in flight) while the others keep decoding; a slot whose
  observation is ready, or a new episode, joins at the next boundary.
- **Gathering.** A decode chunk costs about the same however few slots it decodes, so before
  one, results of env calls still in flight are collected while they keep coming: until
  none came for `gather_s` or 5% of the last chunk's time, whichever is longer, and for at
  most one chunk's time or 4 x `gather_s`. Slots whose steps end close together then decode
  in one program rather than several, and a wait costs at most a small part of the chunk
  it saves. Env steps answered in-process need the default 2 ms; a server's sessions
  (agentrl/serve/), whose next requests come back over HTTP some milliseconds apart, pass a
  wider gap.
- **Timeouts.** An env reset or step that has not answered after `env_timeout_s` ends its
  episode as SafeEnv ends one whose env raised `EnvTimeout`: an error result with the env's
  error_reward, counted in env/env_timeouts. The call's thread is abandoned, never joined.
- **Reproducible sampling.** Episode e's turn u, step s draws with
  fold_in(fold_in(fold_in(rng, e), u), s): the same rng and seeds give the same trajectories
  whatever the slot count, env latency or completion order. Greedy decoding gives the same
  tokens as `agent_loop.run_per_turn`.
- **Episodes that arrive while it runs** (a server: agentrl/serve/sessions.py). `arrivals`
  is polled at every scheduling round for new (env, seed[, greedy]) episodes, which are
  numbered after the ones before them (their keys are fold_in(rng, e) as above, so an
  episode's tokens do not depend on when it arrived), until it returns None; the run then
  ends once every episode has. Such a run keeps no trajectory: each episode's goes to
  `watch` when it ends (a server runs for days), and keeps only a few list entries per episode.
- **Watching.** `watch(kind, env, trajectory)` is called on the scheduler thread when a model
  turn was sampled ("sampled", before the env gets its text) and when an episode ended
  ("ended"), with the env as given to the run; and after every decode chunk, for each slot
  that sampled in it, with the ids it added to the turn in place of the trajectory
  ("decoded": what a server streams while a turn is sampled, at `chunk` steps' granularity).

Token bookkeeping, SafeEnv wrapping, metrics and the Trajectory format are `agent_loop`'s.
"""
import collections
import functools
import time
from typing import Any, Sequence

from absl import logging
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from agentrl.envs import base
from agentrl.envs import safe
from agentrl.models import lora
from agentrl.models import transformer
from agentrl.envs import fork as env_fork
from agentrl.rollout import agent_loop
from agentrl.rollout import branching
from agentrl.rollout import engine_programs as programs
from agentrl.rollout import env_workers as workers_lib
from agentrl.rollout import sampler as sampler_lib

_GATHER_FRACTION = 0.05   # of a decode chunk's time: the longest result gap worth waiting over
GATHER_S = 0.002   # default gather_s: an env result gap after which a decode chunk starts
_POLL_S = 0.005  # the longest wait for env results while episodes may arrive
_IDLE_WAIT_S = 0.05   # how long an idle serving run waits for an arrival before looking again


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
    self.stopped = False     # the last turn ended on a stop id
    self.mid_turn = False    # a branch that resumes a turn: its prefill starts no new turn
    self.force = -1          # a branch's forced first token (Fork.token), or -1


class Engine:
  """Compiled prefill / decode / compact programs for one model graph, and the host scheduler.

  Args:
    graphdef: the policy graph (`nnx.split(model)[0]`); params are given to `run`.
    pad_id: the tokenizer's pad id.
    slots: the most rows decoding at once; a run uses min(slots, its rows rounded up to a
      power of two). Memory: a KV cache of slots x (transcript length) tokens.
    chunk: decode steps between scheduling points.
    env_workers: env resets/steps in flight at once.
    env_timeout_s: seconds an env call may take before its episode ends (None: no limit).
    cache_dtype: KV cache dtype (default: the model's compute dtype).
    unroll_layers: run prefill and decode over a per-layer copy of the layer weights, made
      once per `run` (`transformer.unstack_layers`), instead of scanning the stacked weights,
      whose per-layer slices XLA:CPU copies at every step. Costs one more copy of the layer
      weights while a run lasts, and a longer compile. None: on the CPU backend only. A LoRA
      policy then decodes over its merged weights W + (alpha / rank) A B (`lora.merge`, once
      per run): no adapter matmuls per token, and log-probs equal to the adapter forward's up
      to float rounding (the score step's `logp_mismatch` shows it).
    copy_prefixes: a branch's cache row starts as a copy of a row holding its prefix
      (rollout/branching.py); False prefills every branch's prefix again (the reference the
      copy is measured and tested against: the same trajectories, more prefill).
  """

  def __init__(self, graphdef, *, pad_id: int, slots: int = 64, chunk: int = 16,
               env_workers: int = 8, env_timeout_s: float | None = 300.0, cache_dtype=None,
               unroll_layers: bool | None = None, copy_prefixes: bool = True):
    if slots < 1 or chunk < 1 or env_workers < 1:
      raise ValueError(f"need slots, chunk and env_workers >= 1; got {slots}, {chunk}, "
                       f"{env_workers}.")
    if env_timeout_s is not None and not env_timeout_s > 0:
      raise ValueError(f"env_timeout_s must be > 0 or None, got {env_timeout_s}.")
    self.graphdef, self.pad_id, self.slots, self.chunk = graphdef, int(pad_id), slots, chunk
    self.env_workers, self.env_timeout_s, self.cache_dtype = env_workers, env_timeout_s, \
        cache_dtype
    if unroll_layers is None:
      unroll_layers = jax.default_backend() == "cpu"
    self.unroll_layers, self.copy_prefixes = bool(unroll_layers), bool(copy_prefixes)
    # Compiled once per engine and shared by its runs.
    self.unstack = jax.jit(lambda params: transformer.unstack_layers(params))
    self.step_programs = _programs(graphdef)   # (prefill, decode)
    self.compact = jax.jit(programs.compact, donate_argnums=(0,))
    self.fork = jax.jit(programs.fork, donate_argnums=(0,))
    self._merged = None   # (merge, programs of the merged graph) for a LoRA policy, made once
    self.chunk_s = 0.02   # wall time of the last decode chunk (how long to wait for envs)

  def merged_programs(self, model):
    """(merge(params) -> merged params, programs of the merged plain Transformer's graph) for
    a LoRA policy, built on first use."""
    if self._merged is None:
      base_def = nnx.split(lora.base_model(model))[0]
      merge = jax.jit(lambda params: lora.merge(self.graphdef, params)[1])
      self._merged = merge, _programs(base_def)
    return self._merged

  def run(self, params, tok, envs: Sequence[Any], seeds: Sequence[Any], *, rng: jax.Array,
          max_turns: int, max_new_tokens: int, max_len: int,
          greedy: bool | Sequence[bool] = False, chat_template: bool = True,
          system_prompt: str | None = None, temperature: float = 1.0, top_k: int = 0,
          top_p: float = 1.0, logp_mode: str = "tempered", adaptive_temperature=None,
          brancher=None, max_branches: int | None = None, alternatives: int = 0,
          arrivals=None, watch=None, gather_s: float = GATHER_S
          ) -> tuple[list[agent_loop.Trajectory], dict[str, float]]:
    """Runs env i from reset(seeds[i]) for up to max_turns model turns; returns (trajs, metrics).

    Args:
      params: the policy's nnx.State.
      tok: tokenizer (encode, decode, apply_chat_template, end_of_turn_ids, eos_id).
      envs: Env objects (envs/base.py); each is wrapped in SafeEnv unless it is one already.
      seeds: one reset seed per env.
      rng: a PRNG key; episode i's draws depend only on (rng, i) (see the module doc).
      max_new_tokens: per-turn sampling budget; max_len: budget for the whole transcript.
      greedy: argmax decoding for all rows or per row.
      chat_template: render env text through tok.apply_chat_template (else raw text).
      system_prompt: overrides each env's own `system_prompt` (chat_template only).
      temperature, top_k, top_p, logp_mode: as `Sampler.generate`.
      adaptive_temperature: None, or the 6 floats of `sampler.entropy_temperature` (HAPO's
        entropy-adaptive temperature): each sampled token's temperature then follows the
        entropy of its own next-token distribution.
      brancher: None, or a function ForkPoint -> list of Fork (rollout/branching.py) that
        forks episodes mid-way; the result then holds the roots (in the order of `envs`)
        followed by the branches, each with its `parent` and `fork_at`.
      max_branches: the most branches the run may make (default 64 per env): a brancher that
        asks for more raises ValueError (e.g. one that forks its own branches without end).
      alternatives: A > 0 records, for every sampled token, the A most likely tokens and
        their log-probs (`Trajectory.alternatives`, `alternative_logp`; what LATR's branch
        trigger reads).
      arrivals: None, or a function wait_s -> a list of (env, seed) or (env, seed, greedy)
        episodes to add (it may block up to wait_s seconds for one; the engine passes 0 while
        it has work), or None once no more will come (module docstring). Needs `watch`;
        the run then returns no trajectories.
      watch: None, or a function (kind, env, trajectory) -> None called on the scheduler
        thread at each sampled turn ("sampled") and episode end ("ended"), and with a slot's
        new ids (an int32 array) instead of a trajectory after each decode chunk ("decoded");
        it must not raise and should return quickly.
      gather_s: the env-result gap a decode chunk waits over (module doc, "Gathering").
    """
    if len(envs) != len(seeds):
      raise ValueError(f"got {len(envs)} envs but {len(seeds)} seeds; pass one seed per env.")
    if not gather_s >= 0:
      raise ValueError(f"gather_s must be >= 0, got {gather_s}.")
    if max_turns < 1 or max_new_tokens < 1 or max_len < 2:
      raise ValueError(f"need max_turns >= 1, max_new_tokens >= 1, max_len >= 2; got "
                       f"{max_turns}, {max_new_tokens}, {max_len}.")
    sampler_lib.validate_settings([1], [1], temperature, top_k, top_p, logp_mode)
    flags = [bool(greedy)] * len(envs) if isinstance(greedy, bool) else [bool(g) for g in greedy]
    if len(flags) != len(envs):
      raise ValueError(f"greedy has {len(flags)} entries but there are {len(envs)} envs.")
    if brancher is not None and (arrivals is not None or watch is not None):
      raise ValueError("Engine.run: brancher cannot be combined with arrivals or watch.")
    if arrivals is not None and watch is None:
      raise ValueError("Engine.run(arrivals=...) keeps no trajectory: pass watch= to get "
                       "each episode's trajectory when it ends.")
    render = agent_loop.Renderer(tok, chat_template=chat_template, system_prompt=system_prompt)
    sampling = dict(temperature=np.float32(temperature), top_p=np.float32(top_p),
                    top_k=int(top_k), use_top_p=top_p < 1.0, logp_mode=logp_mode,
                    adaptive_6=sampler_lib.adaptive_params(adaptive_temperature))
    run = _Run(self, params, tok, len(envs), render, rng=rng, max_turns=max_turns,
               max_new_tokens=max_new_tokens, max_len=max_len, sampling=sampling,
               brancher=brancher, max_branches=64 * len(envs) if max_branches is None
               else max_branches, alternatives=alternatives, serving=arrivals is not None,
               watch=watch, gather_s=gather_s)
    run.add(envs, seeds, flags)
    workers = workers_lib.EnvWorkers(self.env_workers, self.env_timeout_s)
    try:
      run.loop(workers, arrivals)
    finally:
      workers.close()
    trajs = run.trajectories()
    run.ended_counts["env_timeouts"] += run.counts.pop("env_timeouts")
    metrics = {f"rollout/{k}": float(v) for k, v in run.counts.items()}
    metrics["rollout/turn_cut_frac"] = run.cut_turns / max(run.model_turns, 1)
    metrics["rollout/prefill_tokens"] = float(run.prefill_tokens)
    live = [i for i, e in enumerate(run.safe_envs) if e is not None]
    metrics.update(agent_loop.env_metrics(
        [run.safe_envs[i] for i in live] + run.branch_envs,
        [run.before[i] for i in live] + run.branch_before, run.ended_counts))
    metrics.update(agent_loop.summarize(trajs))
    return trajs, metrics


def _replay(args):
  """A worker call: (env, seed, actions) -> a fork of env after those actions, replayed, or the
  error's text (a worker call never raises)."""
  env, seed, actions = args
  try:
    return env_fork.fork_env(env, seed=seed, actions=actions, how=env_fork.REPLAY)
  except Exception as e:  # pylint: disable=broad-except
    return f"{type(e).__name__}: {e}"


def _programs(graphdef):
  """The jitted (prefill, decode) programs of one model graph."""
  prefill = jax.jit(functools.partial(programs.prefill, graphdef), donate_argnums=(2,))
  decode = jax.jit(functools.partial(programs.decode, graphdef), donate_argnums=(2,),
                   static_argnames=("num_steps", "top_k", "use_top_p", "logp_mode",
                                    "alternatives"))
  return prefill, decode


class _Run:
  """One `Engine.run`: the scheduler's host state and the device cache."""

  def __init__(self, engine, params, tok, num_envs, render, *, rng, max_turns,
               max_new_tokens, max_len, sampling, brancher, max_branches, alternatives,
               serving, watch, gather_s):
    self.e, self.params, self.tok = engine, params, tok
    self.render, self.max_turns, self.max_new = render, max_turns, max_new_tokens
    self.max_len, self.rng, self.sampling = max_len, rng, sampling
    model = nnx.merge(engine.graphdef, params)
    cfg = model.cfg
    self.prefill, self.decode = engine.step_programs
    if engine.unroll_layers and isinstance(model, lora.LoraTransformer):
      merge, (self.prefill, self.decode) = engine.merged_programs(model)
      self.params = merge(params)
    unroll = engine.unroll_layers and type(model) in (transformer.Transformer,
                                                      lora.LoraTransformer)
    self.layers = engine.unstack(self.params) if unroll else None
    # A serving run does not know how many episodes will come: it takes every slot.
    self.B = engine.slots if serving else min(engine.slots, sampler_lib.bucket(num_envs))
    # Every decode step attends over all `capacity` columns, so the cache starts near one
    # transcript's length and grows by doubling; each capacity is one compiled shape.
    self.capacity = sampler_lib.bucket(min(max_len, 256) + engine.chunk, 32)
    self.cache = transformer.init_cache(cfg, self.B, self.capacity, dtype=engine.cache_dtype,
                                        per_layer=self.layers is not None)
    self.col = 0
    self.slots = [_Slot() for _ in range(self.B)]
    stops = sorted({int(t) for t in tok.end_of_turn_ids} | {int(tok.eos_id)})
    self.stop_BK = np.tile(np.asarray(stops, np.int32), (self.B, 1))
    self.counts = collections.Counter(obs_overflow=0, prompt_overflow=0, sampled_tokens=0,
                                      env_timeouts=0)
    self.cut_turns = self.model_turns = self.prefill_tokens = 0
    # Episode keys as key data (rollout/branching.py, "Sampling keys"), and the tree.
    if not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
      self.rng = rng = jax.random.wrap_key_data(rng)    # a legacy uint32 key
    self.impl = jax.random.key_impl(rng)
    self.brancher, self.max_branches = brancher, max_branches
    self.alternatives, self.vocab = int(alternatives), cfg.vocab
    if brancher is not None:
      self.counts.update(branches=0, fork_kv_tokens=0, fork_failures=0)
    # Per episode (roots, then arrivals and branches in the order they come).
    self.rows, self.seeds, self.keys, self.paths, self.depth, self.forks_made = \
        [], [], [], [], [], []
    self.given, self.safe_envs, self.before = [], [], []   # roots: as given, wrapped, counters
    self.waiting = []   # root episodes not started, the next one last
    self.serving, self.watch, self.polling = serving, watch, False
    self.gather_s = float(gather_s)
    self.ended_counts = collections.Counter()   # env counters of released episodes
    self.source = {}   # branch -> (parent, at, mid-turn, turn start, turn, forced token)
    self.queued = collections.deque()   # branches not started, before the waiting roots
    self.freed = [None] * self.B   # a free row's leftover KV: (episode, tokens it holds)
    self.copies = []        # (src, dst, keep) row copies to make before the next program
    self.branch_envs, self.branch_before = [], []

  def add(self, envs, seeds, flags) -> None:
    """Adds root episodes (the run's envs, or arrivals), numbered after the ones before."""
    first, n = len(self.rows), len(envs)
    safe_envs = [e if isinstance(e, safe.SafeEnv) else safe.SafeEnv(e) for e in envs]
    self.given += list(envs)
    self.safe_envs += safe_envs
    self.before += [dict(e.counters) for e in safe_envs]
    self.rows += [agent_loop.Row(env, bool(g)) for env, g in zip(safe_envs, flags)]
    self.seeds += list(seeds)
    if n:   # indices padded to a power of two: a few key programs for any arrival sizes
      index = np.arange(first, first + sampler_lib.bucket(n), dtype=np.uint32)
      keys = jax.vmap(lambda e: jax.random.key_data(jax.random.fold_in(self.rng, e)))(
          jax.device_put(index))
      self.keys += list(np.asarray(jax.device_get(keys))[:n])
    self.paths += [(e,) for e in range(first, first + n)]
    self.depth += [0] * n
    self.forks_made += [0] * n
    self.waiting[:0] = range(first + n - 1, first - 1, -1)

  def _arrive(self, arrivals, workers: workers_lib.EnvWorkers) -> bool:
    """Adds the episodes that arrived (waiting a little when the run is idle); False once
    `arrivals` is closed."""
    idle = not (self.waiting or workers.in_flight
                or any(s.episode is not None for s in self.slots))
    new = arrivals(_IDLE_WAIT_S if idle else 0.0)
    if new is None:
      return False
    new = [tuple(item) + (False,) * (3 - len(item)) for item in new]
    self.add([a[0] for a in new], [a[1] for a in new], [a[2] for a in new])
    return True

  def loop(self, workers: workers_lib.EnvWorkers, arrivals=None) -> None:
    self.polling = arrivals is not None
    while (self.polling or self.waiting or self.queued or workers.in_flight
           or any(s.episode is not None for s in self.slots)):
      if self.polling:
        self.polling = self._arrive(arrivals, workers)
      holders = self._holders()
      for i, slot in enumerate(self.slots):         # new episodes take free slots
        if slot.episode is None and (self.waiting or self.queued):
          e = self._next_episode(i)
          self.slots[i] = _Slot(e)
          if e in self.source:
            self._place_branch(i, holders, workers)
          else:
            workers.submit(workers_lib.Call(i, "reset", self.rows[e].env.reset, self.seeds[e]))
          self.freed[i] = None
      self._copy_rows()
      self._collect(workers)
      busy = workers.busy()
      self._prefill_pending(busy)
      decoding = [i for i, s in enumerate(self.slots)
                  if s.episode is not None and not s.pending and i not in busy]
      if decoding:
        for i, action in self._decode_chunk(decoding):
          e = self.slots[i].episode
          self._branch("sampled", e)
          if self.watch is not None:
            self.watch("sampled", self.given[e], self.rows[e].trajectory())
          self.rows[e].actions.append(action)
          workers.submit(workers_lib.Call(i, "step", self.rows[e].env.step, action))

  def _collect(self, workers: workers_lib.EnvWorkers) -> None:
    """Applies finished env calls. With no slot ready to decode, waits for one. Otherwise it
    keeps collecting while results keep coming (module doc, "Gathering")."""
    deadline = time.monotonic() + max(self.e.chunk_s, 4 * self.gather_s)
    gap = max(self.gather_s, _GATHER_FRACTION * self.e.chunk_s)
    while workers.in_flight:
      busy = workers.busy()
      ready = any(s.episode is not None and i not in busy for i, s in enumerate(self.slots))
      # While episodes may arrive, a wait for env results is short, so arrivals are polled.
      calls = workers.collect(block=True, max_wait_s=gap if ready else
                              _POLL_S if self.polling else None)
      for call in calls:
        self._apply(self.slots[call.slot], call)
      if (ready or self.polling) and (not calls or time.monotonic() > deadline):
        return

  def _apply(self, slot, call: workers_lib.Call) -> None:
    """Applies an env call's result (None: it timed out) to the slot's row."""
    e, row = slot.episode, self.rows[slot.episode]
    if call.kind == "fork":
      if isinstance(call.result, safe.SafeEnv):
        self._add_branch_env(row, call.result)
        return
      self.counts["fork_failures"] += 1
      logging.warning("branch %d of episode %d ends unstarted: its env could not be replayed "
                      "(%s)", e, row.parent, call.result or "timed out")
      row.finish(truncated=True)
    elif call.kind == "reset":
      if call.result is not None:
        obs = call.result
      else:
        self.counts["env_timeouts"] += 1
        row.env.reset_error = f"the environment did not reset within {self.e.env_timeout_s}s"
        obs = f"Error: {row.env.reset_error}"
      agent_loop.apply_reset(row, obs, self.render, self.max_len, self.counts)
    else:
      if call.result is not None:
        result = call.result
      else:
        self.counts["env_timeouts"] += 1
        message = f"the environment did not answer within {self.e.env_timeout_s}s"
        result = (f"Error: {message}", row.env.error_reward, True,
                  base.make_info(reward=row.env.error_reward, error=message))
      stopped, turn = slot.stopped, slot.turn
      agent_loop.apply_step(row, result, stopped, turn, render=self.render,
                             last_turn=turn == self.max_turns - 1, max_len=self.max_len,
                             counts=self.counts)
      slot.turn += 1
      slot.mid_turn = False
    if row.finished:
      self.freed[call.slot] = (e, slot.cached)
      slot.episode = None
      self._branch("finished", e)
      self._ended(e)
    else:
      if call.kind == "step":
        self._branch("stepped", e)
      slot.pending = True

  def _ended(self, e: int) -> None:
    """Hands episode e's trajectory to `watch`; a serving run then lets the episode go,
    keeping its env counters' totals for the metrics."""
    if self.watch is not None:
      self.watch("ended", self.given[e], self.rows[e].trajectory())
    if self.serving:
      env, before = self.safe_envs[e], self.before[e]
      self.ended_counts.update({k: env.counters[k] - before[k] for k in safe.COUNTERS})
      for per_episode in (self.rows, self.given, self.safe_envs, self.before, self.seeds,
                          self.keys, self.paths):
        per_episode[e] = None

  def _branch(self, kind: str, e: int) -> None:
    """Asks the brancher about episode e at a `kind` point and queues the branches."""
    if self.brancher is None:
      return
    row = self.rows[e]
    traj = row.trajectory()
    n = len(traj.tokens)
    turn = int(traj.turn[-1]) if kind == "sampled" else len(traj.turn_rewards)
    point = branching.ForkPoint(
        kind=kind, episode=e, root=self.paths[e][0], depth=self.depth[e], turn=turn,
        turn_start=branching.turn_start(traj, n - 1) if kind == "sampled" else n,
        trajectory=traj)
    forks = branching.check_forks(point, self.brancher(point))
    if self.counts["branches"] + sum(f.n for f in forks) > self.max_branches:
      raise ValueError(f"the brancher asked for more than max_branches={self.max_branches} "
                       "branches in this run: bound its forks (e.g. by ForkPoint.depth) or pass "
                       "a larger max_branches to Engine.run.")
    for fork in forks:
      if fork.token is not None and not 0 <= fork.token < self.vocab:
        raise ValueError(f"Fork(token={fork.token}) of episode {e}: not a token id of this "
                         f"model (vocabulary {self.vocab}).")
      steps = branching.env_steps_before(traj, fork.at)
      for _ in range(fork.n):
        j, b = self.forks_made[e], len(self.rows)
        self.forks_made[e] += 1
        child = row.branch(fork.at, steps, self._env_now(e, steps))
        child.parent = e
        if child.env is not None:
          self._add_branch_env(child, child.env)
        self.rows.append(child)
        self.seeds.append(self.seeds[e])
        key = branching.branch_key_data(*jax.device_put((self.keys[e], np.uint32(fork.at),
                                                         np.uint32(j))), impl=self.impl)
        self.keys.append(np.asarray(jax.device_get(key)))
        self.paths.append(self.paths[e] + ((fork.at, j),))
        self.depth.append(self.depth[e] + 1)
        self.forks_made.append(0)
        mid = fork.at < n
        self.source[b] = (e, fork.at, mid, branching.turn_start(traj, fork.at),
                          int(traj.turn[fork.at]) if mid else len(traj.turn_rewards),
                          -1 if fork.token is None else fork.token)
        self.queued.append(b)
        self.counts["branches"] += 1

  def _env_now(self, e: int, steps: int):
    """A branch's env if it can be had now, a clone of episode e's env when that is in the
    state after `steps` env steps, or None when it is to be replayed (`_place_branch`); an
    env that can do neither is refused (env_fork.NotForkable, a ValueError)."""
    row = self.rows[e]
    if env_fork.check(row.env) == env_fork.CLONE and steps == len(row.turn_rewards):
      return env_fork.fork_env(row.env, seed=self.seeds[e], actions=row.actions,
                               how=env_fork.CLONE)
    return None

  def _add_branch_env(self, row, env) -> None:
    row.env = env
    self.branch_envs.append(env)
    self.branch_before.append(dict(env.counters))

  def _holders(self) -> list[tuple[int, int, int]]:
    """(cache row, episode, tokens of its transcript the row holds) of every row that holds
    one: the live rows, and the free rows not yet compacted away."""
    held = []
    for i, s in enumerate(self.slots):
      if s.episode is not None and not s.reset:
        held.append((i, s.episode, s.cached))
      elif s.episode is None and self.freed[i] is not None:
        held.append((i, *self.freed[i]))
    return held

  def _next_episode(self, i: int) -> int:
    """The next episode for free slot i: a branch whose whole prefix the row still holds
    (continued in place: a branch of the row's episode, or of a sibling that shares it), else
    the oldest branch (its source is the likeliest to be gone soon), else the next root."""
    if self.freed[i] is not None and self.e.copy_prefixes:
      held = [(i, *self.freed[i])]
      for e in self.queued:
        at = self.source[e][1]
        if self._best_holder(held, self.rows[e].tokens[:at - 1])[1] == at - 1:
          self.queued.remove(e)
          return e
    return self.queued.popleft() if self.queued else self.waiting.pop()

  def _best_holder(self, holders, tokens) -> tuple[int | None, int]:
    """The cache row holding the longest prefix of `tokens`, and that prefix's length: any
    row whose cached transcript starts with the same ids (the same ids at the same positions
    have the same keys and values), e.g. the source, a sibling branch or an ancestor."""
    best, best_len = None, 0
    for i, e, cached in holders:
      n = min(cached, len(tokens))
      same = np.asarray(self.rows[e].tokens[:n]) == np.asarray(tokens[:n])
      length = n if same.all() else int(np.argmin(same))
      if length > best_len:
        best, best_len = i, length
    return best, best_len

  def _place_branch(self, i: int, holders, workers: workers_lib.EnvWorkers) -> None:
    """Starts branch episode slots[i].episode: its cache row from a row holding its prefix
    (or its prefill from scratch), its turn state, and its env replay if it needs one."""
    slot = self.slots[i]
    e, row = slot.episode, self.rows[slot.episode]
    _, at, mid, start, turn, slot.force = self.source.pop(e)
    src, keep = self._best_holder(holders if self.e.copy_prefixes else [], row.tokens[:at - 1])
    if src is not None:
      self.copies.append((src, i, keep))
      slot.reset = False
    slot.cached, slot.pending, slot.turn, slot.mid_turn = keep, keep < at - 1, turn, mid
    slot.turn_start, slot.budget = start, min(self.max_new, self.max_len - start)
    if row.env is None:
      source_env, seed, actions = self.rows[row.parent].env, self.seeds[e], list(row.actions)
      workers.submit(workers_lib.Call(i, "fork", _replay, (source_env, seed, actions)))

  def _copy_rows(self) -> None:
    """Makes the queued branch row copies (one program for all)."""
    if not self.copies:
      return
    D = sampler_lib.bucket(len(self.copies))
    src, dst, keep = np.zeros((D,), np.int32), np.full((D,), self.B, np.int32), \
        np.zeros((D,), np.int32)
    for d, (a, b, k) in enumerate(self.copies):
      src[d], dst[d], keep[d] = a, b, k
    self.cache = self.e.fork(self.cache, *jax.device_put((src, dst, keep)))
    self.counts["fork_kv_tokens"] += sum(k for _, _, k in self.copies)
    self.copies = []

  def trajectories(self) -> list[agent_loop.Trajectory]:
    """The rows' trajectories in `branching.order`, parents as indices of that list (none
    for a serving run: they went to `watch`)."""
    if self.serving:
      return []
    order = branching.order(self.paths)
    index = {old: new for new, old in enumerate(order)}
    trajs = [self.rows[old].trajectory() for old in order]
    for t in trajs:
      if t.parent >= 0:
        t.parent = index[t.parent]
    return trajs

  def _room(self, width: int) -> None:
    """Makes columns [col, col + width) writable: compacts, and grows the cache if it must."""
    if self.col + width <= self.capacity:
      return
    live = np.asarray([s.episode is not None and not s.reset for s in self.slots])
    self.cache, used = self.e.compact(self.cache, jax.device_put(live))
    self.col = int(used)
    self.freed = [None] * self.B      # compaction dropped the free rows
    # Grow when the compacted transcripts fill more than half of the cache, so compactions
    # (a copy of the whole cache) stay rare.
    if 2 * (self.col + width) > self.capacity:
      new_capacity = sampler_lib.bucket(2 * (self.col + width))
      grow = new_capacity - self.capacity
      pad = lambda x, axis: jnp.pad(x, [(0, grow) if a == axis else (0, 0)
                                        for a in range(x.ndim)])
      s = transformer.kv_batch_axis(self.cache) + 2
      k, v = jax.tree.map(lambda x: pad(x, s), (self.cache.k_LBGSK, self.cache.v_LBGSK))
      self.cache = transformer.KVCache(k, v,
                                       pad(self.cache.valid_BS, 1), pad(self.cache.pos_BS, 1))
      self.capacity = new_capacity

  def _prefill_pending(self, busy) -> None:
    todo = [i for i, s in enumerate(self.slots)
            if s.episode is not None and s.pending and i not in busy]
    if not todo:
      return
    new = {i: self.rows[self.slots[i].episode].tokens[self.slots[i].cached:-1] for i in todo}
    # Rows that prefill; a new episode whose whole first prompt equals one already listed is
    # filled by copying that row instead (the samples of one group).
    source, first = {}, {}
    for i in todo:
      key = tuple(new[i]) if self.slots[i].reset and new[i] else ("row", i)
      source[i] = first.setdefault(key, i)
    prefill_rows = sorted(set(source.values()))
    width = max(len(new[i]) for i in prefill_rows)
    N, R = sampler_lib.bucket(width, 16), sampler_lib.bucket(len(prefill_rows))
    self._room(N)
    tokens = np.full((R, N), self.e.pad_id, np.int32)
    pos, mask = np.zeros((R, N), np.int32), np.zeros((R, N), bool)
    rows, reset = np.full((R,), prefill_rows[0], np.int32), np.zeros((R,), bool)
    for r, i in enumerate(prefill_rows):
      n, start = len(new[i]), self.slots[i].cached
      if n:
        tokens[r, N - n:], pos[r, N - n:] = new[i], np.arange(start, start + n)
        mask[r, N - n:] = True
      rows[r], reset[r] = i, self.slots[i].reset
    dst, src = np.full((self.B,), self.B, np.int32), np.zeros((self.B,), np.int32)
    sub_index = {i: r for r, i in enumerate(prefill_rows)}
    for j, i in enumerate(todo):
      dst[j], src[j] = i, sub_index[source[i]]
    self.cache = self.prefill(self.params, self.layers, self.cache, *jax.device_put(
        (rows, reset, tokens, pos, mask, dst, src, np.int32(self.col))))
    self.col += N
    self.prefill_tokens += sum(len(new[i]) for i in prefill_rows)
    for i in todo:
      slot, row = self.slots[i], self.rows[self.slots[i].episode]
      slot.cached, slot.pending, slot.reset = len(row.tokens) - 1, False, False
      if not slot.mid_turn:      # a branch resuming a turn keeps that turn's start
        slot.turn_start = len(row.tokens)
        slot.budget = min(self.max_new, self.max_len - len(row.tokens))

  def _decode_chunk(self, decoding):
    """Decodes the slots for up to `chunk` steps; returns (slot, action text) per slot whose
    turn ended."""
    B, K = self.B, self.e.chunk
    self._room(K)
    feed, pos = np.zeros((B,), np.int32), np.zeros((B,), np.int32)
    active, budget = np.zeros((B,), bool), np.zeros((B,), np.int32)
    like = self.keys[self.slots[decoding[0]].episode]   # (episode 0's may be let go)
    keys = np.zeros((B, *like.shape), like.dtype)
    turn, step0 = np.zeros((B,), np.int32), np.zeros((B,), np.int32)
    greedy, force = np.zeros((B,), bool), np.full((B,), -1, np.int32)
    for i in decoding:
      slot, row = self.slots[i], self.rows[self.slots[i].episode]
      done = len(row.tokens) - slot.turn_start
      feed[i], pos[i], active[i] = row.tokens[-1], len(row.tokens) - 1, True
      budget[i], step0[i], greedy[i] = slot.budget - done, done, row.greedy
      keys[i], turn[i] = self.keys[slot.episode], slot.turn
      force[i], slot.force = slot.force, -1    # a forced first token: this chunk's first step
    sampling = dict(self.sampling)
    floats = (sampling.pop("temperature"), sampling.pop("top_p"), sampling.pop("adaptive_6"))
    start = time.monotonic()
    inputs = jax.device_put((np.int32(self.col), feed, pos, active, budget, keys, turn, step0,
                             greedy, force, self.stop_BK))
    self.cache, *out = self.decode(
        self.params, self.layers, self.cache, *inputs, self.rng, *jax.device_put(floats),
        num_steps=K, alternatives=self.alternatives, **sampling)
    tokens, logp, lengths, stopped, steps, alt, alt_logp = jax.device_get(out)
    self.col += int(steps)
    self.e.chunk_s = time.monotonic() - start
    ended = []
    for i in decoding:
      slot, row = self.slots[i], self.rows[self.slots[i].episode]
      n = int(lengths[i])
      row.append(tokens[i, :n], turn=slot.turn, logp=logp[i, :n],
                 alternatives=(alt[i, :n], alt_logp[i, :n]) if self.alternatives else None)
      slot.cached += n
      self.counts["sampled_tokens"] += n
      if self.watch is not None and n:
        self.watch("decoded", self.given[slot.episode], tokens[i, :n])
      if stopped[i] or len(row.tokens) - slot.turn_start >= slot.budget:
        self.model_turns += 1
        self.cut_turns += not stopped[i]
        ids = row.tokens[slot.turn_start:]
        slot.stopped = bool(stopped[i])
        ended.append((i, self.tok.decode([int(t) for t in (ids[:-1] if stopped[i] else ids)])))
    return ended
