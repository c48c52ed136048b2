# pylint: disable=invalid-name
r"""MSSR: single-rollout RLVR with a Beta-conjugate baseline and entropy shaping (arXiv 2512.18215).

  python -m experiments.shaping.mssr                                   # verbose arithmetic, CPU
  python -m experiments.shaping.mssr --config=experiments/shaping/mssr.py:smoke --workdir=/tmp/mssr
  python -m experiments.shaping.mssr --config.loss.entropy_coef=0.0    # the plain Beta baseline

docs/algorithms.md §13.9 (no official code; the abstract states the mechanism, the rest is
[INF] and a config key). One sample per prompt (G = 1, so no group baseline). Each prompt has a
Beta(a, b) posterior of its success rate, from the prior Beta(1, 1) [INF: `loss.prior`]:
  b_i = a / (a + b), read BEFORE this batch's update;  A_i = r_i - b_i;
  then a <- decay a + r, b <- decay b + (1 - r) [INF: decay = `loss.decay` = 1, no forgetting];
rewards are the verifier's binary ones. [INF] Entropy shaping:
  A'_{i,t} = A_i clip(1 + c z_i, 1 - m, 1 + m) on the response tokens,
z_i the batch z-score of response i's mean token entropy under pi_old (kept by the score step,
`loop.make_score_step`), c = `loss.entropy_coef` = 0.1, m =
`loss.entropy_bound` = 0.5; c = 0 is the plain Beta-baseline advantage
(`exploration.mssr_advantage`). Then GRPO's PPO clip, optional KL and aggregation.

The table is an `exploration.BetaTable` of `mssr.num_slots` entries, one per training-set index
(as experiments/efficiency/hapo_length.py's history: a prompt's seed is its slot; `length_rewards.
PromptSlots` maps other keys), held in the train state: donated, checkpointed and restored
with it, so a resumed run continues with exactly the table it had. The table is read and
written inside the jitted update, so that update sees the whole rollout batch:
updates.minibatches = updates.epochs = 1 (SCHEMA).

The posterior only pays off when prompts repeat. The default (`cpu`) task is the verbose-answer
arithmetic task (envs/verbose_arithmetic.py), whose training set is 256 problems revisited
every epoch; [INF] 128 prompts x 1 sample per step, so each prompt is seen every 2 steps.
Presets: cpu, smoke. The reasoning-gym presets (smollm2, pod) stream endless fresh prompts, so
every baseline would be the prior's 1/2: they are rejected.
"""
import dataclasses

from absl import app
import flax
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl.advantages import exploration
from agentrl import configs
from agentrl import distributed
from agentrl.envs import verbose_arithmetic
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import kl
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rollout import collect
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


@flax.struct.dataclass
class Batch(types.Batch):
  slot_B: jax.Array | None = None        # int32 posterior slot of each row's prompt (-1: none)


@flax.struct.dataclass
class State(types.TrainState):
  posterior: exploration.BetaTable       # Beta(a, b) per training-set index


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  recipe.reject_preset("mssr", arg.preset, ("cpu",),
                           "MSSR's per-prompt posterior needs prompts that repeat; the verbose "
                           "arithmetic task has a finite training set, reasoning-gym streams "
                           "do not")
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  recipe.use_verbose_task(c)
  c.rollout.update(group_size=1, prompts_per_step=4 if arg.smoke else 128)
  c.loss = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.0, kl_kind="k3", agg="token-mean",
                prior=1.0, decay=1.0, entropy_coef=0.1, entropy_bound=0.5)
  c.mssr = dict(num_slots=verbose_arithmetic.TRAIN_SIZE)
  c.updates.minibatches = 1  # the posterior is read and written by the one update (SCHEMA)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "task.name": configs.Key(str, choices=("verbose_arithmetic",),
                             why="for MSSR (a finite training set whose prompts repeat)"),
    "rollout.group_size": configs.Key(int, min=1, max=1, why="for MSSR (single rollout)"),
    "updates.minibatches": configs.Key(
        int, min=1, max=1, why="for MSSR (the update reads and writes the posterior table)"),
    "updates.epochs": configs.Key(
        int, min=1, max=1, why="for MSSR (a second epoch would count the batch twice)"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.kl_kind": configs.Key(str, choices=("k1", "k2", "k3", "abs", "k3+")),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "loss.prior": configs.Key(float, min=1e-6),
    "loss.decay": configs.Key(float, min=0.0, max=1.0),
    "loss.entropy_coef": configs.Key(float, min=0.0),
    "loss.entropy_bound": configs.Key(float, min=0.0, max=1.0),
    "mssr.num_slots": configs.Key(int, min=1),
}


# ---------------------------------------------------------------------------------------------
# The advantage, the loss composition and the posterior step: the part to fork.
# ---------------------------------------------------------------------------------------------
def mssr_step(config, table: exploration.BetaTable, batch: Batch):
  """(batch with adv_BT, the next table, metrics): the baseline from the table before this
  batch, MSSR's shaped advantage, then the conjugate update."""
  lc = config.loss
  baseline_B = exploration.beta_baseline(table, batch.slot_B, prior=lc.prior)
  adv_BT = exploration.mssr_advantage(batch.reward_B, baseline_B, batch.entropy_BT,
                                      batch.loss_mask_BT, entropy_coef=lc.entropy_coef,
                                      entropy_bound=lc.entropy_bound)
  new_table = exploration.beta_update(table, batch.slot_B, batch.reward_B, decay=lc.decay)
  index_B = jnp.clip(batch.slot_B, 0, table.a_N.shape[0] - 1)
  seen_B = (batch.slot_B >= 0) & (table.a_N[index_B] + table.b_N[index_B] > 2 * lc.prior)
  metrics = {"adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
             "mssr/baseline_mean": baseline_B.mean(),
             "mssr/seen_frac": seen_B.astype(jnp.float32).mean()}
  return batch.replace(adv_BT=adv_BT), new_table, metrics


def make_update_step(config, graphdef, tx):
  """update_step(state, batch): MSSR's advantage from state.posterior, the PPO loss, then the
  posterior update. Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    kl_BT = kl.kl_penalty(logp_BT, batch.ref_logp_BT, lc.kl_kind)
    loss = aggregation.aggregate(pg_BT + lc.kl_coef * kl_BT, mask_BT, lc.agg)
    metrics |= {"loss": loss, "kl_loss": aggregation.aggregate(kl_BT, mask_BT, "token-mean")}
    return loss, metrics

  def update_step(state: State, batch: Batch):
    batch, posterior, adv_metrics = mssr_step(config, state.posterior, batch)
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    new_state, grad_metrics = loop.apply_gradients(state, grads, tx)
    return new_state.replace(posterior=posterior), metrics | grad_metrics | adv_metrics

  return update_step


def init_state(config, params, tx, mesh) -> tuple[State, State]:
  """(State, its shardings): the TrainState plus the prior table (replicated)."""
  base, base_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  posterior = jax.device_put(
      exploration.BetaTable.create(config.mssr.num_slots, prior=config.loss.prior), replicated)
  state = State(step=base.step, params=base.params, opt_state=base.opt_state,
                posterior=posterior)
  shardings = State(step=base_shardings.step, params=base_shardings.params,
                    opt_state=base_shardings.opt_state,
                    posterior=jax.tree.map(lambda _: replicated, posterior))
  return state, shardings


def rollout_fn_with_slots(config, engine, tok, make_env, data, mesh):
  """rollout_fn(params, rng, step): one sample per prompt, each row tagged with its slot.

  A prompt's slot is its seed (its training-set index); seeds outside the table get -1.
  """
  rc, tc = config.rollout, config.task
  rows = sharding.batch_sharding(mesh)

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    out = collect.env_rollout(engine, params, tok, make_env, seeds, rng=rng,
                              group_size=rc.group_size, max_turns=tc.max_turns,
                              max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
                              temperature=rc.temperature, chat_template=tc.chat_template,
                              min_len=rc.max_len, sharding=rows)
    slot_B = np.repeat([s if 0 <= s < config.mssr.num_slots else -1 for s in seeds],
                       rc.group_size).astype(np.int32)
    fields = {f.name: getattr(out.batch, f.name) for f in dataclasses.fields(types.Batch)}
    out.batch = Batch(**fields, slot_B=jax.device_put(slot_B, rows))
    return out

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """MSSR end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="mssr")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, optimizer; the posterior in the state.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = init_state(config, params, tx, mesh)

  # ---- Jitted steps: scoring keeps pi_old's per-token entropy; the advantage is computed
  # inside the update (it reads the posterior).
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout (rows tagged with their slot), data and held-out evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop. No row shuffling needed by the math, but one update sees every row.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=rollout_fn_with_slots(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=lambda batch, extras: (batch, {}), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), shuffle=False,
        **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="MSSR", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
