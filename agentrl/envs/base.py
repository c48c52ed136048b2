"""The environment protocol shared by every built-in env and by the agent loop.

An environment is host Python that talks text (docs/architecture.md §3):

  obs = env.reset(seed)                          # the first user message (task statement)
  obs, reward, done, info = env.step(action)     # one model turn -> one env turn

Single-turn verifiable tasks are one-step envs: `step(completion)` scores the completion and
returns done=True.

What the agent loop (agentrl/rollout/agent_loop.py) may rely on, for every built-in env and
for any env wrapped in `agentrl.envs.safe.SafeEnv`:

  - `env.system_prompt: str`  instructions to put in the system message ("" if none).
  - `env.max_turns: int >= 1` the env returns done=True at the latest on that step.
  - `reset(seed: int) -> str` is deterministic in `seed` (same seed, same task, same
    observations for the same actions). It may be called again to start a new episode.
  - `step(action: str)` returns (observation: str, reward: float, done: bool, info: dict):
      observation  the env's reply, to be tokenized as context (loss_mask 0); may be "" when
                   done.
      reward       finite float for THIS turn (per-turn reward; the episode's outcome is the
                   sum unless an env documents otherwise).
      done         True when the episode ended (success, failure or turn budget).
      info         dict with at least these keys (`make_info` builds them):
                     "success": bool  the task is solved (stays True once reached);
                     "error":   str   "" or why the action was rejected / the env failed
                                      (unparseable action, bad tool call, exception text);
                     "reward":  float the same value as the returned reward.
                   Envs may add more keys (e.g. TextWorld's "admissible_commands", "score").
  - `step` never raises on model text: malformed, empty or malicious actions become an error
    observation with info["error"] set and a zero or small negative reward. Env bugs may still
    raise; `SafeEnv` turns those into error observations too and counts them.

Only actions after `reset` and before done are defined; `SafeEnv` answers others with an error
observation.
"""
from typing import Any, Protocol, runtime_checkable

Info = dict[str, Any]
StepResult = tuple[str, float, bool, Info]

SUCCESS = "success"
ERROR = "error"
REWARD = "reward"
REQUIRED_INFO_KEYS = (SUCCESS, ERROR, REWARD)


@runtime_checkable
class Env(Protocol):
  """Text environment: reset(seed) -> observation; step(action) -> (obs, reward, done, info)."""

  system_prompt: str
  max_turns: int

  def reset(self, seed: int) -> str:
    ...

  def step(self, action: str) -> StepResult:
    ...


def make_info(*, reward: float, success: bool = False, error: str = "", **extra) -> Info:
  """The info dict of one step, with the required keys first."""
  return {SUCCESS: bool(success), ERROR: str(error), REWARD: float(reward), **extra}
