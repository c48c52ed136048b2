"""Fault isolation around any Env: exceptions, bad results and long observations never crash.

`safe_step(env, action)` is the functional form; `SafeEnv(env)` also tracks the episode
(turn budget, steps after done, reset failures). Both count every fault in a counters dict
that the agent loop logs as metrics:

  steps, resets              calls seen
  env_errors                 env.reset / env.step raised; the episode is ended
  env_timeouts               env.reset / env.step raised EnvTimeout: the env did not answer
                             in time (isolated.IsolatedEnv killed its worker; it restarts)
  env_crashes                env.reset / env.step raised EnvCrash: the env's worker process
                             died (e.g. a segfault in a game engine); the episode is ended
  invalid_actions            the env rejected the action (info["error"] was set)
  unsafe_actions             the env refused to pass the action to its engine (it set
                             info["unsafe_action"]; also an invalid action)
  verify_timeouts            checking the answer ran past its time or memory limit and was
                             stopped (agentrl.rewards.bounded; the env set
                             info["verify_timeout"]); scored 0, also an invalid action
  empty_actions              the action was empty or whitespace (still passed to the env)
  truncated_observations     an observation was longer than max_obs_chars and was cut
  nonfinite_rewards          the env returned NaN/inf or a non-number; replaced by error_reward
  bad_results                the env returned something other than (str, float, bool, dict)
  steps_after_done           step() before reset() or after the episode ended
  turn_limit                 SafeEnv ended an episode at env.max_turns
"""
import copy
import math
from typing import Any

from agentrl.envs import base

COUNTERS = ("steps", "resets", "env_errors", "env_timeouts", "env_crashes", "invalid_actions",
            "unsafe_actions", "verify_timeouts", "empty_actions", "truncated_observations",
            "nonfinite_rewards", "bad_results", "steps_after_done", "turn_limit")
TRUNCATION_MARK = "\n[observation truncated]"
UNSAFE_ACTION = "unsafe_action"  # info key: the action was refused before reaching the engine
VERIFY_TIMEOUT = "verify_timeout"  # info key: checking the answer ran out of time or memory


class EnvTimeout(TimeoutError):
  """The env did not answer within its time limit (counted as env_timeouts, not env_errors)."""


class EnvCrash(RuntimeError):
  """The process running the env died (counted as env_crashes, not env_errors)."""


def _fault_counter(error: Exception) -> str:
  if isinstance(error, EnvTimeout):
    return "env_timeouts"
  return "env_crashes" if isinstance(error, EnvCrash) else "env_errors"


def new_counters() -> dict[str, int]:
  return dict.fromkeys(COUNTERS, 0)


def truncate(text: str, max_chars: int) -> tuple[str, bool]:
  """(text cut to at most max_chars characters including the mark, whether it was cut)."""
  if len(text) <= max_chars:
    return text, False
  keep = max(0, max_chars - len(TRUNCATION_MARK))
  return (text[:keep] + TRUNCATION_MARK)[:max_chars], True


_error_result = base.error_result  # the same answer as a built-in env's step outside an episode


def _validate(result: Any, counters: dict[str, int], error_reward: float) -> base.StepResult:
  """Coerces an env's step result to the contract, counting what had to be repaired."""
  if not (isinstance(result, tuple) and len(result) == 4):
    counters["bad_results"] += 1
    return _error_result(f"env.step returned {type(result).__name__}, expected a "
                         "(observation, reward, done, info) tuple", error_reward)
  obs, reward, done, info = result
  if not isinstance(obs, str) or not isinstance(info, dict):
    counters["bad_results"] += 1
    return _error_result("env.step returned a non-str observation or non-dict info",
                         error_reward)
  info = dict(info)
  try:
    reward = float(reward)
  except (TypeError, ValueError):
    reward = math.nan
  if not math.isfinite(reward):
    counters["nonfinite_rewards"] += 1
    info[base.ERROR] = info.get(base.ERROR) or f"non-finite reward {result[1]!r}"
    reward = error_reward
  info.setdefault(base.SUCCESS, False)
  info.setdefault(base.ERROR, "")
  info[base.REWARD] = reward
  return obs, reward, bool(done), info


def safe_step(env: base.Env, action: str, *, counters: dict[str, int] | None = None,
              max_obs_chars: int = 4096, error_reward: float = 0.0) -> base.StepResult:
  """env.step(action) that never raises; faults become error observations (see module doc)."""
  counters = new_counters() if counters is None else counters
  counters["steps"] += 1
  if not isinstance(action, str):
    action = "" if action is None else str(action)
  if not action.strip():
    counters["empty_actions"] += 1
  try:
    result = env.step(action)
  except Exception as e:  # pylint: disable=broad-except
    counters[_fault_counter(e)] += 1
    obs, reward, done, info = _error_result(
        f"the environment failed ({type(e).__name__}: {e})", error_reward)
  else:
    obs, reward, done, info = _validate(result, counters, error_reward)
    counters["invalid_actions"] += int(bool(info[base.ERROR]))
    counters["unsafe_actions"] += int(bool(info.get(UNSAFE_ACTION)))
    counters["verify_timeouts"] += int(bool(info.get(VERIFY_TIMEOUT)))
  obs, cut = truncate(obs, max_obs_chars)
  counters["truncated_observations"] += int(cut)
  info["truncated"] = cut
  return obs, reward, done, info


class SafeEnv:
  """Wraps an Env so that reset/step never raise and the turn budget is enforced."""

  def __init__(self, env: base.Env, *, max_obs_chars: int = 4096, error_reward: float = 0.0):
    if max_obs_chars < len(TRUNCATION_MARK):
      raise ValueError(f"max_obs_chars={max_obs_chars} is too small; use at least "
                       f"{len(TRUNCATION_MARK)}.")
    self.env = env
    self.max_obs_chars = max_obs_chars
    self.error_reward = error_reward
    self.counters = new_counters()
    self.reset_error = ""
    self._turn = 0
    self._done = True

  @property
  def system_prompt(self) -> str:
    return str(getattr(self.env, "system_prompt", ""))

  @property
  def max_turns(self) -> int:
    return int(getattr(self.env, "max_turns", 1))

  @property
  def examples(self) -> tuple:
    """Few-shot chat messages shown before the task (agentrl/envs/few_shot.py); () if none."""
    return tuple(getattr(self.env, "examples", ()))

  def reset(self, seed: int) -> str:
    """env.reset(seed); on failure returns an error observation and sets `reset_error`."""
    self.counters["resets"] += 1
    self._turn, self.reset_error = 0, ""
    try:
      obs = self.env.reset(seed)
      if not isinstance(obs, str):
        raise TypeError(f"reset returned {type(obs).__name__}, expected str")
    except Exception as e:  # pylint: disable=broad-except
      self.counters[_fault_counter(e)] += 1
      self.reset_error = f"the environment failed to reset ({type(e).__name__}: {e})"
      self._done = True
      return truncate(f"Error: {self.reset_error}", self.max_obs_chars)[0]
    self._done = False
    obs, cut = truncate(obs, self.max_obs_chars)
    self.counters["truncated_observations"] += int(cut)
    return obs

  def step(self, action: str) -> base.StepResult:
    if self._done:
      self.counters["steps_after_done"] += 1
      message = self.reset_error or "step() called before reset() or after the episode ended"
      return _error_result(message, self.error_reward)
    obs, reward, done, info = safe_step(self.env, action, counters=self.counters,
                                        max_obs_chars=self.max_obs_chars,
                                        error_reward=self.error_reward)
    self._turn += 1
    if not done and self._turn >= self.max_turns:
      self.counters["turn_limit"] += 1
      done = True
      info["turn_limit"] = True
    self._done = done
    return obs, reward, done, info

  def rewrap(self, env: base.Env) -> "SafeEnv":
    """This SafeEnv's episode state (turn, done, reset error) and a copy of its counters,
    around `env`, a fork of its env (envs/base.py, "Forking"). Counters are totals since
    construction: rollout metrics are each env's counters minus their value when it joined
    (agent_loop.env_metrics), so a fork's copied totals are not counted twice."""
    other = copy.copy(self)
    other.env, other.counters = env, dict(self.counters)
    return other

  def metrics(self) -> dict[str, float]:
    """Counters as floats, for the metrics dict of a step."""
    return {f"env/{k}": float(v) for k, v in self.counters.items()}
