# pylint: disable=invalid-name
r"""BRPO, budget-relative policy optimization (AnytimeReasoner; Qi et al. 2025, 2505.13438).

  python -m experiments.efficiency.brpo                                   # verbose arithmetic, CPU
  python -m experiments.efficiency.brpo --config=experiments/efficiency/brpo.py:smoke \
      --workdir=/tmp/brpo
  python -m experiments.efficiency.brpo --config.brpo.prior=uniform       # the AR-uniform prior

docs/algorithms.md §12.4; code sail-sg/AnytimeReasoner `verl/verl/trainer/ppo/brpo.py`. The
policy's thinking is cut at every budget b_0 < ... < b_{S-1} and A summaries are sampled from
each cut (`agentrl.rollout.anytime.run`, as `sample_partial_cot`). R_{g,s}, the mean summary
score at budget s, gives
  * each thinking segment [b_{s-1}, b_s) the advantage sum_{j>=s} p_j R_{g,j} minus the
    baseline (s V1 + (S - s) V2) / S (`efficiency.brpo_thinking`,
    `brpo_thinking_tokens`), p the prior over budgets;
  * each summary its score minus the mean of the summaries of the same cut (A > 1) or of the
    group at the same budget (A = 1) (`brpo_summary`).
Thinking rows (the sampled thinking) and summary rows (context = prompt + cut thinking +
think-end, loss on the summary) are trained together with the clipped surrogate, token-mean
(verl's default; the authors' script changes neither it nor the clip).

The mapping onto the verbose-answer arithmetic task (envs/verbose_arithmetic.py,
"..>9750.." + EOS, filler the reward ignores): the thinking is the leading filler through the
think-end ">" (the thinking phase stops at ">"), the summary is what follows: the answer and
any trailing filler, then EOS. Cutting the thinking at b_s and appending ">" asks for the
answer after b_s filler tokens. A summary scores the env's reward of the cut thinking, ">"
and the summary, if the text holds exactly one ">" (the official format check).

Defaults (`cpu`): S = 4 budgets 2, 4, 6, 8 (the official 2000, 4000, 6000, 8000 of an 8000
thinking budget, scaled to this task's thinking of 1..7 tokens [INF]), the linear prior (p
proportional to b: AR-linear), variance_reduction "brpo", summary_method "brpo", and A = 1
summary per budget with a budget of 8 tokens (the official main runs use A = 4 and 118 tokens;
the authors' GRPO+vr ablation uses A = 1) [CPU-scale choice]. The rollout reward and success
are the scores of the last budget's summaries (the complete response). Presets: cpu, smoke.
smollm2 and pod are rejected: their reasoning-gym chat tasks have no thinking/summary format.

This file is the fork unit: the config, the loss composition, the advantage step and the
loop are all here; the building blocks come from agentrl.harness.recipe and agentrl.train.loop.
"""
from absl import app
from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections as mlc
import numpy as np

from agentrl.advantages import efficiency
from agentrl.advantages import estimators
from agentrl import configs
from agentrl import distributed
from agentrl.envs import verbose_arithmetic
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rollout import anytime
from agentrl.rollout import collect
from agentrl.rollout import pack
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types

PRIORS = ("linear", "uniform", "base")


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  recipe.reject_preset("brpo", arg.preset, ("cpu",),
                           "BRPO needs a thinking/summary format; the verbose arithmetic task "
                           "has one (its think-end '>'), the reasoning-gym chat tasks do not")
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  recipe.use_verbose_task(c)
  c.loss = dict(eps_low=0.2, eps_high=0.2, agg="token-mean")
  c.brpo = dict(budgets="2,4,6,8", prior="linear", summaries=1, summary_tokens=8,
                variance_reduction="brpo", summary_method="brpo", discount=2.0)
  if arg.smoke:
    c.brpo.budgets = "4,8"  # two budgets: half the summary rows to compile and run
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "task.name": configs.Key(str, choices=("verbose_arithmetic",),
                             why="for BRPO (its thinking ends at the task's '>')"),
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "brpo.budgets": configs.Key(str),          # comma-separated increasing thinking budgets
    "brpo.prior": configs.Key(str, choices=PRIORS),
    "brpo.summaries": configs.Key(int, min=1),  # A
    "brpo.summary_tokens": configs.Key(int, min=1),
    "brpo.variance_reduction": configs.Key(str, choices=efficiency.BRPO_VARIANCE_REDUCTION),
    "brpo.summary_method": configs.Key(str, choices=("brpo", "grpo")),
    "brpo.discount": configs.Key(float, min=0.0),
}


def validate(config: mlc.ConfigDict) -> list[int]:
  """rl_config.validate plus BRPO's: the longest summary row fits the packed length."""
  rl_config.validate(config, SCHEMA)
  budgets = recipe.parse_ints("brpo.budgets", config.brpo.budgets)
  longest = 2 * config.task.digits + 3 + budgets[-1] + 1 + config.brpo.summary_tokens
  configs.require(longest <= config.rollout.max_len,
                  f"config.rollout.max_len ({config.rollout.max_len}) must hold a summary row: "
                  f"prompt + brpo.budgets[-1] + 1 + brpo.summary_tokens = {longest} tokens")
  return budgets


def budget_prior(prior: str, budgets) -> list[float]:
  """p_s of `set_training_split_plan`: linear (proportional to b), uniform, or base (last)."""
  if prior == "linear":
    return [b / sum(budgets) for b in budgets]
  if prior == "uniform":
    return [1.0 / len(budgets)] * len(budgets)
  return [0.0] * (len(budgets) - 1) + [1.0]


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """update_step(state, batch): the clipped surrogate over thinking and summary rows."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, batch.loss_mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    loss = aggregation.aggregate(pg_BT, batch.loss_mask_BT, lc.agg)
    return loss, metrics | {"loss": loss}

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config, budgets):
  """(batch: B thinking rows then B S A summary rows, extras with score_BSA) -> adv_BT."""
  bc, G = config.brpo, config.rollout.group_size
  B = config.rollout.prompts_per_step * G
  probs = budget_prior(bc.prior, budgets)

  def advantage_fn(batch: types.Batch, extras):
    score_BSA = extras["score_BSA"]
    think_mask_BT, summary_mask_BT = batch.loss_mask_BT[:B], batch.loss_mask_BT[B:]
    adv_BS = efficiency.brpo_thinking(
        score_BSA.mean(axis=-1), group_size=G, budget_probs=probs,
        variance_reduction=bc.variance_reduction, discount=bc.discount)
    think_adv_BT = efficiency.brpo_thinking_tokens(adv_BS, think_mask_BT, budgets=budgets)
    cut_BS = efficiency.brpo_cut_index(think_mask_BT.sum(axis=1), budgets=budgets)
    summary_adv_BSA = efficiency.brpo_summary(score_BSA, cut_BS, group_size=G,
                                                     summary_method=bc.summary_method)
    summary_adv_BT = estimators.broadcast_to_tokens(summary_adv_BSA.reshape(-1),
                                                    summary_mask_BT)
    adv_BT = jnp.concatenate([think_adv_BT, summary_adv_BT])
    metrics = {"adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
               "brpo/thinking_adv_abs_mean": estimators.adv_abs_mean(think_adv_BT,
                                                                     think_mask_BT)}
    return batch.replace(adv_BT=adv_BT), metrics

  return advantage_fn


def brpo_rollout_fn(config, engine, tok, make_env, data, mesh, budgets):
  """rollout_fn(params, rng, step): B thinking rows, then the B S A summary rows."""
  rc, tc, bc = config.rollout, config.task, config.brpo
  rows = sharding.batch_sharding(mesh)
  think_end_id = verbose_arithmetic.single_id(tok, verbose_arithmetic.THINK_END)

  def rollout_fn(params, rng, step):
    del step
    seeds = [entry["seed"] for entry in data.take(rc.prompts_per_step)]
    out = anytime.run(engine, params, tok, make_env, seeds, group_size=rc.group_size,
                      budgets=budgets, num_summaries=bc.summaries,
                      summary_tokens=bc.summary_tokens, think_end_id=think_end_id, rng=rng,
                      max_len=rc.max_len, temperature=rc.temperature,
                      chat_template=tc.chat_template)
    trajs = out.thinking + out.summaries
    batch = pack.pack(trajs, max_len=rc.max_len, pad_id=tok.pad_id, min_len=rc.max_len,
                      sharding=rows)
    return loop.Rollout(batch=batch, metrics=rollout_metrics(out, trajs, batch),
                        extras={"score_BSA": jax.device_put(out.score_BSA, rows)},
                        trajectories=trajs, tokenizer=tok)

  return rollout_fn


def rollout_metrics(out: anytime.AnytimeRollout, trajs, batch) -> dict[str, float]:
  """The thinking rollout's metrics, with reward, success and response length those of the
  complete responses: the thinking and the last budget's first summary."""
  S, A = out.score_BSA.shape[1:]
  final = out.score_BSA[:, -1, :].mean()
  thinking_B = np.asarray([t.loss_mask.sum() for t in out.thinking])
  summary_B = np.asarray([t.loss_mask.sum() for t in out.summaries[(S - 1) * A::S * A]])
  metrics = {**out.metrics, **collect.batch_metrics(trajs, batch),
             "reward": float(final), "success": float(final),
             "rollout/reward_mean": float(final),
             "rollout/response_tokens_mean": float(np.mean(thinking_B + summary_B)),
             "brpo/thinking_tokens": float(thinking_B.mean())}
  for s in range(S):
    metrics[f"brpo/score_b{s}"] = float(out.score_BSA[:, s].mean())
  return metrics


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """BRPO end to end; returns the summary written to <workdir>/summary.json."""
  budgets = validate(config)
  start = rundir.write_config(config, workdir, experiment="brpo")
  rc, mesh = config.rollout, sharding.make_mesh(config.mesh)
  make_env = recipe.make_task(config.task)

  # ---- Policy (warm-started), optimizer (no KL term: the authors' runs have none).
  tok, graphdef, params = recipe.build_policy(config, mesh)
  params, sft_info = recipe.warm_start(config, workdir, mesh, graphdef, params, tok)
  ref_params = recipe.reference_params(params)  # the `kl` diagnostic's anchor
  tx = recipe.make_optimizer(config.optim)
  state, state_shardings = sharding.create_train_state(params, tx, mesh, config.sharding_rules)

  # ---- Jitted steps.
  score_step = jax.jit(loop.make_score_step(graphdef, temperature=rc.temperature,
                                            logprob_impl=config.model.logprob_impl,
                                            with_ref=True))
  update_step = jax.jit(loop.skip_nonfinite(make_update_step(config, graphdef, tx)),
                        donate_argnames="state", out_shardings=(state_shardings, None))

  # ---- Thinking + summary rollout, data and held-out evaluation (full greedy responses).
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=brpo_rollout_fn(config, engine, tok, make_env, data, mesh, budgets),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config, budgets)), update_fn=update_step,
        data=data, evaluate=recipe.length_evaluator(config, engine, tok, make_env),
        **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="BRPO (AnytimeReasoner)", start=start,
                              sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
