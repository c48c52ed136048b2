# pylint: disable=invalid-name
r"""PPO with a learned critic and GAE (Schulman et al. 2017; Ouyang et al. 2022 for LLMs).

  python -m experiments.policy.ppo                                    # default CPU run
  python -m experiments.policy.ppo --config=experiments/policy/ppo.py:smoke --workdir=/tmp/ppo
  python -m experiments.policy.ppo --config=experiments/policy/ppo.py:smollm2 \
      --workdir=runs/ppo_smollm2

docs/algorithms.md §4.1-§4.2, as verl:
  * token rewards R_t = score * 1[t = last policy token] - beta * kl_k1(pi_old || pi_ref)_t;
  * a value head V on the policy's own hidden states, read at the position that predicts
    token t (so V_t sees tokens < t, like log pi_t). Its input is stop-gradiented: critic
    updates never move the policy; the head starts at 0;
  * GAE over policy tokens (gamma, lambda), returns = A + V, advantages whitened over the batch;
  * loss = PPO clipped surrogate (token-mean) + vf_coef * clipped value loss (token-mean),
    with separate Adam learning rates (and global-norm clipping) for policy and critic.

Presets are agentrl.harness.rl_config's (cpu by default, smollm2, pod; add smoke for a
CI-sized run). No group baseline is used, so rollout.group_size may be 1.

This file is the fork unit: the config, the loss composition, the advantage step and the
loop are all here; the building blocks come from agentrl.harness.recipe and agentrl.train.loop. It
differs from experiments/policy/grpo.py where the critic enters: the params are {"policy", "value"}
(the checkpoint's params["policy"] is what experiments/eval.py reads), scoring adds values, the
optimizer has one group per part, and rollout and evaluation read params["policy"].
"""
from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import optax

from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import kl
from agentrl.losses import policy as pg
from agentrl.losses import value as value_lib
from agentrl.models import heads
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  # kl_coef is beta of the k1 KL penalty folded into the token rewards; value_clip bounds the
  # value prediction's move from its rollout-time value; value_lr is the critic's Adam lr.
  c.loss = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.001, gamma=1.0, lam=0.95, vf_coef=0.5,
                value_clip=0.5, value_lr=1e-3)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    # The critic is the baseline: no group is needed, so one sample per prompt is allowed.
    "rollout.group_size": configs.Key(int, min=1),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.gamma": configs.Key(float, min=0.0, max=1.0),
    "loss.lam": configs.Key(float, min=0.0, max=1.0),
    "loss.vf_coef": configs.Key(float, min=0.0),
    "loss.value_clip": configs.Key(float, min=0.0),
    "loss.value_lr": configs.Key(float, min=0.0),
}


# ---------------------------------------------------------------------------------------------
# The critic, the loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def _values(policy, head, batch: types.Batch) -> jax.Array:
  """V_t from the hidden state at t - 1 (the one that predicts token t); column 0 is 0."""
  h_BTD = jax.lax.stop_gradient(policy.hidden(batch.tokens_BT, batch.positions_BT,
                                              batch.input_mask_BT))
  return jnp.pad(head(h_BTD)[:, :-1], ((0, 0), (1, 0)))


def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics); graphdef = (policy, value head).

  Pure; jit it in train(). `grad_norm` is the policy's gradient norm, `value_grad_norm` the
  critic's (each part is clipped by its own norm in `make_optimizer`).
  """
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature
  policy_def, head_def = graphdef

  def loss_fn(params, batch: types.Batch):
    policy, head = nnx.merge(policy_def, params["policy"]), nnx.merge(head_def, params["value"])
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    vf_BT, vf_metrics = value_lib.clipped_value_loss(_values(policy, head, batch), batch.value_BT,
                                                     batch.ret_BT, mask_BT,
                                                     clip_range=lc.value_clip)
    pg_loss = aggregation.aggregate(pg_BT, mask_BT, "token-mean")
    vf_loss = aggregation.aggregate(vf_BT, mask_BT, "token-mean")
    loss = pg_loss + lc.vf_coef * vf_loss
    return loss, metrics | vf_metrics | {"loss": loss, "pg_loss": pg_loss, "vf_loss": vf_loss}

  def update_step(state: types.TrainState, batch: types.Batch):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    state, _ = loop.apply_gradients(state, grads, tx)  # its grad_norm mixes both parts
    return state, metrics | {"grad_norm": optax.tree.norm(grads["policy"]),
                             "value_grad_norm": optax.tree.norm(grads["value"])}

  return update_step


def make_advantage_fn(config):
  """(batch, extras) -> batch with adv_BT (GAE, whitened) and ret_BT; KL in the reward."""
  lc = config.loss

  def advantage_fn(batch: types.Batch, extras):
    del extras
    mask_BT = batch.loss_mask_BT
    reward_BT, kl_metrics = kl.kl_in_reward(batch.reward_B, batch.old_logp_BT, batch.ref_logp_BT,
                                            mask_BT, beta=lc.kl_coef, kind="k1")
    adv_BT, ret_BT = estimators.gae(reward_BT, batch.value_BT, mask_BT, gamma=lc.gamma,
                                    lam=lc.lam)
    adv_BT = aggregation.masked_whiten(adv_BT, mask_BT)
    metrics = {"kl_in_reward": kl_metrics["kl_in_reward"],
               "adv_abs_mean": estimators.adv_abs_mean(adv_BT, mask_BT),
               "value_mean": aggregation.masked_mean(batch.value_BT, mask_BT),
               "ret_mean": aggregation.masked_mean(ret_BT, mask_BT)}
    return batch.replace(adv_BT=adv_BT, ret_BT=ret_BT), metrics

  return advantage_fn


def make_optimizer(config) -> optax.GradientTransformation:
  """Adam per parameter group: the policy at optim.lr, the critic at loss.value_lr.

  Each group is `recipe.make_optimizer` (its own global-norm clipping, the same warmup).
  """
  return optax.multi_transform(
      {"policy": recipe.make_optimizer(config.optim),
       "value": recipe.make_optimizer(config.optim, lr=config.loss.value_lr)},
      {"policy": "policy", "value": "value"})  # a prefix of the params {"policy", "value"}


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """PPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="ppo")
  rc, rules, mesh = config.rollout, config.sharding_rules, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, critic head, optimizer.
  tok, policy_def, policy_params = recipe.build_policy(config, mesh)
  policy_params, sft_info = recipe.warm_start(config, workdir, mesh, policy_def, policy_params,
                                              tok)
  ref_params = recipe.reference_params(policy_params)  # None: LoRA's base
  width = nnx.merge(policy_def, policy_params).cfg.width
  head_def, head_params = sharding.create_sharded(lambda: heads.ValueHead(width), mesh, rules)
  tx = make_optimizer(config)
  state, state_shardings = sharding.create_train_state(
      {"policy": policy_params, "value": head_params}, tx, mesh, rules)

  # ---- Jitted steps: scoring adds the critic's values to the policy's log-probs.
  policy_score = loop.make_score_step(policy_def, temperature=rc.temperature,
                                      logprob_impl=config.model.logprob_impl, with_ref=True)

  def score_step(params, ref_params, batch):
    batch, metrics = policy_score(params["policy"], ref_params, batch)
    policy, head = nnx.merge(policy_def, params["policy"]), nnx.merge(head_def, params["value"])
    return batch.replace(value_BT=_values(policy, head, batch)), metrics

  score_step = jax.jit(score_step)
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, (policy_def, head_def), tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout, data and held-out evaluation: they read the policy half of the params.
  engine = recipe.rollout_engine(config, policy_def, tok)
  data = recipe.prompt_stream(make_env)
  rollout = recipe.group_rollout_fn(config, engine, tok, make_env, data, mesh)
  evaluate = recipe.evaluator(config, engine, tok, make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=lambda params, rng, step: rollout(params["policy"], rng, step),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=lambda params: evaluate(params["policy"]), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="PPO", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
