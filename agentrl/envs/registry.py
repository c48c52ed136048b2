"""Name -> Env constructor, for configs that pick an environment by string.

A plain dict: experiments may equally call the constructors directly. The engine-backed games
(TextWorld, ALFWorld) are built isolated in a worker process (`envs/isolated.py`); construct
the classes directly for an in-process env. Heavy optional packages (reasoning-gym, textworld,
alfworld, rank-bm25) are imported only when their env is constructed.
"""
from agentrl.envs import alfworld_env
from agentrl.envs import arithmetic
from agentrl.envs import base
from agentrl.envs import calculator
from agentrl.envs import hidden_rule
from agentrl.envs import reasoning_gym_env
from agentrl.envs import search
from agentrl.envs import textworld_env
from agentrl.envs import tool_use

ENVS = {
    "arithmetic": arithmetic.ArithmeticEnv,
    "calculator": calculator.CalculatorEnv,
    "hidden_rule": hidden_rule.HiddenRuleEnv,
    "reasoning_gym": reasoning_gym_env.ReasoningGymEnv,
    "tool_use": tool_use.ToolUseEnv,
    # Builds (once per process) the BM25 index of its generated corpus; needs rank-bm25.
    "search": search.SearchEnv,
    # Engine-backed games run in a worker process: a hang or crash costs one episode.
    "textworld": textworld_env.TextWorldEnv.isolated,
    "alfworld": alfworld_env.AlfWorldEnv.isolated,
}


def make(name: str, /, **kwargs) -> base.Env:
  """ENVS[name](**kwargs), with an error that lists the valid names.

  `name` is positional-only, so an env's own `name` argument (reasoning-gym's dataset) passes
  through: make("reasoning_gym", name="basic_arithmetic").
  """
  if name not in ENVS:
    raise ValueError(f"Unknown env {name!r}; choose one of {sorted(ENVS)}.")
  return ENVS[name](**kwargs)
