# pylint: disable=invalid-name
r"""R3L (Shi et al. 2026, arXiv 2601.03715): retry a failed episode from its failing turn, and
train only the turns where the original and the retry differ, on a multi-turn agent task.

  python -m experiments.agents.r3l                                       # hidden-rule game
  python -m experiments.agents.r3l --config=experiments/agents/r3l.py:textworld
  python -m experiments.agents.r3l --config=experiments/agents/r3l.py:smoke --workdir=/tmp/r3l

Each step, per prompt:
  1. restart.roots first attempts from reset, sampled by the rollout engine;
  2. when a first attempt ends without success, `restart.first_failing_turn` picks the turn k
     to retry (R3L asks the model's reflection; without a reflection model: the first turn
     with an env error or a negative reward, else the last turn [INF]) and the episode forks
     restart.retries times at the turn's first sampled token (`restart.turn_start`,
     `Engine.run(brancher=)`): a retry keeps the attempt's tokens of turns < k (their cache
     rows copied, never prefilled again), plays on against a replay of the env to the state
     before turn k (agentrl/envs/fork.py) and samples turn k onwards; a retry is not retried;
  3. credit (`restart.token_advantages`): the prompt's attempts and retries are one group;
     score = R3L's positive-amplified group advantage (`r3l_scores`: restart.normalize "grpo"
     z-scores the rewards, as the code's `grpo_reweight_adv` for a PPO loss; "mean" is OPMD's
     r - mean), a success scores 1, a non-negative failure's score is tripled;
  4. pivotal mask: turns < k train on neither the attempt nor its retry (the shared prefix
     carries no contrast); every other sampled token gets its row's score;
  5. PPO clip (one update per batch), token-mean over the pivotal tokens, KL 0.

Defaults [code]: half of a task's 8 samples are first attempts, each retried at most once
(`repeat_times: 8`, `self.n // 2`). A retry samples only turns k onwards, so 4 + 4 costs far
fewer sampled tokens than 8 whole episodes; the `cpu` preset spends the GRPO job's budget
(32 prompts x 8 whole episodes) on 7 first attempts per prompt instead [INF: a budget; its
README section gives the measured tokens per step]. The batch is padded to roots x
(1 + retries) rows per prompt with rows that train nothing, since how many attempts fail
changes every step. Presets: cpu (default: the hidden-rule game,
agentrl.harness.rl_config.hidden_rule_study), textworld (the long-horizon coin collector,
rl_config.textworld_study), pod (the game at agent.py's pod scale on rl_config's Qwen3-8B mesh,
the paper's sizes), smoke (CI, seconds).

Not here: the reflection model (its guided retry and its "distilled" copy without the
guidance), OPMD's loss (PPO clip with the "grpo" scores instead), and CSO's variant
(`restart.cso_pairs`), whose DPO pairs need a frozen reference, a pair loss and an expert's
alternatives, a different update step and sampler rather than a different credit.
This file is the fork unit; the building blocks come from agentrl.harness.recipe, loop and credit.
"""
from absl import app
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl import configs
from agentrl.credit import restart
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


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.agent_study(arg, experiment="r3l", names=registry.NAMES)
  c.loss = dict(eps_low=0.2, eps_high=0.2, agg="token-mean")
  # roots, retries: first attempts per prompt and retries per failed one; the restart rule's
  # switches: restart.first_failing_turn's; normalize, amplify: restart.r3l_scores'.
  c.restart = dict(roots=4, retries=1, on_error=True, on_negative_reward=True,
                   on_no_progress=False, fallback="last", normalize="grpo", amplify=3.0)
  if arg.preset == "cpu" and not arg.smoke:
    c.restart.roots = 7    # the GRPO job's sampled tokens per step (module docstring)
  if arg.preset == "pod":
    c.rollout.prompts_per_step = 64
  if arg.smoke:
    c.restart.roots = 2
  c.rollout.group_size = c.restart.roots    # the first attempts of a prompt's group
  return c


SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    **registry.schema(registry.NAMES),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "rollout.group_size": configs.Key(int, min=1, why="the first attempts of each prompt"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "restart.roots": configs.Key(int, min=1),
    "restart.retries": configs.Key(int, min=1),
    "restart.on_error": configs.Key(bool),
    "restart.on_negative_reward": configs.Key(bool),
    "restart.on_no_progress": configs.Key(bool),
    "restart.fallback": configs.Key(str, choices=restart.FALLBACKS),
    "restart.normalize": configs.Key(str, choices=restart.NORMALIZE),
    "restart.amplify": configs.Key(float, min=0.0),
}


def rows_per_prompt(rc) -> int:
  """Rows of a prompt whose every first attempt fails: each is retried restart.retries times."""
  return rc.roots * (1 + rc.retries)


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train().

  batch.loss_mask_BT is already the pivotal mask (the advantage step sets it)."""
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
  """(batch, extras with the R3L scores adv_BT and the pivotal mask_BT) -> (batch, metrics):
  the scores on the tokens, the loss mask cut to the pivotal tokens."""
  mask_BT = batch.loss_mask_BT * extras["mask_BT"]
  return batch.replace(adv_BT=extras["adv_BT"], loss_mask_BT=mask_BT), {
      "adv_abs_mean": estimators.adv_abs_mean(extras["adv_BT"], mask_BT)}


# ---------------------------------------------------------------------------------------------
# The rollout: attempts, their retries, the credit, packed.
# ---------------------------------------------------------------------------------------------
def make_brancher(rc):
  """R3L's retry: a first attempt that ends without success forks restart.retries times at
  the first sampled token of its failing turn; retries are not retried."""

  def brancher(point: branching.ForkPoint) -> list[branching.Fork]:
    if point.kind != "finished" or point.depth > 0:
      return []
    t = point.trajectory
    k = restart.first_failing_turn(
        t.turn_rewards, t.infos, on_error=rc.on_error, on_negative_reward=rc.on_negative_reward,
        on_no_progress=rc.on_no_progress, fallback=rc.fallback)
    if k is None:
      return []
    return [branching.Fork(at=restart.turn_start(t.turn, t.loss_mask, k), n=rc.retries)]

  return brancher


def retry_metrics(trajs, mask_BT, loss_mask_BT) -> dict[str, float]:
  """The retries' success rate and mean restart turn (0 in a step without retries), and the
  share of the rows' sampled tokens that the pivotal mask trains."""
  retries = [t for t in trajs if t.parent >= 0]
  return {"r3l/retry_success": float(np.mean([collect.trajectory_success(t) for t in retries]))
                               if retries else 0.0,
          "r3l/restart_turn": float(np.mean([t.turn[t.fork_at] for t in retries]))
                              if retries else 0.0,
          "r3l/trained_frac": float(mask_BT.sum() / max(loss_mask_BT.sum(), 1.0))}


def make_rollout_fn(config, engine, tok, make_env, data, mesh):
  """rollout_fn(params, rng, step): attempts and retries, packed to a fixed row count, with
  the R3L scores and the pivotal mask as extras."""
  rc, sc = config.rollout, config.restart
  rows = sharding.batch_sharding(mesh)
  brancher, U = make_brancher(sc), make_env().max_turns
  B = rc.prompts_per_step * rows_per_prompt(sc)

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    row_seeds = [s for s in seeds for _ in range(sc.roots)]
    trajs, metrics = engine.run(
        params, tok, [make_env() for _ in row_seeds], row_seeds, rng=rng, max_turns=U,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, temperature=rc.temperature,
        chat_template=config.task.chat_template, brancher=brancher)
    forest = tree_lib.from_trajectories(trajs, group_B=tree_lib.root_groups(trajs, sc.roots))
    real = len(trajs)
    # How many attempts fail changes every step: pad to B rows that train nothing, so the
    # update step keeps one shape.
    padded = trajs + [trajs[0]] * (B - real)
    host_batch = pack.pack_numpy(padded, max_len=rc.max_len, pad_id=tok.pad_id,
                                 min_len=rc.max_len)
    batch = jax.device_put(host_batch, rows)
    T, loss_mask_BT = host_batch.tokens_BT.shape[1], host_batch.loss_mask_BT[:real]
    reward = np.asarray([t.reward for t in trajs], np.float64)
    adv_BT, mask_BT = np.zeros((B, T), np.float32), np.zeros((B, T), np.float32)
    adv_BT[:real], mask_BT[:real] = restart.token_advantages(
        forest, reward, loss_mask_BT, normalize=sc.normalize, amplify=sc.amplify)
    host = {**collect.rollout_metrics(trajs), **metrics, **collect.batch_metrics(trajs, batch),
            **retry_metrics(trajs, mask_BT[:real], loss_mask_BT), "r3l/rows": float(real)}
    return loop.Rollout(batch=batch, metrics=host,
                        extras=jax.device_put({"adv_BT": adv_BT, "mask_BT": mask_BT}, rows),
                        lengths_B=collect.row_lengths(padded, batch), trajectories=trajs,
                        tokenizer=tok)

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """R3L end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  configs.require(config.rollout.group_size == config.restart.roots,
                  f"config.rollout.group_size ({config.rollout.group_size}) must equal "
                  f"config.restart.roots ({config.restart.roots}): the first attempts are the "
                  "prompt's group")
  start = rundir.write_config(config, workdir, experiment="r3l")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), optimizer. No reference model: KL 0.
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
  return rundir.write_summary(workdir, result, name="R3L", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
