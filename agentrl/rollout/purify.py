# pylint: disable=invalid-name
"""Instruction purification (Lens: Guo, Hu, Sun, Lin, "Less Noise, More Voice", arXiv
2601.21244; docs/algorithms.md §17.4): delete the prompt tokens whose log-prob moved most
from the reference, resample low-success prompts under the purified prompt, and store the
successful purified rows under the ORIGINAL prompt in place of failed ones
(agentrl/rollout/guided.py's splice; agentrl/losses/guided.py's `crpo_loss` trains them).

  scores_T = purify.interference_scores(logp_T, ref_logp_T)          # |log π_θ − log π_ref|
  delete_T = purify.interference_set(scores_T, eligible_T, gamma=0.05)   # top ⌈γ·n⌉
  rollout = purify.purified_rollout(engine, params, tok, make_env, seeds, score_fn=score,
                                    gamma=0.05, tau=0.5, num_purified=8, rng=key, ...)

Eligible tokens are the task text's only (the env's first observation as `tok.encode` gives
it, found inside the rendered prompt): the BOS, a chat template's tokens, the system prompt,
few-shot examples and padding are never deleted. n in k = ⌈γ·n⌉ counts the eligible tokens.
A token is deleted only if its score exceeds `min_score` (0 by default), so at π_θ = π_ref
(step 1 from the warm start, every score exactly 0) nothing is deleted and no prompt is
resampled [INF: the paper does not say what happens then]. Ties in the score go to the
earlier position (a stable sort), so the deletion is deterministic.
"""
from collections.abc import Callable, Sequence
import math
from typing import Any

import jax
import numpy as np

from agentrl.rollout import agent_loop
from agentrl.rollout import collect
from agentrl.rollout import guided
from agentrl.rollout import pack as pack_lib


def interference_scores(logp_T, ref_logp_T, *, absolute: bool = True) -> np.ndarray:
  """Lens's interference score S_I(s, a) = |log π_θ(a|s) − log π_ref(a|s)| per token (float64);
  `absolute=False` keeps the sign (π_θ above π_ref ranks first) [INF: the form of v1]."""
  d = np.asarray(logp_T, np.float64) - np.asarray(ref_logp_T, np.float64)
  return np.abs(d) if absolute else d


def deletion_count(n_eligible: int, gamma: float) -> int:
  """k = ⌈γ·n⌉ (0 for n = 0). γ·n is rounded to 9 decimals first, so that 0.03·100 (which is
  3.0000000000000004 in floating point) deletes 3 tokens, not 4."""
  if not 0.0 <= gamma <= 1.0:
    raise ValueError(f"gamma (the deletion ratio) must be in [0, 1]; got {gamma}.")
  if n_eligible < 0:
    raise ValueError(f"n_eligible must be >= 0; got {n_eligible}.")
  return math.ceil(round(gamma * n_eligible, 9))


def interference_set(scores_T, eligible_T, *, gamma: float, min_score: float = 0.0) -> np.ndarray:
  """bool [T]: the interference set, the k = ⌈γ·n⌉ eligible tokens of highest score (n =
  eligible tokens). Only tokens scoring above `min_score` can be deleted (so fewer than k, or
  none, when too few do); ties go to the earlier position."""
  scores_T, eligible_T = np.asarray(scores_T, np.float64), np.asarray(eligible_T, bool)
  if scores_T.shape != eligible_T.shape or scores_T.ndim != 1:
    raise ValueError(f"scores {scores_T.shape} and eligible {eligible_T.shape} must be equal "
                     "1-D shapes.")
  k = deletion_count(int(eligible_T.sum()), gamma)
  candidates = np.flatnonzero(eligible_T & (scores_T > min_score))
  order = candidates[np.argsort(-scores_T[candidates], kind="stable")]
  out = np.zeros(scores_T.shape, bool)
  out[order[:k]] = True
  return out


def task_span(prompt_ids: Sequence[int], task_ids: Sequence[int]) -> tuple[int, int]:
  """[start, end) of the LAST occurrence of `task_ids` in `prompt_ids` (the task text comes
  after the system prompt and the few-shot examples). ValueError if it does not occur (a
  tokenizer that merges the task's first or last token with the template's)."""
  p, q = list(prompt_ids), list(task_ids)
  if not q:
    raise ValueError("the task text encodes to no tokens; nothing can be purified.")
  for start in range(len(p) - len(q), -1, -1):
    if p[start:start + len(q)] == q:
      return start, start + len(q)
  raise ValueError("the task text's tokens do not occur in the rendered prompt (the template "
                   "merges them with its own); purification needs a tokenizer that keeps them.")


def transfer_pairs(original_success: Sequence[bool],
                   purified_success: Sequence[bool]) -> list[tuple[int, int]]:
  """(original row, purified row) pairs: when the purified success rate is strictly higher
  than the original one, the successful purified rows replace as many failed original rows
  (both in row order [INF: the rows are exchangeable]); else none."""
  orig, pur = np.asarray(original_success, bool), np.asarray(purified_success, bool)
  if not len(orig) or not len(pur) or pur.mean() <= orig.mean():
    return []
  return list(zip(np.flatnonzero(~orig).tolist(), np.flatnonzero(pur).tolist()))


def prompt_scores(score_fn, params, prompts: Sequence[Sequence[int]], *, pad_id: int,
                  max_len: int, min_len: int, per_octave: int, sharding=None,
                  absolute: bool = True) -> list[np.ndarray]:
  """Per prompt, S_I of each of its tokens (0 at position 0, which has no prefix).

  `score_fn(params, batch) -> (batch, metrics)` must fill `old_logp_BT` (π_θ) and `ref_logp_BT`
  (π_ref): the experiment's score step with its reference (`loop.make_score_step(...,
  with_ref=True)`), so LoRA, the log-prob kernel and the temperature are the trainer's."""
  rows = [agent_loop.Trajectory(
      tokens=np.asarray(p, np.int32), loss_mask=np.zeros(len(p), np.float32),
      turn=np.full(len(p), -1, np.int32), sampler_logp=np.zeros(len(p), np.float32),
      turn_rewards=[], reward=0.0, done=True, truncated=False, prompt_len=len(p))
          for p in prompts]
  batch = pack_lib.pack(rows, max_len=max_len, pad_id=pad_id, min_len=min_len,
                        per_octave=per_octave, sharding=sharding)
  scored, _ = score_fn(params, batch)
  if scored.ref_logp_BT is None:
    raise ValueError("score_fn returned no ref_logp_BT; build it with with_ref=True.")
  logp, ref = jax.device_get((scored.old_logp_BT, scored.ref_logp_BT))
  return [interference_scores(logp[i, :len(p)], ref[i, :len(p)], absolute=absolute)
          for i, p in enumerate(prompts)]


def purify_prompt(tok, prompt_ids: Sequence[int], task_text: str, scores_T, *, gamma: float,
                  min_score: float = 0.0) -> tuple[str, int]:
  """(the purified task text, tokens deleted): the task text's tokens (`task_span`) minus
  their interference set, decoded. The purified prompt is that text rendered as the original
  was (the template, system prompt and examples unchanged) [INF: a BPE tokenizer may encode
  the decoded text differently from the kept ids]."""
  start, end = task_span(prompt_ids, tok.encode(task_text))
  eligible_T = np.zeros(len(prompt_ids), bool)
  eligible_T[start:end] = True
  delete_T = interference_set(scores_T, eligible_T, gamma=gamma, min_score=min_score)
  kept = [int(t) for t, d in zip(prompt_ids[start:end], delete_T[start:end]) if not d]
  return tok.decode(kept), int(delete_T.sum())


def first_observation(make_env: Callable[[], Any], seed) -> str:
  """seed's first observation (the task text a purification edits)."""
  env = make_env()
  obs = env.reset(seed)
  close = getattr(env, "close", None)
  if callable(close):
    close()
  return obs


def success_of(traj: agent_loop.Trajectory, success_tau: float) -> bool:
  """A row succeeds when its reward reaches `success_tau` (1 for the binary verifiable rewards
  Lens trains on)."""
  return traj.reward >= success_tau


def purified_rollout(engine, params, tok, make_env: Callable[[], Any], seeds: Sequence[Any], *,
                     score_fn, gamma: float, tau: float, num_purified: int, rng: jax.Array,
                     group_size: int, max_turns: int, max_new_tokens: int, max_len: int,
                     temperature: float, chat_template: bool, success_tau: float = 1.0,
                     absolute: bool = True, min_score: float = 0.0,
                     system_prompt: str | None = None, min_len: int = 16, per_octave: int = 1,
                     sharding=None, **sample_kwargs) -> collect.Rollout:
  """Lens's rollout: G rows per seed under the original prompt; for each prompt whose success
  rate is below τ, `num_purified` rows under its purified prompt (`purify_prompt` on
  `prompt_scores`, when it deletes a token); `transfer_pairs` then puts successful purified
  rows, `guided.reprompt`ed under the original prompt, in place of failed original ones.

  The batch keeps P·G rows, rows [i·G, (i+1)·G) seed i's. Extras: `guided_B` (1 on transferred
  rows, whose `sampler_logp` is π_old under the purified prompt). Host metrics add
  rollout/low_success_prompts, purified_prompts, deleted_tokens (mean per purified prompt),
  purified_success and purified_original_success (success rates of the purified rows and of
  the original rows of the same prompts), transferred_rows (0 where there are none).
  """
  if not 0 < num_purified:
    raise ValueError(f"num_purified must be >= 1; got {num_purified}.")
  run_kw = dict(max_turns=max_turns, max_new_tokens=max_new_tokens, max_len=max_len,
                temperature=temperature, chat_template=chat_template,
                system_prompt=system_prompt, **sample_kwargs)
  G = group_size
  row_seeds = [s for s in seeds for _ in range(G)]
  key_original, key_purified = jax.random.split(rng)
  rows, metrics = engine.run(params, tok, [make_env() for _ in row_seeds], row_seeds,
                             rng=key_original, **run_kw)
  rows = list(rows)
  success = [success_of(t, success_tau) for t in rows]
  low = [i for i in range(len(seeds)) if np.mean(success[i * G:(i + 1) * G]) < tau]
  prompts = {i: rows[i * G].tokens[:rows[i * G].prompt_len] for i in range(len(seeds))}
  texts, deleted = {}, {}
  if low:
    scores = prompt_scores(score_fn, params, [prompts[i] for i in low], pad_id=tok.pad_id,
                           max_len=max_len, min_len=min_len, per_octave=per_octave,
                           sharding=None, absolute=absolute)
    for i, s in zip(low, scores):
      text, n = purify_prompt(tok, prompts[i], first_observation(make_env, seeds[i]), s,
                              gamma=gamma, min_score=min_score)
      if n:
        texts[i], deleted[i] = text, n
  purified_idx = sorted(texts)
  flags = np.zeros(len(rows), np.float32)
  pur_success, orig_success, moved = [], [], 0
  if purified_idx:
    envs = [guided.GuidedEnv(make_env(), (lambda obs, seed, t=texts[i]: t))
            for i in purified_idx for _ in range(num_purified)]
    pur_seeds = [seeds[i] for i in purified_idx for _ in range(num_purified)]
    pur_rows, pur_metrics = engine.run(params, tok, envs, pur_seeds, rng=key_purified, **run_kw)
    for k, v in pur_metrics.items():  # counts add up; a rate (turn_cut_frac) stays the first's
      if k in metrics and not k.endswith("_frac"):
        metrics[k] += v
    for j, i in enumerate(purified_idx):
      block = pur_rows[j * num_purified:(j + 1) * num_purified]
      block_success = [success_of(t, success_tau) for t in block]
      pur_success += block_success
      orig_success += success[i * G:(i + 1) * G]
      for o, p in transfer_pairs(success[i * G:(i + 1) * G], block_success):
        rows[i * G + o] = guided.reprompt(block[p], prompts[i])
        flags[i * G + o] = 1.0
        moved += 1
  batch = pack_lib.pack(rows, max_len=max_len, pad_id=tok.pad_id, min_len=min_len,
                        per_octave=per_octave, sharding=sharding)
  mean = lambda xs: float(np.mean(xs)) if len(xs) else 0.0
  host = {**metrics, **agent_loop.summarize(rows), **collect.rollout_metrics(rows),
          **collect.batch_metrics(rows, batch),
          "rollout/low_success_prompts": float(len(low)),
          "rollout/purified_prompts": float(len(purified_idx)),
          "rollout/deleted_tokens": mean(list(deleted.values())),
          "rollout/purified_success": mean(pur_success),
          "rollout/purified_original_success": mean(orig_success),
          "rollout/transferred_rows": float(moved)}
  extras = {"guided_B": jax.device_put(flags, sharding)}
  return collect.Rollout(batch=batch, metrics=host, extras=extras,
                         lengths_B=collect.row_lengths(rows, batch), trajectories=rows,
                         tokenizer=tok)
