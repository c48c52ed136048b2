"""Delethink rollouts: reasoning in fixed-size chunks with a context reset and a carry-over.

The Markovian Thinker (Aghajohari et al. 2025, arXiv 2510.06557; code
`McGill-NLP/the-markovian-thinker`, `verl/experimental/agent_loop/delethink_agent_loop.py`
with the `progressive` trimmer of `delethink_trimmers.py`). docs/algorithms.md §12.7:

  traces, metrics = delethink.run(engine, params, tok, envs, seeds, rng=key)   # 24k defaults
  rows, owner = delethink.chunk_rows(traces)       # one training row per chunk
  batch = pack.pack(rows, max_len=..., pad_id=tok.pad_id)
  adv_C = adv_B[owner]                             # each chunk gets its trace's advantage

Chunk 0 samples up to `chunk_size` (C = 8192) tokens from the rendered prompt. A chunk that
ends on a stop id (EOS or end-of-turn) ends the trace; otherwise the next chunk's context is
the prompt followed by the carry-over, the first `keep_head` (100) tokens of chunk 0 and the
last `keep_tail` (C/2 - 100) tokens of (previous carry-over + this chunk), and it samples up
to `intermediate_max_new_tokens` (C/2) tokens; at most `max_chunks` (I = 5) chunks. The
context of a chunk is thus at most prompt + C tokens, whatever the trace's length.

Token in, token out: the carry-over is made of the sampled ids themselves, never decoded and
re-encoded. Each chunk runs through the rollout engine (`Engine.run`) as a one-turn episode
whose prompt is given as ids; chunk k of every live trace runs in one `Engine.run` call. The
task env is reset once per trace and stepped once at the end with the text of the last chunk
and its carry-over (the response the official reward manager scores), so any single-turn
verifiable env works unchanged.

Each chunk is an `agent_loop.Trajectory`: its context has loss_mask 0 and turn -1, its sampled
ids loss_mask 1 and turn k (the chunk index); every chunk of a trace carries the trace's
reward, done and truncated flags. A trace is truncated when no chunk stopped.
"""
import dataclasses
from typing import Any, Sequence

import jax
import numpy as np

from agentrl.envs import safe
from agentrl.rollout import agent_loop
from agentrl.rollout import continuations


@dataclasses.dataclass
class Trace:
  """One Delethink rollout: its chunks in order and the task env's verdict."""
  chunks: list[agent_loop.Trajectory]
  reward: float
  done: bool               # the task env ended the episode
  truncated: bool          # no chunk ended on a stop id (the chunk cap ended the trace)
  prompt_len: int          # tokens of the rendered prompt (every chunk's context starts so)
  infos: list[dict] = dataclasses.field(default_factory=list)

  @property
  def trace_len(self) -> int:
    """Sampled tokens over all chunks (the official loss normaliser's trace length)."""
    return int(sum(c.loss_mask.sum() for c in self.chunks))


def carry_over(answer: Sequence[int], *, keep_head: int, keep_tail: int) -> list[int]:
  """The `progressive` trimmer: the first keep_head and last keep_tail ids of `answer`.

  `answer` is the previous carry-over followed by the chunk just sampled (chunk 0 alone
  after the first chunk), so the head stays chunk 0's first tokens. Like the official trimmer
  it needs len(answer) > keep_head + keep_tail, which holds for a chunk that used its budget.
  """
  if len(answer) <= keep_head + keep_tail:
    raise ValueError(f"carry_over needs more than keep_head + keep_tail = "
                     f"{keep_head + keep_tail} ids, got {len(answer)}.")
  return list(answer[:keep_head]) + list(answer[len(answer) - keep_tail:])


def _chunk_key(rng, chunk: int):
  # An explicit transfer, so rollouts run under jax_transfer_guard="disallow".
  return jax.random.fold_in(rng, jax.device_put(np.uint32(chunk)))


def _chunk(traj: agent_loop.Trajectory, context_len: int, k: int) -> agent_loop.Trajectory:
  """The engine's one-turn trajectory with the chunk index as the sampled ids' turn."""
  turn = np.full(len(traj.tokens), -1, np.int32)
  turn[context_len:] = k
  return dataclasses.replace(traj, turn=turn, turn_rewards=[], reward=0.0, done=False,
                             truncated=False, prompt_len=context_len, infos=[])


def run(engine, params, tok, envs: Sequence[Any], seeds: Sequence[Any], *, rng: jax.Array,
        chunk_size: int = 8192, keep_head: int = 100, keep_tail: int | None = None,
        intermediate_max_new_tokens: int | None = None, max_chunks: int = 5,
        greedy: bool | Sequence[bool] = False, chat_template: bool = True,
        system_prompt: str | None = None, **sample_kwargs) -> tuple[list[Trace], dict]:
  """Delethink rollouts of env i from reset(seeds[i]); returns (traces, metrics).

  Args:
    engine: an `agentrl.rollout.engine.Engine` (anything with its `run`).
    params, tok: the policy's nnx.State and tokenizer, as for `Engine.run`.
    envs: single-turn task envs (envs/base.py), stepped once with the final answer text.
    chunk_size: C, the first chunk's budget (official `data.max_response_length` = 8192).
    keep_head, keep_tail: the carry-over (100 and C/2 - 100 by default: m = C/2).
    intermediate_max_new_tokens: budget of chunks after the first (C/2 by default).
    max_chunks: I, the most chunks per trace (5: a 24k thinking budget; the 96k runs use 23).
    greedy, chat_template, system_prompt: as `Engine.run` (they shape the first prompt).
    **sample_kwargs: temperature, top_k, top_p, logp_mode for `Engine.run`.
  """
  keep_tail = chunk_size // 2 - keep_head if keep_tail is None else keep_tail
  budget_later = (chunk_size // 2 if intermediate_max_new_tokens is None
                  else intermediate_max_new_tokens)
  if len(envs) != len(seeds):
    raise ValueError(f"got {len(envs)} envs but {len(seeds)} seeds; pass one seed per env.")
  if not (keep_head >= 0 and keep_tail > 0 and keep_head + keep_tail < chunk_size
          and 1 <= budget_later <= chunk_size and max_chunks >= 1):
    raise ValueError(f"Delethink needs keep_head >= 0, keep_tail > 0, keep_head + keep_tail < "
                     f"chunk_size, 1 <= intermediate_max_new_tokens <= chunk_size and "
                     f"max_chunks >= 1; got keep_head={keep_head}, keep_tail={keep_tail}, "
                     f"chunk_size={chunk_size}, intermediate_max_new_tokens={budget_later}, "
                     f"max_chunks={max_chunks}.")
  flags = [bool(greedy)] * len(envs) if isinstance(greedy, bool) else [bool(g) for g in greedy]
  stop_ids = {int(t) for t in tok.end_of_turn_ids} | {int(tok.eos_id)}
  render = agent_loop.Renderer(tok, chat_template=chat_template, system_prompt=system_prompt)
  safe_envs = [e if isinstance(e, safe.SafeEnv) else safe.SafeEnv(e) for e in envs]
  before = [dict(e.counters) for e in safe_envs]
  prompts = [render.prompt(e.reset(s), e.system_prompt, e.examples)
             for e, s in zip(safe_envs, seeds)]
  chunks: list[list[agent_loop.Trajectory]] = [[] for _ in envs]
  carries: list[list[int]] = [[] for _ in envs]   # carry-over in the last chunk's context
  stopped = [False] * len(envs)
  live = [i for i, e in enumerate(safe_envs) if not e.reset_error]
  totals = {"rollout/sampled_tokens": 0.0, "rollout/prefill_tokens": 0.0}
  for k in range(max_chunks):
    if not live:
      break
    contexts = [prompts[i] + carries[i] for i in live]
    budget = chunk_size if k == 0 else budget_later
    trajs, metrics = continuations.sample_continuations(
        engine, params, tok, contexts, rng=_chunk_key(rng, k), max_new_tokens=budget,
        greedy=[flags[i] for i in live], **sample_kwargs)
    for key in totals:
      totals[key] += metrics.get(key, 0.0)
    still = []
    for i, context, traj in zip(live, contexts, trajs):
      response = [int(t) for t in traj.tokens[len(context):]]
      chunks[i].append(_chunk(traj, len(context), k))
      stopped[i] = bool(response) and response[-1] in stop_ids
      if not stopped[i] and k + 1 < max_chunks:
        answer = response if k == 0 else carries[i] + response
        carries[i] = carry_over(answer, keep_head=keep_head, keep_tail=keep_tail)
        still.append(i)
    live = still
  traces = [_finish(tok, env, prompt, row_chunks, stop, stop_ids)
            for env, prompt, row_chunks, stop in zip(safe_envs, prompts, chunks, stopped)]
  return traces, _metrics(traces, totals, agent_loop.env_metrics(safe_envs, before))


def _finish(tok, env: safe.SafeEnv, prompt: list[int], row_chunks, stopped: bool,
            stop_ids) -> Trace:
  """Scores the last chunk with its carry-over and stamps the verdict on every chunk."""
  if not row_chunks:                       # the reset failed: no model turn, as agent_loop
    return Trace([], 0.0, False, False, len(prompt))
  last = row_chunks[-1]
  answer = [int(t) for t in last.tokens[len(prompt):]]
  if answer and answer[-1] in stop_ids:
    answer = answer[:-1]
  _, reward, done, info = env.step(tok.decode(answer))
  reward, truncated = float(reward), not stopped
  row_chunks = [dataclasses.replace(c, turn_rewards=[reward], reward=reward, done=bool(done),
                                    truncated=truncated) for c in row_chunks]
  row_chunks[-1].infos = [info]
  return Trace(row_chunks, reward, bool(done), truncated, len(prompt), [info])


def _metrics(traces: Sequence[Trace], totals: dict, env: dict) -> dict[str, float]:
  mean = lambda xs: float(np.mean(xs)) if len(xs) else 0.0
  contexts = [c.prompt_len for t in traces for c in t.chunks]
  return {**totals, **env,
          "rollout/reward_mean": mean([t.reward for t in traces]),
          "rollout/truncated_frac": mean([t.truncated for t in traces]),
          "rollout/response_tokens_mean": mean([t.trace_len for t in traces]),
          "delethink/chunks_mean": mean([len(t.chunks) for t in traces]),
          "delethink/context_max": float(max(contexts, default=0))}


def chunk_rows(traces: Sequence[Trace]) -> tuple[list[agent_loop.Trajectory], np.ndarray]:
  """(every chunk as a training row, trace index of each row [C] int32), traces in order.

  Per-trace values (advantages, trace lengths) reach the chunk rows as `value_B[owner]`.
  """
  rows = [c for t in traces for c in t.chunks]
  owner = np.asarray([i for i, t in enumerate(traces) for _ in t.chunks], np.int32)
  return rows, owner
