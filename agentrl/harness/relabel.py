# pylint: disable=invalid-name
"""Group rollouts relabelled on the host: rewards or per-row data from the completions.

Label-free RL replaces the verifier's reward by one computed from each group's own answers
(TTRL's majority vote, EMPO's cluster frequency; `agentrl.rewards.label_free`), COPO needs the
answer clusters of each group, FAPO re-scores each correct answer by a flaw detector. All of
them read the sampled completions on the host, after sampling and before packing:

  rollout_fn = relabel.group_rollout_fn(config, engine, tok, make_env, data, mesh, relabel_fn)
  relabel_fn(trajs) -> Labels(reward_B=..., extras={"answer_id_B": ...}, metrics={...})

`group_rollout_fn` is `recipe.group_rollout_fn` (same sampling, length buckets, rollout
metrics and row lengths) with that hook between the engine and `pack`. A replaced reward
becomes the batch's reward_B and the logged `reward`; the env's own (the verifier's) mean is logged as `verifier_reward`,
and `success` stays the env's, so a label-free run still shows the real task's progress.
"""
from collections.abc import Callable, Sequence
import dataclasses

import jax
import ml_collections as mlc
import numpy as np

from agentrl.rewards import extract
from agentrl.rewards import label_free
from agentrl.rollout import agent_loop
from agentrl.rollout import collect
from agentrl.rollout import pack
from agentrl import sharding
from agentrl.train import loop

Trajectory = agent_loop.Trajectory


@dataclasses.dataclass
class Labels:
  """What a relabel function returns for the P * G trajectories of a step."""
  reward_B: Sequence[float] | None = None   # replaces the env rewards; None keeps them
  extras: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)  # [B, ...] per row
  metrics: dict[str, float] = dataclasses.field(default_factory=dict)      # host scalars


def completion_text(traj: Trajectory, tok) -> str:
  """The policy's text of the trajectory's last model turn, as the env's step() received it.

  The sampled ids of that turn, decoded, without the stop token (EOS or end of turn) that
  ended it; "" when the policy sampled nothing.
  """
  sampled = np.asarray(traj.loss_mask) > 0
  if not sampled.any():
    return ""
  turn = np.asarray(traj.turn)
  ids = [int(t) for t in np.asarray(traj.tokens)[sampled & (turn == turn[sampled].max())]]
  stops = {int(tok.eos_id), *(int(t) for t in tok.end_of_turn_ids)}
  if ids and ids[-1] in stops:
    ids = ids[:-1]
  return tok.decode(ids)


def final_answer(text: str, task_name: str) -> str | None:
  """The answer a task reads from a completion; None when it holds none.

  arithmetic scores the whole completion by exact match, so the answer is the stripped
  completion; every other task goes through `extract.extract(text, "tag_or_last_line")`, the
  reasoning-gym env's extraction.
  """
  if task_name == "arithmetic":
    return text.strip() or None
  return extract.extract(text, "tag_or_last_line")


def answers(trajs: Sequence[Trajectory], tok, task_name: str) -> list[str | None]:
  """`final_answer` of every trajectory's completion, in batch order."""
  return [final_answer(completion_text(t, tok), task_name) for t in trajs]


def majority_accuracy(answers_B: Sequence[str | None], success_B: Sequence[bool], *,
                      group_size: int) -> float:
  """Fraction of groups whose most frequent answer (ties: the first) is a correct one.

  The label quality of majority-vote RL (TTRL's "label accuracy"): `success_B` is the
  verifier's verdict per row; a group without any answer counts as wrong.
  """
  votes_B = label_free.per_group(list(answers_B), group_size, label_free.majority_vote_rewards)
  hits = [any(v > 0 and s for v, s in zip(votes_B[i:i + group_size],
                                          success_B[i:i + group_size]))
          for i in range(0, len(votes_B), group_size)]
  return float(np.mean(hits))


def group_rollout_fn(config: mlc.ConfigDict, engine, tok, make_env, data, mesh,
                     relabel: Callable[[list[Trajectory]], Labels]) -> Callable:
  """rollout_fn(params, rng, step) -> loop.Rollout: `recipe.group_rollout_fn`, relabelled.

  `relabel(trajs)` sees the P * G host trajectories (rows [i*G, (i+1)*G) share a prompt).
  Its `extras` go to the device with the batch's row sharding and reach the advantage step
  as its `extras` argument; its `metrics` are logged with the rollout's.
  """
  rc, tc = config.rollout, config.task
  rows = sharding.batch_sharding(mesh)
  min_len = min(rc.min_len, rc.max_len)

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    groups = agent_loop.rollout_groups(
        engine, params, tok, make_env, seeds, group_size=rc.group_size, rng=rng,
        max_turns=tc.max_turns, max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
        temperature=rc.temperature, chat_template=tc.chat_template)
    trajs = groups.trajectories
    labels = relabel(trajs)
    host = {**groups.metrics, **labels.metrics}
    if labels.reward_B is not None:
      if len(labels.reward_B) != len(trajs):
        raise ValueError(f"relabel returned {len(labels.reward_B)} rewards for {len(trajs)} "
                         "trajectories.")
      host["verifier_reward"] = float(np.mean([t.reward for t in trajs]))
      trajs = [dataclasses.replace(t, reward=float(r)) for t, r in zip(trajs, labels.reward_B)]
      host["rollout/reward_mean"] = float(np.mean(labels.reward_B))
    batch = pack.pack(trajs, max_len=rc.max_len, pad_id=tok.pad_id, min_len=min_len,
                      per_octave=rc.buckets_per_octave, sharding=rows)
    host |= collect.rollout_metrics(trajs) | collect.batch_metrics(trajs, batch)
    extras = {k: jax.device_put(np.asarray(v), rows) for k, v in labels.extras.items()}
    return loop.Rollout(batch=batch, metrics=host, extras=extras,
                        lengths_B=collect.row_lengths(trajs, batch), trajectories=trajs,
                        tokenizer=tok)

  return rollout_fn
