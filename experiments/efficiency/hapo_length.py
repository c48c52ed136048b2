# pylint: disable=invalid-name
r"""HAPO: history-aware length reward (Huang et al. 2025, arXiv 2505.11225) on top of GRPO.

  python -m experiments.efficiency.hapo_length                            # verbose arithmetic, CPU
  python -m experiments.efficiency.hapo_length \
      --config=experiments/efficiency/hapo_length.py:smoke --workdir=/tmp/h
  python -m experiments.efficiency.hapo_length --config.loss.w=0.0        # w = 0: exactly GRPO

Reward (docs/algorithms.md §12.1; code HCY123902/HAPO `grpo_trainer.combined_reward_func`):
  R = 1[correct] + w * r_len(L, h),  r_len = cos(pi/2 * L/h) if L < 2h else -1, clamped to
  >= -0.7 for a correct response and <= 0 for an incorrect one; r_len = 0 while h is undefined.
h is the prompt's shortest correct length seen so far (`loss.mode="min"`, the default), read
from the table *before* this batch and updated after it, as the official trainer does. Then
GRPO: group mean/std advantage, the clipped surrogate and aggregation of experiments/policy/grpo.py.

The history table is a `length_rewards.LengthHistory` of `hapo.num_slots` entries, one per
training-set index (HAPO indexes its table by dataset position), held in the train state: it
is donated, checkpointed and restored with it, so a resumed run continues with exactly the
table it had (tests/efficiency_experiments_test.py checks this). Because the table is read and
written inside the jitted update, that update sees the whole rollout batch, in group order:
updates.minibatches = updates.epochs = 1 (SCHEMA) and the loop does not shuffle rows.

The history only pays off when prompts repeat: HAPO trains 5 epochs over 2000 problems. The
default (`cpu`) task is the verbose-answer arithmetic task (envs/verbose_arithmetic.py: answers
padded with filler the reward ignores), whose training set is 256 problems revisited every
epoch; a prompt's seed is its slot. Presets: cpu, smoke. The reasoning-gym presets (smollm2,
pod) stream endless fresh prompts, so the table would never be read: they are rejected.

This file is the fork unit: the config, the loss composition, the advantage step and the
loop are all here; the building blocks come from agentrl.harness.recipe and agentrl.train.loop.
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
from agentrl.rewards import length_rewards
from agentrl.rollout import collect
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


@flax.struct.dataclass
class Batch(types.Batch):
  slot_B: jax.Array | None = None        # int32 history slot of each row's prompt (-1: none)


@flax.struct.dataclass
class State(types.TrainState):
  # h and count per training-set index, with an undefined h stored as 0 instead of +inf:
  # loop.skip_nonfinite drops any update whose new state has a non-finite leaf.
  history: length_rewards.LengthHistory


def _table(stored: length_rewards.LengthHistory) -> length_rewards.LengthHistory:
  """The library's LengthHistory (+inf where undefined) of the state's stored one."""
  return stored.replace(h_N=jnp.where(stored.h_N > 0, stored.h_N, jnp.inf))


def _stored(history: length_rewards.LengthHistory) -> length_rewards.LengthHistory:
  """What the state keeps: 0 where h is undefined (lengths are >= 1 token)."""
  return history.replace(h_N=jnp.where(jnp.isfinite(history.h_N), history.h_N, 0.0))


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  recipe.reject_preset("hapo_length", arg.preset, ("cpu",),
                           "HAPO's history needs prompts that repeat; the verbose arithmetic "
                           "task has a finite training set, reasoning-gym streams do not")
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  recipe.use_verbose_task(c)
  c.loss = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.0, kl_kind="k3", agg="seq-mean-token-mean",
                norm_by_std=True, w=1.0, kind="cosine", mode="min")
  c.hapo = dict(num_slots=verbose_arithmetic.TRAIN_SIZE)
  c.updates.minibatches = 1  # the history is read and written by the one update (SCHEMA)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "task.name": configs.Key(str, choices=("verbose_arithmetic",),
                             why="for HAPO (a finite training set whose prompts repeat)"),
    "updates.minibatches": configs.Key(
        int, min=1, max=1, why="for HAPO (the update reads and writes the history table)"),
    "updates.epochs": configs.Key(
        int, min=1, max=1, why="for HAPO (a second epoch would fold the batch in twice)"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.kl_kind": configs.Key(str, choices=("k1", "k2", "k3", "abs", "k3+")),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "loss.norm_by_std": configs.Key(bool),
    # The README of HAPO: w in [0, 1] keeps every correct response above every incorrect one.
    "loss.w": configs.Key(float, min=0.0, max=1.0),
    "loss.kind": configs.Key(str, choices=("cosine", "linear")),
    "loss.mode": configs.Key(str, choices=("min", "mean")),
    "hapo.num_slots": configs.Key(int, min=1),
}


# ---------------------------------------------------------------------------------------------
# The reward, the loss composition and the history step: the part to fork.
# ---------------------------------------------------------------------------------------------
def hapo_advantage(config, history: length_rewards.LengthHistory, batch: Batch):
  """(batch with adv_BT, the next history, metrics): HAPO's reward, then GRPO's advantage."""
  lc, G = config.loss, config.rollout.group_size
  correct_B = recipe.is_correct(batch.reward_B)
  length_B = recipe.response_length(batch.loss_mask_BT)
  h_B = history.lookup(batch.slot_B)                      # the table before this batch
  r_len_B = length_rewards.hapo_length_reward(length_B, correct_B, h_B, w=lc.w, kind=lc.kind)
  reward_B = correct_B.astype(jnp.float32) + r_len_B
  adv_BT = estimators.broadcast_to_tokens(
      estimators.grpo(reward_B, group_size=G, norm_by_std=lc.norm_by_std), batch.loss_mask_BT)
  new_history = length_rewards.update_history(history, batch.slot_B, length_B, correct_B,
                                              mode=lc.mode)
  live_B = estimators.group_has_variance(reward_B, group_size=G)
  defined_B = jnp.isfinite(h_B)
  metrics = {"adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
             "groups_with_signal": live_B.astype(jnp.float32).mean(),
             "hapo/length_reward": jnp.mean(r_len_B),
             "hapo/history_defined": jnp.mean(defined_B.astype(jnp.float32)),
             "hapo/history_mean": jnp.sum(jnp.where(defined_B, h_B, 0.0))
                                  / jnp.maximum(jnp.sum(defined_B), 1)}
  return batch.replace(adv_BT=adv_BT), new_history, metrics


def make_update_step(config, graphdef, tx):
  """update_step(state, batch): HAPO's advantage from state.history, GRPO's loss, then the
  history update. Pure; jit it in train()."""
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
    batch, history, adv_metrics = hapo_advantage(config, _table(state.history), batch)
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    new_state, grad_metrics = loop.apply_gradients(state, grads, tx)
    return new_state.replace(history=_stored(history)), metrics | grad_metrics | adv_metrics

  return update_step


def init_state(config, params, tx, mesh) -> tuple[State, State]:
  """(State, its shardings): the TrainState plus an empty history table (replicated)."""
  base, base_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  history = jax.device_put(_stored(length_rewards.LengthHistory.create(config.hapo.num_slots)),
                           replicated)
  state = State(step=base.step, params=base.params, opt_state=base.opt_state, history=history)
  shardings = State(step=base_shardings.step, params=base_shardings.params,
                    opt_state=base_shardings.opt_state,
                    history=jax.tree.map(lambda _: replicated, history))
  return state, shardings


def rollout_fn_with_slots(config, engine, tok, make_env, data, mesh):
  """rollout_fn(params, rng, step): G samples per prompt, each row tagged with its slot.

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
    slot_B = np.repeat([s if 0 <= s < config.hapo.num_slots else -1 for s in seeds],
                       rc.group_size).astype(np.int32)
    fields = {f.name: getattr(out.batch, f.name) for f in dataclasses.fields(types.Batch)}
    out.batch = Batch(**fields, slot_B=jax.device_put(slot_B, rows))
    return out

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """HAPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="hapo_length")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, optimizer; the history in the state.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = init_state(config, params, tx, mesh)

  # ---- Jitted steps; the advantage is computed inside the update (it reads the history).
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout (rows tagged with their slot), data and held-out evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop. No row shuffling: the update's GRPO groups are contiguous rows.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=rollout_fn_with_slots(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=lambda batch, extras: (batch, {}), update_fn=update_step, data=data,
        evaluate=recipe.length_evaluator(config, engine, tok, make_env), shuffle=False,
        **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="HAPO (history-aware length reward)",
                              start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
