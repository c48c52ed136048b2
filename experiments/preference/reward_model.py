# pylint: disable=invalid-name
r"""RL from a learned reward: Bradley-Terry reward model, then GRPO scored by it.

  python -m experiments.preference.reward_model
  python -m experiments.preference.reward_model \
      --config=experiments/preference/reward_model.py:smoke --workdir=/tmp/rm

Phase 1 (Ouyang et al. 2022, sec. 3.5; `losses.preference.bradley_terry`): a reward model (a
tiny transformer with a scalar head read at the last real token, `models.heads.RewardModel`)
is trained on preference pairs for reversed-digit addition: for each prompt the chosen
completion is the correct answer and the rejected one the same answer with one digit changed
(the labeler is the exact-match verifier). Loss: -log sigmoid(r_chosen - r_rejected).

Phase 2: GRPO (the loss composition of experiments/policy/grpo.py, written out below), except that
the reward of every rollout is the reward model's score of (prompt, completion), not the
verifier's. `success` (the env's exact match) is still logged, so the table shows whether
optimizing the learned reward improves the real task or exploits the reward model.
"""
import os
import random

from absl import app
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np
import optax

from agentrl.advantages import estimators
from agentrl import checkpoint
from agentrl import configs
from agentrl import distributed
from agentrl.envs import arithmetic
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import kl
from agentrl.losses import policy as pg
from agentrl.losses import preference
from agentrl.models import heads
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types

RM_SEED_BASE = 3 * 2**30  # preference-pair prompts: disjoint from RL, SFT and held-out seeds


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  if arg.preset != "cpu":  # the reward model and its pairs use the arithmetic tokenizer
    raise configs.ConfigError(f"unknown reward_model preset {arg.preset!r}; use cpu (default) "
                              "or smoke")
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  c.loss = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.0, agg="seq-mean-token-mean")
  c.rm = dict(steps=300, batch_size=64, lr=1e-3, eval_pairs=256)
  if arg.smoke:
    c.rm.update(steps=2, batch_size=4, eval_pairs=4)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    # The preference pairs are built from reversed-addition problems.
    "task.name": configs.Key(str, choices=("arithmetic",), why="for the reward model"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "rm.steps": configs.Key(int, min=1),
    "rm.batch_size": configs.Key(int, min=1),
    "rm.lr": configs.Key(float, min=0.0),
    "rm.eval_pairs": configs.Key(int, min=1),
}


# ---------------------------------------------------------------------------------------------
# Phase 1: the reward model.
# ---------------------------------------------------------------------------------------------
def corrupt(answer: str, rng: random.Random) -> str:
  """The answer with one digit replaced by a different digit (a near miss)."""
  i = rng.randrange(len(answer))
  digit = rng.choice([d for d in "0123456789" if d != answer[i]])
  return answer[:i] + digit + answer[i + 1:]


def preference_pairs(tok, seed_base: int, n: int, digits: int, length: int):
  """(chosen, rejected) encoded batches for n prompts: correct vs one-digit-off answers."""
  problems = arithmetic.problems(seed_base, n, digits)
  rng = random.Random(seed_base)
  rejected = [dict(p, answer=corrupt(p["answer"], rng)) for p in problems]
  return (arithmetic.encode_gold(tok, problems, length),
          arithmetic.encode_gold(tok, rejected, length))


def rm_scorer(graphdef):
  """score(params, batch) -> reward_B of the reward model, at each row's last real token."""

  def score(params, batch):
    return nnx.merge(graphdef, params)(batch["tokens_BT"], batch["positions_BT"],
                                       batch["input_mask_BT"])

  return score


def make_rm_update_step(graphdef, tx):
  """The reward model's Bradley-Terry update: update_step(state, (chosen, rejected))."""
  score = rm_scorer(graphdef)

  def loss_fn(params, pair):
    loss_B, metrics = preference.bradley_terry(score(params, pair[0]), score(params, pair[1]))
    loss = loss_B.mean()
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def train_reward_model(config, workdir, mesh, tok):
  """Phase 1, cached in <workdir>/reward_model: returns (graphdef, params, info)."""
  rc, digits = config.rm, config.task.digits
  length = arithmetic.gold_length(tok, digits)
  cfg = recipe.model_config(config.model, tok.vocab_size)
  graphdef, params = sharding.create_sharded(
      lambda: heads.RewardModel(cfg, rngs=nnx.Rngs(config.seed + 1)), mesh,
      config.sharding_rules)
  ckpt = checkpoint.Checkpointer(os.path.join(workdir, "reward_model"), save_every=1, keep=1,
                                 async_save=False)
  if ckpt.latest_step() is not None:
    tree, info = ckpt.restore({"params": params})
    ckpt.close()
    return graphdef, tree["params"], info
  tx = optax.adam(rc.lr)
  state, shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)
  update_step = jax.jit(make_rm_update_step(graphdef, tx), donate_argnames="state",
                        out_shardings=(shardings, None))
  rows = sharding.batch_sharding(mesh)
  for step in range(rc.steps):
    pair = preference_pairs(tok, RM_SEED_BASE + step * rc.batch_size, rc.batch_size, digits,
                            length)
    state, metrics = update_step(state, jax.device_put(pair, rows))
  chosen, rejected = jax.device_put(
      preference_pairs(tok, recipe.EVAL_SEED_BASE, rc.eval_pairs, digits, length), rows)
  score = jax.jit(rm_scorer(graphdef))
  accuracy = jax.device_get((score(state.params, chosen) > score(state.params, rejected)).mean())
  info = {"steps": rc.steps, "train_loss": float(jax.device_get(metrics["loss"])),
          "held_out_pair_accuracy": float(accuracy)}
  print(f"reward model: {info}", flush=True)
  ckpt.save(rc.steps, {"params": state.params}, info, force=True)
  ckpt.close()
  return graphdef, state.params, info


# ---------------------------------------------------------------------------------------------
# Phase 2: GRPO on the reward model's scores. The loss composition is GRPO's.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    kl_BT = kl.kl_penalty(logp_BT, batch.ref_logp_BT, "k3")
    loss = aggregation.aggregate(pg_BT + lc.kl_coef * kl_BT, mask_BT, lc.agg)
    # The KL term as the loss sees it (current policy vs reference); `kl` is the score step's.
    metrics |= {"loss": loss, "kl_loss": aggregation.aggregate(kl_BT, mask_BT, "token-mean")}
    return loss, metrics

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """GRPO's group-normalized advantage of the reward model's scores."""
  return estimators.grpo_step(config.rollout.group_size)


def reward_model_rollout_fn(rollout_fn, score, rm_params):
  """`rollout_fn` with reward_B replaced by the reward model's score of each row."""

  def scored_rollout_fn(params, rng, step):
    out = rollout_fn(params, rng, step)
    reward_B = score(rm_params, {"tokens_BT": out.batch.tokens_BT,
                                 "positions_BT": out.batch.positions_BT,
                                 "input_mask_BT": out.batch.input_mask_BT})
    out.metrics["verifier_reward"] = out.metrics["reward"]
    out.metrics["reward"] = float(np.asarray(jax.device_get(reward_B)).mean())
    out.batch = out.batch.replace(reward_B=reward_B)
    return out

  return scored_rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """Phase 1 (reward model), then GRPO on its scores; returns the GRPO summary."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="reward_model")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, optimizer; then the reward model.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  rm_graphdef, rm_params, _ = train_reward_model(config, workdir, mesh, tok)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout scored by the reward model, data and held-out evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)
  rollout_fn = reward_model_rollout_fn(
      recipe.group_rollout_fn(config, engine, tok, make_env, data, mesh),
      jax.jit(rm_scorer(rm_graphdef)), rm_params)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=rollout_fn,
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="GRPO on a learned reward", start=start,
                              sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
