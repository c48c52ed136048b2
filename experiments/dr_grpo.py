# pylint: disable=invalid-name
r"""Dr.GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training", arXiv 2503.20783).

  python -m experiments.dr_grpo
  python -m experiments.dr_grpo --config=experiments/dr_grpo.py:smoke --workdir=/tmp/dr_grpo

GRPO with its two length/difficulty biases removed (algorithms.md §4.4):
  * advantage A_i = R_i - mean_G R, without dividing by the group std;
  * loss: each sequence's token *sum* divided by a constant, the maximum generation length
    (here rollout.max_new_tokens), averaged over sequences, instead of each sequence's mean.
No KL term (verl recipe: use_kl_loss=False). Everything else is experiments/grpo.py.
"""
from absl import app
from absl import flags
from flax import nnx
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
}


def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature
  max_new_tokens = config.rollout.max_new_tokens

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    # (1/B) sum_i sum_t L_it / L_max: a constant normalizer, so long and short answers get
    # the same per-token weight (Dr.GRPO eq. 3).
    loss = aggregation.aggregate(pg_BT, mask_BT, "seq-mean-token-sum-norm",
                                 norm=mask_BT.shape[0] * max_new_tokens)
    return loss, metrics | {"loss": loss}

  return grpo.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """A_i = R_i - mean_G R (no std), broadcast to the response tokens."""
  G = config.rollout.group_size

  def advantage_fn(batch: types.Batch, extras):
    del extras
    adv_B = advantages.grpo(batch.reward_B, group_size=G, norm_by_std=False)
    return (batch.replace(adv_BT=advantages.broadcast_to_tokens(adv_B, batch.loss_mask_BT)),
            {"adv_abs_mean": abs(adv_B).mean()})

  return advantage_fn


METHOD = grpo.Method("Dr.GRPO", LOSS_SCHEMA, make_update_step, make_advantage_fn)


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  return grpo.run(config, workdir, METHOD)


def main(argv):
  del argv
  sharding.initialize_distributed()  # no-op unless launched multi-process
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", __file__, lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", "runs/dr_grpo", "Output directory.")
  app.run(main)
