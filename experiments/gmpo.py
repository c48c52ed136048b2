# pylint: disable=invalid-name
r"""GMPO, Geometric-Mean Policy Optimization (Zhao et al. 2025, arXiv 2507.20673).

  python -m experiments.gmpo
  python -m experiments.gmpo --config=experiments/gmpo.py:smoke --workdir=/tmp/gmpo

The sequence objective uses the geometric mean of the token ratios, each clipped in log space
to [-eps_low, eps_high] and picked pessimistically by the sign of A (min for A > 0, max for
A < 0): L_i = -A_i exp(mean_t l_t), averaged over sequences (algorithms.md §4.7; verl
`geo_mean`, eps = 0.4 as in its example script). GRPO advantages, no KL.
Everything else (warm start, rollout, scoring, loop, summary) is experiments/grpo.py.
"""
from absl import app
from absl import flags
from flax import nnx
import jax.numpy as jnp
import ml_collections as mlc
from ml_collections import config_flags

from agentrl import configs
from agentrl import sharding
from agentrl import types
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from experiments import grpo


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  c = grpo.get_config(arg)
  c.loss = dict(eps_low=0.4, eps_high=0.4)
  return c


LOSS_SCHEMA = {
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
}


def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    loss_B, metrics = pg.gmpo(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                              eps_low=lc.eps_low, eps_high=lc.eps_high)
    valid_B = (mask_BT.sum(-1) > 0).astype(jnp.float32)
    loss = aggregation.aggregate(loss_B, valid_B, "seq-mean")
    return loss, metrics | {"loss": loss}

  return grpo.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """GRPO advantages (group mean/std), one per sequence."""
  return grpo.group_advantage_fn(config.rollout.group_size)


METHOD = grpo.Method("GMPO", LOSS_SCHEMA, make_update_step, make_advantage_fn)


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  return grpo.run(config, workdir, METHOD)


def main(argv):
  del argv
  sharding.initialize_distributed()  # no-op unless launched multi-process
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", __file__, lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", "runs/gmpo", "Output directory.")
  app.run(main)
