# pylint: disable=invalid-name
r"""ETR, Elastic Trust Regions (Zhang et al. 2026, arXiv 2601.03723): GRPO with a moving clip.

  python -m experiments.shaping.etr
  python -m experiments.shaping.etr --config=experiments/shaping/etr.py:smoke --workdir=/tmp/etr
  python -m experiments.shaping.etr --config=experiments/shaping/etr.py:smollm2

docs/algorithms.md §13.4 (abstract only, no code found: a reconstruction). GRPO's advantage
and PPO surrogate, with each token's clip window scaled by signal quality
(`trust_region.etr_ppo`):
  eps_t = eps (1 + alpha |A_t|) (1 + beta 4 Var_G(R))
on both bounds: wider for high-|A| tokens (micro level) and for groups whose rewards vary
most, pass rate near 1/2 (macro level; `shaping.group_reward_variance`, carried to the loss
per row in `batch.aux`). The forms and alpha = beta = 0.5 are [INF] (no published values);
alpha = beta = 0 is GRPO. eps 0.2, token-mean, no KL.
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
from agentrl.losses import trust_region
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  c.loss = dict(eps_low=0.2, eps_high=0.2, alpha=0.5, beta=0.5)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.alpha": configs.Key(float, min=0.0),
    "loss.beta": configs.Key(float, min=0.0),
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
    loss_BT, metrics = trust_region.etr_ppo(
        logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT, group_var_B=batch.aux["group_var_B"],
        alpha=lc.alpha, beta=lc.beta, eps_low=lc.eps_low, eps_high=lc.eps_high)
    loss = aggregation.aggregate(loss_BT, mask_BT, "token-mean")
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """GRPO's advantage, plus each row's group reward variance for the loss (batch.aux)."""
  G = config.rollout.group_size
  grpo_step = estimators.grpo_step(G)

  def advantage_fn(batch: types.Batch, extras):
    batch, metrics = grpo_step(batch, extras)
    var_B = shaping.group_reward_variance(batch.reward_B, group_size=G)
    metrics["group_reward_var"] = var_B.mean()
    return batch.replace(aux={"group_var_B": var_B}), metrics

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """ETR end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="etr")
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
  return rundir.write_summary(workdir, result, name="ETR", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
