"""Name -> Env constructor, for configs that pick an environment by string.

A plain dict (style.md §5.7): experiments may equally call the constructors directly. Heavy
optional packages (reasoning-gym, textworld, alfworld) are imported only when their env is
constructed.
"""
from agentrl.envs import alfworld_env
from agentrl.envs import arithmetic
from agentrl.envs import base
from agentrl.envs import calculator
from agentrl.envs import hidden_rule
from agentrl.envs import reasoning_gym_env
from agentrl.envs import textworld_env

ENVS = {
    "arithmetic": arithmetic.ArithmeticEnv,
    "calculator": calculator.CalculatorEnv,
    "hidden_rule": hidden_rule.HiddenRuleEnv,
    "reasoning_gym": reasoning_gym_env.ReasoningGymEnv,
    "textworld": textworld_env.TextWorldEnv,
    "alfworld": alfworld_env.AlfWorldEnv,
}


def make(name: str, /, **kwargs) -> base.Env:
  """ENVS[name](**kwargs), with an error that lists the valid names.

  `name` is positional-only, so an env's own `name` argument (reasoning-gym's dataset) passes
  through: make("reasoning_gym", name="basic_arithmetic").
  """
  if name not in ENVS:
    raise ValueError(f"Unknown env {name!r}; choose one of {sorted(ENVS)}.")
  return ENVS[name](**kwargs)
