# pylint: disable=invalid-name
"""Host-side inputs of the turn-level credit methods, built from `agent_loop.Trajectory`s.

Where each model turn starts and ends, "context then answer" probe rows (IGPO's gold-answer
probes, SIOP's reference probes), GiGPO's anchor-state step groups, MAPO's per-turn rewards
and progress signals, SIOP's answer modes, InfoPO's counterfactual transcripts, a PRM's step
layout (`prm_steps`, for `rewards.process` labels and `heads.StepHead` scores), and the
jitted teacher-forced passes that score them (`make_probe_step`, `make_counterfactual_step`);
rows [i*G, (i+1)*G) are prompt i's trajectories throughout. experiments/agents/agent.py
composes them.
"""
from collections.abc import Callable, Sequence
import dataclasses

from flax import nnx
import jax.numpy as jnp
import numpy as np

from agentrl.models import policy as policy_lib
from agentrl import types

from agentrl.credit import gigpo
from agentrl.credit import infopo
from agentrl.credit import siop
from agentrl.rewards import process
from agentrl.rollout import agent_loop

PROGRESS = "progress"   # the optional info key of an env's per-step progress in [0, 1]


def turn_starts(traj: agent_loop.Trajectory) -> list[int]:
  """Index of the first sampled token of each model turn (the history ends just before)."""
  sampled = np.nonzero(traj.loss_mask > 0)[0]
  turns = traj.turn[sampled]
  return [int(sampled[np.argmax(turns == k)]) for k in range(len(traj.turn_rewards))
          if np.any(turns == k)]


def turn_ends(traj: agent_loop.Trajectory) -> list[int]:
  """One past the last sampled token of each model turn (its observation starts there)."""
  sampled = np.nonzero(traj.loss_mask > 0)[0]
  turns = traj.turn[sampled]
  return [int(sampled[turns == k][-1]) + 1 for k in range(len(traj.turn_rewards))
          if np.any(turns == k)]


def probe_rows(pairs, *, length: int, pad_id: int):
  """[N, length] rows "context, then answer" (the most recent context kept) and the answer's
  mask; a None pair is an empty row (it scores 0)."""
  tokens = np.full((len(pairs), length), pad_id, np.int32)
  mask = np.zeros((len(pairs), length), np.float32)
  for row, pair in enumerate(pairs):
    if pair is not None:
      context, answer = pair
      context = context[max(len(context) - (length - len(answer)), 0):]
      n = len(context) + len(answer)
      tokens[row, :n] = np.concatenate([context, answer])
      mask[row, len(context):n] = 1.0
  positions = np.broadcast_to(np.arange(length, dtype=np.int32), tokens.shape).copy()
  return tokens, positions, tokens != pad_id, mask


def probe_batch(trajs, gold_ids, *, max_turns: int, length: int, pad_id: int):
  """[B * U, length] probe rows: the history before turn k, then the gold answer's ids."""
  pairs, turn_mask = [], np.zeros((len(trajs), max_turns), np.float32)
  for i, (traj, gold) in enumerate(zip(trajs, gold_ids)):
    starts = turn_starts(traj)[:max_turns]
    turn_mask[i, :len(starts)] = 1.0
    pairs += [(traj.tokens[:start], gold) for start in starts]
    pairs += [None] * (max_turns - len(starts))
  return (*probe_rows(pairs, length=length, pad_id=pad_id), turn_mask)


def per_turn(rows: Sequence[Sequence[float]], *, max_turns: int) -> np.ndarray:
  """float32 [B, U] from one list of per-turn values per trajectory (cut to U, 0-padded)."""
  out = np.zeros((len(rows), max_turns), np.float32)
  for i, row in enumerate(rows):
    values = np.asarray(row[:max_turns], np.float32)
    out[i, :len(values)] = values
  return out


def step_groups(trajs, *, group_size: int, max_turns: int) -> dict[str, np.ndarray]:
  """GiGPO's inputs: each turn's env reward, and its anchor-state group (the transcript the
  turn starts from: trajectories of a group that reached the same history share a group)."""
  step_reward = per_turn([traj.turn_rewards for traj in trajs], max_turns=max_turns)
  keys = [[traj.tokens[:start].tobytes() for start in turn_starts(traj)[:max_turns]]
          for traj in trajs]
  anchor = gigpo.anchor_groups(keys, group_size=group_size, num_turns=max_turns)
  return {"step_reward_BU": step_reward, "anchor_id_BU": anchor}


def turn_signals(trajs, *, max_turns: int) -> dict[str, np.ndarray]:
  """MAPO's inputs [B, U] (`credit.mapo`): each turn's env reward (`turn_rewards`), its progress
  signal and the turn mask (one turn per env step).

  The progress signal is the step's info[PROGRESS], a float in [0, 1] that the env sets where
  it can say whether the step moved towards the goal (TextWorld's intermediate reward, a tool
  env's per-call correctness); 0.0 where the info lacks it. It stands in for MAPO's judge.
  """
  progress = [[float(info.get(PROGRESS) or 0.0) for info in traj.infos] for traj in trajs]
  turns = [[1.0] * len(traj.turn_rewards) for traj in trajs]
  return {"env_reward_BU": per_turn([traj.turn_rewards for traj in trajs], max_turns=max_turns),
          "progress_BU": per_turn(progress, max_turns=max_turns),
          "turn_mask_BU": per_turn(turns, max_turns=max_turns)}


def prm_steps(trajs, *, max_steps: int, max_len: int | None = None) -> dict[str, np.ndarray]:
  """Where each row's steps (model turns) end, and what a fork shares with its parent.

  Returns "step_end" int32 [B, U] (last sampled token of each step, a position in the row as
  `pack` right-pads it), "step_mask" [B, U] (steps that exist, and end before `max_len`, the
  pack cut, when given), "num_steps" [B], "parent" [B] and "shared" [B] (whole steps shared
  with the parent; `Trajectory.fork_at` in steps): the inputs of `process.continuation_counts`
  and `process.sibling_groups`.
  """
  ends, masks = zip(*(process.step_ends(t.turn[None], t.loss_mask[None], max_steps=max_steps)
                      for t in trajs))
  end_BU, mask_BU = np.concatenate(ends), np.concatenate(masks)
  if max_len is not None:
    mask_BU = mask_BU * (end_BU < max_len)
  parent_B = np.array([t.parent for t in trajs], np.int32)
  shared_B = np.array([process.shared_steps(end_BU[t.parent], mask_BU[t.parent], t.fork_at)
                       if t.parent >= 0 else 0 for t in trajs], np.int32)
  return {"step_end": end_BU, "step_mask": mask_BU, "num_steps": mask_BU.sum(1).astype(np.int32),
          "parent": parent_B, "shared": shared_B}


def siop_references(answers, *, group_size: int, num_refs: int = 3):
  """Per rollout: its mode's reference answers, their weights alpha [B, R] and q(mode) [B].

  Modes are exact matches (`siop.answer_clusters`' default; SIOP's NLI judge is not offline)
  and there is no NLI evidence, so q is the mode's share of the group's answers.
  """
  refs, weights, ids = [], [], []
  for start in range(0, len(answers), group_size):
    group = answers[start:start + group_size]
    cluster_ids = siop.answer_clusters(group)
    group_refs, weight_GR = siop.cluster_references(group, cluster_ids, num_refs=num_refs)
    refs, weights, ids = refs + group_refs, weights + [weight_GR], ids + [cluster_ids]
  ids = np.concatenate(ids)
  return refs, np.concatenate(weights), siop.target_distribution(ids, group_size=group_size)


def siop_probes(trajs, ref_ids, *, max_turns: int, num_refs: int, length: int, pad_id: int):
  """[B * (U + 1) * R, length] probe rows, row (i, k + 1, r): trajectory i's prompt (k = -1) or
  its history through the end of model turn k (the observation after it excluded), then its
  reference r's ids; and the turn mask [B, U]."""
  pairs, turn_mask = [], np.zeros((len(trajs), max_turns), np.float32)
  for i, (traj, refs) in enumerate(zip(trajs, ref_ids)):
    ends = turn_ends(traj)[:max_turns]
    turn_mask[i, :len(ends)] = 1.0
    contexts = [traj.tokens[:traj.prompt_len]] + [traj.tokens[:end] for end in ends]
    contexts += [None] * (max_turns + 1 - len(contexts))
    pairs += [None if context is None or r >= len(refs) else (context, refs[r])
              for context in contexts for r in range(num_refs)]
  return (*probe_rows(pairs, length=length, pad_id=pad_id), turn_mask)


def counterfactual_trajs(trajs, placeholder_ids, *, max_turns: int):
  """B * (U - 1) transcripts, row i * (U - 1) + t: trajectory i with observation t's tokens
  replaced by the placeholder at the same length (`infopo.fit_placeholder`, so positions line
  up); and the feedback mask [B, U], 1 where turn t got an observation. An observation is all
  of turn t's env tokens: with the chat template its turn markers are replaced too."""
  out, feedback = [], np.zeros((len(trajs), max_turns), np.float32)
  for i, traj in enumerate(trajs):
    for t in range(max_turns - 1):
      obs = np.nonzero((traj.turn == t) & (traj.loss_mask == 0))[0]
      tokens = traj.tokens.copy()
      if obs.size:
        tokens[obs] = infopo.fit_placeholder(placeholder_ids, obs.size)
        feedback[i, t] = 1.0
      out.append(dataclasses.replace(traj, tokens=tokens))
  return out, feedback


def make_probe_step(graphdef, *, logprob_impl: str):
  """probe_step(params, tokens, positions, input_mask, mask) -> summed gold log-prob per row."""

  def probe_step(params, tokens_BT, positions_BT, input_mask_BT, mask_BT):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, tokens_BT, positions_BT, input_mask_BT,
                                        impl=logprob_impl)
    return (logp_BT * mask_BT).sum(-1)

  return probe_step


def make_counterfactual_step(graphdef, *, temperature: float, logprob_impl: str):
  """step(params, batch, counterfactual) -> (logp_BT, counterfactual_logp_BT): the policy's
  log-probs of the real transcript, and those of each turn t + 1's tokens with observation t
  replaced (`counterfactual` packs `counterfactual_trajs`); the real ones elsewhere."""

  def step(params, batch: types.Batch, counterfactual: types.Batch):
    policy = nnx.merge(graphdef, params)
    score = lambda b: policy_lib.token_logprobs(policy, b.tokens_BT, b.positions_BT,
                                                b.input_mask_BT, temperature=temperature,
                                                impl=logprob_impl)
    logp_BT = score(batch)
    B, T = logp_BT.shape
    cf_BVT = score(counterfactual).reshape(B, -1, T)
    index_BT = jnp.clip(batch.turn_BT - 1, 0, cf_BVT.shape[1] - 1)
    cf_BT = jnp.take_along_axis(cf_BVT, index_BT[:, None, :], axis=1)[:, 0]
    return logp_BT, jnp.where(batch.turn_BT >= 1, cf_BT, logp_BT)

  return step


def final_answers(trajs, tok, parse: Callable[[str], Sequence[str] | None]) -> list[str | None]:
  """Each rollout's final answer: its last model turn's text as `parse` reads it (e.g.
  `hidden_rule.parse_command`: "guess 37"), words joined; None without a model turn or a parse."""
  stop = {int(t) for t in tok.end_of_turn_ids}
  stop |= {int(tok.eos_id)} if tok.eos_id is not None else set()
  answers = []
  for traj in trajs:
    sampled = np.nonzero(traj.loss_mask > 0)[0]
    last = sampled[traj.turn[sampled] == traj.turn[sampled].max()] if sampled.size else sampled
    command = parse(
        tok.decode([int(t) for t in traj.tokens[last] if int(t) not in stop]))
    answers.append(" ".join(command).strip() if command else None)
  return answers
