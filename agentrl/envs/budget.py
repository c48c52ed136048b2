"""HBPO's hierarchical budgets on the env side: the budget sentence and the group layout.

HBPO (Lyu et al. 2025, arXiv 2507.15844; `ZJU-REAL/HBPO`
`verl/workers/rollout/vllm_rollout/vllm_rollout_spmd-hierarchical.py`) splits each group of
rollouts into equal subgroups, one per token budget {512, 1024, 2048, 2560}, and states the
budget in the assistant prefill "<think> I will answer the question with {b} tokens".

  budgets = budget.row_budgets(group_size=16)                 # 4 rows per budget, in order
  envs = [budget.BudgetEnv(make_env(), b) for _ in seeds for b in budgets]
  trajs, metrics = engine.run(params, tok, envs, [s for s in seeds for _ in budgets], ...)

`BudgetEnv` appends the sentence to the first observation. With `chat_template=False` the
prompt is raw text and the sentence is exactly the prefill; with a chat template it ends the
user message instead, because the rollout renders env text through the template [INF,
docs/algorithms.md §12.2]. The reward and advantage are `length_rewards.hbpo_reward` and
`efficiency.hbpo`, given each row's budget.
"""
from collections.abc import Sequence
import copy

from agentrl.envs import base

BUDGETS = (512, 1024, 2048, 2560)
BUDGET_PROMPT = "<think> I will answer the question with {budget} tokens"


def row_budgets(group_size: int, budgets: Sequence[int] = BUDGETS) -> list[int]:
  """The budget of each of a group's G rows: G/k contiguous rows per budget, in order.

  The official rollout samples n/8 responses for each of 8 prefills, two per budget: with
  n = 16, 4 rollouts per budget.
  """
  k = len(budgets)
  if k < 1 or group_size % k:
    raise ValueError(f"group_size={group_size} must be a positive multiple of the number of "
                     f"budgets ({k}): HBPO splits each group equally.")
  return [int(b) for b in budgets for _ in range(group_size // k)]


class BudgetEnv:
  """`env` whose first observation ends with the budget sentence; steps are `env`'s own."""

  def __init__(self, env: base.Env, budget: int, *, template: str = BUDGET_PROMPT,
               sep: str = ""):
    if budget < 1:
      raise ValueError(f"budget must be a positive token count, got {budget}.")
    self.env, self.budget = env, int(budget)
    self.suffix = sep + template.format(budget=self.budget)

  @property
  def system_prompt(self) -> str:
    return str(getattr(self.env, "system_prompt", ""))

  @property
  def max_turns(self) -> int:
    return int(getattr(self.env, "max_turns", 1))

  # The contract holds whatever `env` does: a seed is checked before `env` sees it, and `env`
  # is not stepped outside an episode.
  @base.episode_reset
  def reset(self, seed: int) -> str:
    return self.env.reset(seed) + self.suffix

  @base.episode_step
  def step(self, action: str) -> base.StepResult:
    return self.env.step(action)

  def rewrap(self, env: base.Env) -> "BudgetEnv":
    """This BudgetEnv (its budget, its episode) around `env`, a fork of its env (envs/base.py,
    "Forking")."""
    other = copy.copy(self)
    other.env = env
    return other
