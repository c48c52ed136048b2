# pylint: disable=invalid-name
r"""GSPO, Group Sequence Policy Optimization (Zheng et al. 2025, arXiv 2507.18071).

  python -m experiments.gspo
  python -m experiments.gspo --config=experiments/gspo.py:smoke --workdir=/tmp/gspo

The importance ratio is the length-normalized *sequence* ratio
s_i = exp((1/|y_i|) sum_t log(pi/pi_old)) (the geometric mean of the token ratios), clipped at
[1 - 3e-4, 1 + 4e-4] around 1, with the PPO pessimistic min and one GRPO advantage per sequence:
L_i = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high)), averaged over sequences
(algorithms.md §4.6). Windows this small only make sense for the sequence ratio. As in the
paper, each rollout batch is split into 4 minibatches, so later updates are off-policy.
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
  # Paper settings (GSPO v2 §5.1): tiny clip range on the sequence ratio, no KL.
  c.loss = dict(eps_low=3e-4, eps_high=4e-4)
  if not configs.parse_arg(arg, preset="cpu", smoke=False).smoke:
    c.updates.minibatches = 4
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
    loss_B, metrics = pg.gspo(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                              eps_low=lc.eps_low, eps_high=lc.eps_high)
    valid_B = (mask_BT.sum(-1) > 0).astype(jnp.float32)
    loss = aggregation.aggregate(loss_B, valid_B, "seq-mean")
    return loss, metrics | {"loss": loss}

  return grpo.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """GRPO advantages (group mean/std), one per sequence."""
  return grpo.group_advantage_fn(config.rollout.group_size)


METHOD = grpo.Method("GSPO", LOSS_SCHEMA, make_update_step, make_advantage_fn)


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  return grpo.run(config, workdir, METHOD)


def main(argv):
  del argv
  sharding.initialize_distributed()  # no-op unless launched multi-process
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", __file__, lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", "runs/gspo", "Output directory.")
  app.run(main)
