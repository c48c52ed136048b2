# pylint: disable=invalid-name
r"""HBPO: hierarchical budget policy optimization (Lyu et al. 2025, arXiv 2507.15844).

  python -m experiments.efficiency.hbpo                                   # verbose arithmetic, CPU
  python -m experiments.efficiency.hbpo --config=experiments/efficiency/hbpo.py:smoke \
      --workdir=/tmp/hbpo
  python -m experiments.efficiency.hbpo --config=experiments/efficiency/hbpo.py:pod \
      --config.model.path=/ckpt/Qwen3-8B

docs/algorithms.md §12.2; code ZJU-REAL/HBPO. Each group of G rollouts is split into k equal
subgroups, one per token budget b (`envs.budget.row_budgets`: G/k contiguous rows per budget),
and each row's prompt states its budget (`envs.budget.BudgetEnv`). A correct response of L
sampled tokens gets min(f1, f2) with f1 = beta cos(pi L / 2 L_max) - alpha |L - b| and f2 =
beta cos(pi b / 2 L_max) (`length_rewards.hbpo_reward`, the released code's rule); incorrect
0, unparseable -1 (the env reported an error for the answer). The advantage is GRPO over the
whole group plus intra_coef * (mean reward of the row's subgroup - f2(b))
(`efficiency.hbpo`), then the clipped surrogate and aggregation of experiments/policy/grpo.py.
Held-out evaluation uses the plain prompts (no budget sentence), as the paper evaluates.

Presets:
  cpu (default)  the verbose-answer arithmetic task (envs/verbose_arithmetic.py: answers padded
                 with filler the reward ignores; responses of 6..15 tokens after SFT), budgets
                 6, 8, 10, 12 tokens written "[b]" after the prompt, L_max = 16 (the response
                 budget), G = 8: two rows per budget [INF: the official budgets 512..2560 of a
                 4096 context scaled to this task's lengths].
  smollm2        budgets 12, 24, 36, 48 of L_max = 48 with the official sentence [INF: scaled].
  pod            the official setting: budgets 512, 1024, 2048, 2560, L_max = 4096 (so the
                 response budget is 4096 tokens), G = 16, "<think> I will answer the question
                 with {b} tokens".
The budget sentence ends the user message under a chat template [INF, envs/budget.py].

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
from agentrl.envs import budget
from agentrl.envs import verbose_arithmetic
from agentrl.harness import cli
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.losses import aggregation
from agentrl.losses import kl
from agentrl.losses import policy as pg
from agentrl.models import policy as policy_lib
from agentrl.rewards import length_rewards
from agentrl.records import rundir
from agentrl import sharding
from agentrl.train import loop
from agentrl import types


def get_config(arg: str | None = None) -> mlc.ConfigDict:
  arg = configs.parse_arg(arg, preset="cpu", smoke=False)
  c = rl_config.rl_config(arg.preset, smoke=arg.smoke)
  c.loss = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.0, kl_kind="k3", agg="seq-mean-token-mean")
  if arg.preset == "cpu":
    recipe.use_verbose_task(c)
    c.hbpo = dict(budgets="6,8,10,12", template=verbose_arithmetic.BUDGET_TEMPLATE,
                  max_len=c.rollout.max_new_tokens)
  elif arg.preset == "smollm2":
    c.hbpo = dict(budgets="12,24,36,48", template=budget.BUDGET_PROMPT, max_len=48)
    c.loss.update(kl_coef=0.001, agg="token-mean")
  else:  # pod: the official budgets, context and group size
    c.hbpo = dict(budgets=",".join(map(str, budget.BUDGETS)), template=budget.BUDGET_PROMPT,
                  max_len=4096)
    c.rollout.update(group_size=16, max_new_tokens=4096, max_len=4608)
    c.loss.update(kl_coef=0.001, agg="token-mean")
  c.hbpo.update(beta=4.0, within_budget="min", intra_coef=1.0)
  if arg.smoke:
    c.rollout.group_size = 4  # one row per budget
  return c


SCHEMA = {
    **rl_config.RL_SCHEMA,
    "loss.eps_low": configs.Key(float, min=0.0, max=1.0),
    "loss.eps_high": configs.Key(float, min=0.0),
    "loss.kl_coef": configs.Key(float, min=0.0),
    "loss.kl_kind": configs.Key(str, choices=("k1", "k2", "k3", "abs", "k3+")),
    "loss.agg": configs.Key(str, choices=tuple(m for m in aggregation.MODES if m != "seq-mean")),
    "hbpo.budgets": configs.Key(str),          # comma-separated token budgets, increasing
    "hbpo.template": configs.Key(str),         # the budget sentence; "{budget}" is replaced
    "hbpo.max_len": configs.Key(int, min=1),   # L_max of the reward's cosine
    "hbpo.beta": configs.Key(float, min=0.0),
    "hbpo.within_budget": configs.Key(str, choices=("min", "flat")),
    "hbpo.intra_coef": configs.Key(float, min=0.0),
}


def validate(config: mlc.ConfigDict) -> list[int]:
  """rl_config.validate plus HBPO's checks; returns the budgets."""
  rl_config.validate(config, SCHEMA)
  budgets = recipe.parse_ints("hbpo.budgets", config.hbpo.budgets)
  try:
    budget.row_budgets(config.rollout.group_size, budgets)
  except ValueError as e:
    raise configs.ConfigError(f"config.rollout.group_size: {e}") from None
  configs.require("{budget}" in config.hbpo.template,
                  f"config.hbpo.template={config.hbpo.template!r} must contain '{{budget}}'")
  return budgets


# ---------------------------------------------------------------------------------------------
# The loss composition and the advantage step: the part to fork.
# ---------------------------------------------------------------------------------------------
def make_update_step(config, graphdef, tx):
  """Returns update_step(state, batch) -> (state, metrics): GRPO's loss. Pure; jit it."""
  lc, impl, temperature = config.loss, config.model.logprob_impl, config.rollout.temperature

  def loss_fn(params, batch: types.Batch):
    policy = nnx.merge(graphdef, params)
    logp_BT = policy_lib.token_logprobs(policy, batch.tokens_BT, batch.positions_BT,
                                        batch.input_mask_BT, temperature=temperature, impl=impl)
    mask_BT = batch.loss_mask_BT
    pg_BT, metrics = pg.ppo_clip(logp_BT, batch.old_logp_BT, batch.adv_BT, mask_BT,
                                 eps_low=lc.eps_low, eps_high=lc.eps_high)
    kl_BT = kl.kl_penalty(logp_BT, batch.ref_logp_BT, lc.kl_kind)
    loss = aggregation.aggregate(pg_BT + lc.kl_coef * kl_BT, mask_BT, lc.agg)
    metrics |= {"loss": loss, "kl_loss": aggregation.aggregate(kl_BT, mask_BT, "token-mean")}
    return loss, metrics

  return loop.gradient_step(loss_fn, tx)


def make_advantage_fn(config):
  """(batch, extras with budget_B and formatted_B) -> (batch with adv_BT, metrics)."""
  hc, G = config.hbpo, config.rollout.group_size

  def advantage_fn(batch: types.Batch, extras):
    budget_B, length_B = extras["budget_B"], recipe.response_length(batch.loss_mask_BT)
    reward_B = length_rewards.hbpo_reward(
        recipe.is_correct(batch.reward_B), length_B, budget_B,
        formatted_B=extras["formatted_B"], max_len=hc.max_len, beta=hc.beta,
        within_budget=hc.within_budget)
    adv_B = efficiency.hbpo(reward_B, budget_B, group_size=G, intra_coef=hc.intra_coef,
                                   max_len=hc.max_len, beta=hc.beta)
    adv_BT = estimators.broadcast_to_tokens(adv_B, batch.loss_mask_BT)
    metrics = {"adv_abs_mean": estimators.adv_abs_mean(adv_BT, batch.loss_mask_BT),
               "groups_with_signal": estimators.group_has_variance(
                   reward_B, group_size=G).astype(jnp.float32).mean(),
               "hbpo/reward": jnp.mean(reward_B),
               "hbpo/within_budget": jnp.mean((length_B <= budget_B).astype(jnp.float32))}
    return batch.replace(adv_BT=adv_BT), metrics

  return advantage_fn


class BudgetRows:
  """make_env for `recipe.group_rollout_fn`: the i-th env of a rollout states budget
  row_budgets[i % G] and records whether its answer parsed.

  agent_loop.rollout_groups builds one env per row, in row order, so env i is row i;
  `rollout_fn` checks that a rollout built exactly one env per row.
  """

  def __init__(self, make_env, row_budgets, template: str):
    self.make_env, self.row_budgets, self.template = make_env, row_budgets, template
    self.envs = []

  def __call__(self):
    env = _ParseRecordingEnv(self.make_env(), self.row_budgets[len(self.envs) %
                                                               len(self.row_budgets)],
                             template=self.template)
    self.envs.append(env)
    return env


class _ParseRecordingEnv(budget.BudgetEnv):
  """A BudgetEnv that keeps the env's verdict on whether the answer parsed."""
  formatted = False  # until a step without an error

  def step(self, action):
    result = super().step(action)
    self.formatted = not result[3].get("error")
    return result


def budget_rollout_fn(config, engine, tok, make_env, data, mesh, budgets):
  """rollout_fn(params, rng, step): G rows per prompt, row g of each group under budget
  `row_budgets(G)[g]`; extras hold budget_B and formatted_B (the env parsed an answer)."""
  rc, hc = config.rollout, config.hbpo
  row_budgets = budget.row_budgets(rc.group_size, budgets)
  B, rows = rc.prompts_per_step * rc.group_size, sharding.batch_sharding(mesh)
  budget_rows = BudgetRows(make_env, row_budgets, hc.template)
  group_rollout = recipe.group_rollout_fn(config, engine, tok, budget_rows, data, mesh)
  budget_B = jax.device_put(np.tile(np.asarray(row_budgets, np.float32), B // rc.group_size),
                            rows)

  def rollout_fn(params, rng, step):
    budget_rows.envs = []
    out = group_rollout(params, rng, step)
    if len(budget_rows.envs) != B:
      raise RuntimeError(f"expected one env per row ({B}), the rollout built "
                         f"{len(budget_rows.envs)}: the budget of each row is unknown.")
    formatted_B = np.asarray([env.formatted for env in budget_rows.envs], bool)
    out.extras.update(budget_B=budget_B, formatted_B=jax.device_put(formatted_B, rows))
    return out

  return rollout_fn


# ---------------------------------------------------------------------------------------------
# train() and main().
# ---------------------------------------------------------------------------------------------
def train(config: mlc.ConfigDict, workdir: str) -> dict:
  """HBPO end to end; returns the summary written to <workdir>/summary.json."""
  budgets = validate(config)
  start = rundir.write_config(config, workdir, experiment="hbpo")
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

  # ---- Budgeted rollout, data and held-out evaluation (plain prompts).
  engine = recipe.rollout_engine(config, graphdef, tok)
  data = recipe.prompt_stream(make_env)

  # ---- The RL loop.
  with jax.set_mesh(mesh):
    result = loop.run(
        state, rng=jax.random.key(config.seed), total_steps=config.total_steps, workdir=workdir,
        rollout_fn=budget_rollout_fn(config, engine, tok, make_env, data, mesh, budgets),
        score_fn=lambda params, batch: score_step(params, ref_params, batch),
        advantage_fn=jax.jit(make_advantage_fn(config)), update_fn=update_step, data=data,
        evaluate=recipe.length_evaluator(config, engine, tok, make_env),
        **recipe.loop_options(config))
  return rundir.write_summary(workdir, result, name="HBPO (hierarchical budgets)", start=start,
                              sft_info=sft_info)


def main(argv):
  del argv
  distributed.initialize_distributed()  # no-op unless launched multi-process
  cli.run(train, _CONFIG.value, _WORKDIR.value)  # user errors: one line, not a traceback


if __name__ == "__main__":
  _CONFIG, _WORKDIR = cli.define_flags(__file__)
  app.run(main, flags_parser=cli.parse_flags)
