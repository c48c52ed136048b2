"""Every shipped environment: one row each, naming its constructor and its config keys.

An environment is one module plus one row of `ENVS`. The row says how to build the env from an
experiment's `config.task` (each key's `configs.Key`, its default and the constructor argument
it fills), and what the env offers the harness (scripted demonstrations for an SFT warm start, a
gold action for answer probes). Everything that picks an env by name reads this table:
`recipe.make_task`, `rl_config.TASKS` and the task keys of `rl_config.RL_SCHEMA`,
experiments/agents/agent.py's `task.name` choices and experiments/eval.py's.

  make_env = registry.factory(config.task)        # functools.partial(constructor, **kwargs)
  registry.task_config("search", max_turns=3)      # {"name": "search", its keys at defaults}

`config.task` holds `name`, the keys every env shares (`COMMON`: `max_turns` bounds the rollout
of any env, `chat_template` how prompts are rendered) and the keys of the env. A config that
offers several envs (`task_config(name, names=...)`) holds the union of their keys, so that
`--config.task.name=...` can switch between them (ml_collections only overrides keys a config
has); the chosen env reads its own keys and the others' are left unread. A key of no env, or a
value its env's Key refuses, is a `configs.ConfigError` that names it.

The engine-backed games (TextWorld, ALFWorld) are built isolated in a worker process
(`envs/isolated.py`): a hang or crash costs one episode. Heavy optional packages
(reasoning-gym, textworld, alfworld, rank-bm25) are imported only when their env is built.
"""
from collections.abc import Callable, Mapping, Sequence
import dataclasses
import functools
import importlib
import json
from typing import Any

from agentrl import configs
from agentrl.envs import alfworld_env
from agentrl.envs import arithmetic
from agentrl.envs import base
from agentrl.envs import calculator
from agentrl.envs import few_shot
from agentrl.envs import hidden_rule
from agentrl.envs import reasoning_gym_env
from agentrl.envs import search
from agentrl.envs import search_corpus
from agentrl.envs import textworld_env
from agentrl.envs import thinker
from agentrl.envs import tool_calls
from agentrl.envs import tool_use
from agentrl.rewards import extract


@dataclasses.dataclass(frozen=True)
class Field:
  """One config.task key of an env: its schema, its default and the argument it fills.

  Attributes:
    key: the value's schema.
    default: the value when config.task does not set it.
    arg: the constructor's keyword argument ("" : the key's own name).
  """
  key: configs.Key
  default: Any
  arg: str = ""


@dataclasses.dataclass(frozen=True)
class Vocab:
  """The corpus and size of the sentencepiece tokenizer a scratch model gets for an env.

  Its texts: the env's system prompt (with `system`), the prompts of episodes 0..seeds-1, their
  demonstrated actions and replies (noise 0.5) where the env has demonstrations, and each
  episode's reply to every action in `bad` (so that error replies get pieces too).
  byte_fallback False: no byte pieces, for a tiny model sampling at temperature 1 would spend
  mass on 256 ids that no env text uses (a character outside the corpus encodes as <unk>).
  """
  seeds: int = 50
  bad: tuple[str, ...] = ("?",)
  size: int = 512
  byte_fallback: bool = True
  system: bool = True


@dataclasses.dataclass(frozen=True)
class Row:
  """One environment.

  Attributes:
    build: the constructor, called with the keyword arguments of `fields` (after `convert`).
    fields: config.task key -> Field. A multi-turn env has `max_turns`.
    about: one line for docs and --print_config readers.
    sft: the scratch model's warm start: "demonstrations" (the env's `demonstration(seed, rng,
      noise=)`), "gold" (arithmetic's gold answers) or "" (none: RL starts from the init).
    gold_action: whether the env states `gold_action` after reset (IGPO / A2TGPO probes).
    parse_action: reads an action into its command words, or None if it is not one (SIOP
      clusters a group's final answers by it); None: the env has no such reader.
    vocab: a scratch model's tokenizer: a Vocab, a function of the constructor's arguments
      that returns a Vocab or the tokenizer itself (arithmetic's exact vocabulary), or None
      (open-ended texts: a pretrained model's tokenizer only).
    demo_kwargs: constructor arguments of the env the demonstrations come from.
    convert: keyword arguments -> the constructor's, for values that need parsing.
    check: raises ConfigError for arguments the constructor would only refuse deep inside.
    fork: how envs/fork.py forks the env mid-episode for branching rollouts: "clone" (it
      copies its state) or "replay" (reset and the episode's actions on a new env: the
      engine-backed games, in a worker process).
  """
  build: Callable[..., base.Env]
  fields: Mapping[str, Field]
  about: str
  sft: str = ""
  gold_action: bool = False
  parse_action: Callable[[str], Sequence[str] | None] | None = None
  vocab: Vocab | Callable[[dict], Any] | None = Vocab()
  demo_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  convert: Callable[[dict], dict] | None = None
  check: Callable[[dict], None] | None = None
  fork: str = "clone"

  @property
  def multi_turn(self) -> bool:
    return "max_turns" in self.fields


def rg_kwargs(text: str) -> dict:
  """The reasoning-gym generator arguments in config.task.rg_config (a JSON object, or "")."""
  try:
    kwargs = json.loads(text) if text.strip() else {}
  except json.JSONDecodeError as e:
    raise configs.ConfigError(f"config.task.rg_config must be a JSON object such as "
                              f"'{{\"max_digits\": 2}}'; got {text!r} ({e})") from None
  if not isinstance(kwargs, dict):
    raise configs.ConfigError(f"config.task.rg_config must be a JSON object of generator "
                              f"arguments, got {text!r}")
  return kwargs


def _rg_convert(kwargs: dict) -> dict:
  """rg_config's JSON becomes generator arguments; system_prompt "" is reasoning-gym's own."""
  kwargs = dict(kwargs)
  kwargs.update(rg_kwargs(kwargs.pop("rg_config")))
  kwargs["system_prompt"] = kwargs["system_prompt"] or None
  return kwargs


def _rg_check(kwargs: dict) -> None:
  """Builds the generator once, so a bad dataset or generator argument fails up front."""
  try:
    reasoning_gym_env.ReasoningGymTask(
        kwargs["name"], **{k: v for k, v in kwargs.items() if k not in ("name", "system_prompt")})
  except (TypeError, AssertionError) as e:
    raise configs.ConfigError(f"config.task.rg_config does not fit the {kwargs['name']!r} "
                              f"generator: {e}") from None


def _verbose():
  """envs/verbose_arithmetic, imported on use: its filler detector is jax code, and the envs
  package itself never imports jax (base_test's NoJaxTest)."""
  return importlib.import_module("agentrl.envs.verbose_arithmetic")


def _alf_convert(kwargs: dict) -> dict:
  kind = kwargs.pop("task_type")
  return {**kwargs, "task_types": alfworld_env.TASK_TYPES if kind == "mixed" else (kind,)}


def _tw_convert(kwargs: dict) -> dict:
  """game_settings' JSON becomes the kind's settings; 0 pool sizes and "" game_pool: none."""
  kwargs = dict(kwargs)
  text = kwargs.pop("game_settings")
  try:
    settings = json.loads(text) if text.strip() else {}
  except json.JSONDecodeError:
    settings = None
  if not isinstance(settings, dict):
    raise configs.ConfigError(f"config.task.game_settings must be a JSON object such as "
                              f"'{{\"level\": 15}}', got {text!r}")
  for key in ("pool_size", "heldout_pool_size", "pool"):
    kwargs[key] = kwargs[key] or None
  return {**kwargs, **settings}


def _tw_command(action: str) -> tuple[str, ...] | None:
  return tuple(textworld_env.parse_command(action).split()) or None


# Commands whose replies are TextWorld's error and refusal texts.
_TW_BAD = ("look", "", "go", "go up", "xyzzy", "take it", "save")


def _tw_vocab(kwargs: dict) -> Vocab:
  """Compact texts: room names, commands and error replies in few pieces, from 40 games'
  episodes; full texts: a few games (each seed not in a pool is a generated game, seconds)."""
  if kwargs["observation"] == "compact":
    return Vocab(seeds=40, bad=_TW_BAD, size=512, byte_fallback=False)
  return Vocab(seeds=4, bad=("look",))


def _turns(default: int, lo: int = 1) -> Field:
  return Field(configs.Key(int, min=lo), default)


_DIGITS = Field(configs.Key(int, min=1, max=9), 3)
# How a tool env's calls and results are written (envs/tool_calls.py): "hermes", "tags", or ""
# for the env's own default (tags for calculator and search, hermes for tool_use), so that a
# config offering several envs gives each its own.
_TOOL_FORMAT = Field(configs.Key(str, choices=("",) + tool_calls.FORMATS), "")


def _tool_format(kwargs: dict) -> dict:
  """tool_format "" is the constructor's default."""
  return {k: v for k, v in kwargs.items() if not (k == "tool_format" and v == "")}


# The hidden-rule games' texts and error replies; compact texts need few pieces.
_GAME_BAD = ("?", "guess ?", "query 999", "encode ?", "test 0")


def _game_vocab(kwargs: dict) -> Vocab:
  if kwargs["style"] == "compact":
    return Vocab(seeds=200, bad=_GAME_BAD, size=160, byte_fallback=False)
  return Vocab(seeds=200, bad=_GAME_BAD)


ENVS: dict[str, Row] = {
    "arithmetic": Row(
        arithmetic.ArithmeticEnv, {"digits": _DIGITS},
        "reversed addition: '123+456=' -> '9750', exact match (envs/arithmetic.py)", sft="gold",
        vocab=lambda kwargs: arithmetic.build_tokenizer(kwargs["digits"])),
    "verbose_arithmetic": Row(
        lambda **kwargs: _verbose().VerboseArithmeticEnv(**kwargs), {"digits": _DIGITS},
        "arithmetic whose answers carry filler the reward ignores (envs/verbose_arithmetic.py)",
        # Half the demonstrated prompts end with a budget "[b]" (HBPO's format).
        sft="demonstrations", demo_kwargs={"budget_prompts": 0.5},
        vocab=lambda kwargs: _verbose().build_tokenizer(kwargs["digits"])),
    "reasoning_gym": Row(
        reasoning_gym_env.ReasoningGymEnv,
        {"rg_dataset": Field(configs.Key(str), "basic_arithmetic", "name"),
         # Its generator's arguments as a JSON object ('{"max_digits": 2}'; "": defaults).
         "rg_config": Field(configs.Key(str), ""),
         "answer_mode": Field(configs.Key(str, choices=extract.MODES), "tag_or_last_line"),
         # The chat system message ("": reasoning-gym's own, which asks for <answer> tags).
         "system_prompt": Field(configs.Key(str), "")},
        "any reasoning-gym dataset, scored by its own scorer (envs/reasoning_gym_env.py)",
        vocab=None, convert=_rg_convert, check=_rg_check),
    "hidden_rule": Row(
        hidden_rule.HiddenRuleEnv,
        {"family": Field(configs.Key(str, choices=("mixed",) + hidden_rule.FAMILIES), "mixed"),
         "max_turns": _turns(8),
         "style": Field(configs.Key(str, choices=hidden_rule.STYLES), "full"),
         # c x how far a failed episode narrowed the secret down (0: the outcome only).
         "closeness_reward": Field(configs.Key(float, min=0.0, max=0.99), 0.0)},
        "infer a hidden rule by querying over turns (envs/hidden_rule.py)",
        sft="demonstrations", gold_action=True, parse_action=hidden_rule.parse_command,
        vocab=_game_vocab),
    "thinker": Row(
        thinker.ThinkerEnv,
        {"family": Field(configs.Key(str, choices=hidden_rule.BELIEF_FAMILIES), "guess"),
         "max_turns": _turns(7, lo=2),
         "style": Field(configs.Key(str, choices=hidden_rule.STYLES), "compact"),
         "schedule": Field(configs.Key(str, choices=thinker.SCHEDULES), "every"),
         "first": Field(configs.Key(int, min=0), 1)},
        "the hidden-rule game with thinker turns before its commands (envs/thinker.py)",
        sft="demonstrations", gold_action=True, parse_action=hidden_rule.parse_command,
        vocab=_game_vocab),
    "calculator": Row(
        calculator.CalculatorEnv,
        {"num_ops": Field(configs.Key(int, min=1, max=8), 3),
         "max_operand": Field(configs.Key(int, min=1), 999), "max_turns": _turns(4),
         "tool_format": _TOOL_FORMAT},
        "arithmetic with a calculator tool, answered in <answer> (envs/calculator.py)",
        sft="demonstrations", convert=_tool_format),
    "tool_use": Row(
        tool_use.ToolUseEnv,
        {"family": Field(configs.Key(str, choices=("mixed",) + tool_use.TASKS), "mixed", "task"),
         "max_turns": _turns(6), "tool_format": _TOOL_FORMAT},
        "JSON tool calls over a fictional world's facts (envs/tool_use.py)",
        sft="demonstrations", convert=_tool_format,
        vocab=Vocab(seeds=300, size=384, byte_fallback=False, system=False)),
    "search": Row(
        search.SearchEnv,
        {"corpus_size": Field(configs.Key(int, min=1), 100),
         "top_k": Field(configs.Key(int, min=1), 3), "max_turns": _turns(4),
         "reward": Field(configs.Key(str, choices=search.REWARDS), "em"),
         "question_kind": Field(
             configs.Key(str, choices=("mixed",) + search_corpus.QUESTION_KINDS), "mixed"),
         "tool_format": _TOOL_FORMAT},
        "BM25 <search> over a generated corpus, EM/F1-scored <answer> (envs/search.py)",
        convert=_tool_format),
    "textworld": Row(
        textworld_env.TextWorldEnv.isolated,
        {"kind": Field(configs.Key(str, choices=tuple(textworld_env.DEFAULT_SETTINGS)),
                       "coin_collector"),
         "max_turns": _turns(50),
         # The kind's generator settings as a JSON object ('{"level": 15}'; "": defaults).
         "game_settings": Field(configs.Key(str), ""),
         # Games of the training pool and of each held-out pool (0: every seed its own game;
         # textworld_env.game_seed), and their directory ("": $AGENTRL_GAME_POOL or <tmp>).
         "pool_size": Field(configs.Key(int, min=0), 0),
         "heldout_pool_size": Field(configs.Key(int, min=0), 0),
         "game_pool": Field(configs.Key(str), "", "pool"),
         "observation": Field(configs.Key(str, choices=textworld_env.OBSERVATIONS), "full"),
         "objective": Field(configs.Key(bool), True)},
        "generated TextWorld games, in a worker process (envs/textworld_env.py)",
        # SIOP's final answer: the last command's words ("take coin").
        sft="demonstrations", parse_action=_tw_command, vocab=_tw_vocab, convert=_tw_convert,
        fork="replay"),
    "alfworld": Row(
        alfworld_env.AlfWorldEnv.isolated,
        {"task_type": Field(configs.Key(str, choices=("mixed",) + alfworld_env.TASK_TYPES),
                            "mixed"),
         "max_turns": _turns(50)},
        "generated ALFRED household tasks, in a worker process (envs/alfworld_env.py)",
        vocab=Vocab(seeds=4, bad=("look",)), convert=_alf_convert, fork="replay"),
}

# The long-horizon credit study's task (experiments/agents/agent.py:textworld and
# spa_rl.py:textworld): coin collector at level 15, a chain of 15 rooms with the coin in the last
# (14 moves and "take coin": a 15-command walkthrough), found without the objective (which
# recites the walkthrough): every room but the first has two exits, the way back and the way on;
# 20 turns, compact texts; 200 training games and 64 each for held-out evaluation and SFT
# validation (scripts/make_game_pool.py generates them once).
TEXTWORLD_STUDY = dict(kind="coin_collector", game_settings='{"level": 15}', max_turns=20,
                       pool_size=200, heldout_pool_size=64, observation="compact",
                       objective=False)
NAMES = tuple(ENVS)
SINGLE_TURN = tuple(name for name, row in ENVS.items() if not row.multi_turn)
# Keys of every task config: the env's name, the rollout's turn bound, how prompts render.
# few_shot: solved episodes of the env's expert shown before each task (envs/few_shot.py).
COMMON = {"name": configs.Key(str, choices=NAMES), "max_turns": configs.Key(int, min=1),
          "chat_template": configs.Key(bool), "few_shot": configs.Key(int, min=0, max=8)}


def row(name: str) -> Row:
  """ENVS[name]; ConfigError naming the valid names."""
  if name not in ENVS:
    raise configs.ConfigError(f"config.task.name must be one of {NAMES} (the envs of "
                              f"agentrl/envs/registry.py), got {name!r}")
  return ENVS[name]


def defaults(name: str) -> dict:
  """The config.task keys of env `name` at their defaults (not `name` and `chat_template`)."""
  return {key: field.default for key, field in row(name).fields.items()}


def task_config(name: str, *, names: Sequence[str] = (), **values) -> dict:
  """config.task for env `name`: every key of `name` (and of the envs `names`, so that
  --config.task.name can switch to them), at its default unless `values` sets it."""
  config = {"name": name, "max_turns": 1, "chat_template": False, "few_shot": 0}
  for other in (*names, name):   # `name`'s own defaults win a key two envs share
    config.update(defaults(other))
  unknown = sorted(set(values) - set(config))
  if unknown:
    raise configs.ConfigError(f"config.task.{unknown[0]} is not a key of task.name={name!r}; "
                              f"its keys: {sorted(config)}")
  return {**config, **values}


def _merge(keys: Sequence[configs.Key]) -> configs.Key:
  """One Key accepting what any of `keys` accepts (a key two envs share, e.g. family)."""
  if all(k == keys[0] for k in keys):
    return keys[0]
  choices = (tuple(dict.fromkeys(c for k in keys for c in k.choices))
             if all(k.choices is not None for k in keys) else None)
  lows, highs = [k.min for k in keys], [k.max for k in keys]
  return configs.Key(keys[0].type, choices=choices,
                     min=None if None in lows else min(lows),
                     max=None if None in highs else max(highs))


def schema(names: Sequence[str], prefix: str = "task.") -> dict[str, configs.Key]:
  """The experiment-schema entries of a task config offering envs `names`: task.name's choices
  and every key of those envs (a shared key accepts what any of them does; `check` then holds
  the chosen env's own key)."""
  keys: dict[str, list[configs.Key]] = {}
  for name in names:
    for key, field in row(name).fields.items():
      keys.setdefault(key, []).append(field.key)
  out = {f"{prefix}{k}": v for k, v in COMMON.items()}
  out[f"{prefix}name"] = configs.Key(str, choices=tuple(names))
  out.update({f"{prefix}{key}": _merge(ks) for key, ks in keys.items() if key not in COMMON})
  return out


def check(tc: Mapping[str, Any]) -> Row:
  """The row of tc.name, once every key tc sets is a key of some env and the chosen env's keys
  fit their schema; ConfigError naming the first bad key and the valid ones."""
  env = row(tc["name"])
  known = set(COMMON).union(*(r.fields for r in ENVS.values()))
  for key in tc:
    if key not in known:
      raise configs.ConfigError(f"config.task.{key} is not a key of task.name={tc['name']!r}; "
                                f"its keys: {sorted(set(COMMON) | set(env.fields))}")
  for key, field in env.fields.items():
    try:
      configs.check_key(f"task.{key}", tc.get(key, field.default), field.key)
    except configs.ConfigError as e:
      raise configs.ConfigError(f"{e} (for task.name={tc['name']!r})") from None
  shots = tc.get("few_shot", 0)
  configs.check_key("task.few_shot", shots, COMMON["few_shot"])
  if shots and env.sft != "demonstrations":
    raise configs.ConfigError(f"config.task.few_shot={shots} needs an env with demonstrations; "
                              f"task.name={tc['name']!r} has none (use few_shot=0, or one of "
                              f"{[n for n, r in ENVS.items() if r.sft == 'demonstrations']})")
  if shots and not tc.get("chat_template", False):
    raise configs.ConfigError(f"config.task.few_shot={shots} shows examples as chat turns; set "
                              "config.task.chat_template=True or few_shot=0")
  return env


def constructor_kwargs(tc: Mapping[str, Any]) -> dict:
  """The constructor's keyword arguments for config.task `tc` (checked by `check`)."""
  env = check(tc)
  kwargs = {field.arg or key: tc.get(key, field.default) for key, field in env.fields.items()}
  kwargs = env.convert(kwargs) if env.convert else kwargs
  if env.check:
    env.check(kwargs)
  return kwargs


def factory(tc: Mapping[str, Any]) -> Callable[[], base.Env]:
  """make_env() for config.task `tc`: functools.partial(constructor, **its arguments)."""
  kwargs = constructor_kwargs(tc)
  return few_shot.wrap(functools.partial(ENVS[tc["name"]].build, **kwargs),
                       tc.get("few_shot", 0))


def make(name: str, /, **kwargs) -> base.Env:
  """ENVS[name]'s constructor called with constructor `kwargs`, with an error that lists the
  valid names.

  `name` is positional-only, so an env's own `name` argument (reasoning-gym's dataset) passes
  through: make("reasoning_gym", name="basic_arithmetic").
  """
  if name not in ENVS:
    raise ValueError(f"Unknown env {name!r}; choose one of {sorted(ENVS)}.")
  return ENVS[name].build(**kwargs)
