# pylint: disable=invalid-name
r"""T-PPO: PPO whose responses are cut by a generation window (Fan et al. 2025, 2506.15050).

  python -m experiments.efficiency.tppo                                   # verbose arithmetic, CPU
  python -m experiments.efficiency.tppo --config=experiments/efficiency/tppo.py:smoke \
      --workdir=/tmp/tppo
  python -m experiments.efficiency.tppo --config=experiments/efficiency/tppo.py:smollm2 \
      --workdir=runs/tppo_smollm2

docs/algorithms.md §12.6 (no official code was found: the extended GAE's exact form is
[INF]). The policy is trained on the first `loss.window` sampled tokens of each response. A
response longer than the window is unfinished: its outcome reward is not used, and its last
kept token bootstraps from the critic's value at the truncation point, delta = r + gamma
V(s_trunc) - V (`efficiency.truncated_gae`); finished responses get PPO's GAE. The
critic is trained on finished responses only. Everything else is experiments/policy/ppo.py: k1 KL
in the token rewards, whitened advantages, clipped surrogate plus clipped value loss, separate
Adam learning rates for policy and critic.

The window is applied to full sampled responses: tokens past it stay in the sequence with loss
mask 0, and causal attention makes the kept tokens' log-probs and values exactly those of a
generation stopped at the window, so this trains on what a windowed generator would give
(and the rollout, its metrics and the held-out evaluation keep the full response budget).

Presets: cpu (default: the verbose-answer arithmetic task, envs/verbose_arithmetic.py, whose
SFT responses span 6..15 tokens; window 12 cuts about a fifth of them), smoke, smollm2 (window
32 of 48), pod (window 1024 of 2048).

This file is the fork unit: the config, the loss composition, the advantage step and the
loop are all here; the building blocks come from agentrl.harness.recipe and agentrl.train.loop. It
differs from experiments/policy/ppo.py in the advantage step (the window, the bootstrap, the
critic's mask).
"""
import dataclasses

from absl import app
import flax
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import optax

from agentrl.advantages import efficiency
from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import kl
from agentrl.losses import policy as pg
from agentrl.losses import value as value_lib
from agentrl.models import heads
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types

WINDOW = {"cpu": 12, "smollm2": 32, "pod": 1024}


@flax.struct.dataclass
class Batch(types.Batch):
  value_mask_BT: jax.Array | None = None   # float32: where the critic trains (finished rows)


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  if arg.preset == "cpu":
    recipe.use_verbose_task(c)
  # As experiments/policy/ppo.py, plus the generation window (in sampled tokens).
  c.loss = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.001, gamma=1.0, lam=0.95, vf_coef=0.5,
                value_clip=0.5, value_lr=1e-3, window=4 if arg.smoke else WINDOW[arg.preset])
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "rollout.group_size": configs.Key(int, min=1),   # the critic is the baseline
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.gamma": configs.Key(float, min=0.0, max=1.0),
    "loss.lam": configs.Key(float, min=0.0, max=1.0),
    "loss.vf_coef": configs.Key(float, min=0.0),
    "loss.value_clip": configs.Key(float, min=0.0),
    "loss.value_lr": configs.Key(float, min=0.0),
    "loss.window": configs.Key(int, min=1),
}


# ---------------------------------------------------------------------------------------------
# The critic, the loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def _values(policy, head, batch: types.Batch) -> jax.Array:
  """V_t from the hidden state at t - 1 (the one that predicts token t); column 0 is 0."""
  h_BTD = jax.lax.stop_gradient(policy.hidden(batch.tokens_BT, batch.positions_BT,
                                              batch.input_mask_BT))
  return jnp.pad(head(h_BTD)[:, :-1], ((0, 0), (1, 0)))


def make_update_step(config, graphdef, tx):
  """update_step(state, batch): PPO's loss with the value loss on finished rows only."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature
  policy_def, head_def = graphdef

  def loss_fn(params, batch: Batch):
    policy, head = nnx.merge(policy_def, params["policy"]), nnx.merge(head_def, params["value"])
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT, value_mask_BT = batch.loss_mask_BT, batch.value_mask_BT
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    vf_BT, vf_metrics = value_lib.clipped_value_loss(_values(policy, head, batch), batch.value_BT,
                                                     batch.ret_BT, value_mask_BT,
                                                     clip_range=lc.value_clip)
    pg_loss = aggregation.aggregate(pg_BT, mask_BT, "token-mean")
    vf_loss = aggregation.aggregate(vf_BT, value_mask_BT, "token-mean")
    loss = pg_loss + lc.vf_coef * vf_loss
    return loss, metrics | vf_metrics | {"loss": loss, "pg_loss": pg_loss, "vf_loss": vf_loss}

  def update_step(state: types.TrainState, batch: Batch):
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, batch)
    state, _ = loop.apply_gradients(state, grads, tx)
    return state, metrics | {"grad_norm": optax.tree.norm(grads["policy"]),
                             "value_grad_norm": optax.tree.norm(grads["value"])}

  return update_step


def window_cut(loss_mask_BT: jax.Array, window: int) -> tuple[jax.Array, jax.Array, jax.Array]:
  """(kept mask [B, T], truncated [B], index of the last kept token [B]) for a window.

  A row keeps its first `window` sampled tokens; it is truncated if it sampled more.
  """
  sampled_BT = loss_mask_BT > 0
  keep_BT = sampled_BT & (jnp.cumsum(sampled_BT, axis=1) <= window)
  truncated_B = sampled_BT.sum(axis=1) > window
  T = loss_mask_BT.shape[1]
  last_B = T - 1 - jnp.argmax(keep_BT[:, ::-1], axis=1)
  return keep_BT.astype(jnp.float32), truncated_B, last_B


def make_advantage_fn(config):
  """(batch, extras) -> (Batch with the window's mask, adv_BT, ret_BT, value_mask_BT)."""
  lc = config.loss

  def advantage_fn(batch: types.Batch, extras):
    del extras
    keep_BT, truncated_B, last_B = window_cut(batch.loss_mask_BT, lc.window)
    # value_BT[:, t] is V of the state before token t: V(s_trunc) sits one past the last kept
    # token, a real token of a truncated row (it sampled more), so always inside the batch.
    T = keep_BT.shape[1]
    bootstrap_B = jnp.take_along_axis(batch.value_BT, jnp.minimum(last_B + 1, T - 1)[:, None],
                                      axis=1)[:, 0]
    score_B = jnp.where(truncated_B, 0.0, batch.reward_B)   # an unfinished answer is not judged
    reward_BT, kl_metrics = kl.kl_in_reward(score_B, batch.old_logp_BT, batch.ref_logp_BT,
                                            keep_BT, beta=lc.kl_coef, kind="k1")
    adv_BT, ret_BT, value_mask_BT = efficiency.truncated_gae(
        reward_BT, batch.value_BT, keep_BT, truncated_B, bootstrap_B, gamma=lc.gamma, lam=lc.lam)
    adv_BT = aggregation.masked_whiten(adv_BT, keep_BT)
    fields = {f.name: getattr(batch, f.name) for f in dataclasses.fields(types.Batch)}
    out = Batch(**fields, value_mask_BT=value_mask_BT).replace(
        loss_mask_BT=keep_BT, adv_BT=adv_BT, ret_BT=ret_BT)
    truncated = truncated_B.astype(jnp.float32)
    metrics = {"kl_in_reward": kl_metrics["kl_in_reward"],
               "adv_abs_mean": estimators.adv_abs_mean(adv_BT, keep_BT),
               "value_mean": aggregation.masked_mean(batch.value_BT, keep_BT),
               "ret_mean": aggregation.masked_mean(ret_BT, keep_BT),
               "tppo/truncated_frac": truncated.mean(),
               "tppo/bootstrap_value": jnp.sum(bootstrap_B * truncated)
                                       / jnp.maximum(truncated.sum(), 1.0)}
    return out, metrics

  return advantage_fn


def make_optimizer(config) -> optax.GradientTransformation:
  """Adam per parameter group: the policy at optim.lr, the critic at loss.value_lr."""
  return optax.multi_transform(
      {"policy": recipe.make_optimizer(config.optim),
       "value": recipe.make_optimizer(config.optim, lr=config.loss.value_lr)},
      {"policy": "policy", "value": "value"})


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """T-PPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="tppo")
  rc, rules, mesh = config.rollout, config.sharding_rules, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, critic head, optimizer.
  tok, policy_def, policy_params = recipe.build_policy(config, mesh)
  policy_params, sft_info = recipe.warm_start(config, workdir, mesh, policy_def, policy_params,
                                              tok)
  ref_params = recipe.reference_params(policy_params)  # None: LoRA's base
  width = nnx.merge(policy_def, policy_params).cfg.width
  head_def, head_params = sharding.create_sharded(lambda: heads.ValueHead(width), mesh, rules)
  tx = make_optimizer(config)
  state, state_shardings = sharding.create_train_state(
      {"policy": policy_params, "value": head_params}, tx, mesh, rules)

  # ---- Jitted steps: scoring adds the critic's values to the policy's log-probs.
  policy_score = loop.make_score_step(policy_def, temperature=rc.temperature,
                                      logprob_impl=config.model.logprob_impl, with_ref=True)

  def score_step(params, ref_params, batch):
    batch, metrics = policy_score(params["policy"], ref_params, batch)
    policy, head = nnx.merge(policy_def, params["policy"]), nnx.merge(head_def, params["value"])
    return batch.replace(value_BT=_values(policy, head, batch)), metrics

  score_step = jax.jit(score_step)
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, (policy_def, head_def), tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout, data and held-out evaluation: they read the policy half of the params.
  engine = recipe.rollout_engine(config, policy_def, tok)
  data = recipe.prompt_stream(make_env)
  rollout = recipe.group_rollout_fn(config, engine, tok, make_env, data, mesh)
  evaluate = recipe.length_evaluator(config, engine, tok, make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=lambda params, rng, step: rollout(params["policy"], rng, step),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=lambda params: evaluate(params["policy"]), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="T-PPO (truncated-response GAE)",
                              start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
