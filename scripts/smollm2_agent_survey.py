# pylint: disable=invalid-name
r"""Base behaviour of SmolLM2-135M-Instruct on multi-turn tool tasks: where agent RL can start.

  python scripts/smollm2_agent_survey.py          # the default candidates, 32 problems each
  python scripts/smollm2_agent_survey.py \
      --task='{"name": "calculator", "num_ops": 1, "max_operand": 99, "max_turns": 3}'

The multi-turn counterpart of scripts/smollm2_task_survey.py. Each --task is a config.task as
JSON (agentrl/envs/registry.py keys; chat_template is always on). For each it runs the held-out
seeds the experiments evaluate on (`recipe.EVAL_SEED_BASE` on) with the smollm2 policy and the
rollout engine and reports:

  greedy / sampled    episode success, greedy and at the rollout temperature;
  signal              the fraction of G-sample groups with both a success and a failure (the
                      prompts that give a group-baseline gradient);
  one turn            greedy success with max_turns=1: what the model solves without the tool
                      or the env's feedback (a task worth the agent preset is one it cannot);
  valid               the fraction of sampled model turns the env accepted (info["error"] empty:
                      a well-formed tool call or answer);
  calls               sampled episodes that made at least one tool call (info["tool_calls"]);
  turns               model turns per sampled episode.

The table goes to stdout.
"""
import json
import time

from absl import app
from absl import flags
import jax
import numpy as np

from agentrl import configs
from agentrl.envs import registry
from agentrl.harness import recipe
from agentrl.harness import rl_config
from agentrl.rollout import collect
from agentrl import sharding

_TASKS = flags.DEFINE_multi_string(
    "task", ['{"name": "calculator", "num_ops": 1, "max_operand": 99, "max_turns": 3}',
             '{"name": "calculator", "num_ops": 2, "max_operand": 20, "max_turns": 3}',
             '{"name": "tool_use", "family": "convert", "max_turns": 3}'],
    "A config.task as JSON: its name and any of its env's keys.")
_PROBLEMS = flags.DEFINE_integer("problems", 32, "Held-out problems per task.")
_GROUP = flags.DEFINE_integer("group", 4, "Samples per problem for the group statistics.")
_NEW = flags.DEFINE_integer("max_new_tokens", 48, "Per-turn token budget.")
_MAX_LEN = flags.DEFINE_integer("max_len", 512, "Token budget of a whole episode.")
_SYSTEM = flags.DEFINE_string("system_prompt", None, "Overrides the env's system message.")


def parse_task(spec: str) -> dict:
  try:
    values = json.loads(spec)
  except json.JSONDecodeError as e:
    raise app.UsageError(f"--task={spec!r} is not JSON ({e.msg}); write e.g. "
                         '\'{"name": "calculator", "max_turns": 3}\'') from None
  if not isinstance(values, dict) or "name" not in values:
    raise app.UsageError(f"--task={spec!r}: give a JSON object with at least a \"name\".")
  name = values.pop("name")
  try:
    tc = registry.task_config(name, chat_template=True, **values)
    registry.check(tc)
  except configs.ConfigError as e:
    raise app.UsageError(f"--task={spec!r}: {e}") from None
  return tc


def episode_stats(trajs) -> dict:
  """collect.episode_metrics plus the episodes that made at least one tool call."""
  return {**collect.episode_metrics(trajs),
          "calls": float(np.mean([any(i.get("tool_calls", 0) for i in t.infos) for t in trajs]))}


def survey(tc: dict, engine, params, tok, temperature: float) -> dict:
  seeds = [recipe.EVAL_SEED_BASE + i for i in range(_PROBLEMS.value)]
  kw = dict(max_new_tokens=_NEW.value, max_len=_MAX_LEN.value, chat_template=True,
            system_prompt=_SYSTEM.value)

  def run(task, row_seeds, rng, **more):
    make_env = registry.factory(task)
    return engine.run(params, tok, [make_env() for _ in row_seeds], row_seeds,
                      rng=jax.random.key(rng), max_turns=task["max_turns"], **kw, **more)[0]

  start = time.perf_counter()
  greedy = run(tc, seeds, 0, greedy=True)
  one_turn = run({**tc, "max_turns": 1}, seeds, 0, greedy=True)
  group_seeds = [s for s in seeds for _ in range(_GROUP.value)]
  sampled = run(tc, group_seeds, 1, temperature=temperature)
  won_PG = np.asarray([collect.trajectory_success(t) for t in sampled],
                      np.float32).reshape(-1, _GROUP.value)
  return {"greedy": episode_stats(greedy)["success"],
          "one_turn": episode_stats(one_turn)["success"], **episode_stats(sampled),
          "mixed": float(np.mean(won_PG.min(1) < won_PG.max(1))),
          "seconds": time.perf_counter() - start}


def main(argv):
  del argv
  tasks = [parse_task(spec) for spec in _TASKS.value]
  config = rl_config.rl_config("smollm2")
  config.rollout.slots = 64
  tok, graphdef, params = recipe.build_policy(config, sharding.make_mesh(config.mesh))
  engine = recipe.rollout_engine(config, graphdef, tok)
  temperature = config.rollout.temperature
  print(f"SmolLM2-135M-Instruct, {_PROBLEMS.value} held-out problems, {_NEW.value} new tokens "
        f"per turn, temperature {temperature}, groups of {_GROUP.value}")
  print("| task | greedy | sampled | signal | one turn | valid | calls | turns | s |")
  print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
  for tc in tasks:
    r = survey(tc, engine, params, tok, temperature)
    keys = {k: v for k, v in tc.items()
            if k not in ("chat_template",) and v != registry.task_config(tc["name"]).get(k)}
    label = f"{tc['name']} {json.dumps(keys)}" if keys else tc["name"]
    print(f"| `{label}` | {r['greedy']:.1%} | {r['success']:.1%} | {r['mixed']:.1%} | "
          f"{r['one_turn']:.1%} | {r['valid_turns']:.1%} | {r['calls']:.1%} | {r['turns']:.2f} | "
          f"{r['seconds']:.0f} |", flush=True)


if __name__ == "__main__":
  app.run(main)
