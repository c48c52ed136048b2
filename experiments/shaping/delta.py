# pylint: disable=invalid-name
r"""DelTA, discriminative token credit (Zhang, Wu & Lin 2026, arXiv 2605.21467).

  python -m experiments.shaping.delta
  python -m experiments.shaping.delta --config=experiments/shaping/delta.py:smoke \
      --workdir=/tmp/delta
  python -m experiments.shaping.delta --config=experiments/shaping/delta.py:smollm2

As the official code RUCBM/DelTA (`verl-DelTA/verl/workers/actor/dp_actor.py`
`compute_log_prob_h`, "Normal"; `recipe/dapo/srcs/run_DelTA.sh`); docs/algorithms.md §13.2.
The update sum_i A_i grad log p is a linear discriminator between the advantage-weighted
centroids of token-gradient vectors v_t = (1 - p_t) h_t (h_t the final hidden state that
predicts token t); tokens close to both centroids (formatting) dilute it. Each token gets a
coefficient w in [0.8, 1.2] from its margin between the centroids (one refinement step),
rescaled to mean 1 over the batch (`selection.delta_token_weights`), and the PPO loss sees
A_i w_t: dual-clip PPO, eps 0.2 / 0.28, c = 10, token-mean, no KL (the launcher's).
w_min = w_max = 1 is GRPO.

Step order: the weights need the GRPO advantages and the rollout policy's hidden states of the
whole batch, so this advantage step takes the params and runs inside the score step, after the
log-probs, as the official code computes them in its old-log-prob pass after the advantages.
It costs one more forward of the trunk per step.
"""
from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc

from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.losses import selection
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  # run_DelTA.sh: K = 1, lam_min 0.8, lam_max 1.2, clip 0.2 / 0.28, clip_ratio_c 10.
  c.loss = dict(eps_low=0.2, eps_high=0.28, dual_clip=10.0, steps=1, w_min=0.8, w_max=1.2)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.dual_clip": configs.Key(float, min=1.000001, why="for the dual clip c > 1"),
    "loss.steps": configs.Key(int, min=0),
    "loss.w_min": configs.Key(float, min=0.0),
    "loss.w_max": configs.Key(float, min=0.0),
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


def make_advantage_fn(config, graphdef):
  """(params, scored batch) -> (batch with adv_BT = A_i w_t, metrics). Pure; run it in the
  score step, where the rollout policy's params are."""
  G, lc = config.rollout.group_size, config.loss

  def advantage_fn(params, batch: types.Batch):
    adv_B = estimators.grpo(batch.reward_B, group_size=G)
    model = nnx.merge(graphdef, params)
    h_BTD = model.hidden(batch.tokens_BT, batch.positions_BT, batch.input_mask_BT)
    h_BTD = jnp.pad(h_BTD[:, :-1], ((0, 0), (1, 0), (0, 0)))  # h at t - 1 predicts token t
    w_BT = selection.delta_token_weights(h_BTD, batch.old_logp_BT, adv_B, batch.loss_mask_BT,
                                         steps=lc.steps, w_min=lc.w_min, w_max=lc.w_max)
    adv_BT = adv_B[:, None] * w_BT  # w is 0 off the loss mask
    valid_BT = batch.loss_mask_BT > 0
    metrics = {"adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
               "groups_with_signal": estimators.group_has_variance(
                   batch.reward_B, group_size=G).astype(jnp.float32).mean(),
               "delta/weight_min": jnp.where(valid_BT, w_BT, jnp.inf).min(),
               "delta/weight_max": jnp.where(valid_BT, w_BT, -jnp.inf).max()}
    return batch.replace(adv_BT=adv_BT), metrics

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """DelTA end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  configs.require(config.loss.w_min <= config.loss.w_max,
                  f"config.loss.w_min ({config.loss.w_min}) must be <= config.loss.w_max "
                  f"({config.loss.w_max})")
  start = rundir.write_config(config, workdir, experiment="delta")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps: scoring, then DelTA's advantage step with the same params.
  policy_score = loop.make_score_step(graphdef, temperature=rc.temperature,
                                      logprob_impl=config.model.logprob_impl, with_ref=True)
  advantage_step = make_advantage_fn(config, graphdef)

  def score_step(params, ref_params, batch):
    batch, metrics = policy_score(params, ref_params, batch)
    batch, adv_metrics = advantage_step(params, batch)
    return batch, metrics | adv_metrics

  score_step = jax.jit(score_step)
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout, data and held-out evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop; the loop's advantage slot has nothing left to do.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=recipe.group_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=lambda batch, extras: (batch, {}), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="DelTA", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
