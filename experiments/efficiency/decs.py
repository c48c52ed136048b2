# pylint: disable=invalid-name
r"""DECS: decoupled token rewards against redundant reasoning (Jiang et al. 2025, 2509.25827).

  python -m experiments.efficiency.decs                                   # verbose arithmetic, CPU
  python -m experiments.efficiency.decs --config=experiments/efficiency/decs.py:smoke \
      --workdir=/tmp/decs
  python -m experiments.efficiency.decs --config.loss.beta=0.0            # beta = 0: exactly GRPO

docs/algorithms.md §12.5; code pixas/DECS `src_valid/valid_ray_trainer.py`
(`compute_grpo_proc_length_advantage_return`). Every token of a response gets the reward
s (1 + beta), s the outcome score, except the redundant span of a correct response, which gets
s + beta (1 - L / T) (L its length, T the response budget); each token position is then
z-scored over the group (`efficiency.decs`) and trained with the clipped surrogate and
aggregation of experiments/policy/grpo.py. beta = 0.1 (`length_reward_beta`).

The redundant tokens are, in DECS, the reasoning chunks after the first one that reaches the
answer, found by an LLM judge. On the verbose-answer arithmetic task (envs/verbose_arithmetic
.py: "..>9750.." + EOS, filler the reward ignores) the chunks are tokens and the answer is
reached by its last digit, so the redundant tokens are the trailing filler
(`verbose_arithmetic.trailing_filler`) [INF: the judge replaced by this exact detector].
Leading filler is not redundant by this rule (the answer is not reached yet): DECS leaves it
to the outcome reward. Presets: cpu (default), smoke. The reasoning-gym presets (smollm2, pod)
are rejected: their redundancy would need the paper's judge model.

This file is the fork unit: the config, the loss composition, the advantage step and the
loop are all here; the building blocks come from agentrl.harness.recipe and agentrl.train.loop.
"""
from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc

from agentrl.advantages import efficiency
from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
from agentrl.envs import verbose_arithmetic
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import kl
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  recipe.reject_preset("decs", arg.preset, ("cpu",),
                           "DECS's redundancy detector here is the verbose arithmetic task's; "
                           "the paper's LLM judge is not available")
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  recipe.use_verbose_task(c)
  c.loss = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.0, kl_kind="k3", agg="seq-mean-token-mean",
                beta=0.1)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "task.name": configs.Key(str, choices=("verbose_arithmetic",),
                             why="for DECS (its redundancy detector reads the filler)"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.kl_kind": configs.Key(str, choices=("k1", "k2", "k3", "abs", "k3+")),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "loss.beta": configs.Key(float, min=0.0),
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


def make_advantage_fn(config, *, filler_id: int, stop_ids):
  """(batch, extras) -> (batch with adv_BT, metrics): DECS's per-position advantage."""
  G, T = config.rollout.group_size, config.rollout.max_new_tokens

  def advantage_fn(batch: types.Batch, extras):
    del extras
    mask_BT = batch.loss_mask_BT
    score_B = recipe.is_correct(batch.reward_B).astype(jnp.float32)
    redundant_BT = verbose_arithmetic.trailing_filler(batch.tokens_BT, mask_BT,
                                                      filler_id=filler_id, stop_ids=stop_ids)
    adv_BT = efficiency.decs(score_B, redundant_BT, mask_BT, group_size=G,
                                    max_response_len=T, beta=config.loss.beta)
    correct_B = score_B > 0
    metrics = {"adv_abs_mean": estimators.adv_abs_mean(adv_BT, mask_BT),
               "groups_with_signal": estimators.group_has_variance(
                   score_B, group_size=G).astype(jnp.float32).mean(),
               "decs/redundant_frac": aggregation.masked_mean(
                   redundant_BT.astype(jnp.float32), mask_BT * correct_B[:, None])}
    return batch.replace(adv_BT=adv_BT), metrics

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """DECS end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="decs")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps; the detector needs the filler and stop ids.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))
  stop_ids = tuple(sorted({int(t) for t in tok.end_of_turn_ids} | {int(tok.eos_id)}))
  advantage_fn = make_advantage_fn(
      config, filler_id=verbose_arithmetic.single_id(tok, verbose_arithmetic.FILLER),
      stop_ids=stop_ids)

  # ---- Rollout, data and held-out evaluation (with the greedy response length).
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=recipe.group_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(advantage_fn), update_fn=update_step, data=data,
        evaluate=recipe.length_evaluator(config, engine, tok, make_env),
        **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="DECS (decoupled token rewards)",
                              start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
