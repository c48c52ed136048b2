# pylint: disable=invalid-name
r"""PPO with a learned critic and GAE (Schulman et al. 2017; Ouyang et al. 2022 for LLMs).

  python -m experiments.ppo
  python -m experiments.ppo --config=experiments/ppo.py:smoke --workdir=/tmp/ppo

algorithms.md §4.1-§4.2, as verl:
  * token rewards R_t = score * 1[t = last policy token] - beta * kl_k1(pi_old || pi_ref)_t;
  * a value head V on the policy's own hidden states, read at the position that predicts
    token t (so V_t sees tokens < t, like log pi_t). Its input is stop-gradiented: critic
    updates never move the policy; the head starts at 0;
  * GAE over policy tokens (gamma, lambda), returns = A + V, advantages whitened over the batch;
  * loss = PPO clipped surrogate (token-mean) + vf_coef * clipped value loss (token-mean),
    with separate Adam learning rates for policy and critic.
The warm start, rollout, evaluation and summary are experiments/grpo.py's; the train() here
differs where the critic enters: params are {"policy", "value"}, scoring adds values.
"""
import time

from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
from ml_collections import config_flags
import optax

from agentrl import advantages
from agentrl import configs
from agentrl import loop
from agentrl import sharding
from agentrl import types
from agentrl.data import generators
from agentrl.data import stream
from agentrl.losses import aggregation
from agentrl.losses import kl
from agentrl.losses import policy as pg
from agentrl.losses import value as value_lib
from agentrl.models import heads
from agentrl.models import policy as policy_lib
from agentrl.rollout import sampler as sampler_lib
from experiments import grpo


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  c = grpo.get_config(arg)
  c.loss = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.001, gamma=1.0, lam=0.95, vf_coef=0.5,
                value_clip=0.5, value_lr=1e-3)
  return c


LOSS_SCHEMA = {
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.gamma": configs.Key(float, min=0.0, max=1.0),
    "loss.lam": configs.Key(float, min=0.0, max=1.0),
    "loss.vf_coef": configs.Key(float, min=0.0),
    "loss.value_clip": configs.Key(float, min=0.0),
    "loss.value_lr": configs.Key(float, min=0.0),
    "rollout.group_size": configs.Key(int, min=1),
}


def _values(policy, head, batch: types.Batch) -> jax.Array:
  """V_t from the hidden state at t - 1 (the one that predicts token t); column 0 is 0."""
  h_BTD = jax.lax.stop_gradient(policy.hidden(batch.tokens_BT, batch.positions_BT,
                                              batch.input_mask_BT))
  return jnp.pad(head(h_BTD)[:, :-1], ((0, 0), (1, 0)))


def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics); graphdef = (policy, value head)."""
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
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics |= {"grad_norm": optax.tree.norm(grads["policy"]),
                "value_grad_norm": optax.tree.norm(grads["value"])}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return update_step


def make_advantage_fn(config):
  """(batch, extras) -> batch with adv_BT (GAE, whitened) and ret_BT; KL in the reward."""
  lc = config.loss

  def advantage_fn(batch: types.Batch, extras):
    del extras
    mask_BT = batch.loss_mask_BT
    reward_BT, kl_metrics = kl.kl_in_reward(batch.reward_B, batch.old_logp_BT, batch.ref_logp_BT,
                                            mask_BT, beta=lc.kl_coef, kind="k1")
    adv_BT, ret_BT = advantages.gae(reward_BT, batch.value_BT, mask_BT, gamma=lc.gamma,
                                    lam=lc.lam)
    adv_BT = aggregation.masked_whiten(adv_BT, mask_BT)
    metrics = {"kl_in_reward": kl_metrics["kl"],
               "value_mean": aggregation.masked_mean(batch.value_BT, mask_BT),
               "ret_mean": aggregation.masked_mean(ret_BT, mask_BT)}
    return batch.replace(adv_BT=adv_BT, ret_BT=ret_BT), metrics

  return advantage_fn


def make_optimizer(config) -> optax.GradientTransformation:
  """Adam per parameter group: the policy at optim.lr, the critic at loss.value_lr."""
  oc = config.optim
  group = lambda lr: optax.chain(optax.clip_by_global_norm(oc.clip_norm),
                                 optax.adam(lr, b2=oc.b2))
  labels = lambda params: {k: jax.tree.map(lambda _, k=k: k, v) for k, v in params.items()}
  return optax.multi_transform({"policy": group(oc.lr), "value": group(config.loss.value_lr)},
                               labels)


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """PPO end to end; returns the summary written to <workdir>/summary.json."""
  grpo.validate(config, LOSS_SCHEMA)
  start, rc, rules = time.perf_counter(), config.rollout, config.sharding_rules
  mesh = sharding.make_mesh(config.mesh)

  # ---- Policy (warm-started), critic head, optimizer.
  tok, policy_def, policy_params = grpo.build_policy(config, mesh)
  policy_params, sft_info = grpo.warm_start_params(config, workdir, mesh, policy_def,
                                                   policy_params, tok)
  ref_params = jax.tree.map(jnp.copy, policy_params)
  width = nnx.merge(policy_def, policy_params).cfg.width
  head_def, head_params = sharding.create_sharded(lambda: heads.ValueHead(width), mesh, rules)
  tx = make_optimizer(config)
  state, state_shardings = sharding.create_train_state(
      {"policy": policy_params, "value": head_params}, tx, mesh, rules)

  # ---- Jitted steps.
  policy_score = loop.make_score_step(policy_def, temperature=rc.temperature,
                                      logprob_impl=config.model.logprob_impl, with_ref=True)

  def score_step(params, ref_params, batch):
    batch, metrics = policy_score(params["policy"], ref_params, batch)
    policy, head = nnx.merge(policy_def, params["policy"]), nnx.merge(head_def, params["value"])
    return batch.replace(value_BT=_values(policy, head, batch)), metrics

  score_step = jax.jit(score_step)
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, (policy_def, head_def), tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout and evaluation read the policy half of the params.
  sampler = sampler_lib.Sampler(policy_def, pad_id=tok.pad_id)
  make_env = grpo.make_task(config)
  data = stream.PromptStream(generators.GeneratorSource(generators.env_prompts(make_env())),
                             shuffle=False)
  rollout = grpo.default_rollout_fn(config, sampler, tok, make_env, data, mesh)

  def evaluate(params):
    return {"success": grpo.held_out_success(
        sampler, tok, make_env, params["policy"], num=config.eval.num_problems,
        max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
        chat_template=config.task.chat_template)}

  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps,
        workdir=workdir, rollout_fn=lambda params, rng, step: rollout(params["policy"], rng, step),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step,
        epochs=config.updates.epochs, num_minibatches=config.updates.minibatches, data=data,
        evaluate=evaluate, eval_every=config.eval.every, save_every=config.log.save_every,
        keep=config.log.keep, tensorboard=config.log.tensorboard)
  return grpo.write_summary(workdir, result, sft_info, time.perf_counter() - start, "PPO")


def main(argv):
  del argv
  sharding.initialize_distributed()  # no-op unless launched multi-process
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", __file__, lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", "runs/ppo", "Output directory.")
  app.run(main)
