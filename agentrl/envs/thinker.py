"""A thinker role inside hidden-rule episodes (TTExplore, arXiv 2605.24828; docs/algorithms.md
§5.7).

TTExplore splits an agent in two: a *thinker* reads the interaction history and writes its
inference of the hidden rule into the context of an *actor*, which goes on acting. Here both
roles are the same policy: `ThinkerEnv` wraps a `HiddenRuleEnv` and, before the game turns its
`schedule` picks, ends the observation with a think cue. The model's reply to the cue is a
*thought*: it is not a game command, does not use a game turn, and stays in the transcript,
where the actor's next turn reads it; the env answers it with the act cue. In the compact
style of the number-guessing game:

  number 1-100? guess X: higher/lower (7 turns) | guess 50 | higher think | 51-100 | act |
  guess 75 | lower think | 51-74 | act | guess 62 | ...

`demonstration` is the hidden-rule expert's game with the ideal thought (`HiddenRuleEnv.belief`:
the range the feedback leaves open) at every think cue, the supervised warm start's data.
`thought_turns` finds a trajectory's thoughts and `keep_one_thought` keeps one of them as the
trajectory's only training sample (TTExplore trains the thinker on one thinking node per
trajectory, so one task-level reward is not spread over many thoughts); `shared_thought_turn`
picks one node for a whole group, so its members' thoughts are compared at the same point.

Step infos carry `thought` (bool) and, on thoughts, `thought_correct` (the thought states the
ideal belief); a thought step's reward is 0 and its `success` False, so a trajectory's reward and
success are the game's.
"""
import collections
import copy
import random
from typing import Sequence

import numpy as np

from agentrl.envs import base
from agentrl.envs import hidden_rule

SCHEDULES = ("every", "once", "never")
# The think and act cues, by hidden_rule style: the observation before a thought ends with the
# think cue; a thought is answered with the act cue.
THINK_CUE = {"compact": "think",
             "full": "Before your next command, write only what you have inferred about the "
                     "hidden rule so far (no command)."}
ACT_CUE = {"compact": "act", "full": "Now give your next command."}
_ONCE_SALT = 0x7417   # the `once` schedule's turn draw: not the game's own random stream


class ThinkerEnv:
  """A hidden-rule game with thinker turns (the module docstring); an Env (envs/base.py).

  Args:
    family: a hidden_rule family with a stated belief (hidden_rule.BELIEF_FAMILIES).
    max_turns: the game's turns (commands); the env's own `max_turns`, the model turns an
      episode may take, adds one per scheduled thought.
    style: hidden_rule.STYLES.
    schedule: "every" (think before every game turn from `first` on: the thinker is called
      periodically), "once" (before one game turn drawn uniformly from [first, max_turns) per
      seed) or "never" (the plain game, the actor alone).
    first: the first game turn a thought may precede (0 would think before any feedback).
    invalid_penalty: the game's reward for an unparsable command (hidden_rule).
  """

  def __init__(self, family: str = "guess", *, max_turns: int = 7, style: str = "compact",
               schedule: str = "every", first: int = 1, invalid_penalty: float = 0.0):
    if family not in hidden_rule.BELIEF_FAMILIES:
      raise ValueError(f"family={family!r}: the thinker's demonstrations need a family whose "
                       f"episodes state a belief, one of {hidden_rule.BELIEF_FAMILIES}.")
    if schedule not in SCHEDULES:
      raise ValueError(f"schedule={schedule!r} must be one of {SCHEDULES}.")
    if not 0 <= first < max_turns:
      raise ValueError(f"first={first} must be in [0, max_turns={max_turns}).")
    self.game = hidden_rule.HiddenRuleEnv(family, max_turns=max_turns, style=style,
                                          invalid_penalty=invalid_penalty)
    self.family, self.style, self.schedule, self.first = family, style, schedule, first
    self.game_turns = max_turns
    thoughts = {"every": max_turns - first, "once": 1, "never": 0}[schedule]
    self.max_turns = max_turns + thoughts   # model turns (envs/base.py contract)
    self._think_at: set[int] = set()
    self._played, self._awaiting = 0, False

  @property
  def system_prompt(self) -> str:
    return self.game.system_prompt

  def think_turns(self, seed: int) -> set[int]:
    """The game turns (0-based) that a thought precedes in the episode of `seed`."""
    if self.schedule == "never":
      return set()
    if self.schedule == "every":
      return set(range(self.first, self.game_turns))
    return {random.Random(seed * 1_000_003 + _ONCE_SALT).randrange(self.first, self.game_turns)}

  @base.episode_reset
  def reset(self, seed: int) -> str:
    obs = self.game.reset(seed)
    self._think_at, self._played = self.think_turns(seed), 0
    return self._cue(obs)

  def clone(self) -> "ThinkerEnv":
    """A copy in the same state (envs/base.py, "Forking"): the game's clone, the schedule's
    place in it."""
    other = copy.copy(self)
    other.game, other._think_at = self.game.clone(), set(self._think_at)
    return other

  def _cue(self, obs: str) -> str:
    """Appends the think cue when the next game turn has a thought before it."""
    self._awaiting = self._played in self._think_at
    return f"{obs} {THINK_CUE[self.style]}" if self._awaiting else obs

  @base.episode_step
  def step(self, action: str) -> base.StepResult:
    if self._awaiting:   # a thought: kept in the transcript, no game turn used
      self._awaiting = False
      # thought_correct: the thought states the ideal player's belief (a diagnostic only:
      # the thinker's reward is the game's outcome).
      correct = " ".join(action.split()) == self.game.belief
      return ACT_CUE[self.style], 0.0, False, base.make_info(reward=0.0, thought=True,
                                                             thought_correct=correct)
    obs, reward, done, info = self.game.step(action)
    self._played += 1
    return (obs if done else self._cue(obs)), reward, done, {**info, "thought": False}

  def demonstration(self, seed: int, rng: random.Random, *, noise: float = 0.0) -> list[str]:
    """The expert's commands (hidden_rule, `noise` as there) with the ideal thought (the game's
    `belief` after the feedback so far) before every scheduled turn. Leaves this env's own
    episode alone."""
    commands = self.game.demonstration(seed, rng, noise=noise)
    replay = hidden_rule.HiddenRuleEnv(self.family, max_turns=self.game_turns,
                                       style=self.style)
    replay.reset(seed)
    think_at, actions = self.think_turns(seed), []
    for turn, command in enumerate(commands):
      if turn in think_at:
        actions.append(replay.belief)
      actions.append(command)
      if replay.step(command)[2]:
        break
    return actions

  @property
  def answer(self) -> str:
    return self.game.answer

  @property
  def gold_action(self) -> str:
    return self.game.gold_action


def thought_turns(infos: Sequence[dict]) -> list[int]:
  """The model turns (indices into a trajectory's step infos) that were thoughts."""
  return [u for u, info in enumerate(infos) if info.get("thought")]


def keep_one_thought(turn_T: np.ndarray, loss_mask_T: np.ndarray, infos: Sequence[dict],
                     rng: np.random.Generator, *, at: int | None = None) -> tuple[np.ndarray, int]:
  """(loss mask on one thought's tokens only, that thought's turn or -1).

  The kept thought is model turn `at` when given (none if turn `at` is not a thought of this
  trajectory, or at = -1), else one drawn uniformly (`rng`) among the trajectory's thoughts.
  Its sampled tokens keep their loss-mask values; every other token (the prompt, the
  observations, the actor's commands, the other thoughts) gets 0. Without a kept thought the
  mask is all zero.
  """
  thoughts = thought_turns(infos)
  if at is None:
    at = int(thoughts[rng.integers(len(thoughts))]) if thoughts else -1
  if at not in thoughts:
    return np.zeros_like(loss_mask_T), -1
  return np.where(turn_T == at, loss_mask_T, 0).astype(loss_mask_T.dtype), at


def shared_thought_turn(group_infos: Sequence[Sequence[dict]], rng: np.random.Generator) -> int:
  """A model turn drawn uniformly among those at which at least two of a group's trajectories
  wrote a thought (-1 if there is none): the one thinking node its members are compared at.

  Comparing thoughts written at the same point removes a bias of drawing each trajectory's
  node on its own: late thoughts exist only in long episodes, which are mostly failures, so
  they would be pushed down for where they sit, not for what they say.
  """
  counts = collections.Counter(u for infos in group_infos for u in thought_turns(infos))
  shared = sorted(u for u, n in counts.items() if n >= 2)
  return int(shared[rng.integers(len(shared))]) if shared else -1
