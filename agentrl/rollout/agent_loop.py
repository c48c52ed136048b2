"""Multi-turn rollouts, token-in token-out: the trajectory format, the bookkeeping shared by the
rollout engine (`agentrl.rollout.engine`) and the per-turn reference loop, and group rollouts.

  engine = engine_lib.Engine(graphdef, pad_id=tok.pad_id)
  trajs, metrics = agent_loop.run(engine, params, tok, envs, seeds, rng=key, max_turns=4, ...)
  groups = agent_loop.rollout_groups(engine, params, tok, make_env, seeds, group_size=8,
                                     greedy_baseline=True, rng=key, max_turns=4, ...)
  trajs, metrics = agent_loop.run_per_turn(sampler, params, tok, envs, seeds, rng=key, ...)
  traj = agent_loop.scripted(tok, env, seed, ["guess 50", "guess 25"], chat_template=False)

`scripted` renders a given list of actions (an expert's demonstration, agentrl/harness/sft.py) into
the same token layout a rollout whose policy sampled those actions would have.
`run_per_turn` is the simple reference the engine is tested against: each turn, every
unfinished row is batched into one `Sampler.generate` call with its whole transcript as the
prompt (stop ids: the tokenizer's end-of-turn ids and EOS). Both append the sampled ids to the
transcript exactly as sampled; they are decoded to text only to hand the env an action, and
that text is never encoded again (docs/architecture.md §2). The env's reply is rendered
through the chat template (the text that follows an assistant turn: end-of-turn, user header,
observation, assistant header) and only that text is tokenized; when the model already
emitted the end-of-turn token, its copy at the start of the rendered text is dropped. With
`chat_template=False` (tiny from-scratch models, raw-text tasks) the first observation is
encoded with BOS and later ones are appended as plain text; the env's system prompt is not
rendered. Few-shot `examples` (a served conversation's earlier messages, agentrl/serve/) then
lay out as such a transcript would: BOS, each message's text, an assistant's followed by EOS
(where a sampled plain turn stops), then the observation.

Roles. The observation is a user message, except the results of a tool turn: when the env
lists them in info["tool_results"] (envs/tool_calls.py; envs/base.py) and the template has a
tool role, each is a message of role "tool", which the template renders its own way (Qwen2.5's
wraps them in <tool_response> inside one user turn). A template has a tool role when its source
names the role as a string ('tool' or "tool"): Qwen, Llama 3.1, Mistral and Hermes templates
do; ChatML (SmolLM2) and Gemma's do not, and get the observation text as a user message.
`Renderer(tool_role=...)` overrides the detection. Tool results are used only when they are
strings and together no longer than the observation (they are its parts, so an observation
SafeEnv cut short falls back to the text).

Every env is wrapped in `agentrl.envs.safe.SafeEnv` (unless it already is one), so bad input
never crashes a rollout (docs/architecture.md §6) and every case is counted in the metrics:
  env/env_errors     reset or step raised. A failed reset leaves the row with the error text
                     as its prompt and no model turn (it keeps the group layout and has real
                     tokens); a failed step ends the row with reward 0 for that turn.
  env/env_timeouts   reset or step did not answer in time (the engine's env_timeout_s, or an
                     isolated env's own limit); the row ends as for an error.
  env/empty_actions  the model produced no text (e.g. end-of-turn first). The env gets "" and,
                     by the Env contract (envs/base.py), answers with an error observation and
                     a zero reward; the row goes on if the env does not end it.
  rollout/obs_overflow     the observation does not fit in max_len: the row ends truncated.
  rollout/prompt_overflow  the first prompt does not fit in max_len: the row ends truncated.
  rollout/turn_cut_frac    model turns that hit max_new_tokens (or max_len) before a stop token.
  rollout/truncated_frac   rows that a budget ended before the env finished the episode. A
                           single-turn env judges even a cut-off answer, so there a cut turn
                           shows in turn_cut_frac only.
  (plus SafeEnv's other counters: invalid_actions, nonfinite_rewards, truncated_observations...)

Token bookkeeping: loss_mask is 1 exactly on sampled ids; `turn` is -1 on the first prompt
and u on model turn u and on the observation that answers it; the reward of a trajectory is
the sum of its per-turn rewards. `truncated` means a budget (tokens, loop turns or the env's
own turn limit) ended the row before the env finished the episode.
"""
import collections
import dataclasses
import re
import warnings
from typing import Any, Callable, Sequence

import jax
import numpy as np

from agentrl.envs import safe
from agentrl.rollout import sampler as sampler_lib

_PLACEHOLDER = "AGENTRLASSISTANTTURNPLACEHOLDER"
_TOOL_ROLE = re.compile(r"""['"]tool['"]""")
TOOL_RESULTS = "tool_results"   # the info key of a tool turn's results (envs/base.py)


@dataclasses.dataclass
class Trajectory:
  """One rollout, host-side. Per-token arrays cover prompt + every turn, all of length T."""
  tokens: np.ndarray           # int32 [T]
  loss_mask: np.ndarray        # float32 [T], 1 on policy-sampled ids only
  turn: np.ndarray             # int32 [T], -1 on the first prompt
  sampler_logp: np.ndarray     # float32 [T], sampler log-probs, 0 off policy ids
  turn_rewards: list[float]    # one per env step
  reward: float                # sum(turn_rewards)
  done: bool                   # the env ended the episode
  truncated: bool              # a token or turn budget ended it first
  prompt_len: int
  greedy: bool = False
  infos: list[dict] = dataclasses.field(default_factory=list)   # env info of each step
  # Branching (rollout/engine.py forks): this row continues trajectory `parent` of the same
  # rollout after sharing its first `fork_at` tokens (identical ids, turns, log-probs, and
  # the rewards and infos of the turns completed by then). A root has parent -1, fork_at 0.
  parent: int = -1
  fork_at: int = 0
  # With Engine.run(alternatives=A): each token's A most likely tokens and their log-probs
  # when it was sampled ([T, A]; zeros off policy tokens); None otherwise.
  alternatives: np.ndarray | None = None
  alternative_logp: np.ndarray | None = None


@dataclasses.dataclass
class GroupRollout:
  trajectories: list[Trajectory]         # P * G rows; rows [i*G, (i+1)*G) share seeds[i]
  baseline: list[Trajectory] | None      # P greedy rows (ReMax), or None
  metrics: dict[str, float]


class Row:
  """Mutable transcript while a rollout runs."""

  def __init__(self, env: safe.SafeEnv, greedy: bool):
    self.env, self.greedy = env, greedy
    self.tokens, self.loss_mask, self.turn, self.logp = [], [], [], []
    self.turn_rewards, self.infos = [], []
    self.done = self.truncated = self.finished = False
    self.prompt_len = 0
    self.actions = []          # the action text of each env step
    self.parent, self.fork_at = -1, 0
    self.alt, self.alt_logp = [], []   # per token, when the engine records alternatives

  def branch(self, at: int, steps: int, env) -> "Row":
    """A new row that continues this one after its first `at` tokens and `steps` env steps."""
    row = Row(env, self.greedy)
    for name in ("tokens", "loss_mask", "turn", "logp", "alt", "alt_logp"):
      setattr(row, name, getattr(self, name)[:at])
    for name in ("turn_rewards", "infos", "actions"):
      setattr(row, name, getattr(self, name)[:steps])
    row.prompt_len, row.fork_at = self.prompt_len, at
    return row

  def append(self, ids, *, turn: int, logp=None, alternatives=None):
    """Appends ids: sampled ones with their log-probs, and optionally their alternatives
    (ids [n, A], log-probs [n, A]), or context (logp None)."""
    if alternatives is not None and not self.alt:   # the first alternatives: pad the past
      width = alternatives[0].shape[-1]
      self.alt = [np.zeros((width,), np.int32)] * len(self.tokens)
      self.alt_logp = [np.zeros((width,), np.float32)] * len(self.tokens)
    self.tokens.extend(int(t) for t in ids)
    self.turn.extend([turn] * len(ids))
    sampled = logp is not None
    self.loss_mask.extend([1.0 if sampled else 0.0] * len(ids))
    self.logp.extend([float(x) for x in logp] if sampled else [0.0] * len(ids))
    if self.alt:
      if alternatives is None:
        self.alt += [np.zeros_like(self.alt[0])] * len(ids)
        self.alt_logp += [np.zeros_like(self.alt_logp[0])] * len(ids)
      else:
        self.alt += list(np.asarray(alternatives[0], np.int32))
        self.alt_logp += list(np.asarray(alternatives[1], np.float32))

  def finish(self, *, done: bool = False, truncated: bool = False):
    self.finished, self.done, self.truncated = True, done, truncated

  def trajectory(self) -> Trajectory:
    return Trajectory(
        tokens=np.asarray(self.tokens, np.int32), loss_mask=np.asarray(self.loss_mask, np.float32),
        turn=np.asarray(self.turn, np.int32), sampler_logp=np.asarray(self.logp, np.float32),
        turn_rewards=list(self.turn_rewards), reward=float(sum(self.turn_rewards)),
        done=self.done, truncated=self.truncated, prompt_len=self.prompt_len, greedy=self.greedy,
        infos=list(self.infos), parent=self.parent, fork_at=self.fork_at,
        alternatives=np.asarray(self.alt, np.int32) if self.alt else None,
        alternative_logp=np.asarray(self.alt_logp, np.float32) if self.alt else None)


def has_tool_role(tok) -> bool:
  """Whether the tokenizer's chat template names a "tool" role (module docstring, "Roles")."""
  return bool(_TOOL_ROLE.search(getattr(tok, "chat_template", None) or ""))


def tool_messages(tool_results, obs: str) -> list[dict] | None:
  """The tool messages of `tool_results` (info["tool_results"]), or None when they are not a
  non-empty list of strings at most as long in total as the observation `obs`."""
  if (not isinstance(tool_results, (list, tuple)) or not tool_results
      or not all(isinstance(r, str) for r in tool_results)
      or sum(len(r) for r in tool_results) > len(obs)):
    return None
  return [{"role": "tool", "content": r} for r in tool_results]


class Renderer:
  """Turns env text into token ids: the only place the loop calls `tok.encode`.

  Args:
    tok: the tokenizer.
    chat_template: render through tok.apply_chat_template (else raw text).
    system_prompt: overrides the env's own system prompt (None: the env's).
    tool_role: render tool results as "tool" messages (None: when the template has the role).
  """

  def __init__(self, tok, *, chat_template: bool, system_prompt: str | None,
               tool_role: bool | None = None):
    self.tok, self.chat_template, self.system_prompt = tok, chat_template, system_prompt
    self.tool_role = has_tool_role(tok) if tool_role is None else bool(tool_role)

  def prompt(self, text: str, env_system_prompt: str, examples=()) -> list[int]:
    """Ids of the first prompt: the system message, the env's few-shot `examples` (chat
    messages, agentrl/envs/few_shot.py) and the task `text`; without the chat template, the
    plain layout of the module docstring (no system message)."""
    if not self.chat_template:
      texts = [m["content"] for m in examples] + [text]
      ids = list(self.tok.encode(texts[0], add_bos=self.tok.bos_id is not None))
      for message, after in zip(examples, texts[1:]):
        ids += [self.tok.eos_id] if message["role"] == "assistant" else []
        ids += self.tok.encode(after)
      return ids
    system = self.system_prompt if self.system_prompt is not None else env_system_prompt
    messages = [{"role": "system", "content": system}] if system else []
    for message in examples:
      tools = (tool_messages(message.get("tool_results"), message["content"])
               if self.tool_role and message["role"] == "user" else None)
      messages += tools or [{"role": message["role"], "content": message["content"]}]
    messages.append({"role": "user", "content": text})
    return list(self.tok.encode(self.tok.apply_chat_template(messages,
                                                             add_generation_prompt=True)))

  def observation(self, text: str, model_eot: int | None, tool_results=None) -> list[int]:
    """Ids of the text that follows an assistant turn and carries the observation `text`, or
    the tool messages of `tool_results` where the template has a tool role."""
    if not self.chat_template:
      return list(self.tok.encode(text))
    reply = tool_messages(tool_results, text) if self.tool_role else None
    rendered = self.tok.apply_chat_template(
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": _PLACEHOLDER},
         *(reply or [{"role": "user", "content": text}])], add_generation_prompt=True)
    at = rendered.find(_PLACEHOLDER)
    if at < 0:
      raise ValueError("The tokenizer's chat template does not render assistant content "
                       "verbatim, so observations cannot be appended after a sampled turn; use "
                       "a template that keeps message['content'] unchanged, or "
                       "chat_template=False.")
    ids = list(self.tok.encode(rendered[at + len(_PLACEHOLDER):]))
    # The model's own end-of-turn id is already in the transcript (as a sampled token).
    if model_eot is not None and ids[:1] == [model_eot]:
      ids = ids[1:]
    return ids


def apply_reset(row: Row, obs: str, render: Renderer, max_len: int, counts):
  """Appends the first prompt rendered from env.reset's observation, or ends the row."""
  row.append(render.prompt(obs, row.env.system_prompt, row.env.examples), turn=-1)
  row.prompt_len = len(row.tokens)
  if row.env.reset_error:
    row.finish()
  elif row.prompt_len >= max_len:
    counts["prompt_overflow"] += 1
    row.finish(truncated=True)


def apply_step(row: Row, result, stopped: bool, turn: int, *, render: Renderer,
               last_turn: bool, max_len: int, counts):
  """Records env.step's (obs, reward, done, info), then appends the observation or ends the row."""
  obs, reward, done, info = result
  row.turn_rewards.append(float(reward))
  row.infos.append(info)
  if done:
    row.finish(done=not info.get("turn_limit", False), truncated=info.get("turn_limit", False))
  elif last_turn or len(row.tokens) >= max_len:
    row.finish(truncated=True)
  else:
    obs_ids = render.observation(obs, row.tokens[-1] if stopped else None,
                                 info.get(TOOL_RESULTS))
    if len(row.tokens) + len(obs_ids) >= max_len:    # no room left for a model turn
      counts["obs_overflow"] += 1
      row.finish(truncated=True)
    else:
      row.append(obs_ids, turn=turn)


def env_metrics(safe_envs, before, extra=None) -> dict[str, float]:
  """env/<counter> summed over the envs since `before` (their counters at the start)."""
  extra = extra or {}
  return {f"env/{key}": float(sum(e.counters[key] - b[key] for e, b in zip(safe_envs, before))
                              + extra.get(key, 0)) for key in safe.COUNTERS}


def _turn_key(rng, turn: int):
  # An explicit transfer of the turn index, so rollouts run under jax_transfer_guard="disallow".
  return jax.random.fold_in(rng, jax.device_put(np.uint32(turn)))


def run(engine, params, tok, envs: Sequence[Any], seeds: Sequence[Any],
        **kwargs) -> tuple[list[Trajectory], dict[str, float]]:
  """Runs env i from reset(seeds[i]) for up to max_turns model turns: `engine.run(...)`.

  `engine` is an `agentrl.rollout.engine.Engine`; kwargs are `Engine.run`'s. A `Sampler` in
  its place (this function's signature before the engine) still runs, through
  `run_per_turn`, with a DeprecationWarning; that alias goes in the next release.
  """
  if isinstance(engine, sampler_lib.Sampler):
    warnings.warn("agent_loop.run(sampler, ...) is deprecated: pass a rollout engine "
                  "(agentrl.rollout.engine.Engine(graphdef, pad_id=...)); this call ran the "
                  "per-turn reference loop.", DeprecationWarning, stacklevel=2)
    return run_per_turn(engine, params, tok, envs, seeds, **kwargs)
  return engine.run(params, tok, envs, seeds, **kwargs)


def run_per_turn(sampler: sampler_lib.Sampler, params, tok, envs: Sequence[Any],
                 seeds: Sequence[Any], *, rng: jax.Array, max_turns: int, max_new_tokens: int,
                 max_len: int, greedy: bool | Sequence[bool] = False, chat_template: bool = True,
                 system_prompt: str | None = None,
                 **sample_kwargs) -> tuple[list[Trajectory], dict[str, float]]:
  """The per-turn reference: env i from reset(seeds[i]) for up to max_turns model turns.

  Returns (trajs, metrics) as `Engine.run` does; its greedy trajectories are the engine's
  token for token. Each turn re-prefills every row's whole transcript, so use the engine.

  Args:
    sampler: a Sampler built for the policy graph; params: the policy's nnx.State.
    tok: tokenizer (encode, decode, apply_chat_template, end_of_turn_ids, eos_id).
    envs: Env objects (envs/base.py); each is wrapped in SafeEnv unless it is one already.
    seeds: one reset seed per env.
    max_new_tokens: per-turn sampling budget; max_len: budget for the whole transcript.
    greedy: argmax decoding for all rows or per row.
    chat_template: render env text through tok.apply_chat_template (else raw text).
    system_prompt: overrides each env's own `system_prompt` (chat_template only).
    **sample_kwargs: temperature, top_k, top_p, logp_mode for `Sampler.generate`.
  """
  if len(envs) != len(seeds):
    raise ValueError(f"got {len(envs)} envs but {len(seeds)} seeds; pass one seed per env.")
  if max_turns < 1 or max_new_tokens < 1 or max_len < 2:
    raise ValueError(f"need max_turns >= 1, max_new_tokens >= 1, max_len >= 2; got "
                     f"{max_turns}, {max_new_tokens}, {max_len}.")
  flags = [bool(greedy)] * len(envs) if isinstance(greedy, bool) else [bool(g) for g in greedy]
  stop_ids = sorted({int(t) for t in tok.end_of_turn_ids} | {int(tok.eos_id)})
  render = Renderer(tok, chat_template=chat_template, system_prompt=system_prompt)
  safe_envs = [e if isinstance(e, safe.SafeEnv) else safe.SafeEnv(e) for e in envs]
  before = [dict(e.counters) for e in safe_envs]
  counts = collections.Counter(obs_overflow=0, prompt_overflow=0, sampled_tokens=0)
  rows = [Row(env, g) for env, g in zip(safe_envs, flags)]
  for row, seed in zip(rows, seeds):
    apply_reset(row, row.env.reset(seed), render, max_len, counts)
  cut_turns = model_turns = 0
  for turn in range(max_turns):
    active = [r for r in rows if not r.finished]
    if not active:
      break
    out = sampler.generate(
        params, [r.tokens for r in active], rng=_turn_key(rng, turn),
        max_new_tokens=[min(max_new_tokens, max_len - len(r.tokens)) for r in active],
        greedy=[r.greedy for r in active], stop_ids=stop_ids, **sample_kwargs)
    for i, row in enumerate(active):
      n, stopped = int(out.lengths_B[i]), bool(out.stopped_B[i])
      ids = out.tokens_BN[i, :n]
      row.append(ids, turn=turn, logp=out.logp_BN[i, :n])
      counts["sampled_tokens"] += n
      cut_turns += not stopped  # hit max_new_tokens or max_len before a stop token
      model_turns += 1
      action = tok.decode([int(t) for t in (ids[:-1] if stopped else ids)])
      apply_step(row, row.env.step(action), stopped, turn, render=render,
                  last_turn=turn == max_turns - 1, max_len=max_len, counts=counts)
  trajs = [r.trajectory() for r in rows]
  metrics = {f"rollout/{k}": float(v) for k, v in counts.items()}
  metrics["rollout/turn_cut_frac"] = cut_turns / max(model_turns, 1)
  metrics.update(env_metrics(safe_envs, before))
  metrics.update(summarize(trajs))
  return trajs, metrics


def scripted(tok, env, seed, actions: Sequence[str], *, chat_template: bool,
             system_prompt: str | None = None, observe_last: bool = False) -> Trajectory:
  """The trajectory of env from reset(seed) when the policy's turns are `actions`.

  Each action is `tok.encode(action)` followed by the stop id a sampled turn ends with (the
  first end-of-turn id with the chat template, else EOS), with loss_mask 1; the prompt and
  observations are rendered as in a rollout (loss_mask 0). The env is stepped for real, so the
  observations are its replies; actions left over once it reports done are dropped. No token
  budget applies: the caller packs (and cuts) the trajectory. `observe_last` appends the reply
  to the last action too (unless it ended the episode), so that a policy can take the next
  turn from there (`continuations.replay_then_rollout`).
  """
  stop = (tok.end_of_turn_ids[0] if chat_template and tok.end_of_turn_ids else tok.eos_id)
  render = Renderer(tok, chat_template=chat_template, system_prompt=system_prompt)
  row = Row(env, greedy=False)
  row.append(render.prompt(env.reset(seed), env.system_prompt, getattr(env, "examples", ())),
             turn=-1)
  row.prompt_len = len(row.tokens)
  for turn, action in enumerate(actions):
    ids = list(tok.encode(action)) + [stop]
    row.append(ids, turn=turn, logp=np.zeros(len(ids), np.float32))
    obs, reward, done, info = env.step(action)
    row.turn_rewards.append(float(reward))
    row.infos.append(info)
    if done:
      row.finish(done=True)
      break
    if observe_last or turn < len(actions) - 1:   # a rollout has none after its last turn
      row.append(render.observation(obs, stop, info.get(TOOL_RESULTS)), turn=turn)
  return row.trajectory()


def summarize(trajs: Sequence[Trajectory]) -> dict[str, float]:
  mean = lambda xs: float(np.mean(xs)) if len(xs) else 0.0
  return {"rollout/reward_mean": mean([t.reward for t in trajs]),
          "rollout/truncated_frac": mean([t.truncated for t in trajs]),
          "rollout/turns_mean": mean([len(t.turn_rewards) for t in trajs]),
          "rollout/response_tokens_mean": mean([t.loss_mask.sum() for t in trajs])}


def rollout_groups(engine, params, tok, make_env: Callable[[], Any], seeds: Sequence[Any], *,
                   group_size: int, greedy_baseline: bool = False,
                   **run_kwargs) -> GroupRollout:
  """G rollouts per seed, laid out contiguously, plus one greedy rollout per seed on request.

  `engine` is an `agentrl.rollout.engine.Engine` (the G rows of a seed share one prefill);
  run_kwargs go to `Engine.run`. All P * G (+ P) rows run in one engine run. The greedy rows
  are returned apart (`baseline`, one per prompt) so the main batch keeps the [i*G, (i+1)*G)
  group layout; their rewards are the ReMax baseline b_i (docs/algorithms.md §4.11). Summary
  metrics cover the main rows; rollout/baseline_reward_mean the greedy ones.
  """
  if group_size < 1:
    raise ValueError(f"group_size must be >= 1, got {group_size}.")
  if "greedy" in run_kwargs:
    raise ValueError("rollout_groups sets greedy per row; use greedy_baseline=True instead.")
  P = len(seeds)
  row_seeds = [s for s in seeds for _ in range(group_size)]
  flags = [False] * len(row_seeds)
  if greedy_baseline:
    row_seeds, flags = row_seeds + list(seeds), flags + [True] * P
  envs = [make_env() for _ in row_seeds]
  trajs, metrics = engine.run(params, tok, envs, row_seeds, greedy=flags, **run_kwargs)
  main = trajs[:P * group_size]
  baseline = trajs[P * group_size:] if greedy_baseline else None
  metrics.update(summarize(main))
  if baseline is not None:
    metrics["rollout/baseline_reward_mean"] = summarize(baseline)["rollout/reward_mean"]
  return GroupRollout(main, baseline, metrics)
