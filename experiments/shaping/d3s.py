# pylint: disable=invalid-name
r"""D3S, dynamic dual-level down-sampling (Wang et al. 2025, arXiv 2509.22115): GRPO on a subset.

  python -m experiments.shaping.d3s
  python -m experiments.shaping.d3s --config=experiments/shaping/d3s.py:smoke --workdir=/tmp/d3s
  python -m experiments.shaping.d3s --config=experiments/shaping/d3s.py:smollm2

docs/algorithms.md §13.1 (the paper's code is not public; every choice below that the
abstract does not fix is [INF] and a config key). Each step:
  * sample level: per group, the loss.keep_samples rollouts whose GRPO advantages have the
    largest variance (`selection.max_variance_subset`, exact; for 0/1 rewards it balances
    correct and incorrect rollouts); the other rows get loss mask 0. The kept rows keep the
    advantage computed on the whole group [INF]; keep_samples = G / 2 (at least 2) [INF];
  * token level: of the kept tokens, the top rho by |A_t| H_t survive
    (`selection.d3s_token_mask`, ranked over the batch, loss.scope [INF]), H_t the entropy of
    pi_old at the position that sampled token t, kept in the batch by the score step;
  * curriculum: rho goes from loss.keep_start (aggressive) to loss.keep_end (relaxed) over the
    run's total_steps (`selection.d3s_keep_ratio`, linear by default) [INF: 0.5 -> 1];
then GRPO's PPO clip (eps 0.2) with token-mean over the tokens that survive.
"""
from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

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
  c.loss = dict(eps_low=0.2, eps_high=0.2, keep_samples=max(2, c.rollout.group_size // 2),
                keep_start=0.5, keep_end=1.0, keep_schedule="linear", scope="batch")
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.keep_samples": configs.Key(int, min=2, why="for a variance to maximise"),
    "loss.keep_start": configs.Key(float, min=1e-6, max=1.0),
    "loss.keep_end": configs.Key(float, min=1e-6, max=1.0),
    "loss.keep_schedule": configs.Key(str, choices=("linear", "sin", "constant")),
    "loss.scope": configs.Key(str, choices=selection.SCOPES),
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
    mask_BT = batch.loss_mask_BT  # the advantage step's selection
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    loss = aggregation.aggregate(pg_BT, mask_BT, "token-mean")
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT and the selected loss mask, metrics).

  extras["step"] is the RL step (1-based), the clock of the keep-ratio curriculum.
  """
  G, lc = config.rollout.group_size, config.loss

  def advantage_fn(batch: types.Batch, extras):
    adv_B = estimators.grpo(batch.reward_B, group_size=G)
    keep_B = selection.max_variance_subset(adv_B, group_size=G, k=lc.keep_samples)
    rows_BT = batch.loss_mask_BT * keep_B[:, None]
    keep_ratio = selection.d3s_keep_ratio(extras["step"] - 1, start=lc.keep_start,
                                          end=lc.keep_end, total_steps=config.total_steps,
                                          schedule=lc.keep_schedule)
    mask_BT = selection.d3s_token_mask(adv_B[:, None], batch.entropy_BT, rows_BT,
                                       keep_ratio=keep_ratio, scope=lc.scope)
    adv_BT = estimators.broadcast_to_tokens(adv_B, mask_BT)
    metrics = {"adv_abs_mean": estimators.adv_abs_mean(adv_BT, mask_BT),
               "groups_with_signal": estimators.group_has_variance(
                   batch.reward_B, group_size=G).astype(jnp.float32).mean(),
               "d3s/keep_ratio": keep_ratio,
               "d3s/token_frac": mask_BT.sum() / jnp.maximum(batch.loss_mask_BT.sum(), 1.0)}
    return batch.replace(adv_BT=adv_BT, loss_mask_BT=mask_BT), metrics

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """D3S end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  configs.require(config.loss.keep_samples <= config.rollout.group_size,
                  f"config.loss.keep_samples ({config.loss.keep_samples}) must be <= "
                  f"config.rollout.group_size ({config.rollout.group_size})")
  start = rundir.write_config(config, workdir, experiment="d3s")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps: scoring keeps pi_old's per-token entropy for the token selection.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout (with the step number for the curriculum), data and held-out evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)
  rollout = recipe.group_rollout_fn(config, engine, tok, make_env, data, mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def rollout_fn(params, rng, step):
    out = rollout(params, rng, step)
    out.extras["step"] = jax.device_put(np.int32(step), replicated)
    return out

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=rollout_fn,
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="D3S", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
