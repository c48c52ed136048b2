"""Weighted composition of reward functions, and per-turn reward helpers.

A composed reward is r = sum_i w_i * r_i(completion, target), e.g. an outcome verifier plus a
small format bonus. `Weighted.breakdown` also returns each term (for metrics), and a term that
raises or returns a non-finite value contributes 0 and is counted under "reward_errors" rather
than crashing the rollout.

Multi-turn environments report a reward per step (`info["reward"]`, see agentrl.envs.base);
`add_outcome` adds a trajectory-level verifier score to the last turn, and `episode_return`
sums (optionally discounts) the per-turn rewards into the scalar outcome reward that GRPO-style
estimators use. Turn-level estimators (agentrl.advantages.estimators) take the per-turn list
instead.
"""
from collections.abc import Callable, Sequence
import dataclasses
import math

RewardFn = Callable[..., float]  # fn(completion: str, target, **hparams) -> float


@dataclasses.dataclass(frozen=True)
class Term:
  name: str
  fn: RewardFn
  weight: float = 1.0


class Weighted:
  """r(completion, target) = sum_i weight_i * fn_i(completion, target)."""

  def __init__(self, terms: Sequence[Term]):
    if not terms:
      raise ValueError("Weighted needs at least one Term(name, fn, weight).")
    names = [t.name for t in terms]
    if len(set(names)) != len(names):
      raise ValueError(f"Weighted term names must be unique, got {names}.")
    for t in terms:
      if not callable(t.fn) or not math.isfinite(t.weight):
        raise ValueError(f"Term {t.name!r}: fn must be callable and weight finite.")
    self.terms = tuple(terms)

  def breakdown(self, completion: str, target=None) -> tuple[float, dict[str, float]]:
    """(total, {term name: unweighted value, "reward_errors": count})."""
    total, parts, errors = 0.0, {}, 0
    for t in self.terms:
      try:
        value = float(t.fn(completion, target))
      except Exception:  # pylint: disable=broad-except
        value = math.nan
      if not math.isfinite(value):
        errors += 1
        value = 0.0
      parts[t.name] = value
      total += t.weight * value
    parts["reward_errors"] = float(errors)
    return total, parts

  def __call__(self, completion: str, target=None) -> float:
    return self.breakdown(completion, target)[0]


def add_outcome(turn_rewards: Sequence[float], outcome: float, *,
                weight: float = 1.0) -> list[float]:
  """Per-turn rewards with weight * outcome added to the last turn (a copy)."""
  if not turn_rewards:
    raise ValueError("add_outcome needs at least one turn reward.")
  out = [float(r) for r in turn_rewards]
  out[-1] += weight * float(outcome)
  return out


def episode_return(turn_rewards: Sequence[float], *, gamma: float = 1.0) -> float:
  """sum_t gamma**t * r_t over the turns of one episode."""
  if not 0.0 <= gamma <= 1.0:
    raise ValueError(f"gamma must be in [0, 1], got {gamma}.")
  return float(sum(gamma**t * float(r) for t, r in enumerate(turn_rewards)))
