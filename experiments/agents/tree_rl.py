# pylint: disable=invalid-name
r"""TreeRL (Hou et al. 2025, arXiv 2506.11902): an on-policy tree per prompt, process credit
from its nodes, on a multi-turn agent task.

  python -m experiments.agents.tree_rl                                   # hidden-rule game
  python -m experiments.agents.tree_rl --config=experiments/agents/tree_rl.py:textworld
  python -m experiments.agents.tree_rl --config=experiments/agents/tree_rl.py:smoke \
      --workdir=/tmp/tree_rl

Each step, per prompt:
  1. tree.roots episodes from reset (EPTree's M chains), sampled by the rollout engine;
  2. when a root episode ends, its tree.fork_points sampled tokens of largest -log p
     (`treerl.fork_points`; a branch's first token is never a fork point) each start
     tree.branches new episodes (`Engine.run(brancher=)`): a branch keeps the root's tokens
     before the fork point (its cache rows copied, never prefilled again), redraws from
     there, and plays on against a replay of the env (agentrl/envs/fork.py); tree.iterations
     rounds of this (EPTree's L: branches of branches when > 1);
  3. the forest of the prompt's rows (`credit.tree`): each leaf's outcome centred by the
     others' mean, node values V(s) over the leaves below, and every token gets
     R(s) = (V'(s) - V'(parent)) + V'(s), V' = V / sqrt(|leaves(s)|) (`treerl.node_rewards`,
     the official code's form; tree.form="paper" for the paper's);
  4. every row trains its whole transcript ("paths", the code's training set: a shared prefix
     trains once per leaf below it), or each token once (tree.weighting="owned");
  5. PPO clip (one update per batch: REINFORCE with the ratio at 1, as the launch), token-mean.

Defaults [code]: M = 6, N = 2, L = 1, T = 2 (`--m 6 --n 2 --l 1 --t 2`), i.e. 6 + 24 leaves
per prompt. The `cpu` preset halves the forest (M = 4, N = 1, T = 1: 8 leaves, the GRPO job's
group size) so a step costs about what a GRPO step does [INF: a budget]. Presets: cpu
(default: the hidden-rule game, agentrl.harness.rl_config.hidden_rule_study), textworld (the
long-horizon coin collector, rl_config.textworld_study), pod (the game at agent.py's pod scale
on rl_config's Qwen3-8B mesh, the paper's sizes), smoke (CI, seconds).
This file is the fork unit; the building blocks come from agentrl.harness.recipe, loop and credit.
"""
from absl import app
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl import configs
from agentrl.credit import tree as tree_lib
from agentrl.credit import treerl
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


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.agent_study(arg, experiment="tree_rl", names=registry.NAMES)
  c.loss = dict(eps_low=0.2, eps_high=0.2, agg="token-mean")
  # roots, fork_points, branches, iterations: EPTree's M, N, T, L; reweight and form:
  # treerl.node_rewards'; weighting: credit.tree.token_weights' mode.
  c.tree = dict(roots=4, fork_points=1, branches=1, iterations=1, reweight="sqrt", form="code",
                weighting="paths")
  if arg.preset == "pod":    # the launch's EPTree: 6 + 24 leaves per prompt
    c.tree.update(roots=6, fork_points=2, branches=2)
    c.rollout.prompts_per_step = 32
  c.rollout.group_size = c.tree.roots    # the roots of a prompt's forest
  if arg.smoke:
    c.tree.update(roots=2)
    c.rollout.group_size = 2
  return c


SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    **registry.schema(registry.NAMES),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "rollout.group_size": configs.Key(int, min=1, why="the roots of each prompt's forest"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "tree.roots": configs.Key(int, min=1),
    "tree.fork_points": configs.Key(int, min=0),
    "tree.branches": configs.Key(int, min=1),
    "tree.iterations": configs.Key(int, min=0),
    "tree.reweight": configs.Key(str, choices=treerl.REWEIGHTS),
    "tree.form": configs.Key(str, choices=treerl.FORMS),
    "tree.weighting": configs.Key(str, choices=tree_lib.WEIGHT_MODES),
}


def rows_per_prompt(tc) -> int:
  """Leaves of a full forest: M roots, each round forking every leaf N x T times."""
  return tc.roots * (1 + tc.fork_points * tc.branches) ** tc.iterations


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train().

  batch.loss_mask_BT already carries the tree's token weights (the advantage step sets it)."""
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
  """(batch, extras with the tree's adv_BT and weight_BT) -> (batch, metrics): the node
  rewards on the tokens, the loss mask weighted as tree.weighting says."""
  mask_BT = batch.loss_mask_BT * extras["weight_BT"]
  return batch.replace(adv_BT=extras["adv_BT"], loss_mask_BT=mask_BT), {
      "adv_abs_mean": estimators.adv_abs_mean(extras["adv_BT"], mask_BT)}


# ---------------------------------------------------------------------------------------------
# The rollout: the forests, their credit, packed.
# ---------------------------------------------------------------------------------------------
def make_brancher(tc):
  """EPTree's forks: a finished episode less than tree.iterations forks deep forks at its
  tree.fork_points most surprising own sampled tokens, tree.branches times each."""

  def brancher(point: branching.ForkPoint) -> list[branching.Fork]:
    if point.kind != "finished" or point.depth >= tc.iterations:
      return []
    t = point.trajectory
    # Own sampled tokens, a branch's first one excepted (a root's fork_at is 0, its prompt's).
    forkable = (t.loss_mask > 0) & (np.arange(len(t.tokens)) > t.fork_at)
    _, cols = treerl.fork_points(t.sampler_logp[None], forkable[None], num=tc.fork_points)
    return [branching.Fork(at=int(c), n=tc.branches) for c in cols]

  return brancher


def make_rollout_fn(config, engine, tok, make_env, data, mesh):
  """rollout_fn(params, rng, step): the forests, packed to a fixed row count, with the node
  rewards and the token weights as extras."""
  rc, tc = config.rollout, config.tree
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
        chat_template=config.task.chat_template, brancher=brancher)
    group = tree_lib.root_groups(trajs, tc.roots)
    forest = tree_lib.from_trajectories(trajs, group_B=group)
    real = len(trajs)
    # A root with fewer sampled tokens than fork points forks less: pad to B rows that train
    # nothing, so the update step keeps one shape.
    padded = trajs + [trajs[0]] * (B - real)
    batch = pack.pack(padded, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len,
                      sharding=rows)
    T = batch.tokens_BT.shape[1]
    reward = np.asarray([t.reward for t in trajs], np.float64)
    adv_BT, weight_BT = np.zeros((B, T), np.float32), np.zeros((B, T), np.float32)
    adv_BT[:real] = treerl.token_advantages(forest, reward, T, reweight=tc.reweight,
                                            form=tc.form)
    weight_BT[:real] = tree_lib.token_weights(forest, T, mode=tc.weighting)
    host = {**metrics, **collect.rollout_metrics(trajs), **collect.batch_metrics(trajs, batch),
            "tree/rows": float(real), "tree/nodes_per_prompt": forest.num_nodes / len(seeds)}
    return loop.Rollout(batch=batch, metrics=host,
                        extras=jax.device_put({"adv_BT": adv_BT, "weight_BT": weight_BT}, rows),
                        lengths_B=collect.row_lengths(padded, batch), trajectories=trajs,
                        tokenizer=tok)

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """TreeRL end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  configs.require(config.rollout.group_size == config.tree.roots,
                  f"config.rollout.group_size ({config.rollout.group_size}) must equal "
                  f"config.tree.roots ({config.tree.roots}): the roots are the prompt's group")
  start = rundir.write_config(config, workdir, experiment="tree_rl")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), optimizer. No reference model: KL 0, as the launch.
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
  return rundir.write_summary(workdir, result, name="TreeRL", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
