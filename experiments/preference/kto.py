# pylint: disable=invalid-name
r"""KTO on the policy's own samples (Ethayarajh et al. 2024, arXiv 2402.01306): online KTO.

  python -m experiments.preference.kto
  python -m experiments.preference.kto --config=experiments/preference/kto.py:smoke \
      --workdir=/tmp/kto
  python -m experiments.preference.kto --config=experiments/preference/kto.py:smollm2

The setting. KTO learns from unpaired examples labelled desirable or undesirable; here they
are the G samples per prompt the current policy draws each step, labelled by the task's
verifier (desirable when the reward exceeds loss.threshold = 0.5: a correct answer), against
the frozen warm start as pi_ref. The loss is TRL's `KTOTrainer` ("kto" loss type;
`preference.kto`, docs/algorithms.md §8): with r = log pi(y|x) - log pi_ref(y|x) over the
response tokens and z0 the detached reference point,
  desirable: 1 - sigmoid(beta (r - z0)),  undesirable: 1 - sigmoid(beta (z0 - r)),
averaged over the batch; beta 0.1, both weights 1 (TRL's KTOConfig).
[INF] z0 = max(0, mean(log pi - log pi_ref)) over the batch's own completions, which are
samples of the policy (of pi_old, one update old at most), so the mean is a direct estimate
of KL(pi || pi_ref); TRL pairs each prompt with another row's completion because its offline
data are not the policy's samples.
There is no advantage and no ratio: the loop's advantage step only labels the rows.
"""
from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc

from agentrl import configs
from agentrl import distributed
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import preference
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  c.loss = dict(beta=0.1, desirable_weight=1.0, undesirable_weight=1.0, threshold=0.5)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.beta": configs.Key(float, min=1e-9),
    "loss.desirable_weight": configs.Key(float, min=0.0),
    "loss.undesirable_weight": configs.Key(float, min=0.0),
    "loss.threshold": configs.Key(float),
}


# ---------------------------------------------------------------------------------------------
# The loss composition and the labelling step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    logp_B = preference.sequence_logp(logp_BT, mask_BT)
    ref_logp_B = preference.sequence_logp(batch.ref_logp_BT, mask_BT)
    # The KL pairs are the completions themselves (see the module docstring).
    loss_B, metrics = preference.kto(
        logp_B, ref_logp_B, batch.aux["desirable_B"], logp_B, ref_logp_B, beta=lc.beta,
        desirable_weight=lc.desirable_weight, undesirable_weight=lc.undesirable_weight)
    loss = loss_B.mean()
    # kto's `kl` is its reference point z0; `kl` is the score step's name.
    return loss, {"loss": loss, "kto_z0": metrics["kl"],
                  "reward_chosen": metrics["reward_chosen"],
                  "reward_rejected": metrics["reward_rejected"]}

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """(batch, extras) -> (batch with aux["desirable_B"], metrics): the verifier's labels."""
  threshold = config.loss.threshold

  def advantage_fn(batch: types.Batch, extras):
    del extras
    desirable_B = batch.reward_B > threshold
    return (batch.replace(aux={"desirable_B": desirable_B}),
            {"desirable_frac": desirable_B.astype(jnp.float32).mean()})

  return advantage_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """Online KTO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="kto")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), frozen reference (KTO's pi_ref), optimizer.
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
  return rundir.write_summary(workdir, result, name="KTO (online)", start=start,
                              sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
