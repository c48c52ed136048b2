# pylint: disable=invalid-name
r"""CISPO, Clipped IS-weight Policy Optimization (MiniMax-M1, arXiv 2506.13585).

  python -m experiments.cispo
  python -m experiments.cispo --config=experiments/cispo.py:smoke --workdir=/tmp/cispo

L_t = -sg(clip(r_t, 1 - eps_low, 1 + eps_high)) A_t log pi(y_t): the importance weight is
clipped and detached instead of the update, so every token keeps a gradient (algorithms.md
§4.8). verl's example settings: eps_low = 10 (lower bound inactive), eps_high = 0.2, a k3 KL
to the reference of 0.001, token-mean aggregation; GRPO advantages.
Everything else (warm start, rollout, scoring, loop, summary) is experiments/grpo.py.
"""
from absl import app
from absl import flags
from flax import nnx
import ml_collections as mlc
from ml_collections import config_flags

from agentrl import configs
from agentrl import sharding
from agentrl import types
from agentrl.losses import aggregation
from agentrl.losses import kl
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from experiments import grpo


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  c = grpo.get_config(arg)
  c.loss = dict(eps_low=10.0, eps_high=0.2, kl_coef=0.001)
  return c


LOSS_SCHEMA = {
    "loss.eps_low": configs.Key(float, min=0.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
}


def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.cispo(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                              eps_low=lc.eps_low, eps_high=lc.eps_high)
    kl_BT = kl.kl_penalty(logp_BT, batch.ref_logp_BT, "k3")
    loss = aggregation.aggregate(pg_BT + lc.kl_coef * kl_BT, mask_BT, "token-mean")
    metrics["kl"] = aggregation.aggregate(kl_BT, mask_BT, "token-mean")
    return loss, metrics | {"loss": loss}

  return grpo.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """GRPO advantages (group mean/std), broadcast to response tokens."""
  return grpo.group_advantage_fn(config.rollout.group_size)


METHOD = grpo.Method("CISPO", LOSS_SCHEMA, make_update_step, make_advantage_fn)


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  return grpo.run(config, workdir, METHOD)


def main(argv):
  del argv
  sharding.initialize_distributed()  # no-op unless launched multi-process
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", __file__, lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", "runs/cispo", "Output directory.")
  app.run(main)
