# pylint: disable=invalid-name
r"""TTRL, test-time RL by majority vote (Zuo et al. 2025, arXiv 2504.16084): GRPO without labels.

  python -m experiments.shaping.ttrl
  python -m experiments.shaping.ttrl --config=experiments/shaping/ttrl.py:smoke --workdir=/tmp/ttrl
  python -m experiments.shaping.ttrl --config=experiments/shaping/ttrl.py:smollm2

Label-free: the reward of a rollout is 1 when its extracted answer is the majority answer of
its group and 0 otherwise, missing answers 0 (`label_free.majority_vote_rewards`, as dl-m9/SIOP
`compute_ttrl_majority_rewards`; exact-match clusters; docs/algorithms.md §13.6). The vote is
over the G training samples themselves [INF: TTRL votes over a larger sample and trains on a
subset]. The gold answer never reaches the update: it only scores `success`, `verifier_reward`
(the exact-match reward the vote replaces), `majority_accuracy` (the share of groups whose
majority answer is right: the label quality) and the held-out evaluation. (The cpu preset's
SFT warm start, the stand-in for a pretrained model shared by every cpu run, is supervised on
its own seed range, disjoint from the RL prompts.)
Otherwise GRPO: group-normalised advantage, PPO clip eps 0.2, token-mean, no KL.
On the cpu task the warm start's vote is mostly wrong and the run sharpens onto consistent
wrong answers (measured in docs/algorithms.md §13.10): the file shows the method, not a win.
"""
from absl import app
from flax import nnx
import jax
import ml_collections as mlc

from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.harness import relabel
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rewards import label_free
from agentrl.rollout import collect
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  c.loss = dict(eps_low=0.2, eps_high=0.2)
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
}


# ---------------------------------------------------------------------------------------------
# The loss composition, the advantage step and the label-free reward: the part to fork.
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
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    loss = aggregation.aggregate(pg_BT, mask_BT, "token-mean")
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """GRPO's group-normalised advantage of the majority-vote reward."""
  return estimators.grpo_step(config.rollout.group_size)


def make_reward_fn(config, tok):
  """relabel(trajs) -> Labels: the majority-vote reward of each group's extracted answers."""
  G, task = config.rollout.group_size, config.task.name

  def reward_fn(trajs):
    answers = relabel.answers(trajs, tok, task)
    success = [collect.trajectory_success(t) for t in trajs]  # gold: logged, never trained on
    return relabel.Labels(
        reward_B=label_free.per_group(answers, G, label_free.majority_vote_rewards),
        metrics={"majority_accuracy": relabel.majority_accuracy(answers, success,
                                                                group_size=G)})

  return reward_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """TTRL end to end; returns the summary written to <workdir>/summary.json."""
  rl_config.validate(config, SCHEMA)
  start = rundir.write_config(config, workdir, experiment="ttrl")
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

  # ---- Rollout rewarded by majority vote, data and held-out (gold) evaluation.
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
  return rundir.write_summary(workdir, result, name="TTRL", start=start, sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
