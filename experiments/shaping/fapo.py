# pylint: disable=invalid-name
r"""FAPO, flawed-aware policy optimisation (Ding et al. 2025, arXiv 2510.22543).

  python -m experiments.shaping.fapo
  python -m experiments.shaping.fapo --config=experiments/shaping/fapo.py:smoke --workdir=/tmp/fapo

FAPO penalises flawed positives, answers that are right for the wrong reasons: reward 1 for a
correct rollout, 1 - penalty = 0 for a correct one flagged as flawed, -1 otherwise (verl
`recipe/fapo/reward_fn.py`, `shaping.fapo_reward`; docs/algorithms.md §13.8). GRPO's group
normalisation then schedules the penalty: a flawed positive scores above the group mean
(reinforced) while wrong rollouts outnumber fully correct ones, and below it afterwards.
Loss as the launcher (run_fapo_7b.sh): dual-clip PPO, eps 0.2 / 0.28, c = 10, token-mean,
no KL.

The flaw detector [INF]. FAPO flags flaws with a generative reward model that locates an
erroneous reasoning step; this task has no reasoning steps, so a rule stands in for it, on the
task's required format: the answer must be the fixed-width reversed sum, carry digit
included ("123+456=" -> "9750"). A completion is *correct* when its digits, read reversed,
are the right number whatever the zero padding ("975" or "97500" for 579), and *flawed* when
it is correct but not in the required fixed-width form (the padding is missing or extra).
Exact-match answers get 1, flawed positives 0, the rest -1. `success`, `verifier_reward` and
the held-out evaluation stay the task's exact match; `fapo/flawed_frac` is the share of
rollouts flagged. The rule needs the arithmetic task, so the presets are cpu and smoke only.
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
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  if arg.preset != "cpu":  # the flaw detector is a rule of the arithmetic task
    raise configs.ConfigError(f"unknown fapo preset {arg.preset!r}; use cpu (default) or smoke")
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  c.loss = dict(eps_low=0.2, eps_high=0.28, dual_clip=10.0, penalty=1.0)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "task.name": configs.Key(str, choices=("arithmetic",), why="for the flaw detector"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.dual_clip": configs.Key(float, min=1.000001, why="for the dual clip c > 1"),
    "loss.penalty": configs.Key(float, min=0.0),
}


# ---------------------------------------------------------------------------------------------
# The loss composition, the advantage step and the reward: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics). Pure; jit it in train()."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high,
                                 dual_clip=lc.dual_clip)
    loss = aggregation.aggregate(pg_BT, mask_BT, "token-mean")
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """GRPO's group-normalised advantage of the FAPO reward."""
  return estimators.grpo_step(config.rollout.group_size)


def judge(completion: str, target: str) -> tuple[bool, bool]:
  """(correct, flawed) of a reversed-addition completion against its fixed-width target."""
  text = completion.strip()
  correct = text.isascii() and text.isdigit() and int(text[::-1]) == int(target[::-1])
  return correct, correct and text != target


def make_reward_fn(config, tok):
  """relabel(trajs) -> Labels: the FAPO reward of each rollout, from `judge`."""
  penalty = config.loss.penalty

  def reward_fn(trajs):
    verdicts = [judge(relabel.completion_text(t, tok), t.infos[-1]["target"]) for t in trajs]
    correct_B, flawed_B = (np.asarray(v, bool) for v in zip(*verdicts))
    reward_B = shaping.fapo_reward(correct_B, flawed_B, penalty=penalty)
    return relabel.Labels(reward_B=np.asarray(jax.device_get(reward_B)).tolist(),
                          metrics={"fapo/flawed_frac": float(flawed_B.mean())})

  return reward_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """FAPO end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="fapo")
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

  # ---- Rollout rewarded by FAPO, data and held-out (exact-match) evaluation.
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)
  rollout_fn = relabel.group_rollout_fn(config, engine, tok, make_env, data, mesh,
                                        make_reward_fn(config, tok))

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=rollout_fn,
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.evaluator(config, engine, tok, make_env), **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="FAPO", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
