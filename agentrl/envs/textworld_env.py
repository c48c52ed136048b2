"""TextWorld adapter: locally generated text adventures as a multi-turn Env.

TextWorld (Côté et al. 2018) compiles procedurally generated quests to Z-machine games with
its bundled Inform7 compiler, fully offline (docs/offline.md §1). `make_game` generates
one game per (kind, settings, seed) in-process and caches it in a game-pool directory
($AGENTRL_GAME_POOL, default <tmp>/agentrl_game_pool); generation costs 1-5 s, so the pool
is reused across runs. Kinds: the built-in challenges coin_collector (level), treasure_hunter
(level), simple (rewards, goal, test), cooking (recipe, take, go, open, cook, cut, drop,
recipe_seed, split) and custom quests (world_size, nb_objects, quest_length).

Observations have the Inform7 residue (ASCII banner, `>` prompt, status line such as
"-= Attic =-0/1", end-of-game menu) stripped; with `list_commands` the admissible commands
are appended. observation="compact" shortens each reply to two lines for a small scratch model:
the room's name where the game describes a room (its "-= Attic =-" header), else the reply's
first line ("You can't go that way."), then the admissible commands without the "Valid
commands:" label and without the always-valid "look" and "inventory" (still accepted):
"Attic\ngo east, go north, take coin". objective=False drops the game's opening objective,
which in the coin_collector and treasure_hunter challenges recites the whole walkthrough
("First step, head west. ..."): without it those games are exploration tasks
(coin_collector's goal is always to take the coin). info adds: "admissible_commands" (the
valid command list), "score" and "max_score" (game points), "intermediate_reward" (TextWorld's
dense progress signal, below), "progress", "policy_commands" (a walkthrough from the current
state), "won", "lost", "command" (the command sent), "unsafe_action" (it was refused, below).

TextWorld's intermediate_reward is the sign of the change in the length of the shortest
winning command sequence (tracked from the game's quests): 1 when the last command shortened
it (or won the game), -1 when it lengthened it (e.g. walked away from the goal) or lost the
game, 0 when it stayed the same (look, inventory, a command that changed nothing) or no quest
is tracked. info["progress"] is 1.0 when it is 1 and 0.0 otherwise (a moved-away step is no
progress), and 0.0 for a command that was not sent; it is the per-step progress signal the
turn-credit methods read (`agentrl.credit.probes.turn_signals`, standing in for MAPO's
judge). Games started without quest tracking (the ALFWorld subclass) report None and 0.0.

The command is read from <action>...</action> if present, else from the last non-empty line.
Reward per turn: the increase of the game score divided by max_score, so an episode's rewards
sum to score / max_score in [0, 1]. A command that is not in the admissible list is still
sent to the game but sets info["error"]; an empty command is not sent, and neither is one that
`unsafe_command` refuses (control characters, backslashes, non-ASCII, over MAX_COMMAND_CHARS,
or a file/session meta-verb such as save or quit): the game engine hangs, crashes or writes
files on those, so the turn is an error observation with info["unsafe_action"] set, counted as
env/unsafe_actions by SafeEnv. `TextWorldEnv.isolated(...)` runs the env in a worker process
(agentrl.envs.isolated), so a hang or crash of the engine costs one episode, not the run.

Game pools: with `pool_size`, the training seeds map to pool_size games and, with
`heldout_pool_size`, the held-out and validation seeds each to their own heldout_pool_size
games (`game_seed`), so that a study generates its games once (`TextWorldEnv.make_pool`,
scripts/make_game_pool.py) and never evaluates on a training game. `demonstration` plays the
walkthrough (policy_commands) with optional random detours, the SFT warm start's data.

Requires the `envs` extra (textworld; pip install -e '.[envs]'), imported lazily.
"""
import collections
import copy
import functools
import hashlib
import json
import os
import pickle
import random
import re
import shutil
import tempfile
import warnings

from agentrl.data import generators
from agentrl.envs import arithmetic
from agentrl.envs import base
from agentrl.envs import isolated as isolated_lib
from agentrl.envs import safe
from agentrl.rewards import extract

INSTALL_HINT = "pip install -e '.[envs]'"
SYSTEM_PROMPT = (
    "You are playing a text adventure game. Read the observation and reply with one game "
    "command (for example 'go north' or 'take coin') on the last line of your reply.")
DEFAULT_SETTINGS = {
    "coin_collector": {"level": 1},
    "treasure_hunter": {"level": 1},
    "simple": {"rewards": "dense", "goal": "detailed", "test": False},
    "cooking": {"recipe": 1, "take": 1, "go": 1, "open": False, "cook": False, "cut": False,
                "drop": False, "recipe_seed": 0, "split": "train"},
    "custom": {"world_size": 3, "nb_objects": 5, "quest_length": 3},
}
OBSERVATIONS = ("full", "compact")
_OPEN_GAMES = 8
# Games kept open for demonstrations (an SFT run draws them from the whole training pool).
_DEMO_GAMES = 256
# Always admissible and never changing the game: left out of compact command lists.
_UNLISTED = frozenset({"look", "inventory"})
_HEADER_RE = re.compile(r"^-= (.+) =-$", re.MULTILINE)
MAX_COMMAND_CHARS = 128  # Jericho cuts input at 198 bytes; no game command comes close
# Inform library meta-verbs that write or read files in the working directory ("save" then
# "restore" carries game state across episodes and runs; "script" starts a transcript file) or
# end the session. They are never admissible commands.
_META_VERBS = frozenset({"save", "restore", "script", "transcript", "unscript", "noscript",
                         "quit", "q", "restart"})
_BANNER_RE = re.compile(r"[\s_\\|$/<>]*[_\\|$][\s_\\|$/<>]*")
_END_LINES = ("*** The End ***", "Would you like to RESTART")


def import_textworld():
  try:
    import textworld  # pylint: disable=g-import-not-at-top
    import textworld.challenges  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise ImportError("The TextWorld environments need the 'textworld' package; install it "
                      f"with: {INSTALL_HINT}") from e
  return textworld


def pool_dir(path: str | None = None) -> str:
  path = path or os.environ.get("AGENTRL_GAME_POOL") or os.path.join(
      tempfile.gettempdir(), "agentrl_game_pool")
  os.makedirs(path, exist_ok=True)
  return path


def clean_observation(text: str) -> str:
  """Strips Inform7 residue: banner art, `>` prompt + status line, end-of-game menu."""
  lines = []
  for line in text.splitlines():
    stripped = line.strip()
    if stripped.startswith(">") or _BANNER_RE.fullmatch(stripped) and stripped:
      continue
    if any(stripped.startswith(end) for end in _END_LINES):
      continue
    lines.append(line.rstrip())
  return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


def split_objective(text: str) -> tuple[str, str]:
  """(the opening objective, the rest) of a cleaned first observation: the text before the
  first room header ("-= Attic =-") and the text from it on; ("", text) without a header."""
  match = _HEADER_RE.search(text)
  if not match:
    return "", text
  return text[:match.start()].strip(), text[match.start():]


def compact_reply(text: str) -> str:
  """One line for a cleaned reply: the room's name if it describes a room, else its first
  non-empty line."""
  match = _HEADER_RE.search(text)
  if match:
    return match.group(1).strip()
  return next((line.strip() for line in text.splitlines() if line.strip()), "")


def game_seed(seed: int, pool_size: int | None = None,
              heldout_pool_size: int | None = None) -> int:
  """The generation seed of the game that env seed `seed` plays.

  The harness draws seeds from disjoint ranges (agentrl.envs.arithmetic): RL training
  [0, HELDOUT_START), held-out evaluation [HELDOUT_START, SFT_SEED_BASE), SFT demonstrations
  [SFT_SEED_BASE, VALID_SEED_BASE) and SFT validation [VALID_SEED_BASE, ...). Training and SFT
  seeds play the training pool, games 0 .. pool_size - 1 (seed % pool_size); held-out and
  validation seeds play the first heldout_pool_size seeds of their own range, so the three
  pools never share a game. None: every seed is its own game.
  """
  heldout = (generators.HELDOUT_START <= seed < arithmetic.SFT_SEED_BASE
             or seed >= arithmetic.VALID_SEED_BASE)
  if not heldout:
    return seed % pool_size if pool_size else seed
  if not heldout_pool_size:
    return seed
  base = (generators.HELDOUT_START if seed < arithmetic.SFT_SEED_BASE
          else arithmetic.VALID_SEED_BASE)
  return base + (seed - base) % heldout_pool_size


def pool_seeds(pool_size: int, heldout_pool_size: int) -> list[int]:
  """The generation seeds of every game of a pool (`game_seed`'s image): training, held-out,
  validation."""
  return [*range(pool_size),
          *(base + i for base in (generators.HELDOUT_START, arithmetic.VALID_SEED_BASE)
            for i in range(heldout_pool_size))]


def _settings(kind: str, settings: dict) -> dict:
  if kind not in DEFAULT_SETTINGS:
    raise ValueError(f"Unknown TextWorld kind {kind!r}; choose one of {sorted(DEFAULT_SETTINGS)}.")
  unknown = set(settings) - set(DEFAULT_SETTINGS[kind])
  if unknown:
    raise ValueError(f"Unknown settings {sorted(unknown)} for TextWorld kind {kind!r}; valid: "
                     f"{sorted(DEFAULT_SETTINGS[kind])}.")
  return {**DEFAULT_SETTINGS[kind], **settings}


def _compile(tw, kind: str, settings: dict, seed: int, path: str) -> None:
  options = tw.GameOptions()
  options.seeds = seed
  options.path = path
  options.force_recompile = True
  if kind == "custom":
    options.nb_rooms = settings["world_size"]
    options.nb_objects = settings["nb_objects"]
    options.quest_length = settings["quest_length"]
    tw.make(options)
    return
  _, make, _ = tw.challenges.CHALLENGES[f"tw-{kind}"]
  tw.generator.compile_game(make(settings=dict(settings), options=options), options)


def make_game(kind: str, seed: int, *, pool: str | None = None, **settings) -> str:
  """Path of the cached .z8 game for (kind, settings, seed), generating it if needed.

  Generation goes to a private temporary directory and is moved into the pool with the .z8
  last, so concurrent processes never see a half-written game.
  """
  settings = _settings(kind, settings)
  digest = hashlib.sha1(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:10]
  root = pool_dir(pool)
  stem = os.path.join(root, f"{kind}-{digest}-seed{int(seed)}")
  if os.path.exists(stem + ".z8"):
    return stem + ".z8"
  tw = import_textworld()
  tmp = tempfile.mkdtemp(dir=root, prefix=".gen-")
  try:
    _compile(tw, kind, settings, int(seed), os.path.join(tmp, "game.z8"))
    os.replace(os.path.join(tmp, "game.json"), stem + ".json")
    os.replace(os.path.join(tmp, "game.z8"), stem + ".z8")
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return stem + ".z8"


def parse_command(action: str) -> str:
  """The game command in a model reply: <action> tag or last line, lowercased, unquoted."""
  text = extract.tag(action, "action")
  text = text if text is not None else (extract.last_line(action) or "")
  return " ".join(text.strip().strip("`'\"“”‘’*.!").lower().split())


def unsafe_command(command: str) -> str:
  """Why the game engine must not receive `command` (a parse_command result), or "".

  Jericho hands the command to a dumb-frotz Z-machine interpreter as a C string: a NUL byte
  cuts it short (an empty line spins forever at 100% CPU, "take coin\\x00" segfaults); a line
  that starts with a backslash is an interpreter command that re-reads its input forever,
  writing "unknown command" to stderr ("\\q"); a backslash inside a line is a key escape
  (cursor and function keys, the interpreter's hot keys such as quit); bytes above 127 can be
  read as ZSCII cursor and function keys. So commands are short printable ASCII without
  backslashes, and not a meta-verb.
  """
  if len(command) > MAX_COMMAND_CHARS:
    return f"the command is longer than {MAX_COMMAND_CHARS} characters"
  bad = next((c for c in command if not " " <= c <= "~" or c == "\\"), None)
  if bad is not None:
    return (f"the command contains {bad!r}; game commands are plain ASCII words without "
            "control characters or backslashes")
  verb = command.split(" ", 1)[0]
  if verb in _META_VERBS:
    return f"'{verb}' is an interpreter command and is disabled"
  return ""


@functools.lru_cache(maxsize=2)
def _local_env(blueprint: bytes) -> "TextWorldEnv":
  """One in-process env per pickled make_env (each IsolatedTextWorldEnv has its own partial,
  equal ones pickle alike), kept with its open games for the next demonstrations."""
  return pickle.loads(blueprint)()


class IsolatedTextWorldEnv(isolated_lib.IsolatedEnv):
  """A TextWorldEnv in a worker process (`TextWorldEnv.isolated`), with its demonstrations.

  Demonstrations are played by an env in this process, shared by the IsolatedTextWorldEnvs of
  one make_env: they send the game only its own walkthrough and admissible commands, none of
  the model text the worker guards against.
  """

  def demonstration(self, seed: int, rng: random.Random, *, noise: float = 0.0) -> list[str]:
    """`TextWorldEnv.demonstration` of the wrapped env."""
    return _local_env(pickle.dumps(self.make_env)).demonstration(seed, rng, noise=noise)


class TextWorldEnv:
  """Multi-turn Env over generated (or given) TextWorld games; see the module docstring.

  reset(seed) plays game `game_seed(seed, pool_size, heldout_pool_size)` (or
  game_files[seed % len]).
  """

  system_prompt = SYSTEM_PROMPT

  @classmethod
  def isolated(cls, *args, timeout_s: float = 10.0, reset_timeout_s: float = 300.0,
               **kwargs) -> IsolatedTextWorldEnv:
    """cls(*args, **kwargs) in a worker process: a hung or crashed game costs one episode.

    reset generates the game on first use (seconds), hence its longer time limit.
    """
    return IsolatedTextWorldEnv(functools.partial(cls, *args, **kwargs),
                                timeout_s=timeout_s, reset_timeout_s=reset_timeout_s)

  def __init__(self, kind: str = "coin_collector", *, game_files=None,
               pool_size: int | None = None, heldout_pool_size: int | None = None,
               pool: str | None = None, max_turns: int = 50, list_commands: bool = True,
               policy_commands: bool = True, observation: str = "full",
               objective: bool = True, **settings):
    if game_files is not None:
      game_files = [str(f) for f in game_files]
      missing = [f for f in game_files if not os.path.isfile(f)]
      if not game_files or missing:
        raise FileNotFoundError(f"TextWorld game_files missing or empty: {missing or '[]'}")
    else:
      _settings(kind, settings)
    if max_turns < 1 or any(n is not None and n < 1 for n in (pool_size, heldout_pool_size)):
      raise ValueError(f"need max_turns, pool_size and heldout_pool_size >= 1, got {max_turns}, "
                       f"{pool_size}, {heldout_pool_size}.")
    if observation not in OBSERVATIONS:
      raise ValueError(f"observation={observation!r}; choose one of {OBSERVATIONS}.")
    self.kind, self.settings, self.game_files = kind, settings, game_files
    self.pool_size, self.heldout_pool_size, self.pool = pool_size, heldout_pool_size, pool
    self.max_turns, self.list_commands = max_turns, list_commands
    self.policy_commands, self.observation, self.objective = (policy_commands, observation,
                                                              objective)
    self._games = collections.OrderedDict()  # path -> started game, reused across resets
    self._demo_games = collections.OrderedDict()  # the same for demonstrations
    self._game, self._state = None, None
    self._turn, self._score = 0, 0.0

  def fresh(self) -> "TextWorldEnv":
    """This env's configuration with no episode and no open game: what envs/fork.py replays
    an episode on (a game engine's state is not copied here; a replay starts the game and
    plays the episode's commands, which is deterministic)."""
    other = copy.copy(self)
    other._games, other._demo_games = collections.OrderedDict(), collections.OrderedDict()
    other._game, other._state, other._turn, other._score = None, None, 0, 0.0
    base.close_episode(other)
    return other

  def game_file(self, seed: int) -> str:
    if self.game_files is not None:
      return self.game_files[seed % len(self.game_files)]
    return make_game(self.kind, game_seed(seed, self.pool_size, self.heldout_pool_size),
                     pool=self.pool, **self.settings)

  def make_pool(self, log=None) -> list[str]:
    """Generates (or finds cached) every game this env's seeds can play (`pool_seeds`), e.g.
    once before the runs of a study; returns their paths. `log(done, total)` after each."""
    if self.game_files is not None or not (self.pool_size and self.heldout_pool_size):
      raise ValueError("make_pool needs generated games with pool_size and heldout_pool_size "
                       "set.")
    seeds, paths = pool_seeds(self.pool_size, self.heldout_pool_size), []
    for seed in seeds:
      paths.append(make_game(self.kind, seed, pool=self.pool, **self.settings))
      if log:
        log(len(paths), len(seeds))
    return paths

  def _start(self, path: str):
    tw = import_textworld()
    infos = tw.EnvInfos(admissible_commands=True, policy_commands=self.policy_commands, won=True,
                        lost=True, intermediate_reward=True, score=True, max_score=True,
                        objective=True)
    with warnings.catch_warnings():
      # Jericho flags every TextWorld-compiled game as "not fully supported"; TextWorld itself
      # tracks score and moves, so the warning carries no information here.
      warnings.filterwarnings("ignore", message=".*not fully supported.*")
      return tw.start(path, request_infos=infos)

  def _listed(self, state) -> list[str]:
    """The admissible commands an observation of `state` lists (compact: not look/inventory)."""
    commands = list(state.get("admissible_commands") or [])
    if self.observation == "compact":
      commands = [c for c in commands if c not in _UNLISTED]
    return commands

  def _observation(self, feedback: str, done: bool, first: bool = False) -> str:
    obs, objective = clean_observation(feedback), ""
    if first:
      objective, obs = split_objective(obs)
    if self.observation == "compact":
      obs = compact_reply(obs)
    if objective and self.objective:
      obs = f"{objective}\n\n{obs}"
    if self.list_commands and not done:
      compact = self.observation == "compact"
      obs += ("\n" if compact else "\nValid commands: ") + ", ".join(self._listed(self._state))
    return obs

  @base.episode_reset
  def reset(self, seed: int) -> str:
    path = self.game_file(seed)
    if path not in self._games:
      self._games[path] = self._start(path)
      if len(self._games) > _OPEN_GAMES:  # each open game holds an interpreter's memory
        self._games.popitem(last=False)[1].close()
    self._games.move_to_end(path)
    self._game = self._games[path]
    self._state = self._game.reset()
    self._turn, self._score = 0, float(self._state.get("score") or 0)
    return self._observation(self._state.feedback, done=False, first=True)

  @base.episode_step
  def step(self, action: str) -> base.StepResult:
    self._turn += 1
    command = parse_command(action)
    valid = list(self._state.get("admissible_commands") or [])
    unsafe = unsafe_command(command)
    if not command or unsafe:
      # Not sent to the game: the turn is spent with an error observation.
      error = unsafe or "empty command; reply with one game command"
      info = self._info(0.0, command[:MAX_COMMAND_CHARS], valid, error=error,
                        unsafe=bool(unsafe), progress=0.0)
      return f"Error: {error}.", 0.0, self._turn >= self.max_turns, info
    self._state, step_score, done = self._game.step(command)
    score = float(self._state.get("score") if self._state.get("score") is not None
                  else step_score)
    max_score = float(self._state.get("max_score") or 1.0)
    reward, self._score = (score - self._score) / max_score, score
    won, lost = bool(self._state.get("won")), bool(self._state.get("lost"))
    done = bool(done) or won or lost or self._turn >= self.max_turns
    error = "" if command in valid else f"'{command}' is not an admissible command"
    moved_closer = (self._state.get("intermediate_reward") or 0) > 0
    info = self._info(reward, command, list(self._state.get("admissible_commands") or []),
                      error=error, success=won, lost=lost, progress=float(moved_closer))
    return self._observation(self._state.feedback, done), reward, done, info

  def demonstration(self, seed: int, rng: random.Random, *, noise: float = 0.0) -> list[str]:
    """The commands of a demonstrated episode of game `seed` (at most max_turns of them).

    Each is the next command of the walkthrough from the current state (policy_commands), or
    with probability `noise` an `rng`-drawn other listed command, after which the walkthrough
    from the state it reached goes on (a detour and its recovery), until the game ends. Played
    on game instances of its own (kept open for the next demonstrations): the env's episode is
    left alone.
    """
    if not 0.0 <= noise <= 1.0:
      raise ValueError(f"noise must be in [0, 1], got {noise}.")
    if not self.policy_commands:
      raise ValueError("TextWorld demonstrations follow the walkthrough; build the env with "
                       "policy_commands=True.")
    path = self.game_file(seed)
    if path not in self._demo_games:
      self._demo_games[path] = self._start(path)
      if len(self._demo_games) > _DEMO_GAMES:
        self._demo_games.popitem(last=False)[1].close()
    self._demo_games.move_to_end(path)
    game = self._demo_games[path]
    state, commands = game.reset(), []
    while len(commands) < self.max_turns:
      plan = list(state.get("policy_commands") or [])
      if not plan:
        break
      command = plan[0]
      others = [c for c in self._listed(state) if c != command]
      if others and rng.random() < noise:
        command = rng.choice(others)
      state, _, done = game.step(command)
      commands.append(command)
      if done or state.get("won") or state.get("lost"):
        break
    return commands

  def _info(self, reward, command, valid, unsafe=False, **kwargs) -> base.Info:
    state = self._state
    return base.make_info(
        reward=reward, command=command, admissible_commands=valid, score=self._score,
        max_score=state.get("max_score"), won=bool(state.get("won")),
        intermediate_reward=state.get("intermediate_reward"),
        policy_commands=list(state.get("policy_commands") or []),
        **{safe.UNSAFE_ACTION: unsafe}, **kwargs)

  def close(self) -> None:
    for game in (*self._games.values(), *self._demo_games.values()):
      game.close()
    self._games, self._game = collections.OrderedDict(), None
    self._demo_games = collections.OrderedDict()
