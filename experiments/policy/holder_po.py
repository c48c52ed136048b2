# pylint: disable=invalid-name
r"""HölderPO, Hölder Policy Optimisation (arXiv 2605.12058).

  python -m experiments.policy.holder_po
  python -m experiments.policy.holder_po --config=experiments/policy/holder_po.py:smoke \
      --workdir=/tmp/holder_po

The sequence ratio is the Hölder power mean of the token ratios with exponent p
(p = 1 arithmetic, p = 0 geometric as GMPO/GSPO, p -> -inf the minimum), clipped at the
sequence level: L_i = max(-A_i rho_i, -A_i clip(rho_i, 1 - eps, 1 + eps)), averaged over
sequences (docs/algorithms.md §2.2). p follows a schedule over RL steps (§2.4; the maths run:
linear_dec from 2 to -2 over 500 steps); p ticks once per rollout batch, as in the reference.
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
from agentrl.losses import schedules
from agentrl.losses import sequence
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  # p_steps: the schedule's length in RL steps; 0 means the run's total_steps, read when the
  # update step is built, so --config.total_steps=N stretches the schedule with the run.
  # clip_mode: "sequence" (the paper's sequence-level clip), "token" (per-token PPO clip of
  # the power mean's terms) or "sequence_w_clip" (token log-ratios clamped to +-log(1 + eps),
  # then the sequence clip: the authors' maths learner variant).
  c.loss = dict(eps_low=0.2, eps_high=0.2, p_schedule="linear_dec", p_const=1.0, p_min=-2.0,
                p_max=2.0, p_steps=0, clip_mode="sequence")
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.p_schedule": configs.Key(str, choices=schedules.SCHEDULES),
    "loss.p_const": configs.Key(float),
    "loss.p_min": configs.Key(float),
    "loss.p_max": configs.Key(float),
    "loss.p_steps": configs.Key(int, min=0),
    "loss.clip_mode": configs.Key(str, choices=sequence.HOLDER_CLIP_MODES),
}


def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature
  updates_per_rl_step = config.updates.epochs * config.updates.minibatches
  p_steps = lc.p_steps or config.total_steps

  def loss_fn(params, batch: types.Batch, step):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    p = schedules.holder_p(step // updates_per_rl_step, schedule=lc.p_schedule,
                           p_const=lc.p_const, p_min=lc.p_min, p_max=lc.p_max,
                           schedule_steps=p_steps)
    loss_B, metrics = sequence.holder_po(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                         p=p, eps_low=lc.eps_low, eps_high=lc.eps_high,
                                         clip_mode=lc.clip_mode)
    valid_B = (mask_BT.sum(-1) > 0).astype(jnp.float32)
    loss = aggregation.aggregate(loss_B, valid_B, "seq-mean")  # metrics hold p as holder_p
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx, with_step=True)


def make_advantage_fn(config):
  """GRPO advantages (group mean/std), one per sequence."""
  return estimators.grpo_step(config.rollout.group_size)


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """HölderPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="holder_po")
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
  return rundir.write_summary(workdir, result, name="HölderPO", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
