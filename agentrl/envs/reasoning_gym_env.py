"""reasoning-gym adapter: any of its ~100 procedural generators as a one-step Env.

reasoning-gym (Stojanovski et al. 2025) generates an entry {"question", "answer", "metadata"}
per index and scores an answer string with the generator's own `score_answer(answer, entry)`
in [0, 1]. Here `reset(seed)` returns the question of entry `seed`, and `step(completion)`
extracts the answer from the completion and returns that score.

Answer extraction (`answer_mode`, agentrl.rewards.extract): by default the content of the
last <answer>...</answer> (reasoning-gym's own convention and the format its default system
prompt asks for), falling back to the last non-empty line. A completion with neither scores
0.0 with info["error"] set.

Seeds: entry `seed` comes from a dataset block created with reasoning-gym seed
`seed_offset + 1024 * (seed // 1024)`; generators that derive item i from Random(seed + i)
(most of them) therefore give the same question and answer as reasoning-gym's own dataset at
index `seed` (metadata["source_index"] is block-local; entries carry the agentrl seed under
"seed", and are scored by the dataset block that generated them).
Some generators (boxnet, graph_color, propositional_logic, rubiks_cube, rush_hour) accept
several answers and do not score their own "answer" field as 1.0 (docs/offline.md §4).

Requires the `envs` extra (pip install -e '.[envs]'); it is imported only when an env or task
is constructed.
"""
import collections
import copy
import functools
import math
import pickle

from agentrl.envs import base
from agentrl.envs import safe
from agentrl.rewards import bounded
from agentrl.rewards import extract

_BLOCK = 1024
_CACHED_BLOCKS = 4
INSTALL_HINT = "pip install -e '.[envs]'"


def import_reasoning_gym():
  try:
    import reasoning_gym  # pylint: disable=g-import-not-at-top
    import reasoning_gym.utils  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise ImportError("The reasoning-gym environments need the 'reasoning-gym' package; "
                      f"install it with: {INSTALL_HINT}") from e
  return reasoning_gym


class ReasoningGymTask:
  """seed -> entry, and the generator's scorer, for one named reasoning-gym dataset.

  Scorers parse model text with sympy, which can compute for ever holding the GIL (an answer of
  `10**10**10`), so they run in `agentrl.rewards.bounded`'s worker processes: an answer whose
  scoring takes more than verify_timeout_s seconds, or more memory than the workers' limit,
  scores 0.0. Some scorers hand the answer to sympy's `parse_expr` or to `eval`; in those
  workers both evaluate only an allow-list of expressions (`agentrl.rewards.untrusted`), so an
  answer such as `__import__('os').system(...)` scores 0.0 and runs nothing.
  """

  def __init__(self, name: str, *, seed_offset: int = 0, answer_mode: str = "tag_or_last_line",
               verify_timeout_s: float = bounded.DEFAULT_TIMEOUT_S, **config):
    if not verify_timeout_s > 0:
      raise ValueError(f"verify_timeout_s must be positive, got {verify_timeout_s}.")
    rg = import_reasoning_gym()
    if name not in rg.factory.DATASETS:
      raise ValueError(f"Unknown reasoning-gym dataset {name!r}; choose one of "
                       f"{sorted(rg.factory.DATASETS)}.")
    extract.extract("", answer_mode)  # validates the mode
    self.name, self.seed_offset, self.answer_mode, self.config = (name, seed_offset,
                                                                  answer_mode, config)
    self.verify_timeout_s = verify_timeout_s
    self._rg = rg
    self._blocks = collections.OrderedDict()
    self.block_dataset(0)  # fails now, not mid-rollout, on a bad config
    self._spec = (name, seed_offset, pickle.dumps(config))  # the task, rebuilt in a worker

  def copy(self) -> "ReasoningGymTask":
    """This task with a cache of its own holding the same generated blocks, so that two envs
    on different threads never update one cache."""
    other = copy.copy(self)
    other._blocks = collections.OrderedDict(self._blocks)
    return other

  def block_dataset(self, block: int):
    """The generated dataset of seeds [block * 1024, (block + 1) * 1024), cached."""
    if block not in self._blocks:
      self._blocks[block] = self._rg.create_dataset(
          self.name, size=_BLOCK, seed=self.seed_offset + _BLOCK * block, **self.config)
      if len(self._blocks) > _CACHED_BLOCKS:
        self._blocks.popitem(last=False)
    self._blocks.move_to_end(block)
    return self._blocks[block]

  def entry(self, seed: int) -> dict:
    block, index = divmod(int(seed), _BLOCK)
    return {**self.block_dataset(block)[index], "seed": int(seed)}

  def make_problem(self, seed: int) -> dict:
    """{"prompt", "answer", "seed", "entry"} for agentrl.data generator sources."""
    entry = self.entry(seed)
    return {"prompt": entry["question"], "answer": entry["answer"], "seed": seed,
            "entry": entry}

  def score(self, answer: str | None, entry: dict) -> tuple[float, str, dict]:
    """(the generator's own score of an already-extracted answer, error message or "", extra
    info keys: safe.VERIFY_TIMEOUT when the scorer ran past its time or memory limit)."""
    if answer is None:
      return 0.0, "no answer found; put the final answer inside <answer></answer>", {}
    block = int(entry.get("seed", 0)) // _BLOCK
    try:
      value = bounded.call(_score_in_worker, self._spec, answer, entry,
                           timeout_s=self.verify_timeout_s,
                           setup=functools.partial(_prepare_worker, self._spec, block))
    except bounded.LimitExceeded as e:
      return 0.0, f"the answer's verification {e}", {safe.VERIFY_TIMEOUT: True}
    except Exception as e:  # pylint: disable=broad-except
      return 0.0, f"scorer failed on the answer ({type(e).__name__}: {e})", {}
    if not math.isfinite(value):
      return 0.0, "scorer returned a non-finite value", {}
    return value, "", {}

  def score_unbounded(self, answer: str, entry: dict) -> float:
    """The scorer called in this process, unbounded: what `score` runs in a worker."""
    dataset = self.block_dataset(int(entry.get("seed", 0)) // _BLOCK)
    return float(dataset.score_answer(answer=answer, entry=entry))

  def reward(self, completion: str, entry: dict) -> float:
    """Reward function `fn(completion, entry) -> float` (agentrl.rewards signature)."""
    return self.score(extract.extract(completion, self.answer_mode), entry)[0]


_worker_tasks: dict[tuple, ReasoningGymTask] = {}  # in a bounded worker: spec -> task


def _worker_task(spec: tuple) -> ReasoningGymTask:
  if spec not in _worker_tasks:
    name, seed_offset, config = spec
    _worker_tasks[spec] = ReasoningGymTask(name, seed_offset=seed_offset,
                                           **pickle.loads(config))
  return _worker_tasks[spec]


def _prepare_worker(spec: tuple, block: int) -> None:
  """Worker setup: imports reasoning-gym and builds the dataset block, outside the time limit."""
  _worker_task(spec).block_dataset(block)


def _score_in_worker(spec: tuple, answer: str, entry: dict) -> float:
  return _worker_task(spec).score_unbounded(answer, entry)


class ReasoningGymEnv:
  """One-step Env: reset(seed) -> question; step(completion) -> the generator's score."""

  max_turns = 1

  def __init__(self, name: str, *, seed_offset: int = 0, answer_mode: str = "tag_or_last_line",
               system_prompt: str | None = None, **config):
    self.task = ReasoningGymTask(name, seed_offset=seed_offset, answer_mode=answer_mode,
                                 **config)
    if system_prompt is None:
      system_prompt = import_reasoning_gym().utils.SYSTEM_PROMPTS["default"]
    self.system_prompt = system_prompt
    self._entry = None

  @base.episode_reset
  def reset(self, seed: int) -> str:
    self._entry = self.task.entry(seed)
    return self._entry["question"]

  def clone(self) -> "ReasoningGymEnv":
    """A copy in the same state (envs/base.py, "Forking"), with its own entry and task cache."""
    other = copy.copy(self)
    other.task, other._entry = self.task.copy(), copy.deepcopy(self._entry)
    return other

  @base.episode_step
  def step(self, action: str) -> base.StepResult:
    answer = extract.extract(action, self.task.answer_mode)
    reward, error, extra = self.task.score(answer, self._entry)
    return "", reward, True, base.make_info(reward=reward, success=reward == 1.0, error=error,
                                            target=self._entry["answer"], **extra)
