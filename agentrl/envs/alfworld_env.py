"""ALFWorld-style household tasks through TextWorld's PDDL engine, generated offline.

ALFWorld (Shridhar et al. 2021) plays ALFRED household problems as text through TextWorld's
PDDL backend (fast-downward planner). Its game files are downloaded at run time, so they are
unavailable offline (docs/offline.md §2); the wheel does ship the domain, the text
grammar, the 120 AI2-THOR floor plans' object/receptacle inventories, the object affordances
(`alfworld.gen.constants`) and the goal library. `make_problem` builds an ALFRED problem from
those: a floor plan's receptacles (each at its own location; Fridge/Microwave/Cabinet/... are
openable), portable objects placed in compatible receptacles, the `canContain` table, and a
goal from the goal library for one of the task types

  pick_and_place_simple, pick_clean_then_place_in_recep, pick_heat_then_place_in_recep,
  pick_cool_then_place_in_recep, pick_two_obj_and_place, look_at_obj_in_light

with the goal sentence rendered from the library's first template ("put a hot apple in
fridge"). Object ids use ALFRED's mangling so AlfredDemangler renders them as "apple 1".

`AlfWorldEnv` plays generated problems (cached as *.tw-pddl in the game pool) or real ALFWorld
game files (`find_games($ALFWORLD_DATA)` lists */game.tw-pddl). Observations, commands and
rewards are those of `textworld_env.TextWorldEnv` (reward 1.0 when the goal holds). With
policy_commands=True, info["policy_commands"] is the planner's plan from the current state;
it is off by default because fast-downward replans on every step (0.03-0.3 s).

Requires `pip install alfworld 'textworld[pddl]'` (not part of the `envs` extra: it builds
fast-downward from source, ~2 min).
"""
import glob
import hashlib
import json
import os
import random

from agentrl.envs import textworld_env

TASK_TYPES = ("pick_and_place_simple", "pick_clean_then_place_in_recep",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep",
              "pick_two_obj_and_place", "look_at_obj_in_light")
INSTALL_HINT = "pip install alfworld 'textworld[pddl]'"
SYSTEM_PROMPT = (
    "You are a household robot in a text environment. Read the observation and reply with "
    "one command (for example 'go to fridge 1' or 'take apple 1 from countertop 1') on the "
    "last line of your reply.")
# The task's required appliance: (action affordance in VAL_ACTION_OBJECTS, receptacle type).
_STATE_CHANGE = {"pick_clean_then_place_in_recep": ("Cleanable", "SinkBasin"),
                 "pick_heat_then_place_in_recep": ("Heatable", "Microwave"),
                 "pick_cool_then_place_in_recep": ("Coolable", "Fridge")}
_RENAMED = {"Sink": "SinkBasin", "Bathtub": "BathtubBasin"}  # navigable part in ALFRED
_LAMP_HOSTS = ("Desk", "SideTable", "Dresser", "Shelf", "CounterTop", "DiningTable")
_DOMAIN_CONSTANTS = {"otype": ("KnifeType", "ButterKnifeType"),
                     "rtype": ("SinkBasinType", "MicrowaveType", "FridgeType")}


def import_alfworld():
  """(alfworld.info, constants, goal_library, AlfredDemangler), or an ImportError with a fix."""
  try:
    import alfworld.info  # pylint: disable=g-import-not-at-top
    from alfworld.gen import constants, goal_library  # pylint: disable=g-import-not-at-top
    from alfworld.agents.environment import alfred_tw_env  # pylint: disable=g-import-not-at-top
    import fast_downward  # pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    raise ImportError(f"ALFWorld environments need alfworld and textworld[pddl]: {INSTALL_HINT}"
                      ) from e
  return alfworld.info, constants, goal_library, alfred_tw_env.AlfredDemangler


def _mangle(type_name: str, rng: random.Random, taken) -> str:
  """A fresh ALFRED id "Apple|+00.10|+00.90|-01.00", mangled as ALFWorld's PDDL files are."""
  while True:
    coords = "|".join(f"{rng.uniform(-3, 3):+06.2f}" for _ in range(3))
    text = f"{type_name}|{coords}"
    for old, new in (("|", "_bar_"), ("+", "_plus_"), ("-", "_minus_"), (".", "_dot_")):
      text = text.replace(old, new)
    if text not in taken:
      return text


def _scene(rng: random.Random, constants, layouts: str, plan: int, max_receptacles: int):
  """Receptacle types (one entry per instance) and portable object types of a floor plan."""
  with open(os.path.join(layouts, f"FloorPlan{plan}-openable.json")) as f:
    receps = [_RENAMED.get(k.split("|")[0], k.split("|")[0]) for k in json.load(f)]
  with open(os.path.join(layouts, f"FloorPlan{plan}-objects.json")) as f:
    present = set(json.load(f))
  static = set(constants.VAL_RECEPTACLE_OBJECTS) - set(constants.MOVABLE_RECEPTACLES)
  receps += sorted((present & static) - set(receps))
  receps = [r for r in receps if r in constants.VAL_RECEPTACLE_OBJECTS]
  rng.shuffle(receps)
  receps = receps[:max_receptacles]
  portable = sorted(t for t in present if t in constants.OBJECTS and t not in static
                    and any(t in constants.VAL_RECEPTACLE_OBJECTS[r] for r in receps))
  return receps, portable, "DeskLamp" in present


def _pick_task(rng, task_type, constants, receps, portable, has_lamp):
  """(object type, target receptacle type or lamp host) for the task, or None if impossible."""
  rtypes, targets = set(receps), set(receps)
  if task_type in _STATE_CHANGE:
    affordance, appliance = _STATE_CHANGE[task_type]
    if appliance not in rtypes:
      return None
    portable = [o for o in portable if o in constants.VAL_ACTION_OBJECTS[affordance]]
    targets.discard(appliance)  # "put a cool apple in fridge" would need no placing step
  if task_type == "look_at_obj_in_light":
    hosts = sorted(rtypes & set(_LAMP_HOSTS))
    return (rng.choice(portable), rng.choice(hosts)) if has_lamp and portable and hosts else None
  pairs = [(o, r) for o in portable for r in sorted(targets)
           if o in constants.VAL_RECEPTACLE_OBJECTS[r]
           and any(o in constants.VAL_RECEPTACLE_OBJECTS[x] for x in rtypes - {r})]
  return rng.choice(pairs) if pairs else None


def make_problem(seed: int, *, task_types=TASK_TYPES, max_receptacles: int = 12,
                 max_objects: int = 8) -> dict:
  """{"pddl_domain", "grammar", "pddl_problem", "task", "task_type"}: one solvable problem."""
  unknown = set(task_types) - set(TASK_TYPES)
  if unknown or not task_types:
    raise ValueError(f"task_types {sorted(unknown) or '[]'} invalid; choose from {TASK_TYPES}.")
  info, constants, goals, _ = import_alfworld()
  layouts = os.path.join(os.path.dirname(constants.__file__), "layouts")
  plans = sorted(int(p.split("FloorPlan")[1].split("-")[0])
                 for p in glob.glob(os.path.join(layouts, "FloorPlan*-openable.json")))
  rng = random.Random(seed)
  task_type = rng.choice(list(task_types))  # drawn once: retries must not favor easy types
  for _ in range(100):
    receps, portable, has_lamp = _scene(rng, constants, layouts, rng.choice(plans),
                                        max_receptacles)
    choice = _pick_task(rng, task_type, constants, receps, portable, has_lamp)
    if choice is not None:
      break
  else:
    raise RuntimeError(f"no scene supports task_types={task_types} (seed {seed}).")
  obj, target = choice
  others = [o for o in portable if o != obj]
  kinds = [obj, obj] + rng.sample(others, min(len(others), max_objects - 2))
  problem = _problem_text(rng, constants, task_type, receps, kinds, obj, target, goals)
  template = goals.gdict[task_type]["templates"][0]
  task = template.format(obj=obj.lower(), recep=target.lower(), toggle="desklamp")
  with open(info.ALFRED_PDDL_PATH) as f:
    domain = f.read()
  with open(info.ALFRED_TWL2_PATH) as f:
    grammar = f.read().replace("UNKNOWN GOAL", task)
  return {"pddl_domain": domain, "grammar": grammar, "pddl_problem": problem, "task": task,
          "task_type": task_type}


def _problem_text(rng, constants, task_type, receps, kinds, obj, target, goals) -> str:
  """The PDDL problem: receptacles at their own locations, objects placed compatibly."""
  objects, facts = {"agent1": "agent", "loc_start": "location"}, ["(atLocation agent1 loc_start)"]
  recep_ids = []
  for i, rtype in enumerate(receps):
    rid, loc = _mangle(rtype, rng, objects), f"loc_{i}"
    objects.update({rid: "receptacle", loc: "location", f"{rtype}Type": "rtype"})
    facts += [f"(receptacleAtLocation {rid} {loc})", f"(receptacleType {rid} {rtype}Type)"]
    if rtype in constants.OPENABLE_CLASS_SET:
      facts.append(f"(openable {rid})")
    recep_ids.append((rid, rtype, loc))
  placed = list(kinds)
  if task_type == "look_at_obj_in_light":
    placed.append("DeskLamp")
  for otype in placed:
    oid = _mangle(otype, rng, objects)
    objects.update({oid: "object", f"{otype}Type": "otype"})
    facts.append(f"(objectType {oid} {otype}Type)")
    if otype == "DeskLamp":
      hosts = [r for r in recep_ids if r[1] == target]
      facts.append(f"(toggleable {oid})")
    else:
      # The target object starts outside the target receptacle type, as in ALFRED.
      hosts = [r for r in recep_ids if otype in constants.VAL_RECEPTACLE_OBJECTS[r[1]]
               and not (otype == obj and r[1] == target and task_type != "look_at_obj_in_light")]
      facts.append(f"(pickupable {oid})")
      for affordance, pred in (("Heatable", "heatable"), ("Coolable", "coolable"),
                               ("Cleanable", "cleanable"), ("Sliceable", "sliceable")):
        if otype in constants.VAL_ACTION_OBJECTS[affordance]:
          facts.append(f"({pred} {oid})")
    rid, _, loc = rng.choice(hosts)
    facts += [f"(inReceptacle {oid} {rid})", f"(objectAtLocation {oid} {loc})"]
  for rtype in sorted(set(receps)):
    for otype in sorted(set(placed)):
      if otype in constants.VAL_RECEPTACLE_OBJECTS[rtype]:
        facts.append(f"(canContain {rtype}Type {otype}Type)")
  for kind, names in _DOMAIN_CONSTANTS.items():
    objects.update({n: kind for n in names})
  goal = goals.gdict[task_type]["pddl"].replace("#", "-").format(
      obj=obj, recep=target, toggle="DeskLamp")
  decls = "\n".join(f"  {name} - {kind}" for name, kind in objects.items())
  return (f"(define (problem agentrl_{task_type})\n(:domain alfred)\n(:objects\n{decls}\n)\n"
          f"(:init\n  " + "\n  ".join(facts) + f"\n)\n{goal}")


def make_game(seed: int, *, pool: str | None = None, **kwargs) -> str:
  """Path of the cached *.tw-pddl game for (kwargs, seed), generating it if needed."""
  digest = hashlib.sha1(json.dumps(kwargs, sort_keys=True).encode()).hexdigest()
  path = os.path.join(textworld_env.pool_dir(pool), f"alfred-{digest[:10]}-seed{int(seed)}"
                      ".tw-pddl")
  if not os.path.exists(path):
    data = make_problem(seed, **kwargs)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
      json.dump(data, f)
    os.replace(tmp, path)
  return path


def find_games(root: str) -> list[str]:
  """ALFWorld game files under root (the $ALFWORLD_DATA layout: .../<trial>/game.tw-pddl)."""
  games = sorted(glob.glob(os.path.join(root, "**", "game.tw-pddl"), recursive=True))
  if not games:
    raise FileNotFoundError(f"No */game.tw-pddl under {root!r}; set ALFWORLD_DATA or use "
                            "generated games (AlfWorldEnv without game_files).")
  return games


class AlfWorldEnv(textworld_env.TextWorldEnv):
  """TextWorldEnv over generated ALFRED problems (or given ALFWorld game files)."""

  system_prompt = SYSTEM_PROMPT

  def __init__(self, *, task_types=TASK_TYPES, game_files=None, pool: str | None = None,
               max_turns: int = 50, list_commands: bool = True, policy_commands: bool = False,
               max_receptacles: int = 12, max_objects: int = 8):
    import_alfworld()
    super().__init__("custom", game_files=game_files, pool=pool, max_turns=max_turns,
                     list_commands=list_commands, policy_commands=policy_commands)
    self.problem_kwargs = dict(task_types=tuple(task_types), max_receptacles=max_receptacles,
                               max_objects=max_objects)

  def game_file(self, seed: int) -> str:
    if self.game_files is not None:
      return self.game_files[seed % len(self.game_files)]
    return make_game(seed, pool=self.pool, **self.problem_kwargs)

  def _start(self, path: str):
    tw = textworld_env.import_textworld()
    _, _, _, demangler = import_alfworld()
    infos = tw.EnvInfos(admissible_commands=True, policy_commands=self.policy_commands, won=True,
                        lost=True, score=True)
    return tw.start(path, request_infos=infos, wrappers=[demangler])
