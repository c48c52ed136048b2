# pylint: disable=invalid-name
r"""COPO, consistency-aware policy optimisation (arXiv 2508.04138): local GRPO + global term.

  python -m experiments.shaping.copo
  python -m experiments.shaping.copo --config=experiments/shaping/copo.py:smoke --workdir=/tmp/copo
  python -m experiments.shaping.copo --config=experiments/shaping/copo.py:smollm2

As the official code hijih/copo-code (`verl/trainer/ppo/core_algos.py`, `verl/run_copo.sh`,
commit c15c75f; docs/algorithms.md §13.5):
  * local advantage: GRPO's, per group;
  * global advantage: each prompt's pass rate, standardised across the batch's prompts
    (`shaping.copo_global_advantage`), so a group whose rollouts all agree still learns
    relative to the other prompts;
  * gate: w = sigmoid(k (H - b)) [R != 0] with H the entropy in bits of the group's extracted
    answers (`shaping.answer_entropy`, `shaping.copo_local_weight`, "soft-with-zero", k 5,
    b 1): consistent groups lean on the global term, a zero-reward response uses it only;
  * loss: (1 - w) PPO(A_global) + w PPO(A_local) on the same ratio (`consistency.copo_ppo`),
    dual clip 3, eps 0.2, seq-mean-token-mean, no KL.
The answers are read on the host (`relabel.answers`; exact-match classes, a missing answer is
a class of its own) and reach the advantage step as `extras["answer_id_B"]`; the global
advantage and the gate reach the loss per row in `batch.aux`.
"""
from absl import app
from flax import nnx
import jax
import ml_collections as mlc
import numpy as np

from agentrl.advantages import estimators
from agentrl.advantages import shaping
from agentrl import configs
from agentrl import distributed
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.harness import relabel
from agentrl.losses import aggregation
from agentrl.losses import consistency
from agentrl.models import policy as policy_lib
from agentrl.rewards import label_free
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  # run_copo.sh: soft-with-zero, k 5, b 1, reward_coef_flg=false (entropy_coef), clip 0.2.
  c.loss = dict(eps_low=0.2, eps_high=0.2, dual_clip=3.0, mode="soft-with-zero", k=5.0, b=1.0,
                entropy_coef=False, agg="seq-mean-token-mean")
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.dual_clip": configs.Key(float, min=1.000001, why="for the dual clip c > 1"),
    "loss.mode": configs.Key(str, choices=shaping.COPO_MODES),
    "loss.k": configs.Key(float),
    "loss.b": configs.Key(float),
    "loss.entropy_coef": configs.Key(bool),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
}


# ---------------------------------------------------------------------------------------------
# The loss composition, the advantage step and the answer classes: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    loss_BT, metrics = consistency.copo_ppo(
        logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
        global_adv_B=batch.aux["global_adv_B"], local_weight_B=batch.aux["local_weight_B"],
        eps_low=lc.eps_low, eps_high=lc.eps_high, dual_clip=lc.dual_clip)
    loss = aggregation.aggregate(loss_BT, mask_BT, lc.agg)
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """GRPO's local advantage (adv_BT), plus the global advantage and the gate (batch.aux)."""
  G, lc = config.rollout.group_size, config.loss
  grpo_step = estimators.grpo_step(G)

  def advantage_fn(batch: types.Batch, extras):
    batch, metrics = grpo_step(batch, extras)
    answer_id_B = extras["answer_id_B"]
    global_adv_B = shaping.copo_global_advantage(batch.reward_B, answer_id_B, group_size=G,
                                                 entropy_coef=lc.entropy_coef)
    entropy_B = shaping.answer_entropy(answer_id_B, group_size=G)
    weight_B = shaping.copo_local_weight(entropy_B, batch.reward_B, k=lc.k, b=lc.b,
                                         mode=lc.mode)
    metrics["copo/answer_entropy"] = entropy_B.mean()
    return batch.replace(aux={"global_adv_B": global_adv_B, "local_weight_B": weight_B}), metrics

  return advantage_fn


def make_relabel_fn(config, tok):
  """relabel(trajs) -> Labels with extras["answer_id_B"]: per group, equal answers share an id
  (missing ones -1, one more class); the env rewards stay."""
  G, task = config.rollout.group_size, config.task.name

  def relabel_fn(trajs):
    ids = label_free.per_group(relabel.answers(trajs, tok, task), G, label_free.cluster_ids)
    return relabel.Labels(extras={"answer_id_B": np.asarray(ids, np.int32)})

  return relabel_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """COPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="copo")
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

  # ---- Rollout with each group's answer classes, data and held-out evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)
  rollout_fn = relabel.group_rollout_fn(config, engine, tok, make_env, data, mesh,
                                        make_relabel_fn(config, tok))

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=rollout_fn,
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="COPO", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
