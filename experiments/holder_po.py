# pylint: disable=invalid-name
r"""HölderPO, Hölder Policy Optimisation (arXiv 2605.12058).

  python -m experiments.holder_po
  python -m experiments.holder_po --config=experiments/holder_po.py:smoke --workdir=/tmp/holder_po

The sequence ratio is the Hölder power mean of the token ratios with exponent p
(p = 1 arithmetic, p = 0 geometric as GMPO/GSPO, p -> -inf the minimum), clipped at the
sequence level: L_i = max(-A_i rho_i, -A_i clip(rho_i, 1 - eps, 1 + eps)), averaged over
sequences (algorithms.md §2.2). p follows a schedule over RL steps (§2.4; the maths run:
linear_dec from 2 to -2 over 500 steps); p ticks once per rollout batch, as in the reference.
Everything else (warm start, rollout, scoring, loop, summary) is experiments/grpo.py.
"""
from absl import app
from absl import flags
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
from ml_collections import config_flags
import optax

from agentrl import configs
from agentrl import sharding
from agentrl import types
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.losses import schedules
from agentrl.models import policy as policy_lib
from experiments import grpo


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  c = grpo.get_config(arg)
  c.loss = dict(eps_low=0.2, eps_high=0.2, p_schedule="linear_dec", p_const=1.0, p_min=-2.0,
                p_max=2.0, p_steps=c.total_steps)
  return c


LOSS_SCHEMA = {
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.p_schedule": configs.Key(str, choices=schedules.SCHEDULES),
    "loss.p_const": configs.Key(float),
    "loss.p_min": configs.Key(float),
    "loss.p_max": configs.Key(float),
    "loss.p_steps": configs.Key(int, min=1),
}


def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature
  updates_per_rl_step = config.updates.epochs * config.updates.minibatches

  def loss_fn(params, batch: types.Batch, step):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    p = schedules.holder_p(step // updates_per_rl_step, schedule=lc.p_schedule,
                           p_const=lc.p_const, p_min=lc.p_min, p_max=lc.p_max,
                           schedule_steps=lc.p_steps)
    loss_B, metrics = pg.holder_po(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT, p=p,
                                   eps_low=lc.eps_low, eps_high=lc.eps_high)
    valid_B = (mask_BT.sum(-1) > 0).astype(jnp.float32)
    loss = aggregation.aggregate(loss_B, valid_B, "seq-mean")
    metrics["holder_p"] = p
    return loss, metrics | {"loss": loss}

  def update_step(state: types.TrainState, batch: types.Batch):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch,
                                                                    state.step)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics |= {"grad_norm": optax.tree.norm(grads)}
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  return update_step


def make_advantage_fn(config):
  """GRPO advantages (group mean/std), one per sequence."""
  return grpo.group_advantage_fn(config.rollout.group_size)


METHOD = grpo.Method("HölderPO", LOSS_SCHEMA, make_update_step, make_advantage_fn)


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  return grpo.run(config, workdir, METHOD)


def main(argv):
  del argv
  sharding.initialize_distributed()  # no-op unless launched multi-process
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", __file__, lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", "runs/holder_po", "Output directory.")
  app.run(main)
