# pylint: disable=invalid-name
r"""RiskPO, mixed value-at-risk policy optimisation (Ren et al. 2025, arXiv 2510.00911).

  python -m experiments.shaping.riskpo
  python -m experiments.shaping.riskpo --config=experiments/shaping/riskpo.py:smoke \
      --workdir=/tmp/riskpo
  python -m experiments.shaping.riskpo --config=experiments/shaping/riskpo.py:smollm2

As the official code RTkenny/RiskPO (commit 65ec40c; docs/algorithms.md §13.7): consecutive
bundles of loss.bundle_size = 5 prompts; "paper" g of a bundle is the g-th response to each of
its questions, scored by the sum of their rewards; each paper's advantage is the mix of a
CVaR term below the 0.2 quantile and an RVaR term between the 0.2 and 0.8 quantiles of the
bundle's papers (w_mix 1.5), divided by their std, and is shared among the paper's responses
by "sum-mean" credit (`shaping.riskpo_advantage`, the DAPO-math launcher's settings). Loss:
verl's dual-clip PPO (eps 0.2, c = 3), token-mean, no KL.

prompts_per_step must be a multiple of bundle_size: the cpu and pod presets round theirs up
to one (65 and 260 prompts); the smoke and smollm2 presets, with 2 prompts, use one bundle
of 2.
"""
from absl import app
from flax import nnx
import jax
import ml_collections as mlc

from agentrl.advantages import estimators
from agentrl.advantages import shaping
from agentrl import configs
from agentrl import distributed
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  c.loss = dict(eps_low=0.2, eps_high=0.2, dual_clip=3.0, bundle_size=5, alpha_down=0.2,
                alpha_up=0.8, w_mix=1.5, mix_cvar=True, natural_baseline=False,
                credit="sum-mean")
  rc = c.rollout
  if rc.prompts_per_step < c.loss.bundle_size:
    c.loss.bundle_size = rc.prompts_per_step
  rc.prompts_per_step = -(-rc.prompts_per_step // c.loss.bundle_size) * c.loss.bundle_size
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.dual_clip": configs.Key(float, min=1.000001, why="for the dual clip c > 1"),
    "loss.bundle_size": configs.Key(int, min=1),
    "loss.alpha_down": configs.Key(float, min=0.0, max=1.0),
    "loss.alpha_up": configs.Key(float, min=0.0, max=1.0),
    "loss.w_mix": configs.Key(float, min=0.0),
    "loss.mix_cvar": configs.Key(bool),
    "loss.natural_baseline": configs.Key(bool),
    "loss.credit": configs.Key(str, choices=shaping.RISKPO_CREDITS),
}


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high,
                                 dual_clip=lc.dual_clip)
    loss = aggregation.aggregate(pg_BT, mask_BT, "token-mean")
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT, metrics): RiskPO's bundled mixed-VaR advantage."""
  G, lc = config.rollout.group_size, config.loss

  def advantage_fn(batch: types.Batch, extras):
    del extras
    adv_B = shaping.riskpo_advantage(
        batch.reward_B, group_size=G, bundle_size=lc.bundle_size, alpha_down=lc.alpha_down,
        alpha_up=lc.alpha_up, w_mix=lc.w_mix, mix_cvar=lc.mix_cvar,
        natural_baseline=lc.natural_baseline, credit=lc.credit)
    adv_BT = estimators.broadcast_to_tokens(adv_B, batch.loss_mask_BT)
    return batch.replace(adv_BT=adv_BT), {
        "adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT)}

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """RiskPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  lc, rc = config.loss, config.rollout
  configs.divides("loss.bundle_size", lc.bundle_size, "rollout.prompts_per_step",
                  rc.prompts_per_step)
  configs.require(lc.alpha_down < lc.alpha_up,
                  f"config.loss.alpha_down ({lc.alpha_down}) must be < config.loss.alpha_up "
                  f"({lc.alpha_up})")
  start = rundir.write_config(config, workdir, experiment="riskpo")
  mesh = sharding.make_mesh(config.mesh)
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
  return rundir.write_summary(workdir, result, name="RiskPO", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
