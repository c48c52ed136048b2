# pylint: disable=invalid-name
r"""CTPO, Cumulative Token Policy Optimization (arXiv 2605.07331): the CTPO-LA default.

  python -m experiments.ctpo
  python -m experiments.ctpo --config=experiments/ctpo.py:smoke --workdir=/tmp/ctpo

PPO on the cumulative-token ratio rho_t = prod_{s<=t} r_s over policy tokens (value of the
prefix product, gradient rho_t grad log pi_t only), clipped in log space with bounds that grow
with the policy-token position n_t: [-a_lo n_t^kappa, a_hi n_t^kappa], dual clip at
exp(a_c n_t^kappa) for A < 0 (algorithms.md §1.2). Released defaults (§1.3): a_lo = 0.025,
a_hi = 0.05, a_c = 0.05, kappa = 0.5 (set explicitly: the dataclass default is 0), GRPO
advantages, no KL, token-mean, and sequence-level truncated importance sampling against the
sampler's log-probs with threshold 5 (§4.12).
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
from agentrl.losses import policy as pg
from agentrl.losses import ratios
from agentrl.models import policy as policy_lib
from experiments import grpo


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  c = grpo.get_config(arg)
  c.loss = dict(a_lo=0.025, a_hi=0.05, a_c=0.05, kappa=0.5, tis_threshold=5.0)
  return c


LOSS_SCHEMA = {
    "loss.a_lo": configs.Key(float, min=0.0),
    "loss.a_hi": configs.Key(float, min=0.0),
    "loss.a_c": configs.Key(float, min=0.0),
    "loss.kappa": configs.Key(float),
    "loss.tis_threshold": configs.Key(float, min=1.0),
}


def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.ctpo(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                             a_lo=lc.a_lo, a_hi=lc.a_hi, a_c=lc.a_c, kappa=lc.kappa)
    # Sampler/learner mismatch correction: a detached per-sequence weight (ctpo.sh).
    w_BT = ratios.rollout_correction_weight(batch.old_logp_BT, batch.sampler_logp_BT, mask_BT,
                                            level="sequence", threshold=lc.tis_threshold)
    loss = aggregation.aggregate(pg_BT * w_BT, mask_BT, "token-mean")
    metrics["tis_weight"] = aggregation.masked_mean(w_BT, mask_BT)
    return loss, metrics | {"loss": loss}

  return grpo.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """GRPO advantages (group mean/std), broadcast to response tokens."""
  return grpo.group_advantage_fn(config.rollout.group_size)


METHOD = grpo.Method("CTPO", LOSS_SCHEMA, make_update_step, make_advantage_fn)


def train(config: mlc.ConfigDict, workdir: str) -> dict:
  return grpo.run(config, workdir, METHOD)


def main(argv):
  del argv
  sharding.initialize_distributed()  # no-op unless launched multi-process
  train(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  _CONFIG = config_flags.DEFINE_config_file("config", __file__, lock_config=True)
  _WORKDIR = flags.DEFINE_string("workdir", "runs/ctpo", "Output directory.")
  app.run(main)
