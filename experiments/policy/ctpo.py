# pylint: disable=invalid-name
r"""CTPO, Cumulative Token Policy Optimization (arXiv 2605.07331): the CTPO-LA default.

  python -m experiments.policy.ctpo
  python -m experiments.policy.ctpo --config=experiments/policy/ctpo.py:smoke --workdir=/tmp/ctpo

PPO on the cumulative-token ratio rho_t = prod_{s<=t} r_s over policy tokens (value of the
prefix product, gradient rho_t grad log pi_t only), clipped in log space with bounds that grow
with the policy-token position n_t: [-a_lo n_t^kappa, a_hi n_t^kappa], dual clip at
exp(a_c n_t^kappa) for A < 0 (docs/algorithms.md §1.2). Released defaults (§1.3): a_lo = 0.025,
a_hi = 0.05, a_c = 0.05, kappa = 0.5 (set explicitly: the dataclass default is 0), GRPO
advantages, no KL, token-mean, and sequence-level truncated importance sampling against the
sampler's log-probs with threshold 5 (§4.12).
"""
from absl import app
from flax import nnx
import jax
import ml_collections as mlc

from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.losses import ratios
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  c.loss = dict(a_lo=0.025, a_hi=0.05, a_c=0.05, kappa=0.5, tis_threshold=5.0)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
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

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """GRPO advantages (group mean/std), broadcast to response tokens."""
  return estimators.grpo_step(config.rollout.group_size)


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """CTPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="ctpo")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout, data and held-out evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=recipe.group_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="CTPO", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
