# pylint: disable=invalid-name
r"""GRPO with a geometrically length-discounted outcome reward (the issue's "EAPO" discount).

  python -m experiments.efficiency.eapo                                   # verbose arithmetic, CPU
  python -m experiments.efficiency.eapo --config=experiments/efficiency/eapo.py:smoke \
      --workdir=/tmp/eapo
  python -m experiments.efficiency.eapo --config=experiments/efficiency/eapo.py:smollm2 \
      --workdir=runs/eapo_smollm2

The reward of a response of L sampled tokens is gamma^L * R, R the env's correctness reward
(`length_rewards.geometric_length_discount`, docs/algorithms.md §12.3); then GRPO's group
advantage, clipped surrogate and aggregation exactly as experiments/policy/grpo.py. With gamma = 1
this is GRPO. No EAPO paper or code with this reward was available: the form follows the
discounted-RL view of Ayoub et al. (arXiv 2510.23486) and gamma has no source default [INF].
The gamma of each preset halves the reward of a response near the preset's token budget
(0.96^16 = 0.52; 0.985^48 = 0.48; 0.99966^2048 = 0.50) [INF].

Default (`cpu`): the verbose-answer arithmetic task (envs/verbose_arithmetic.py: answers
padded with filler the reward ignores, SFT demonstrations with 0-6 leading and 0-3 trailing
filler tokens), so a shorter correct answer is worth more. Presets: cpu, smoke, smollm2, pod
(the latter two on rl_config.rl_config's reasoning-gym tasks). Logs `eval/response_tokens`, the
held-out greedy response length, next to the success.

This file is the fork unit: the config, the loss composition, the advantage step and the
loop are all here; the building blocks come from agentrl.harness.recipe and agentrl.train.loop.
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
from agentrl.losses import kl
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rewards import length_rewards
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types

GAMMA = {"cpu": 0.96, "smollm2": 0.985, "pod": 0.99966}


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  if arg.preset == "cpu":
    recipe.use_verbose_task(c)
  c.loss = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.0, kl_kind="k3", agg="seq-mean-token-mean",
                norm_by_std=True, gamma=GAMMA[arg.preset])
  if arg.preset in ("smollm2", "pod"):
    c.loss.update(kl_coef=0.001, agg="token-mean")
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.kl_kind": configs.Key(str, choices=("k1", "k2", "k3", "abs", "k3+")),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "loss.norm_by_std": configs.Key(bool),
    # gamma = 1 is GRPO; 0 would zero every reward.
    "loss.gamma": configs.Key(float, min=1e-6, max=1.0),
}


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics): GRPO's loss. Pure; jit it."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    kl_BT = kl.kl_penalty(logp_BT, batch.ref_logp_BT, lc.kl_kind)
    loss = aggregation.aggregate(pg_BT + lc.kl_coef * kl_BT, mask_BT, lc.agg)
    metrics |= {"loss": loss, "kl_loss": aggregation.aggregate(kl_BT, mask_BT, "token-mean")}
    return loss, metrics

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT, metrics): GRPO of gamma^L * reward."""
  grpo_step = estimators.grpo_step(config.rollout.group_size,
                                   norm_by_std=config.loss.norm_by_std)

  def advantage_fn(batch: types.Batch, extras):
    length_B = recipe.response_length(batch.loss_mask_BT)
    reward_B = length_rewards.geometric_length_discount(batch.reward_B, length_B,
                                                        gamma=config.loss.gamma)
    batch, metrics = grpo_step(batch.replace(reward_B=reward_B), extras)
    return batch, metrics | {"eapo/discounted_reward": jnp.mean(reward_B)}

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """EAPO-discounted GRPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="eapo")
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

  # ---- Rollout, data and held-out evaluation (with the greedy response length).
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=recipe.group_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.length_evaluator(config, engine, tok, make_env),
        **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="EAPO (GRPO, gamma^L reward)", start=start,
                              sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
