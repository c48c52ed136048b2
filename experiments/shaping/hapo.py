# pylint: disable=invalid-name
r"""HAPO, Heterogeneous Adaptive Policy Optimization (Liu et al. 2025, arXiv 2509.16591).

  python -m experiments.shaping.hapo
  python -m experiments.shaping.hapo --config=experiments/shaping/hapo.py:smoke --workdir=/tmp/hapo
  python -m experiments.shaping.hapo --config=experiments/shaping/hapo.py:smollm2

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
  * rollout: the adaptive sampling temperature (`sampler.entropy_temperature`): each token is
    sampled at T (1 + tau h_hat), h_hat the normalised entropy of its own next-token
    distribution against the statistics of the previous update's entropies
    (`trust_region.hapo_entropy_stats`, kept in the train state so a resumed run samples as
    the uninterrupted one), tau = rollout.temperature_tau = 0.05; the first step, with no
    update yet, samples at T. [INF] where the released sampler takes its statistics from is
    not shown; rollout.temperature_signed (default on) makes low-entropy tokens cooler as the
    paper describes. As in verl, the score step recomputes the old log-probs at the plain T,
    so the ratio's denominator is the T-tempered policy, not the adapted sampler.
Not ported: the DAPO dynamic sampling and overlong shaping the launchers also turn on
(experiments/policy/dapo.py has them).
"""
from absl import app
import flax
from flax import nnx
import jax
import jax.numpy as jnp
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
from agentrl.rollout import collect
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  # The launchers' values (recipe/qwen3_8b.sh and the others).
  c.loss = dict(eps_low=0.2, eps_high=0.2, dual_clip=10.0, pivot=0.8, clip_alpha=1.0,
                adv_beta=1.0, signed=False, fallback_threshold=5.0)
  c.rollout.update(temperature_tau=0.05, temperature_signed=True)  # tau 0: plain temperature
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.dual_clip": configs.Key(float, min=1.000001, why="for the dual clip c > 1"),
    "loss.pivot": configs.Key(float, min=0.0, max=1.0),
    "loss.clip_alpha": configs.Key(float, min=0.0),
    "loss.adv_beta": configs.Key(float, min=0.0),
    "loss.signed": configs.Key(bool),
    "loss.fallback_threshold": configs.Key(float, min=0.0),
    "rollout.temperature_tau": configs.Key(float, min=0.0, max=0.5),
    "rollout.temperature_signed": configs.Key(bool),
}


@flax.struct.dataclass
class State(types.TrainState):
  # (valid, m, s, pos_max, neg_min): valid = 0 until the first update; then the last update's
  # `trust_region.hapo_entropy_stats`, which the next rollout's temperature reads.
  entropy_stats: jax.Array


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
    stats_4 = trust_region.hapo_entropy_stats(entropy_BT, mask_BT, pivot=lc.pivot)
    return loss, (metrics | {"loss": loss}, stats_4)

  def update_step(state: State, batch: types.Batch):
    (_, (metrics, stats_4)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params,
                                                                                batch)
    new_state, grad_metrics = loop.apply_gradients(state, grads, tx)
    stats_5 = jnp.concatenate([jnp.ones((1,), jnp.float32), stats_4])
    return new_state.replace(entropy_stats=stats_5), metrics | grad_metrics

  return update_step


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT, metrics): HAPO's token-level group average."""
  G, lc = config.rollout.group_size, config.loss

  def advantage_fn(batch: types.Batch, extras):
    del extras
    adv_B = shaping.hapo_group_token_advantage(batch.reward_B, batch.loss_mask_BT, group_size=G,
                                               fallback_threshold=lc.fallback_threshold)
    adv_BT = estimators.broadcast_to_tokens(adv_B, batch.loss_mask_BT)
    live_B = estimators.group_has_variance(batch.reward_B, group_size=G)
    metrics = {"adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
               "groups_with_signal": live_B.astype(jnp.float32).mean()}
    return batch.replace(adv_BT=adv_BT), metrics

  return advantage_fn


def make_rollout_fn(config, engine, tok, make_env, data, mesh):
  """rollout_fn((params, entropy_stats), rng, step): G samples for each of the next P prompts
  of `data`, at the entropy-adapted temperature once an update has set the statistics."""
  rc, tc = config.rollout, config.task

  def rollout_fn(params_and_stats, rng, step):
    del step
    params, stats_5 = params_and_stats
    stats_5 = jax.device_get(stats_5)
    adaptive = None
    if stats_5[0] > 0 and rc.temperature_tau > 0:
      adaptive = (rc.temperature_tau, float(rc.temperature_signed), *stats_5[1:])
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    return collect.env_rollout(engine, params, tok, make_env, seeds, rng=rng,
                               group_size=rc.group_size, max_turns=tc.max_turns,
                               max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
                               temperature=rc.temperature, chat_template=tc.chat_template,
                               min_len=min(rc.min_len, rc.max_len),
                               per_octave=rc.buckets_per_octave,
                               sharding=sharding.batch_sharding(mesh),
                               adaptive_temperature=adaptive)

  return rollout_fn


def init_state(config, params, tx, mesh) -> tuple[State, State]:
  """(State, its shardings): the TrainState plus unset entropy statistics (replicated)."""
  base, base_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  stats = jax.device_put(jnp.zeros((5,), jnp.float32), replicated)
  state = State(step=base.step, params=base.params, opt_state=base.opt_state,
                entropy_stats=stats)
  shardings = State(step=base_shardings.step, params=base_shardings.params,
                    opt_state=base_shardings.opt_state, entropy_stats=replicated)
  return state, shardings


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """HAPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="hapo")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = init_state(config, params, tx, mesh)

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
        rollout_fn=make_rollout_fn(config, engine, tok, make_env, data, mesh),
        rollout_input=lambda state: (state.params, state.entropy_stats),
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
