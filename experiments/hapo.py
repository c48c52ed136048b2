# pylint: disable=invalid-name
r"""HAPO, Heterogeneous Adaptive Policy Optimization (Liu et al. 2025, arXiv 2509.16591).

  python -m experiments.hapo
  python -m experiments.hapo --config=experiments/hapo.py:smoke --workdir=/tmp/hapo
  python -m experiments.hapo --config=experiments/hapo.py:smollm2

The entropy-aware HAPO (not the length-reward HAPO of arXiv 2505.11225), as the official code
starriver030515/HAPO (`verl/trainer/ppo/core_algos.py`, `recipe/*.sh`, commit 7671dde);
docs/algorithms.md §13.3:
  * advantage: the token-level group average (`shaping.hapo_group_token_advantage`): each
    response token carries its score and the group is normalised over tokens, with a fallback
    to GRPO's advantage when any |A| reaches 5 (adv_estimator=hapo);
  * loss: `trust_region.hapo_ppo`, dual-clip PPO (eps 0.2 / 0.2, c = 10) whose clip window and
    advantage move with the normalised entropy ĥ of each token (entropy pivot 0.8, clip_alpha
    = adv_beta = 1), token-mean, no KL. ĥ comes from the entropy of the policy being updated,
    recomputed in the loss and detached, over the minibatch, as the reference computes it
    per micro-batch in `compute_policy_loss`. loss.signed=True is the [INF] sign fix of ĥ.
Not ported: the adaptive sampling temperature (inside vLLM's sampler), and the DAPO dynamic
sampling and overlong shaping the launchers also turn on (experiments/dapo.py has them).
"""
from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc

from agentrl import advantages
from agentrl import cli
from agentrl import configs
from agentrl import distributed
from agentrl import loop
from agentrl import recipe
from agentrl import rundir
from agentrl import shaping
from agentrl import sharding
from agentrl import types
from agentrl.losses import aggregation
from agentrl.losses import trust_region
from agentrl.models import policy as policy_lib


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = recipe.rl_config(arg.preset, smoke=arg.smoke)
  # The launchers' values (recipe/qwen3_8b.sh and the others).
  c.loss = dict(eps_low=0.2, eps_high=0.2, dual_clip=10.0, pivot=0.8, clip_alpha=1.0,
                adv_beta=1.0, signed=False, fallback_threshold=5.0)
  return c


SCHEMA = {
    **recipe.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.dual_clip": configs.Key(float, min=1.000001, why="for the dual clip c > 1"),
    "loss.pivot": configs.Key(float, min=0.0, max=1.0),
    "loss.clip_alpha": configs.Key(float, min=0.0),
    "loss.adv_beta": configs.Key(float, min=0.0),
    "loss.signed": configs.Key(bool),
    "loss.fallback_threshold": configs.Key(float, min=0.0),
}


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT, entropy_BT = policy_lib.token_logprobs(
        policy, batch.tokens_BT, batch.positions_BT, batch.input_mask_BT,
        temperature=temperature, return_entropy=True, impl=impl)
    mask_BT = batch.loss_mask_BT
    loss_BT, metrics = trust_region.hapo_ppo(
        logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT, entropy_BT=entropy_BT,
        eps_low=lc.eps_low, eps_high=lc.eps_high, dual_clip=lc.dual_clip, pivot=lc.pivot,
        clip_alpha=lc.clip_alpha, adv_beta=lc.adv_beta, signed=lc.signed)
    loss = aggregation.aggregate(loss_BT, mask_BT, "token-mean")
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT, metrics): HAPO's token-level group average."""
  G, lc = config.rollout.group_size, config.loss

  def advantage_fn(batch: types.Batch, extras):
    del extras
    adv_B = shaping.hapo_group_token_advantage(batch.reward_B, batch.loss_mask_BT, group_size=G,
                                               fallback_threshold=lc.fallback_threshold)
    adv_BT = advantages.broadcast_to_tokens(adv_B, batch.loss_mask_BT)
    live_B = advantages.group_has_variance(batch.reward_B, group_size=G)
    metrics = {"adv_abs_mean": advantages.adv_abs_mean(adv_BT, batch.loss_mask_BT),
               "groups_with_signal": live_B.astype(jnp.float32).mean()}
    return batch.replace(adv_BT=adv_BT), metrics

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """HAPO end to end; returns the summary written to <workdir>/summary.json."""
  recipe.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir)
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
  return rundir.write_summary(workdir, result, name="HAPO", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
