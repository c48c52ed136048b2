# pylint: disable=invalid-name
"""AnytimeReasoner rollouts for BRPO: a thinking, cut at every budget, summaries of each cut.

sail-sg/AnytimeReasoner `verl/verl/trainer/ppo/brpo.py` (`sample_partial_cot`, the `LLM`
subclass that queues the summary requests, `compute_reward_and_correct_answer`);
docs/algorithms.md §12.4. For each of the G samples of a prompt:

  1. The policy samples a thinking of at most b_{S-1} tokens, stopping at the think-end id
     (or EOS). It "closed" if its last id is the think-end id.
  2. Slot s gets the context prompt + thinking[:b_s] + [think_end] when the thinking is longer
     than b_s or never closed, and prompt + thinking (which ends with think_end) when it closed
     within b_s: every slot past the end of a closed thinking reads the complete thinking
     (`cut_context`). The official code inserts "...\n\n...\n\n</think>" and a final-answer
     delimiter; here the inserted ids are the think-end id alone [INF: the task's format].
  3. A summaries are sampled from each slot's context, up to `summary_tokens` tokens each.
  4. A summary scores the task env's reward of the decoded cut thinking + inserted ids +
     summary, if that text holds exactly one think-end id (the official format check) and the
     cut thinking does not end on EOS; else 0 (`summary_score`).

Training rows (what `run` returns): the G thinking rows (prompt, then the sampled thinking with
loss mask 1) and the S A summary rows of each (context with loss mask 0, summary with loss
mask 1), with score_BSA [B, S, A] for `efficiency.brpo_thinking`, `brpo_summary` and
`brpo_thinking_tokens` (`brpo_cut_index` gives the cut each slot reads). The official code
packs a thinking and its summaries into one sequence with tree attention; separate rows give
the same tokens the same contexts.
"""
from collections.abc import Callable, Sequence
import dataclasses
from typing import Any

import jax
import numpy as np

from agentrl.rollout import agent_loop
from agentrl.rollout import continuations


@dataclasses.dataclass
class AnytimeRollout:
  thinking: list[agent_loop.Trajectory]    # [B]: prompt + sampled thinking
  summaries: list[agent_loop.Trajectory]   # [B S A], row-major: context + sampled summary
  score_BSA: np.ndarray                    # float32 [B, S, A]
  metrics: dict[str, float]


def cut_context(prompt: Sequence[int], thinking: Sequence[int], budget: int, *,
                think_end_id: int) -> list[int]:
  """The context slot b's summaries are sampled from (`sample_partial_cot`)."""
  closed = len(thinking) > 0 and thinking[-1] == think_end_id
  if len(thinking) > budget or not closed:
    return list(prompt) + list(thinking[:budget]) + [think_end_id]
  return list(prompt) + list(thinking)


def summary_score(reward: float, cut_and_summary: Sequence[int], *, think_end_id: int,
                  thinking_ends_on_eos: bool) -> float:
  """`compute_reward_and_correct_answer`: the env's reward if the text is well formed, else 0.

  Args:
    reward: the task env's reward of the decoded cut thinking, inserted ids and summary.
    cut_and_summary: those ids (without the summary's final stop id).
    thinking_ends_on_eos: the cut thinking's last id is EOS (the policy ended without ever
      closing its thinking): scored 0.
  """
  if thinking_ends_on_eos:
    return 0.0
  formatted = list(cut_and_summary).count(think_end_id) == 1
  return float(reward) if formatted else 0.0


def run(engine, params, tok, make_env: Callable[[], Any], seeds: Sequence[Any], *,
        group_size: int, budgets: Sequence[int], num_summaries: int, summary_tokens: int,
        think_end_id: int, rng: jax.Array, max_len: int, temperature: float = 1.0,
        chat_template: bool = False) -> AnytimeRollout:
  """Thinking rollouts of G samples per seed, then A summaries per budget slot of each.

  Rows [i G, (i + 1) G) of `thinking` are seeds[i]'s samples; summaries are row-major over
  (row, slot, summary). `budgets` are the increasing b_s; the thinking's budget is b_{S-1}.
  The metrics are the thinking rollout's, with both phases' sampled and prefilled tokens.
  """
  think_rng, summary_rng = jax.random.split(rng)
  groups = agent_loop.rollout_groups(
      engine, params, stop_at(tok, think_end_id), make_env, seeds,
      group_size=group_size, rng=think_rng, max_turns=1, max_new_tokens=budgets[-1],
      max_len=max_len, temperature=temperature, chat_template=chat_template)
  contexts, on_eos = [], []
  for traj in groups.trajectories:
    prompt, sampled = traj.tokens[:traj.prompt_len], traj.tokens[traj.prompt_len:]
    for b in budgets:
      contexts += [cut_context(prompt, sampled, b, think_end_id=think_end_id)] * num_summaries
      on_eos += [len(sampled[:b]) > 0 and int(sampled[:b][-1]) == tok.eos_id] * num_summaries
  summaries, summary_metrics = continuations.sample_continuations(
      engine, params, tok, contexts, rng=summary_rng, max_new_tokens=summary_tokens,
      temperature=temperature)
  per_row = len(budgets) * num_summaries
  row_seeds = [s for s in seeds for _ in range(group_size)]
  stops = {int(t) for t in tok.end_of_turn_ids} | {int(tok.eos_id)}
  scores = []
  for i, (traj, ends_on_eos) in enumerate(zip(summaries, on_eos)):
    thinking = groups.trajectories[i // per_row]
    cut = [int(t) for t in traj.tokens[thinking.prompt_len:traj.prompt_len]]  # + inserted
    sampled = [int(t) for t in traj.tokens[traj.prompt_len:]]
    if sampled and sampled[-1] in stops:
      sampled = sampled[:-1]
    env = make_env()
    env.reset(row_seeds[i // per_row])
    _, reward, _, _ = env.step(tok.decode(cut + sampled))
    scores.append(summary_score(reward, cut + sampled, think_end_id=think_end_id,
                                thinking_ends_on_eos=ends_on_eos))
  score_BSA = np.asarray(scores, np.float32).reshape(len(groups.trajectories), len(budgets),
                                                     num_summaries)
  metrics = dict(groups.metrics)
  for key in ("rollout/sampled_tokens", "rollout/prefill_tokens"):
    metrics[key] = metrics.get(key, 0.0) + summary_metrics.get(key, 0.0)
  return AnytimeRollout(groups.trajectories, summaries, score_BSA, metrics)


# ---------------------------------------------------------------------------------------------
# Continuations of given token contexts.
# ---------------------------------------------------------------------------------------------
def stop_at(tok, *ids: int):
  """`tok` with extra stop ids (a view: `dataclasses.replace` of a Tokenizer dataclass)."""
  return dataclasses.replace(tok, end_of_turn_ids=tuple(tok.end_of_turn_ids) + tuple(ids))
