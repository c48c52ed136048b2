"""Hidden-rule text games: the rule must be inferred through interaction.

The setting studied for test-time exploration in LLM agents (TTExplore): the task cannot be
solved from the first observation; the agent must spend turns on informative queries, read
per-turn feedback, and then commit. Each `reset(seed)` draws a fresh secret procedurally
(`random.Random(seed)`), so episodes are reproducible per seed and unbounded in number.

Families (`family=`, or "mixed" to draw one per seed):

  transform   secret f(x) = a*x + b or a*x*x + b; `query X` shows f(X); `answer Y` gives f(T).
  guess       secret integer in [1, 100]; `guess X` answers "higher"/"lower"/"correct".
  cipher      secret letter substitution over a-h; `encode ABC` (<= 3 letters) shows the
              ciphertext; `answer WORD` decodes the given secret word.
  category    secret number rule (even, prime, multiple of k, greater than T, ...) with two
              examples; `test X` says whether X follows it (candidates may not be tested);
              `answer X` picks the single candidate that follows it.

Styles (`style=`): "full" (the texts above, for instruction-tuned models) or "compact"
(a one-line task and terse replies such as "higher", "f(3)=20" or "invalid", for tiny
from-scratch models whose cost grows with the transcript's length); the games are the same.

Actions: the command is read from <action>...</action> if present, else from the last
non-empty line of the model's text; only the text's last `extract.MAX_TEXT_CHARS` characters
are read, in linear time. Rewards: 1.0 on solving (episode ends), 0.0 for a wrong
final answer (episode ends; wrong guesses in `guess` do not end it), `invalid_penalty` (<= 0)
for a turn whose command cannot be parsed or is not allowed, 0.0 otherwise. With
`closeness_reward` = c > 0 a failed `guess` episode ends with c times how far its feedback had
narrowed the secret down (1 - ln(width of the open range) / ln 100), so every episode's reward
is graded (a shaped reward: `success` stays the game's outcome, and a failure earns at most
c < 1, less than a solve). Families without a graded notion of progress ignore it.

Checked steps: in the families of CHECKED_FAMILIES every turn's info carries
info["step_ok"] (`base.STEP_OK`), 1.0 or 0.0: whether the turn is a correct step by the game's
own check, a verifiable step label (for process reward models, or VPPO's first error). In
`guess` a turn is a mistake (0.0) if its command is invalid (unparseable, another verb, outside
[1, 100]) or its guess lies outside the range the feedback so far leaves open (which covers
repeating a number already ruled out); every other guess, the winning one included, is correct
(1.0). The other families have no such check and no key: a `transform` query, a `cipher`
encoding or a `category` test is informative or not only in hindsight, and their answer turns
are the outcome itself.

`demonstration(seed, rng, noise=...)` is a scripted expert's actions for the episode of
`seed`, the supervised warm start's data for a from-scratch policy (agentrl/harness/sft.py): it
knows the secret and plays as a player who reads the feedback would (binary search in `guess`;
three queries, then the answer, in `transform`; three encodings, then the decoded word, in
`cipher`; two tests, then the answer, in `category`). With probability `noise` each exploring
action is a random allowed one instead (in `guess`: a random number still consistent with the
feedback), so the data are not one fixed script.
"""
from collections.abc import Callable
import copy
import dataclasses
import math
import random
import re

from agentrl.envs import base
from agentrl.rewards import extract

FAMILIES = ("transform", "guess", "cipher", "category")
BELIEF_FAMILIES = ("guess",)    # families whose episodes state a belief (HiddenRuleEnv.belief)
CHECKED_FAMILIES = ("guess",)   # families whose infos carry base.STEP_OK (module docstring)
STYLES = ("full", "compact")
SYSTEM_PROMPT = (
    "You are playing a game with a hidden rule. Explore with the commands described in the "
    "task, use the feedback to infer the rule, then give your answer. End every reply with "
    "exactly one command on its own line, e.g. 'query 5' or 'answer 12'.")
_CIPHER_ALPHABET = "abcdefgh"


@dataclasses.dataclass
class _Game:
  intro: str
  verb: str                             # the exploration command
  explore: Callable[[str], tuple[str, bool]]   # argument -> (feedback, solved); ValueError
  answer: str                           # gold, as shown after a failed episode
  # (rng, noise, max_turns) -> the scripted expert's actions (see the module docstring).
  expert: Callable[[random.Random, float, int], list[str]]
  ends_on_answer: bool = True           # False for `guess`, whose verb is also the answer
  # () -> what an ideal player infers from the feedback so far (the thinker's target,
  # envs/thinker.py); None for families without one.
  belief: Callable[[], str] | None = None
  # () -> how far the feedback so far has narrowed the secret down, in [0, 1] (1: known);
  # None for families without a graded notion of progress.
  closeness: Callable[[], float] | None = None
  # argument -> whether exploring with it is a correct step given the feedback so far, read
  # before `explore` (which updates `state`); ValueError as explore. None for families without
  # a per-step check (module docstring, "Checked steps").
  step_ok: Callable[[str], bool] | None = None
  # What the closures above read and write as the episode goes on (`guess`: the range the
  # feedback leaves open); the rest is fixed by the seed. HiddenRuleEnv.clone copies it.
  state: dict = dataclasses.field(default_factory=dict)


def _explore_then_answer(script: list[str], answer: str,
                         random_action: Callable[[random.Random], str]):
  """An expert that runs `script` (each action replaced by random_action with probability
  `noise`), cut to leave one turn, then answers."""

  def expert(rng: random.Random, noise: float, max_turns: int) -> list[str]:
    actions = [random_action(rng) if rng.random() < noise else a for a in script]
    return actions[:max_turns - 1] + [f"answer {answer}"]

  return expert


def _int_arg(arg: str, lo: int, hi: int) -> int:
  if not re.fullmatch(r"[-+]?\d{1,6}", arg):
    raise ValueError(f"expected an integer, got {arg[:40]!r}")
  x = int(arg)
  if not lo <= x <= hi:
    raise ValueError(f"{x} is outside [{lo}, {hi}]")
  return x


def _transform(rng: random.Random, compact: bool) -> _Game:
  a, b, target = rng.randint(2, 9), rng.randint(-20, 20), rng.randint(20, 99)
  quadratic = rng.random() < 0.5
  f = (lambda x: a * x * x + b) if quadratic else (lambda x: a * x + b)

  def explore(arg):
    x = _int_arg(arg, -100, 100)
    if x == target:
      raise ValueError(f"you may not query the target input {target}")
    return (f"f({x})={f(x)}" if compact else f"f({x}) = {f(x)}"), False

  intro = (f"f({target})=? query X: f(X); answer Y" if compact else
           f"A secret function f maps integers to integers. What is f({target})?\n"
           "Commands: 'query X' shows f(X) for an integer -100 <= X <= 100 (except "
           f"{target}); 'answer Y' submits your value of f({target}) (one attempt).")
  # f(0), f(1), f(2) give b, a and whether f is linear or quadratic.
  expert = _explore_then_answer(["query 0", "query 1", "query 2"], str(f(target)),
                                lambda r: f"query {r.randint(-10, 10)}")
  return _Game(intro, "query", explore, str(f(target)), expert)


def _guess(rng: random.Random, compact: bool) -> _Game:
  secret = rng.randint(1, 100)
  known = {"lo": 1, "hi": 100}   # the range the feedback so far leaves open

  def explore(arg):
    x = _int_arg(arg, 1, 100)
    if x == secret:
      return ("correct" if compact else f"{x} is correct!"), True
    way = "higher" if secret > x else "lower"
    if way == "higher":
      known["lo"] = max(known["lo"], x + 1)
    else:
      known["hi"] = min(known["hi"], x - 1)
    return (way if compact else f"{x} is wrong: the secret number is {way}."), False

  def belief():
    lo, hi = known["lo"], known["hi"]
    return f"{lo}-{hi}" if compact else f"The secret number is between {lo} and {hi}."

  def step_ok(arg):  # still consistent with every reply so far
    return known["lo"] <= _int_arg(arg, 1, 100) <= known["hi"]

  def closeness():  # the share of the ln 100 nats of uncertainty the feedback has removed
    return 1.0 - math.log(known["hi"] - known["lo"] + 1) / math.log(100)

  def expert(rng: random.Random, noise: float, max_turns: int) -> list[str]:
    actions, lo, hi = [], 1, 100
    while len(actions) < max_turns:
      x = rng.randint(lo, hi) if rng.random() < noise else (lo + hi) // 2
      actions.append(f"guess {x}")
      if x == secret:
        break
      lo, hi = (x + 1, hi) if secret > x else (lo, x - 1)
    return actions

  intro = ("number 1-100? guess X: higher/lower" if compact else
           "I am thinking of an integer between 1 and 100. Find it.\n"
           "Command: 'guess X'; I will answer 'higher', 'lower' or 'correct'.")
  return _Game(intro, "guess", explore, str(secret), expert, ends_on_answer=False,
               belief=belief, closeness=closeness, step_ok=step_ok, state=known)


def _cipher(rng: random.Random, compact: bool) -> _Game:
  shuffled = list(_CIPHER_ALPHABET)
  rng.shuffle(shuffled)
  key = dict(zip(_CIPHER_ALPHABET, shuffled))
  word = "".join(rng.choice(_CIPHER_ALPHABET) for _ in range(4))
  secret = "".join(key[c] for c in word)

  def explore(arg):
    text = arg.lower()
    if not re.fullmatch(f"[{_CIPHER_ALPHABET}]{{1,3}}", text):
      raise ValueError(f"encode takes 1 to 3 letters from '{_CIPHER_ALPHABET}'")
    code = "".join(key[c] for c in text)
    return (f"{text}={code}" if compact else f"encode({text}) = {code}"), False

  intro = (f"decode {secret}" if compact else
           f"A secret substitution cipher maps each letter of '{_CIPHER_ALPHABET}' to a "
           f"different letter of the same set. Decode the secret word '{secret}'.\n"
           "Commands: 'encode ABC' encrypts 1 to 3 letters; 'answer WORD' submits the "
           "decoded word (one attempt).")
  letters = lambda r: "".join(r.choice(_CIPHER_ALPHABET) for _ in range(r.randint(1, 3)))
  expert = _explore_then_answer(["encode abc", "encode def", "encode gh"], word,
                                lambda r: f"encode {letters(r)}")
  return _Game(intro, "encode", explore, word, expert)


def _is_prime(n: int) -> bool:
  return n > 1 and all(n % k for k in range(2, int(n**0.5) + 1))


def _category(rng: random.Random, compact: bool) -> _Game:
  threshold = rng.randint(20, 40)
  rules = {"even": lambda n: n % 2 == 0, "odd": lambda n: n % 2 == 1,
           "multiple of 3": lambda n: n % 3 == 0, "multiple of 5": lambda n: n % 5 == 0,
           "prime": _is_prime, f"greater than {threshold}": lambda n: n > threshold,
           "digit sum is odd": lambda n: sum(map(int, str(n))) % 2 == 1}
  name = rng.choice(sorted(rules))
  rule = rules[name]
  yes = [n for n in range(1, 61) if rule(n)]
  no = [n for n in range(1, 61) if not rule(n)]
  pos, ex_yes = rng.sample(yes, 2)
  negs = rng.sample(no, 4)
  ex_no, candidates = negs[0], [pos] + negs[1:]
  rng.shuffle(candidates)

  def explore(arg):
    x = _int_arg(arg, 1, 60)
    if x in candidates:
      raise ValueError("the candidates may not be tested")
    if compact:
      return ("yes" if rule(x) else "no"), False
    return f"{x} {'follows' if rule(x) else 'does not follow'} the rule.", False

  intro = (f"{ex_yes} yes, {ex_no} no; which of {candidates}? test X; answer X" if compact else
           f"A secret rule classifies the integers 1 to 60. Example: {ex_yes} follows the "
           f"rule; {ex_no} does not. Exactly one of {candidates} follows it. Which one?\n"
           "Commands: 'test X' tells whether X (1-60, not a candidate) follows the rule; "
           "'answer X' submits the candidate (one attempt).")
  testable = [n for n in range(1, 61) if n not in candidates]
  expert = _explore_then_answer([f"test {n}" for n in rng.sample(testable, 2)], str(pos),
                                lambda r: f"test {r.choice(testable)}")
  return _Game(intro, "test", explore, str(pos), expert)


_MAKERS = {"transform": _transform, "guess": _guess, "cipher": _cipher,
           "category": _category}


def parse_command(action: str) -> tuple[str, str] | None:
  """(verb, argument) from the <action> tag or the last non-empty line; None if absent."""
  text = extract.tag(action, "action")
  text = text if text is not None else extract.last_line(action)
  if not text:
    return None
  # Quotes/emphasis, a verb, an optional colon, the argument, trailing quotes/periods. Written
  # as strips around one anchored match: the single regex with a lazy argument took time
  # quadratic in the trailing punctuation.
  start, stop = 0, len(text)
  while start < stop and (text[start] in "`'\"*" or text[start].isspace()):
    start += 1
  while stop > start and (text[stop - 1] in "`'\".*" or text[stop - 1].isspace()):
    stop -= 1
  found = re.match(r"([A-Za-z]+)\s*:?", text[start:stop])
  if found is None:
    return None
  return found.group(1).lower(), text[start:stop][found.end():].strip()


def _same_answer(given: str, gold: str) -> bool:
  given = " ".join(given.lower().split())
  if re.fullmatch(r"[-+]?\d{1,12}", given) and re.fullmatch(r"-?\d+", gold):
    return int(given) == int(gold)
  return given == gold.lower()


class HiddenRuleEnv:
  """Multi-turn Env over one family of hidden-rule games (or "mixed")."""

  system_prompt = SYSTEM_PROMPT

  def __init__(self, family: str = "mixed", *, max_turns: int = 8,
               invalid_penalty: float = 0.0, style: str = "full",
               closeness_reward: float = 0.0):
    if family != "mixed" and family not in FAMILIES:
      raise ValueError(f"family={family!r} must be 'mixed' or one of {FAMILIES}.")
    if style not in STYLES:
      raise ValueError(f"style={style!r} must be one of {STYLES}.")
    if max_turns < 2 or invalid_penalty > 0:
      raise ValueError(f"need max_turns >= 2 and invalid_penalty <= 0, got {max_turns}, "
                       f"{invalid_penalty}.")
    self.family, self.max_turns, self.invalid_penalty = family, max_turns, invalid_penalty
    if not 0.0 <= closeness_reward < 1.0:
      raise ValueError(f"closeness_reward must be in [0, 1) so that a solve (1.0) beats any "
                       f"failure, got {closeness_reward}.")
    self.style, self.closeness_reward = style, closeness_reward
    self._game, self._seed, self._turn = None, None, 0

  def _draw(self, seed: int) -> _Game:
    rng = random.Random(seed)
    family = rng.choice(FAMILIES) if self.family == "mixed" else self.family
    return _MAKERS[family](rng, self.style == "compact")

  @base.episode_reset
  def reset(self, seed: int) -> str:
    self._game, self._seed, self._turn = self._draw(seed), seed, 0
    if self.style == "compact":
      return f"{self._game.intro} ({self.max_turns} turns)"
    return f"{self._game.intro}\nYou have {self.max_turns} turns."

  def clone(self) -> "HiddenRuleEnv":
    """A copy in the same state (envs/base.py, "Forking"): the episode's game drawn again from
    its seed, with a copy of what the feedback so far has changed."""
    other = copy.copy(self)
    if self._game is not None:
      other._game = self._draw(self._seed)
      other._game.state.update(copy.deepcopy(self._game.state))
    return other

  def demonstration(self, seed: int, rng: random.Random, *, noise: float = 0.0) -> list[str]:
    """The scripted expert's actions for the episode of `seed` (at most max_turns of them).

    Exploring actions are random allowed ones with probability `noise` (module docstring);
    with noise=0 the script is a function of the seed. Leaves the env's own episode alone.
    """
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"noise must be in [0, 1], got {noise}.")
    return self._draw(seed).expert(rng, noise, self.max_turns)

  @property
  def answer(self) -> str:
    """The gold answer of the current episode (for evaluation and tests)."""
    if self._game is None:
      raise RuntimeError("HiddenRuleEnv.answer needs reset(seed) first.")
    return self._game.answer

  @property
  def belief(self) -> str:
    """What an ideal player infers from this episode's feedback so far ("38-50" in the compact
    `guess` game: the range still open); the thinker's demonstrated thought (envs/thinker.py).
    Only the families in BELIEF_FAMILIES have one."""
    if self._game is None:
      raise RuntimeError("HiddenRuleEnv.belief needs reset(seed) first.")
    if self._game.belief is None:
      raise ValueError("this episode's family has no stated belief; use family='guess'.")
    return self._game.belief()

  @property
  def gold_action(self) -> str:
    """The command that submits the gold answer ("guess 37", "answer 12")."""
    answer = self.answer  # (needs reset first)
    return f"{'answer' if self._game.ends_on_answer else self._game.verb} {answer}"

  def _checked(self, ok: bool) -> dict:
    """The turn's base.STEP_OK entry, in the families that define it."""
    return {} if self._game.step_ok is None else {base.STEP_OK: float(ok)}

  def _end(self, obs: str, reward: float, *, success: bool, ok: bool, error: str = ""):
    if not success:
      obs = f"{obs} The answer was {self._game.answer}.".strip()
      if self.closeness_reward and self._game.closeness is not None:
        reward += self.closeness_reward * self._game.closeness()
    return obs, reward, True, base.make_info(reward=reward, success=success, error=error,
                                             turns=self._turn, **self._checked(ok))

  @base.episode_step
  def step(self, action: str) -> base.StepResult:
    self._turn += 1
    game, last = self._game, self._turn >= self.max_turns
    command = parse_command(action)
    verbs = {game.verb} | ({"answer"} if game.ends_on_answer else set())
    if command is None or command[0] not in verbs:
      return self._reject(f"unknown command; use one of: {', '.join(sorted(verbs))}", last)
    verb, arg = command
    if verb == "answer":
      correct = _same_answer(arg, game.answer)
      return self._end("Correct!" if correct else "Wrong.", float(correct), success=correct,
                       ok=correct)
    try:
      ok = game.step_ok is None or game.step_ok(arg)   # before explore narrows the range
      feedback, solved = game.explore(arg)
    except ValueError as e:
      return self._reject(str(e), last)
    if solved:
      return self._end(feedback, 1.0, success=True, ok=ok)
    if last:
      return self._end(f"{feedback} Out of turns.", 0.0, success=False, ok=ok)
    return feedback, 0.0, False, base.make_info(reward=0.0, turns=self._turn,
                                                **self._checked(ok))

  def _reject(self, error: str, last: bool) -> base.StepResult:
    # The compact reply names no reason (info["error"] keeps it): one token, not a sentence.
    obs = "invalid" if self.style == "compact" else f"Error: {error}."
    if last:
      return self._end(f"{obs} Out of turns.", self.invalid_penalty, success=False, ok=False,
                       error=error)
    return obs, self.invalid_penalty, False, base.make_info(
        reward=self.invalid_penalty, error=error, turns=self._turn, **self._checked(False))
