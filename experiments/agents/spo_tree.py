# pylint: disable=invalid-name
r"""SPO-tree (Guo et al. 2025, arXiv 2505.23564, the tree variant): segment advantages from a
fixed-shape tree of continuations, on a multi-turn agent task.

  python -m experiments.agents.spo_tree                                  # hidden-rule game
  python -m experiments.agents.spo_tree --config=experiments/agents/spo_tree.py:textworld
  python -m experiments.agents.spo_tree --config=experiments/agents/spo_tree.py:smoke \
      --workdir=/tmp/spo_tree

Each step, per prompt:
  1. tree.roots episodes from reset (the tree's first level: the prompt's children), sampled by
     the rollout engine;
  2. every episode forks at each of the first tree.depth segment boundaries it samples itself,
     tree.branches new episodes each (`Engine.run(brancher=)`), so that every node above the
     last level has 1 + tree.branches children: a branch keeps the episode's tokens up to the
     boundary (its cache rows copied, never prefilled again), samples on from there against a
     copy of the env (cloned, or replayed: agentrl/envs/fork.py), and forks at the later
     boundaries in turn. A full tree has tree.roots x (1 + tree.branches) ** tree.depth
     leaves; an episode that ends before a boundary does not fork there;
  3. the prompt's tree (`credit.tree`): V(leaf) = its reward, V(node) = the mean of its
     children's V, and each segment's tokens get V(node) - V(parent) (`spo_tree.
     segment_advantages`, adv_method "rloo"); a segment with advantage exactly 0 is dropped;
  4. every segment trains once, on the row that sampled it ("owned" tokens, conditioned on its
     parent's text), only on its tokens with p < spo.prob_threshold under pi_old, the
     advantages whitened over those tokens (`spo_tree.token_advantages`, as SPO-chain);
  5. PPO clip on those tokens, token-mean, no KL term.

Segments. The paper's tree is single-turn: a node is M more sampled tokens (M = 30 to 600),
the last level runs to the end. Here a segment ends at a turn boundary by default
(tree.segment="turns": the episode forks at its first tree.depth "stepped" points, after the
env's reply, so a segment is whole turns and a branch redraws the next turn from the same env
state) [INF: the agent adaptation; the turn is the agent's unit of action].
tree.segment="tokens" cuts every tree.segment_tokens sampled tokens as the paper does (forks at
"sampled" points, inside a turn, the env as it was before that turn's step).

Defaults [code] (agentrl/credit/spo_tree.py): the tree 6-6-6 (roots 6, branches 5, depth 2),
adv_method "rloo", zero-advantage edges dropped, p < 0.9, whitening. The `cpu` preset's tree
is 3-3 (roots 3, branches 2, depth 1: 9 leaves per prompt, 32 prompts per step): a root's two
branches resample all but its first turn, so a step samples about as many tokens as the GRPO
job's 8 episodes of each of 32 prompts [INF: a budget]. The replay buffer of edges is not
reproduced (every edge of the step trains). Presets: cpu (default: the hidden-rule game,
agentrl.harness.rl_config.hidden_rule_study), textworld (the long-horizon coin collector,
rl_config.textworld_study), pod (the game at agent.py's pod scale on rl_config's Qwen3-8B mesh,
the paper's sizes), smoke (CI, seconds).
This file is the fork unit; the building blocks come from agentrl.harness.recipe, loop and credit.
"""
from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl import configs
from agentrl.credit import spo
from agentrl.credit import spo_tree
from agentrl.credit import tree as tree_lib
from agentrl import distributed
from agentrl.envs import registry
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rollout import branching
from agentrl.rollout import collect
from agentrl.rollout import pack
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types

SEGMENTS = ("turns", "tokens")


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.agent_study(arg, experiment="spo_tree", names=registry.NAMES)
  c.loss = dict(eps_low=0.2, eps_high=0.2, agg="token-mean")
  # roots: the prompt's children; branches: the extra children of a node at each fork (a node
  # has 1 + branches); depth: the fork levels below the roots (the code's 6-6-6 is roots 6,
  # branches 5, depth 2); segment: "turns" or "tokens" (every segment_tokens sampled tokens).
  c.tree = dict(roots=3, branches=2, depth=1, segment="turns", segment_tokens=6)
  # credit/spo_tree.py: adv_method, drop_zero (zero-advantage edges not trained), the
  # probability mask's threshold and the whitening.
  c.spo = dict(adv_method="rloo", drop_zero=True, prob_threshold=0.9, whiten=True)
  if arg.preset == "pod":    # the code's 6-6-6 tree: 216 leaves per prompt
    c.tree.update(roots=6, branches=5, depth=2)
    c.rollout.prompts_per_step = 8
  c.rollout.group_size = c.tree.roots    # the roots of a prompt's tree
  if arg.smoke:
    c.tree.update(roots=2, branches=1, depth=1)
    c.rollout.group_size = 2
  return c


SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    **registry.schema(registry.NAMES),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "rollout.group_size": configs.Key(int, min=1, why="the roots of each prompt's tree"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "tree.roots": configs.Key(int, min=1),
    "tree.branches": configs.Key(int, min=1),
    "tree.depth": configs.Key(int, min=0),
    "tree.segment": configs.Key(str, choices=SEGMENTS),
    "tree.segment_tokens": configs.Key(int, min=1),
    "spo.adv_method": configs.Key(str, choices=spo_tree.ADV_METHODS),
    "spo.drop_zero": configs.Key(bool),
    "spo.prob_threshold": configs.Key(float, min=0.0, max=1.0),
    "spo.whiten": configs.Key(bool),
}


def rows_per_prompt(tc) -> int:
  """Leaves of a full tree: the roots, each node above the last level with 1 + branches
  children."""
  return tc.roots * (1 + tc.branches) ** tc.depth


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train().

  batch.loss_mask_BT is already the kept segments' probability mask (the advantage step sets
  it)."""
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


def make_advantage_fn(config):
  """(batch, extras with the segments' adv_BT and keep_BT) -> (batch with the whitened token
  advantages and the probability mask of the kept segments as its loss mask, metrics)."""
  sc = config.spo

  def advantage_fn(batch: types.Batch, extras):
    keep_BT = extras["keep_BT"].astype(batch.loss_mask_BT.dtype) * batch.loss_mask_BT
    adv_BT = spo_tree.token_advantages(extras["adv_BT"], extras["keep_BT"], batch.old_logp_BT,
                                       batch.loss_mask_BT, prob_threshold=sc.prob_threshold,
                                       whiten=sc.whiten)
    mask_BT = spo.probability_mask(batch.old_logp_BT, keep_BT,
                                   prob_threshold=sc.prob_threshold).astype(jnp.float32)
    metrics = {"adv_abs_mean": estimators.adv_abs_mean(adv_BT, mask_BT),
               "spo/lowprob_frac": aggregation.masked_mean(mask_BT, keep_BT)}
    return batch.replace(adv_BT=adv_BT, loss_mask_BT=mask_BT), metrics

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# The rollout: the trees, their segment advantages, packed.
# ---------------------------------------------------------------------------------------------
def token_boundaries(t, start: int, tc) -> list[int]:
  """The positions in [start, len) of t's own sampled tokens that begin segments 1..depth:
  sampled token k * segment_tokens (counting from the episode's first), k <= depth."""
  index = np.cumsum(t.loss_mask > 0) - 1      # each sampled token's index among them
  level, rem = np.divmod(index, tc.segment_tokens)
  cut = (t.loss_mask > 0) & (rem == 0) & (level >= 1) & (level <= tc.depth)
  cut &= np.arange(len(t.tokens)) > t.fork_at  # a branch's first token is its fork, not a cut
  return [int(i) for i in np.flatnonzero(cut) if i >= start]


def make_brancher(tc):
  """SPO-tree's fixed shape: every episode forks tree.branches times at each of the first
  tree.depth segment boundaries it samples itself (turn boundaries, or every segment_tokens
  sampled tokens)."""

  def brancher(point: branching.ForkPoint) -> list[branching.Fork]:
    if tc.segment == "turns":
      # A branch made at boundary k starts turn k + 1, so it sees only the later boundaries.
      if point.kind == "stepped" and point.turn <= tc.depth:
        return [branching.Fork(at=len(point.trajectory.tokens), n=tc.branches)]
      return []
    if point.kind != "sampled":
      return []
    return [branching.Fork(at=c, n=tc.branches)
            for c in token_boundaries(point.trajectory, point.turn_start, tc)]

  return brancher


def make_rollout_fn(config, engine, tok, make_env, data, mesh):
  """rollout_fn(params, rng, step): the trees, packed to a fixed row count, with the segment
  advantages and the trained segments as extras."""
  rc, tc, sc = config.rollout, config.tree, config.spo
  rows = sharding.batch_sharding(mesh)
  brancher, U = make_brancher(tc), make_env().max_turns
  B = rc.prompts_per_step * rows_per_prompt(tc)

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    row_seeds = [s for s in seeds for _ in range(tc.roots)]
    trajs, metrics = engine.run(
        params, tok, [make_env() for _ in row_seeds], row_seeds, rng=rng, max_turns=U,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, temperature=rc.temperature,
        chat_template=config.task.chat_template, brancher=brancher,
        max_branches=B - len(row_seeds))
    forest = tree_lib.from_trajectories(trajs, group_B=tree_lib.root_groups(trajs, tc.roots))
    real = len(trajs)
    # An episode that ends before a boundary forks less: pad to B rows that train nothing, so
    # the update step keeps one shape.
    padded = trajs + [trajs[0]] * (B - real)
    batch = pack.pack(padded, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len,
                      sharding=rows)
    T = batch.tokens_BT.shape[1]
    reward = np.asarray([t.reward for t in trajs], np.float64)
    adv_BT, keep_BT = np.zeros((B, T), np.float32), np.zeros((B, T), bool)
    adv_BT[:real], keep_BT[:real] = spo_tree.segment_advantages(
        forest, reward, T, adv_method=sc.adv_method, drop_zero=sc.drop_zero)
    sampled = tree_lib.owned_mask(forest, T)   # each sampled token once, on its owner row
    for b, t in enumerate(trajs):
      sampled[b, :len(t.tokens)] &= t.loss_mask[:T] > 0
    host = {**collect.rollout_metrics(trajs), **metrics, **collect.batch_metrics(trajs, batch),
            "tree/rows": float(real), "tree/nodes_per_prompt": forest.num_nodes / len(seeds),
            "tree/signal_frac": float((sampled & keep_BT[:real]).sum() / max(sampled.sum(), 1))}
    return loop.Rollout(batch=batch, metrics=host,
                        extras=jax.device_put({"adv_BT": adv_BT, "keep_BT": keep_BT}, rows),
                        lengths_B=collect.row_lengths(padded, batch), trajectories=trajs,
                        tokenizer=tok)

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """SPO-tree end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  configs.require(config.rollout.group_size == config.tree.roots,
                  f"config.rollout.group_size ({config.rollout.group_size}) must equal "
                  f"config.tree.roots ({config.tree.roots}): the roots are the prompt's group")
  start = rundir.write_config(config, workdir, experiment="spo_tree")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), optimizer. No reference model: KL 0, as the launches.
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
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="SPO-tree", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
