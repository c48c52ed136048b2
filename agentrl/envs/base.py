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
  - `reset(seed) -> str` starts a new episode, whatever came before, and is deterministic in
    `seed` (same seed, same task, same observations for the same actions).
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
                   Optional keys the library reads when present:
                     "progress": float in [0, 1]  how far this turn got (the per-turn
                                      progress signal turn-level credit can read, e.g.
                                      agentrl/credit/mapo.py): the tool envs give the
                                      fraction of the turn's calls that ran without error
                                      (tool_use: and match a gold call), 0.0 for a turn
                                      with no call, the reward on the answer turn;
                     "step_ok": float 1.0 or 0.0  whether this turn was a correct step by
                                      the env's own check (a verifiable step label: process
                                      reward models, VPPO's first error); hidden_rule's
                                      `guess` family sets it on every turn (STEP_OK);
                     "tool_results": list[str]  the tool messages of a turn of tool calls,
                                      one per call, each a part of the observation
                                      (envs/tool_calls.py); the agent loop renders them
                                      in the chat template's tool role where it has one.
  - optional `env.examples`: chat messages ({"role": "user" | "assistant", "content": str,
    optional "tool_results"}) rendered between the system message and the task, the few-shot
    demonstrations of envs/few_shot.py; () when absent.
  - `step` never raises on model text: malformed, empty or malicious actions become an error
    observation with info["error"] set and a zero or small negative reward. Env bugs may still
    raise; `SafeEnv` turns those into error observations too and counts them.

Seeds. A seed is an int in [0, SEED_LIMIT): a Python int or a numpy integer, never a bool,
float, str or None. Anything else makes reset raise ValueError naming the seed (`check_seed`):
a negative seed does not alias a positive one, a float or a str does not alias an int, and
None does not mean "random" (every episode is reproducible from its seed). SEED_LIMIT is
2**32, the range numpy's seeding accepts, which TextWorld's game generator and some
reasoning-gym generators use; the training, held-out, SFT and validation seed ranges
(agentrl/data/generators.py, envs/arithmetic.py) lie below it.

Episodes. An episode is open from a reset that returned until a step that returned done=True
(or raised). A step outside an episode (before any reset, after done, or after a reset that
raised) pays nothing and changes nothing: it returns `outside_episode()`, an error observation
with reward 0.0, done=True and info["error"] set, as `SafeEnv` does, and never raises. A reset
that raises (a bad seed, a failed game generation) leaves no episode open, so the previous
episode cannot go on. Every built-in env and wrapper (BudgetEnv, ThinkerEnv, IsolatedEnv) gets
both rules, and the seed check, from the `episode_reset` and `episode_step` decorators on its
reset and step; an env of your own can use them too (SafeEnv enforces the episode rule on any
env it wraps).

Forking (branching rollouts: agentrl/envs/fork.py). A fork of an env is a new, independent env
object in the same state: the same episode open (or none), the same turn count, the same
internal randomness, so that the same next actions give the same observations, rewards, done
and infos, and stepping either leaves the other alone. An env offers it in one of two ways:

  - optional `clone() -> Env`: the fork itself, by copying the env's state (mutable parts
    copied deeply). The in-process built-ins have it (arithmetic, verbose_arithmetic,
    reasoning_gym, hidden_rule, thinker, calculator, tool_use, search).
  - replay: a new env with no episode, `reset(seed)`, then `step(a)` for each action of the
    episode so far. Every env is deterministic in (seed, actions) by the contract above, so
    this reaches the same state; the new env comes from the optional `fresh() -> Env` (a new
    instance of the same configuration, no episode open), else from `clone()`. TextWorld,
    ALFWorld and any env run in a worker process (IsolatedEnv) replay.
  - optional `replayable: bool` (absent: True). An env that is not deterministic in (seed,
    actions), e.g. one backed by a live external service, sets it False; without clone() it
    cannot be forked, and branching refuses it with a one-line error naming its class.

A wrapper (SafeEnv, BudgetEnv, FewShotEnv) holds the env it wraps in `env` and offers
`rewrap(env) -> wrapper`: a new wrapper in its own current state around `env`, a fork of the
wrapped env. A fork of a wrapped env is the fork of the innermost env, rewrapped layer by layer;
a replay then runs through the wrappers, so their episode state (a SafeEnv's turn count, a
budget) is the replayed prefix's, and a fork may go back to an earlier point of the episode.
"""
import functools
import numbers
from typing import Any, Protocol, runtime_checkable

Info = dict[str, Any]
StepResult = tuple[str, float, bool, Info]

SUCCESS = "success"
ERROR = "error"
REWARD = "reward"
REQUIRED_INFO_KEYS = (SUCCESS, ERROR, REWARD)
STEP_OK = "step_ok"   # optional info key (module docstring)
SEED_LIMIT = 2**32
NO_EPISODE = ("no episode: step() came before reset(seed), after the episode ended or after a "
              "reset that failed")
_OPEN = "_episode_open"  # the env attribute `episode_reset` and `episode_step` keep


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


def error_result(message: str, reward: float = 0.0) -> StepResult:
  """A step result that ends the episode with an error observation and `reward`."""
  return f"Error: {message}", reward, True, make_info(reward=reward, error=message)


def outside_episode() -> StepResult:
  """What a step outside an episode returns (module docstring, "Episodes")."""
  return error_result(NO_EPISODE)


def check_seed(seed: Any) -> int:
  """`seed` as a Python int; ValueError unless it is an int in [0, SEED_LIMIT) (module doc)."""
  if (isinstance(seed, bool) or not isinstance(seed, numbers.Integral)
      or not 0 <= seed < SEED_LIMIT):
    raise ValueError(f"seed={seed!r:.50} is not a valid seed: use an int in [0, 2**32) (a "
                     "Python or numpy integer; not negative, a bool, a float, a str or None).")
  return int(seed)


def close_episode(env) -> None:
  """Leaves `env` with no episode open, as a step that returned done does (for `fresh()`
  copies of an env that may hold an open episode)."""
  setattr(env, _OPEN, False)


def episode_reset(reset):
  """Decorates an env's reset: checks the seed, and opens an episode only if reset returns."""

  @functools.wraps(reset)
  def checked_reset(self, seed):
    setattr(self, _OPEN, False)  # a reset that raises leaves no episode, whatever came before
    obs = reset(self, check_seed(seed))
    setattr(self, _OPEN, True)
    return obs

  return checked_reset


def episode_step(step):
  """Decorates an env's step: outside an episode it returns `outside_episode()` without
  calling `step`; a step that returns done (or raises) closes the episode."""

  @functools.wraps(step)
  def checked_step(self, action):
    if not getattr(self, _OPEN, False):
      return outside_episode()
    setattr(self, _OPEN, False)
    result = step(self, action)
    setattr(self, _OPEN, not result[2])
    return result

  return checked_step
