# pylint: disable=invalid-name
r"""R2VPO, Ratio-Variance Regularized Policy Optimization (Luo et al. 2026, arXiv 2601.03320).

  python -m experiments.policy.r2vpo                                  # default CPU run
  python -m experiments.policy.r2vpo --config=experiments/policy/r2vpo.py:smoke --workdir=/tmp/r2vpo
  python -m experiments.policy.r2vpo --config=experiments/policy/r2vpo.py:smollm2 \
      --workdir=runs/r2vpo_smollm2

No official code or paper body was available; this is the reconstruction of docs/algorithms.md
§3.2 ([INF], provisional). Instead of clipping, the ratio's second central moment is
constrained, max E_mu[r A] s.t. E_mu[(r - 1)^2] <= delta, by primal-dual steps:
  primal  L = mean(-A r + sg(lambda) (r - 1)^2)          (agentrl.losses.policy.r2vpo)
  dual    lambda <- max(0, lambda + eta (V_hat - delta))  (policy.r2vpo_dual_update)
Advantages are GRPO's (group mean/std, agentrl.advantages.estimators.grpo_step). Off-policy reuse:
each update also trains on the previous step's batch, whose behaviour log-probs are those of the
policy that sampled it, so its ratio is r = pi_theta / mu_old and the variance penalty
re-weights it instead of discarding it; its rows are further weighted by stale_decay ** 1 (one
policy version old). delta, eta (lam_lr), the initial lambda and stale_decay are [INF] choices.
lambda and the replay batch live in the train state, so checkpoints hold them and a resumed
run continues exactly. One update per RL step (updates.epochs = updates.minibatches = 1): the
replay is the whole previous rollout batch.

Presets are agentrl.harness.rl_config's (cpu by default, smollm2, pod; add smoke for a
CI-sized run). This file is the fork unit: the config, the loss composition, the advantage step and
the loop are all here; the building blocks come from agentrl.harness.recipe and agentrl.train.loop.
"""
from absl import app
import flax
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
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types

# The Batch fields the replay keeps (and their dtypes): what the loss reads.
_REPLAY_FIELDS = {"tokens_BT": jnp.int32, "positions_BT": jnp.int32, "input_mask_BT": jnp.bool_,
                  "loss_mask_BT": jnp.float32, "adv_BT": jnp.float32, "old_logp_BT": jnp.float32}


@flax.struct.dataclass
class State(types.TrainState):
  lam: jax.Array                 # the dual variable lambda >= 0
  replay: types.Batch            # the previous step's batch (its behaviour log-probs kept)
  has_replay: jax.Array          # False until a first batch has been stored


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  # delta, lam_lr (eta), lam_init and stale_decay are not known from the paper ([INF]).
  c.loss = dict(delta=0.05, lam_init=0.1, lam_lr=1.0, stale_decay=0.5, level="token")
  c.updates.minibatches = 1  # the replay is one whole rollout batch (SCHEMA)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    # update_step stores the batch it trains on as the next update's replay, sized to one
    # whole rollout batch in init_state; a minibatch or a second epoch would break both.
    "updates.minibatches": configs.Key(
        int, min=1, max=1, why="for R2VPO (the replay pairs with the whole rollout batch)"),
    "updates.epochs": configs.Key(
        int, min=1, max=1, why="for R2VPO (each update stores its batch as the next replay)"),
    "loss.delta": configs.Key(float, min=0.0),
    "loss.lam_init": configs.Key(float, min=0.0),
    "loss.lam_lr": configs.Key(float, min=0.0),
    "loss.stale_decay": configs.Key(float, min=0.0, max=1.0),
    "loss.level": configs.Key(str, choices=("token", "sequence")),
}


# ---------------------------------------------------------------------------------------------
# The loss composition, the dual step and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """update_step(state, batch): primal step on batch + replay, then the dual step on lambda.

  Pure; jit it in train().
  """
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch, staleness_B, lam):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    loss_BT, metrics = pg.r2vpo(logp_BT, batch.old_logp_BT, batch.adv_BT, batch.loss_mask_BT,
                                lam=lam, delta=lc.delta, level=lc.level,
                                staleness_B=staleness_B, stale_decay=lc.stale_decay)
    mode = "token-mean" if lc.level == "token" else "seq-mean-token-mean"
    loss = aggregation.aggregate(loss_BT, batch.loss_mask_BT, mode)
    return loss, metrics | {"loss": loss}

  def update_step(state: State, batch: types.Batch):
    current = types.Batch(**{k: getattr(batch, k) for k in _REPLAY_FIELDS})
    # Before the first store the replay rows have mask 0: they add nothing to the loss.
    stale = state.replay.replace(loss_mask_BT=state.replay.loss_mask_BT * state.has_replay)
    both = jax.tree.map(lambda a, b: jnp.concatenate([a, b]), current, stale)
    B = current.tokens_BT.shape[0]
    staleness_B = jnp.concatenate([jnp.zeros(B), jnp.ones(B)])
    (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, both,
                                                                    staleness_B, state.lam)
    new_state, grad_metrics = loop.apply_gradients(state, grads, tx)
    lam = pg.r2vpo_dual_update(state.lam, metrics["ratio_var"], delta=lc.delta, lr=lc.lam_lr)
    metrics |= grad_metrics | {"replay_used": state.has_replay.astype(jnp.float32)}
    return new_state.replace(lam=lam, replay=current, has_replay=jnp.ones((), bool)), metrics

  return update_step


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT, metrics): GRPO's group-normalized outcome."""
  return estimators.grpo_step(config.rollout.group_size)


def init_state(config, params, tx, mesh) -> tuple[State, State]:
  """(State, its shardings): the TrainState plus lambda and an empty replay batch."""
  base, base_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)
  B = config.rollout.prompts_per_step * config.rollout.group_size
  T = config.rollout.max_len  # train() packs rollouts to exactly max_len (min_len=max_len)
  rows = sharding.batch_sharding(mesh)
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  replay = types.Batch(**{k: jax.device_put(jnp.zeros((B, T), dtype), rows)
                          for k, dtype in _REPLAY_FIELDS.items()})
  state = State(step=base.step, params=base.params, opt_state=base.opt_state,
                lam=jax.device_put(jnp.float32(config.loss.lam_init), replicated),
                replay=replay, has_replay=jax.device_put(jnp.zeros((), bool), replicated))
  shardings = State(step=base_shardings.step, params=base_shardings.params,
                    opt_state=base_shardings.opt_state, lam=replicated,
                    replay=jax.tree.map(lambda _: rows, replay), has_replay=replicated)
  return state, shardings


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """R2VPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  configs.require(not config.updates.sort_by_length,
                  "config.updates.sort_by_length must be False for R2VPO: its replay batch in "
                  "the state has one shape [B, rollout.max_len]")
  start = rundir.write_config(config, workdir, experiment="r2vpo")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference, optimizer; lambda and replay in the state.
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
        rollout_fn=recipe.group_rollout_fn(config, engine, tok, make_env, data, mesh,
                                           min_len=rc.max_len),  # replay: one T
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="R2VPO", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
