# pylint: disable=invalid-name
r"""ARPO (Lu et al. 2025, arXiv 2505.16282): GRPO on a multi-turn agent task, with a stored
success of a prompt replayed into that prompt's group when all of its samples fail.

  python -m experiments.agents.arpo --workdir=runs/arpo                    # hidden-rule game
  python -m experiments.agents.arpo --config.replay.keep_stored_logp=False  # authors' recompute
  python -m experiments.agents.arpo --config=experiments/agents/arpo.py:smoke --workdir=/tmp/arpo

Each step (docs/algorithms.md §16.4):
  1. G samples per prompt (agentrl.rollout.agent_loop.rollout_groups), packed on the host;
  2. for each group with no success whose prompt has a stored success, the newest one
     replaces one of its rows, chosen uniformly (`replay_buffer.arpo_plan`, `splice_batch`):
     its tokens, masks, reward, policy version and behaviour log-probs;
  3. the step's sampled successes are stored (`replay_buffer.add`, FIFO per prompt, at most
     replay.per_prompt rows a prompt and replay.capacity in all) with the sampler's log-probs
     as their pi_old;
  4. the score step recomputes pi_old for every row, then keeps the stored pi_old on the
     replayed rows (`replay_buffer.keep_stored_logp`) so their ratio is pi_theta /
     pi_old(stored) and the clip bounds a stale success; replay.keep_stored_logp=False is the
     authors' verl trainer, which recomputes pi_old for every row (ratio 1 at the first epoch);
  5. GRPO over the spliced groups, PPO clip (0.2, 0.3: the authors' script), token-mean, KL 0.

The buffer is a `loop.run(host_state=...)`, saved with every checkpoint: a resumed run
replays exactly (the rollout is synchronous, updates.max_staleness = 0). A prompt is the env
seed; replay.task_pool > 0 draws the training seeds modulo that many tasks, so each task comes
back every task_pool / prompts_per_step steps, as ARPO's fixed task set does (the default
stream never repeats a seed, and a buffer keyed by prompt would never be read) [INF: pool
size]. A success is the env's `success` flag; a replayed success needs a reward > 0 (a solved
game's is 1). The trajectory records of a replayed row show the sampled row's turns and
infos beside the replayed tokens.

Presets: cpu (default: the hidden-rule game, agentrl.harness.rl_config.hidden_rule_study),
textworld (rl_config.textworld_study), pod (the game at agent.py's pod scale, 2 PPO epochs and
G = 8 [paper: G = 4 on OSWorld]), smoke (CI, seconds).
This file is the fork unit; the building blocks come from agentrl.harness.recipe, loop and
agentrl.train.replay_buffer.
"""
from absl import app
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
from agentrl.envs import registry
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rollout import agent_loop
from agentrl.rollout import collect
from agentrl.rollout import pack
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl.train import replay_buffer as rb
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.agent_study(arg, experiment="arpo", names=registry.NAMES)
  c.loss = dict(eps_low=0.2, eps_high=0.3, agg="token-mean")
  # capacity: stored successes in all; per_prompt: per task (FIFO); task_pool: the training
  # tasks, seeds modulo it (0: the unbounded stream); keep_stored_logp: the module docstring.
  c.replay = dict(capacity=1024, per_prompt=2, task_pool=256, keep_stored_logp=True)
  if arg.preset == "pod":
    c.updates.epochs = 2
    c.replay.update(capacity=4096, task_pool=1024)
  if arg.smoke:
    c.replay.update(capacity=8, task_pool=2)
  return c


SCHEMA = {
    **{k: v for k, v in rl_config.RL_SCHEMA.items() if not k.startswith("task.")},
    **registry.schema(registry.NAMES),
    "sft.demo_noise": configs.Key(float, min=0.0, max=1.0),
    "rollout.group_size": configs.Key(int, min=2, why="a replayed success needs a group"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "replay.capacity": configs.Key(int, min=1),
    "replay.per_prompt": configs.Key(int, min=1),
    "replay.task_pool": configs.Key(int, min=0),
    "replay.keep_stored_logp": configs.Key(bool),
}


# ---------------------------------------------------------------------------------------------
# The loss composition: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
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


# ---------------------------------------------------------------------------------------------
# The rollout: groups, the replayed successes spliced in, the step's successes stored.
# ---------------------------------------------------------------------------------------------
def replay_step(buf: rb.Buffer, host: types.Batch, prompt_P: np.ndarray, success_B: np.ndarray,
                pc, *, G: int, version: int,
                seed: int) -> tuple[types.Batch, rb.Buffer, dict[str, float]]:
  """One step of ARPO's buffer on a packed host batch: (spliced batch, new buffer, metrics).

  Each group without a success gets its prompt's newest stored success in one row (its
  stored pi_old kept when pc.keep_stored_logp); then the step's sampled successes are stored
  with the sampler's log-probs."""
  slot_P, row_P = rb.arpo_plan(buf, success_B.astype(np.float32), prompt_P, group_size=G,
                               seed=seed)
  spliced, replayed_B = rb.splice_batch(host, buf, slot_P, row_P,
                                        keep_stored_logp=pc.keep_stored_logp)
  new = rb.add(buf, prompt_B=np.repeat(prompt_P, G), tokens_BT=host.tokens_BT,
               input_mask_BT=host.input_mask_BT, loss_mask_BT=host.loss_mask_BT,
               old_logp_BT=host.sampler_logp_BT, reward_B=host.reward_B, version=version,
               keep_B=success_B, per_prompt_cap=pc.per_prompt, evict="oldest")
  failed_P = ~success_B.reshape(-1, G).any(axis=1)
  return spliced, new, {"replay/size": float(rb.size(new)),
                        "replay/replayed_rows": float(replayed_B.sum()),
                        "replay/failed_groups": float(failed_P.mean())}


def make_rollout_fn(config, engine, tok, make_env, data, mesh, holder: rb.Holder):
  """rollout_fn(params, rng, step): G samples per task, ARPO's splice, the buffer updated."""
  rc, pc, tc = config.rollout, config.replay, config.task
  G, U, rows = rc.group_size, make_env().max_turns, sharding.batch_sharding(mesh)

  def rollout_fn(params, rng, step):
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    if pc.task_pool:
      seeds = [s % pc.task_pool for s in seeds]
    groups = agent_loop.rollout_groups(
        engine, params, tok, make_env, seeds, group_size=G, rng=rng, max_turns=U,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len, temperature=rc.temperature,
        chat_template=tc.chat_template)
    trajs = groups.trajectories
    host = pack.pack_numpy(trajs, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len)
    host = host.replace(version_B=np.full((len(trajs),), step - 1, np.int32))
    success_B = np.asarray([collect.trajectory_success(t) for t in trajs])
    spliced, holder.buffer, replay_metrics = replay_step(
        holder.buffer, host, np.asarray(seeds), success_B, pc, G=G, version=step - 1,
        seed=config.seed * 1_000_003 + step)
    host_metrics = {**groups.metrics, **collect.rollout_metrics(trajs),
                    **collect.batch_metrics(trajs, host), **replay_metrics}
    return loop.Rollout(batch=jax.device_put(spliced, rows), metrics=host_metrics,
                        trajectories=trajs, tokenizer=tok)

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """ARPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  configs.require(config.updates.max_staleness == 0,
                  "config.updates.max_staleness must be 0 for arpo: its replay buffer is "
                  "checkpointed with the step that filled it")
  start = rundir.write_config(config, workdir, experiment="arpo")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), optimizer. No reference model: KL 0 (the authors' GRPO).
  tok, graphdef, params = recipe.build_policy(config, mesh)
  engine = recipe.rollout_engine(config, graphdef, tok)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok,
                                       engine=engine)
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = loop.make_score_step(graphdef, temperature=rc.temperature,
                                    logprob_impl=config.model.logprob_impl)
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- The replay buffer (checkpointed with the run) and the RL loop.
  holder = rb.Holder(rb.empty(config.replay.capacity, rc.max_len))
  data = recipe.prompt_stream(make_env)
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=make_rollout_fn(config, engine, tok, make_env, data, mesh, holder),
        score_fn=jax.jit(rb.stored_logp_score(score_step)),
        advantage_fn=jax.jit(estimators.grpo_step(rc.group_size)), update_fn=update_step,
        data=data, evaluate=recipe.evaluator(config, engine, tok, make_env),
        host_state=holder, **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="ARPO", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
