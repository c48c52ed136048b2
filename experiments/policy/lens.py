# pylint: disable=invalid-name
r"""Lens (Guo, Hu, Sun, Lin, arXiv 2601.21244, "Less Noise, More Voice: Reinforcement Learning
for Reasoning via Instruction Purification"): GRPO whose low-success prompts are resampled
with their most interfering prompt tokens deleted, the successful purified rows trained under
the original prompt (Calibrated Rollout Policy Optimization, CRPO).

  python -m experiments.policy.lens                                   # default CPU run
  python -m experiments.policy.lens --config=experiments/policy/lens.py:smoke --workdir=/tmp/lens
  python -m experiments.policy.lens --config=experiments/policy/lens.py:pod \
      --config.model.path=/ckpt/Qwen3-8B --workdir=gs://bucket/lens     # accelerators

Default (`cpu`): the main job's task and warm start (reversed 3-digit addition, the SFT'd tiny
transformer). Each step samples G = 8 rows per prompt under the original prompt x. A prompt
whose success rate is below `lens.tau` is purified: its task-text tokens are scored by
S_I = |log π_θ(a|s) − log π_ref(a|s)| (π_ref the warm start, held as every KL-regularised
experiment holds it), the top k = ⌈γ·n⌉ (γ = `lens.gamma`, n its task-text tokens) are
deleted, and `lens.num_purified` rows are sampled under the purified prompt x'
(agentrl/rollout/purify.py). If x' succeeds more often than x did, its successful rows replace
as many failed original rows, stored under x (agentrl/rollout/guided.py's splice) with their
sampler log-probs under x' as the behaviour policy.

Objective (docs/algorithms.md §17.4): GRPO's advantage over the reconstructed group; CRPO's
PPO clip on ρ = π_θ(y|x) / π_old(y|x_roll(y)) (x_roll = x' on transferred rows), each row
weighted by ā (original successes) or 1 − ā (transferred rows, failures left) in calibrated
groups (ā the original success rate), plus β·KL(π_θ ‖ π_ref) (`loss.kl_coef`). At step 1
π_θ = π_ref, every S_I is 0 and nothing is deleted: purification starts once the policy has
moved [INF]. On the cpu task the prompt is 8 characters, so k = 1 deletes a digit or the
operator: the machinery runs, but a purified problem is a different problem (the rewards stay
the original task's); the pod preset (Qwen3-8B on gsm_symbolic word problems) is Lens's
setting. [INF] marks the defaults the paper's text, as read, does not fix (docs/algorithms.md).

Presets: smoke (CI, seconds), cpu (default), pod (Qwen3-8B on reasoning-gym's gsm_symbolic).
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
from agentrl.losses import guided as guided_loss
from agentrl.losses import kl
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl.rollout import purify
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  # [INF] β (verl's kl_loss_coef default, k3 = its low_var_kl) and token-mean aggregation.
  c.loss = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.001, kl_kind="k3", agg="token-mean",
                norm_by_std=True)
  # gamma: the deletion ratio (the paper's range is 1-5%, higher for weaker models); tau: the
  # success rate below which a prompt is purified [INF: 0.5]; num_purified: rows sampled under
  # a purified prompt [INF: G]; success_tau: the reward a success reaches [INF: 1, binary];
  # absolute: |S_I| (the paper's score as summarised) vs the signed difference; min_score:
  # only tokens scoring above it are deleted [INF: 0, so nothing at π_θ = π_ref].
  c.lens = dict(gamma=0.05, tau=0.5, num_purified=8, success_tau=1.0, absolute=True,
                min_score=0.0)
  if arg.smoke:
    c.lens.num_purified = 2
  if arg.preset == "pod":
    c.loss.update(eps_high=0.28)
    c.lens.update(gamma=0.02, num_purified=16)   # a strong model: the low end of 1-5% [INF]
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.kl_kind": configs.Key(str, choices=kl.KINDS),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "loss.norm_by_std": configs.Key(bool),
    "lens.gamma": configs.Key(float, min=0.0, max=1.0),
    "lens.tau": configs.Key(float, min=0.0),
    "lens.num_purified": configs.Key(int, min=1),
    "lens.success_tau": configs.Key(float),
    "lens.absolute": configs.Key(bool),
    "lens.min_score": configs.Key(float, min=0.0),
}


def check(config: mlc.ConfigDict) -> None:
  """The cross-key rules SCHEMA cannot state, each a one-line ConfigError."""
  if config.updates.max_staleness:
    # The stale-row correction reads sampler_logp_BT as the behaviour policy, which on a
    # transferred row is the purified prompt's, not a stale original-prompt one.
    raise configs.ConfigError("updates.max_staleness must be 0 for Lens: transferred rows' "
                              "sampler log-probs are under another prompt; set it to 0.")


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
    loss_BT, metrics = guided_loss.crpo_loss(
        logp_BT, batch.old_logp_BT, batch.sampler_logp_BT, batch.adv_BT, mask_BT,
        batch.aux["guided_B"], batch.aux["row_weight_B"], batch.ref_logp_BT,
        eps_low=lc.eps_low, eps_high=lc.eps_high, kl_coef=lc.kl_coef, kl_kind=lc.kl_kind)
    loss = aggregation.aggregate(loss_BT, mask_BT, lc.agg)
    metrics["loss"] = loss
    return loss, metrics

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT and aux guided_B, row_weight_B; metrics)."""
  lc, G, success_tau = config.loss, config.rollout.group_size, config.lens.success_tau

  def advantage_fn(batch: types.Batch, extras):
    guided_B, reward_B = extras["guided_B"], batch.reward_B
    adv_B = estimators.grpo(reward_B, group_size=G, norm_by_std=lc.norm_by_std)
    success_B = (reward_B >= success_tau).astype(jnp.float32)
    row_weight_B = guided_loss.crpo_row_weights(success_B, guided_B, group_size=G)
    adv_BT = estimators.broadcast_to_tokens(adv_B, batch.loss_mask_BT)
    metrics = {"groups_with_signal": estimators.group_has_variance(
                   reward_B, group_size=G).astype(jnp.float32).mean(),
               "adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
               "crpo_weight_mean": row_weight_B.mean()}
    aux = {"guided_B": guided_B, "row_weight_B": row_weight_B}
    return batch.replace(adv_BT=adv_BT, aux=aux), metrics

  return advantage_fn


def lens_rollout_fn(config: mlc.ConfigDict, engine, tok, make_env, data, mesh, score_fn):
  """rollout_fn(params, rng, step): `purify.purified_rollout` over the next P prompts, the
  interference scores from `score_fn` (the score step with the reference)."""
  rc, tc, lc = config.rollout, config.task, config.lens

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    return purify.purified_rollout(
        engine, params, tok, make_env, seeds, score_fn=score_fn, gamma=lc.gamma, tau=lc.tau,
        num_purified=lc.num_purified, rng=rng, group_size=rc.group_size,
        max_turns=tc.max_turns, max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
        temperature=rc.temperature, chat_template=tc.chat_template,
        success_tau=lc.success_tau, absolute=lc.absolute, min_score=lc.min_score,
        min_len=min(rc.min_len, rc.max_len), per_octave=rc.buckets_per_octave,
        sharding=sharding.batch_sharding(mesh))

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """Lens end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  check(config)
  start = rundir.write_config(config, workdir, experiment="lens")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), the frozen reference (S_I and the KL term), optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  ref_params = recipe.reference_params(params)
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=True))
  score_fn = lambda params, batch: score_step(params, ref_params, batch)
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout, data and held-out evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=lens_rollout_fn(config, engine, tok, make_env, data, mesh, score_fn),
        score_fn=score_fn, advantage_fn=jax.jit(make_advantage_fn(config)),
        update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="Lens", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
