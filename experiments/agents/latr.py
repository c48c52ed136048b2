# pylint: disable=invalid-name
r"""LATR (Xing et al. 2025, arXiv 2510.24302): lookahead tree-based rollouts on a multi-turn
agent task, trained as GRPO.

  python -m experiments.agents.latr                                      # hidden-rule game
  python -m experiments.agents.latr --config=experiments/agents/latr.py:textworld
  python -m experiments.agents.latr --config=experiments/agents/latr.py:smoke --workdir=/tmp/latr

Each step, per prompt (`agentrl.credit.latr` holds the rules, with the official code's
defaults; docs/algorithms.md §5.9):
  1. n_tree = round(latr.tree_rows x mix) rows grow as one tree from a single root episode and
     n_plain = G - round(G x mix) rows are plain samples (mix: `latr.mix_ratio` of the step on
     latr.mix_schedule, the Countdown GRPO launch's by default), in one `Engine.run`;
  2. a tree row decodes greedily (latr.greedy); after each of its model turns the engine shows
     the brancher the turn's tokens with their two most likely tokens and log-probs
     (`alternatives=2`): every token of the row's own where the second one is likely
     (`latr.branch_candidates`: p_1 > 0.25 and p_0 - p_1 < 0.15) starts a branch that keeps the
     tokens before it and takes that alternative there (`Fork(at, token=)`; its cache rows are
     copied, never prefilled again; its env is the source's, cloned), while the tree has room
     (n_tree rows); a branch decodes greedily on from its alternative and may branch in turn;
  3. pruning: a branch whose first r own sampled tokens (r in latr.prune_steps) stay within
     edit distance < 0.4 r of its parent's (`latr.should_prune`) is dropped from the batch, with
     every branch forked from it (the code removes a branch's children with it);
  4. a tree left short of n_tree rows is filled with plain samples of the prompt (latr.fill,
     a second `Engine.run`);
  5. every kept row is an independent sample: GRPO over the prompt's kept rows, tree, fill and
     plain (unbiased std, 1e-6), each row's whole transcript trained;
  6. PPO clip (one update per batch), token-mean, no KL term.

Adaptations to the engine and this task [INF]:
  - Branch points are read when a turn has been sampled ("sampled" points), over the turn's
    tokens in order; the tree's room goes to the points in the order the engine finishes
    turns. The code decodes a tree's rows in lockstep and admits one step's alternatives
    across its rows (rank, then row): earlier tokens come first in both.
  - The thresholds read the sampling distribution at rollout.temperature (the engine records
    those log-probs); the code reads the softmax at temperature 1, which the top two tempered
    log-probs do not determine. A sharper distribution qualifies fewer tokens
    (`latr/candidate_frac` counts them).
  - A row's greedy flag holds for its whole episode (branches inherit it), so a tree decodes
    greedily to the end: the code switches a full tree to plain sampling once its youngest
    branch is older than the last pruning window (`latr.tree_full`, not used), which at this
    game's length (at most 42 sampled tokens) is about the episode's end anyway.
    latr.greedy=False samples the tree's rows at the rollout temperature instead (an
    ablation); a branch then takes whichever of the top two its row did not.
  - Pruning is judged after the rollout: the engine cannot cancel a running branch, so a
    pruned branch runs to its episode's end (its tokens count in rollout/sampled_tokens) and
    trains nothing. Its place in the tree is not given to a new branch (the code's removal
    frees it for later branch points; here that would sample beyond the prompt's row budget);
    the fill takes it instead, and `latr/pruned_frac` says how many branches were spent that
    way. A window is read on the rows' own sampled tokens (env replies skipped) and compared
    only when both rows sampled all its tokens (the code skips windows holding EOS);
    latr.prune_steps scales the code's 20, 30, 50 of 1,024-token answers by 0.4, to turns of
    about 5 tokens here. On this game 3 of a turn's 5 tokens are format ("guess", " ", the end
    of turn), so a judged branch survives only when nearly every digit of its window differs.
  - The fill: the code fills a tree short of its n rows when it returns with copies of its
    first row, which then sample on; a greedy row cannot turn to sampling here, so the fill
    samples from the prompt. latr.fill=False leaves the prompt's group smaller; a prompt with
    a single kept row then gets advantage 0 (verl's GRPO would give R / (1 + eps)).
  - No KL term, as the study's GRPO baseline (experiments/agents/agent.py); the LATR launch
    adds a low-variance KL at 0.01.
  - Budget: latr.tree_rows = G = 8 in the `cpu` preset; with the fill a step samples about
    as many tokens as GRPO's 8 samples per prompt (a branch does not sample its shared prefix,
    a pruned branch samples to its end).

Presets: cpu (default: the hidden-rule game, agentrl.harness.rl_config.hidden_rule_study),
textworld (the long-horizon coin collector, rl_config.textworld_study), pod (the game at
agent.py's pod scale on rl_config's Qwen3-8B mesh, the paper's sizes), smoke (CI, seconds:
every alternative qualifies, so the smoke forks).
This file is the fork unit; the building blocks come from agentrl.harness.recipe, loop and credit.
"""
from absl import app
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl import configs
from agentrl.credit import latr
from agentrl.credit import tree as tree_lib
from agentrl import distributed
from agentrl.envs import registry
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rollout import agent_loop
from agentrl.rollout import branching
from agentrl.rollout import collect
from agentrl.rollout import pack
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.agent_study(arg, experiment="latr", names=registry.NAMES)
  c.loss = dict(eps_low=0.2, eps_high=0.2, agg="token-mean")
  # tree_rows: a tree's capacity at mix ratio 1 (the code's n); abs_thres, rel_thres:
  # latr.branch_candidates'; prune_steps, edit_dist_thres: latr.should_prune's windows (own
  # sampled tokens, comma-separated) and threshold; mix_schedule: "step:ratio,..." for
  # latr.mix_ratio (the Countdown GRPO launch's); greedy: tree rows decode greedily; fill: a
  # tree short of its rows after pruning is filled with plain samples (else its group is
  # smaller).
  c.latr = dict(tree_rows=8, abs_thres=0.25, rel_thres=0.15, prune_steps="8,12,20",
                edit_dist_thres=0.4, mix_schedule="0:1,10:0.75,20:0.5,80:0.25,200:0",
                greedy=True, fill=True)
  if arg.preset == "textworld":   # commands of at most 4 tokens: the code's windows x 0.3
    c.latr.prune_steps = "6,9,15"
  if arg.smoke:
    # Every alternative qualifies and every judged branch is pruned: the smoke forks, prunes
    # and fills.
    c.latr.update(tree_rows=2, abs_thres=0.0, rel_thres=1.0, prune_steps="1,2",
                  edit_dist_thres=2.0, mix_schedule="0:1,2:0.5")
  return c


SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    **registry.schema(registry.NAMES),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "rollout.group_size": configs.Key(int, min=1, why="the plain samples per prompt at mix 0"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "latr.tree_rows": configs.Key(int, min=1),
    "latr.abs_thres": configs.Key(float, min=0.0, max=1.0),
    "latr.rel_thres": configs.Key(float, min=0.0, max=1.0),
    "latr.prune_steps": configs.Key(str),
    "latr.edit_dist_thres": configs.Key(float, min=0.0),
    "latr.mix_schedule": configs.Key(str),
    "latr.greedy": configs.Key(bool),
    "latr.fill": configs.Key(bool),
}


def mix_schedule(text: str) -> dict[int, float]:
  """{step: ratio} of latr.mix_schedule ("0:1,10:0.75"); ConfigError naming the key if bad."""
  try:
    pairs = [item.split(":") for item in text.split(",")]
    schedule = {int(step): float(ratio) for step, ratio in pairs}
  except ValueError:
    schedule = {}
  if (not schedule or min(schedule) != 0 or len(schedule) != len(text.split(","))
      or not all(0.0 <= r <= 1.0 for r in schedule.values())):
    raise configs.ConfigError(f"config.latr.mix_schedule={text!r} must be 'step:ratio' pairs, "
                              "comma-separated, from step 0, ratios in [0, 1], e.g. '0:1,10:0.5'")
  return schedule


def shape(lc, group_size: int, ratio: float) -> tuple[int, int]:
  """(tree rows, plain rows) of a prompt at LATR share `ratio`: the code's round(n x ratio)
  tree rows and the rest of the group as plain samples."""
  return round(lc.tree_rows * ratio), group_size - round(group_size * ratio)


def rows_per_prompt(lc, group_size: int) -> int:
  """The most rows a prompt can have at any ratio of the schedule (the padded batch's)."""
  return max(sum(shape(lc, group_size, r)) for r in mix_schedule(lc.mix_schedule).values())


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train().

  batch.loss_mask_BT already leaves out the pruned and padding rows (the advantage step)."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, batch.loss_mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    loss = aggregation.aggregate(pg_BT, batch.loss_mask_BT, lc.agg)
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def advantage_fn(batch: types.Batch, extras):
  """(batch, extras with the rows' GRPO adv_B and keep_B) -> (batch, metrics): each kept row's
  advantage on its sampled tokens, the other rows out of the loss."""
  mask_BT = batch.loss_mask_BT * extras["keep_B"][:, None]
  adv_BT = estimators.broadcast_to_tokens(extras["adv_B"], mask_BT)
  return batch.replace(adv_BT=adv_BT, loss_mask_BT=mask_BT), {
      "adv_abs_mean": estimators.adv_abs_mean(adv_BT, mask_BT)}


# ---------------------------------------------------------------------------------------------
# The rollout: the trees, pruned, with GRPO over each prompt's kept rows.
# ---------------------------------------------------------------------------------------------
def make_brancher(lc, capacity: dict[int, int]):
  """(brancher, counts) for one run: `capacity` maps each tree's root episode to its rows.

  At a "sampled" point of a tree row, every own token of the turn (a branch's forced token
  excepted) whose alternative qualifies is counted, and the first ones start branches that
  take the alternative there, while the tree has room. counts: "candidates" (qualifying
  tokens) and "tokens" (tokens read)."""
  room = {root: rows - 1 for root, rows in capacity.items()}
  counts = {"candidates": 0, "tokens": 0}

  def brancher(point: branching.ForkPoint) -> list[branching.Fork]:
    if point.kind != "sampled" or point.root not in room:
      return []
    t = point.trajectory
    first = max(point.turn_start, t.fork_at + 1)   # a root's fork_at is 0, inside its prompt
    probs = np.exp(t.alternative_logp[first:].astype(np.float64))
    ok = latr.branch_candidates(probs, abs_thres=lc.abs_thres, rel_thres=lc.rel_thres)[:, 0]
    counts["candidates"] += int(ok.sum())
    counts["tokens"] += len(ok)
    at = first + np.flatnonzero(ok)[:room[point.root]]
    room[point.root] -= len(at)
    return [branching.Fork(at=int(a), token=other_top(t, a)) for a in at]

  return brancher, counts


def other_top(t, at: int) -> int:
  """The one of token `at`'s two most likely ids that the row did not take (the top one when
  it took neither)."""
  top, second = (int(i) for i in t.alternatives[at, :2])
  return second if int(t.tokens[at]) == top else top


def dropped_rows(trajs, lc) -> np.ndarray:
  """bool [N]: the rows that train nothing.

  A branch is dropped when `latr.should_prune` judges its own sampled tokens against its
  parent's (the windows start at its forced token), when its parent is dropped, or when it
  never started (its env could not be forked). Parents come before their branches."""
  steps = recipe.parse_ints("latr.prune_steps", lc.prune_steps)
  drop = np.zeros((len(trajs),), bool)
  for b, t in enumerate(trajs):
    if t.parent < 0:
      continue
    parent = trajs[t.parent]
    if drop[t.parent] or len(t.tokens) <= t.fork_at:
      drop[b] = True
      continue
    k = int((parent.loss_mask[:t.fork_at] > 0).sum())   # own tokens both rows share
    drop[b] = latr.should_prune(t.tokens[t.loss_mask > 0], parent.tokens[parent.loss_mask > 0],
                                k, steps=steps, edit_dist_thres=lc.edit_dist_thres)
  return drop


def group_advantages(reward_B, group_B, keep_B, eps: float = 1e-6) -> np.ndarray:
  """float32 [B]: GRPO over each group's kept rows, (r - mean) / (std + eps) with the
  unbiased std; 0 on dropped rows and on a group's lone kept row."""
  reward_B, group_B = np.asarray(reward_B, np.float64), np.asarray(group_B)
  adv_B = np.zeros(reward_B.shape, np.float64)
  for g in np.unique(group_B[keep_B]):
    rows = keep_B & (group_B == g)
    if rows.sum() > 1:
      r = reward_B[rows]
      adv_B[rows] = (r - r.mean()) / (r.std(ddof=1) + eps)
  return adv_B.astype(np.float32)


def model_turns(trajs) -> int:
  """Model turns the run sampled: each row's turns from its fork point on."""
  own = lambda t: (t.loss_mask > 0) & (np.arange(len(t.tokens)) >= t.fork_at)
  return sum(len(np.unique(t.turn[own(t)])) for t in trajs)


def merge_runs(first, second) -> tuple[list, dict[str, float]]:
  """The (trajs, metrics) of two `Engine.run` calls as one step's: counts summed, the
  per-episode means over all rows, the turn cut fraction over all model turns."""
  (a, ma), (b, mb) = first, second
  trajs = a + b
  metrics = {k: ma.get(k, 0.0) + mb.get(k, 0.0) for k in {*ma, *mb}}
  turns = (model_turns(a), model_turns(b))
  metrics["rollout/turn_cut_frac"] = ((ma["rollout/turn_cut_frac"] * turns[0]
                                       + mb["rollout/turn_cut_frac"] * turns[1])
                                      / max(sum(turns), 1))
  return trajs, metrics | agent_loop.summarize(trajs)


def make_rollout_fn(config, engine, tok, make_env, data, mesh):
  """rollout_fn(params, rng, step): the trees, their fill and the plain samples, the dropped
  rows left out, packed to a fixed row count with the GRPO advantages as extras."""
  rc, lc = config.rollout, config.latr
  rows, U = sharding.batch_sharding(mesh), make_env().max_turns
  schedule = mix_schedule(lc.mix_schedule)
  B = rc.prompts_per_step * rows_per_prompt(lc, rc.group_size)

  def episodes(params, seeds, rng, **kwargs):
    return engine.run(params, tok, [make_env() for _ in seeds], seeds, rng=rng, max_turns=U,
                      max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
                      temperature=rc.temperature, chat_template=config.task.chat_template,
                      **kwargs)

  def rollout_fn(params, rng, step):
    ratio = latr.mix_ratio(int(step), schedule)
    tree, plain = shape(lc, rc.group_size, ratio)
    roots = int(tree > 0) + plain                  # episodes started per prompt
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    row_seeds = [s for s in seeds for _ in range(roots)]
    tree_root = np.asarray([tree > 0 and i % roots == 0 for i in range(len(row_seeds))])
    brancher, counts = make_brancher(lc, {int(i): tree for i in np.flatnonzero(tree_root)})
    tree_rng, fill_rng = jax.random.split(rng)
    trajs, metrics = episodes(params, row_seeds, tree_rng, greedy=list(tree_root & lc.greedy),
                              brancher=brancher, alternatives=2)
    keep, group = ~dropped_rows(trajs, lc), tree_lib.root_groups(trajs, roots)
    branches, trees = len(trajs) - len(row_seeds), int(tree_root.sum())
    host = {"latr/mix_ratio": ratio, "latr/pruned_frac": float((~keep).sum()) / max(branches, 1),
            "latr/rows_per_tree": (trees + branches) / max(trees, 1),
            "latr/candidate_frac": counts["candidates"] / max(counts["tokens"], 1)}
    # The fill: plain samples of the prompt for each tree's missing rows [INF] (module doc).
    in_tree = keep & np.concatenate([tree_root, np.ones((branches,), bool)])
    fill = [tree - int(in_tree[group == p].sum()) if lc.fill else 0 for p in range(len(seeds))]
    fill_seeds = [s for s, n in zip(seeds, fill) for _ in range(n)]
    if fill_seeds:
      trajs, metrics = merge_runs((trajs, metrics), episodes(params, fill_seeds, fill_rng))
      group = np.concatenate([group, np.repeat(np.arange(len(seeds)), fill)])
      keep = np.concatenate([keep, np.ones((len(fill_seeds),), bool)])
    kept = [t for t, k in zip(trajs, keep) if k]
    reward = np.asarray([t.reward for t in trajs], np.float64)
    adv_B, keep_B = np.zeros((B,), np.float32), np.zeros((B,), np.float32)
    adv_B[:len(kept)] = group_advantages(reward, group, keep)[keep]
    keep_B[:len(kept)] = 1.0
    # Pad to B rows that train nothing, so the update step keeps one shape.
    padded = kept + [kept[0]] * (B - len(kept))
    batch = pack.pack(padded, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len,
                      sharding=rows)
    host |= {**collect.rollout_metrics(trajs), **metrics,   # the engine's sampled_tokens
             **collect.batch_metrics(kept, batch), "latr/kept_rows": float(len(kept)),
             "latr/fill_rows": float(len(fill_seeds))}
    return loop.Rollout(batch=batch, metrics=host,
                        extras=jax.device_put({"adv_B": adv_B, "keep_B": keep_B}, rows),
                        lengths_B=collect.row_lengths(padded, batch), trajectories=kept,
                        tokenizer=tok)

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """LATR end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  mix_schedule(config.latr.mix_schedule)             # bad keys fail before anything runs
  recipe.parse_ints("latr.prune_steps", config.latr.prune_steps)
  start = rundir.write_config(config, workdir, experiment="latr")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), optimizer. No reference model: KL 0, as the GRPO baseline.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  engine = recipe.rollout_engine(config, graphdef, tok)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok,
                                       engine=engine)
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- The RL loop.
  data = recipe.prompt_stream(make_env)
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=make_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, None, batch),
        advantage_fn=jax.jit(advantage_fn), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="LATR", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
