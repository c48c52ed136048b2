# pylint: disable=invalid-name
r"""On-policy distillation (G-OPD / ExOPD, Yang et al., arXiv 2602.12125): a student learns
from a teacher's log-probs of the student's own samples.

  python -m experiments.policy.grpo --workdir=runs/grpo                 # the teacher: a GRPO run
  python -m experiments.distill.opd --workdir=runs/opd                   # the student (default cpu)
  python -m experiments.distill.opd --config.teacher.run_dir=runs/ppo --config.loss.lam=1.25
  python -m experiments.distill.opd --config=experiments/distill/opd.py:smoke \
      --config.teacher.run_dir=DIR

Default (`cpu`): the teacher is the finished GRPO main job in runs/grpo (its config.json says
how to rebuild it; its newest checkpoint, or `teacher.step`, holds the weights;
`saved_run.load_teacher`), the student the SFT-only warm start of the same tiny model on
reversed 3-digit addition. Each step the
student samples G answers per prompt; the score step computes the student's log-probs and the
teacher's log-probs of the same tokens in one jitted call (no extra host round trip); every
sampled token gets the dense reward

    r_t = lam (log pi_T - log pi_ref) - (log pi_theta - log pi_ref)

(lam = 1: r_t = log pi_T - log pi_theta, the reference cancels and is not read; lam > 1
extrapolates past the teacher, ExOPD; the reference is the student's warm start). With
`loss.form=ppo` r_t is the advantage of PPO's clipped surrogate, as the G-OPD code replaces the
GRPO advantage by it; `reinforce` trains -sg(r_t) log pi_theta directly. The task's reward is
not needed (it is logged); `loss.outcome_coef` > 0 adds the GRPO outcome advantage, and
`loss.gate` restricts distillation to rollouts whose reward is >= gate_tau (KEPO: "success")
or below it ("failure"). Before training the teacher is evaluated on the held-out problems, so
the summary shows how far the student closes the gap.

The teacher may be any architecture that shares the student's tokenizer (checked token by
token); a teacher with another tokenizer is refused, since token-level log-probs of one
vocabulary mean nothing in another.

This file is the fork unit: the config, the score step with the teacher, the advantage step,
the loss and the loop are all here.
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
from agentrl.harness import saved_run
from agentrl.losses import aggregation
from agentrl.losses import distill
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  # The teacher: a finished run of any RL experiment (its config.json and ckpt/), on the
  # student's tokenizer; step "latest", "warm_start" or a saved step number.
  # Defaults: the GRPO run of the same preset in its default workdir; smoke and pod name it.
  teacher = {"cpu": "runs/grpo", "smollm2": "runs/grpo_smollm2"}.get(arg.preset, "")
  c.teacher = dict(run_dir="" if arg.smoke else teacher, step="latest")
  c.loss = dict(form="ppo", lam=1.0, eps_low=0.2, eps_high=0.2, agg="token-mean",
                outcome_coef=0.0, gate="none", gate_tau=1.0)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "teacher.run_dir": configs.Key(str),
    "teacher.step": configs.Key(str),
    "loss.form": configs.Key(str, choices=("ppo", "reinforce")),
    "loss.lam": configs.Key(float, min=0.0),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "loss.outcome_coef": configs.Key(float, min=0.0),
    "loss.gate": configs.Key(str, choices=("none", "success", "failure")),
    "loss.gate_tau": configs.Key(float),
}


# ---------------------------------------------------------------------------------------------
# The score step (student + teacher), the advantage step and the loss: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_score_step(config, graphdef, teacher_graphdef):
  """score_step(params, ref_params, teacher_params, batch) -> (batch, metrics).

  The learner's score step (old_logp; ref_logp, which the reward reads only when lam != 1,
  and the `kl` to the warm start every experiment logs), plus the teacher's
  log-probs of the sampled tokens in `batch.aux["teacher_logp_BT"]`.
  """
  temperature, impl = config.rollout.temperature, config.model.logprob_impl
  student_step = loop.make_score_step(graphdef, temperature=temperature, logprob_impl=impl,
                                      with_ref=True)

  def score_step(params, ref_params, teacher_params, batch: types.Batch):
    batch, metrics = student_step(params, ref_params, batch)
    teacher = nnx.merge(teacher_graphdef, teacher_params)
    teacher_logp_BT = policy_lib.token_logprobs(teacher, batch.tokens_BT, batch.positions_BT,
                                                batch.input_mask_BT, temperature=temperature,
                                                impl=impl)
    return batch.replace(aux={**(batch.aux or {}), "teacher_logp_BT": teacher_logp_BT}), metrics

  return score_step


def make_advantage_fn(config):
  """(batch, extras) -> (batch with adv_BT = r_t [+ outcome], metrics): the OPD reward."""
  lc, G = config.loss, config.rollout.group_size

  def advantage_fn(batch: types.Batch, extras):
    del extras
    mask_BT = batch.loss_mask_BT
    metrics = {}
    if lc.gate != "none":  # KEPO: rows outside the gate are not distilled at all
      gate_B = distill.quality_gate(batch.reward_B, tau=lc.gate_tau, keep=lc.gate)
      mask_BT = mask_BT * gate_B[:, None]
      metrics["gate_kept"] = gate_B.mean()
    teacher_logp_BT = batch.aux["teacher_logp_BT"]
    adv_BT = distill.opd_advantage(batch.old_logp_BT, teacher_logp_BT, mask_BT,
                                   ref_logp_BT=batch.ref_logp_BT, lam=lc.lam)
    valid_BT = mask_BT > 0
    metrics["opd_reward"] = aggregation.masked_mean(adv_BT, mask_BT)
    metrics["opd_teacher_kl"] = aggregation.masked_mean(
        jnp.where(valid_BT, batch.old_logp_BT - teacher_logp_BT, 0.0), mask_BT)
    if lc.outcome_coef:
      outcome_B = estimators.grpo(batch.reward_B, group_size=G)
      adv_BT = adv_BT + lc.outcome_coef * estimators.broadcast_to_tokens(outcome_B, mask_BT)
    metrics["adv_abs_mean"] = estimators.adv_abs_mean(adv_BT, mask_BT)
    return batch.replace(adv_BT=adv_BT, loss_mask_BT=mask_BT), metrics

  return advantage_fn


def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    if lc.form == "ppo":
      loss_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                     eps_low=lc.eps_low, eps_high=lc.eps_high)
    else:  # -sg(A) log pi: A is r_t from the score-time log-probs (+ the outcome term)
      loss_BT = jnp.where(mask_BT > 0, -jax.lax.stop_gradient(batch.adv_BT) * logp_BT, 0.0)
      metrics = {}
    loss = aggregation.aggregate(loss_BT, mask_BT, lc.agg)
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """On-policy distillation end to end; returns the summary written to summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="opd")
  mesh = sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Student (warm-started), teacher, frozen reference (the warm start), optimizer.
  tok, graphdef, params = recipe.build_policy(config, mesh)
  teacher = saved_run.load_teacher(config.teacher.run_dir, config.teacher.step, tok, mesh=mesh)
  teacher_config, teacher_graphdef, teacher_params = (teacher.config, teacher.graphdef,
                                                      teacher.params)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  ref_params = recipe.reference_params(params)  # a copy; None: LoRA's frozen base
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(make_score_step(config, graphdef, teacher_graphdef))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Rollout, data, held-out evaluation (the teacher's too, on the same problems).
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)
  evaluate = recipe.evaluator(config, engine, tok, make_env)
  with jax.set_mesh(mesh):
    teacher_engine = recipe.rollout_engine(teacher_config, teacher_graphdef, tok)
    teacher_success = recipe.evaluator(config, teacher_engine, tok, make_env)(
        teacher_params)["success"]
  print(f"Teacher held-out greedy success: {teacher_success:.1%}", flush=True)

  # ---- The loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=recipe.group_rollout_fn(config, engine, tok, make_env, data, mesh),
        score_fn=lambda p, batch: score_step(p, ref_params, teacher_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=evaluate, **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="OPD", start=start, sft_info=sft_info,
                              extra={"teacher_success": teacher_success})


def main(argv):
  del argv
  distributed.initialize_distributed()
  cli.run(train, _CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
