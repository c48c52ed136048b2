# pylint: disable=invalid-name
r"""ReMax (Li et al. 2023, arXiv 2310.10505): REINFORCE with a greedy-decoding baseline.

  python -m experiments.remax
  python -m experiments.remax --config=experiments/remax.py:smoke --workdir=/tmp/remax

For each prompt one extra response is decoded greedily (argmax) in the same sampler batch;
its reward b_i is the baseline of every sampled response to that prompt: A = R - b_i, no
critic, no std normalization (algorithms.md §4.11). The policy loss is verl's: the PPO
clipped surrogate, token-mean.
Everything else (warm start, rollout, scoring, loop, summary) is experiments/grpo.py.
"""
import functools

from absl import app
from absl import flags
from flax import nnx
import jax.numpy as jnp
import ml_collections as mlc
from ml_collections import config_flags

from agentrl import advantages
from agentrl import configs
from agentrl import sharding
from agentrl import types
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from experiments import grpo


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  c = grpo.get_config(arg)
  c.loss = dict(eps_low=0.2, eps_high=0.2)
  return c


LOSS_SCHEMA = {
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "rollout.group_size": configs.Key(int, min=1),
}


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
    loss = aggregation.aggregate(pg_BT, mask_BT, "token-mean")
    return loss, metrics | {"loss": loss}

  return grpo.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """R_i - R(greedy response to the same prompt), broadcast to response tokens."""
  del config

  def advantage_fn(batch: types.Batch, extras):
    adv_B = advantages.remax(batch.reward_B, extras["greedy_reward_B"])
    return (batch.replace(adv_BT=advantages.broadcast_to_tokens(adv_B, batch.loss_mask_BT)),
            {"adv_abs_mean": jnp.abs(adv_B).mean()})

  return advantage_fn


METHOD = grpo.Method("ReMax", LOSS_SCHEMA, make_update_step, make_advantage_fn,
                     make_rollout_fn=functools.partial(grpo.default_rollout_fn,
                                                       greedy_baseline=True))


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  return grpo.run(config, workdir, METHOD)


def main(argv):
  del argv
  sharding.initialize_distributed()  # no-op unless launched multi-process
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", __file__, lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", "runs/remax", "Output directory.")
  app.run(main)
