# pylint: disable=invalid-name
r"""Base success of SmolLM2-135M-Instruct on reasoning-gym tasks: where RL can start.

  python scripts/smollm2_task_survey.py               # the default list, 32 problems each
  python scripts/smollm2_task_survey.py --task=gcd --task='products:{"max_digits": 1}' \
      --max_new_tokens=48 --answer_mode=tag_or_last_line --system_prompt=

RL with a group baseline learns from groups whose samples disagree, so a task is in reach when
the base model solves some but not all of its problems. For each task (a reasoning-gym dataset,
optionally with its generator's arguments as JSON after a colon) this evaluates the
experiments' held-out seeds (the ones `recipe.evaluator` uses) with the smollm2 policy, chat
template and rollout engine: greedy success, the success of one sample at the rollout
temperature, and the fraction of G-sample groups with both a success and a failure (prompts
that give a GRPO gradient). The defaults of the budget, answer extraction and system prompt
are those of `experiments/policy/grpo.py:smollm2`. The table goes to stdout.
"""
import functools
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
from agentrl.rewards import extract
from agentrl.rollout import collect
from agentrl import sharding

_TASKS = flags.DEFINE_multi_string(
    "task", ["products:{\"max_digits\": 1}",
             "basic_arithmetic:{\"max_terms\": 2, \"max_digits\": 1, \"operators\": [\"+\", \"-\"], "
             "\"allow_parentheses\": false, \"allow_negation\": false}",
             "chain_sum:{\"max_terms\": 2, \"max_digits\": 2}",
             "gcd:{\"max_value\": 20}",
             "leg_counting:{\"max_animals\": 2, \"min_animals\": 1, \"max_instances\": 3}",
             "letter_counting:{\"min_words\": 3, \"max_words\": 5}"],
    "reasoning-gym tasks: a dataset name, optionally ':' and its generator's arguments (JSON).")
_PROBLEMS = flags.DEFINE_integer("problems", 32, "Held-out problems per task.")
_GROUP = flags.DEFINE_integer("group", 4, "Samples per problem for the group statistics.")
_NEW = flags.DEFINE_integer("max_new_tokens", 24, "Per-answer token budget.")
_MODE = flags.DEFINE_enum("answer_mode", "last_number", extract.MODES,
                          "How the answer is read from a completion (agentrl.rewards.extract).")
_SYSTEM = flags.DEFINE_string("system_prompt", "Answer with the final number.",
                              "Chat system message ('': reasoning-gym's own, which asks for "
                              "<answer></answer> tags).")


def parse_task(spec: str) -> tuple[str, dict]:
  name, _, args = spec.partition(":")
  try:
    return name.strip(), registry.rg_kwargs(args)
  except configs.ConfigError as e:
    raise app.UsageError(f"--task={spec!r}, the arguments after ':': {e}") from None


def survey(name: str, kwargs: dict, config, tok, params, engine) -> dict:
  rc = config.rollout
  make_env = functools.partial(registry.make, "reasoning_gym", name=name,
                               answer_mode=_MODE.value, system_prompt=_SYSTEM.value or None,
                               **kwargs)
  seeds = [recipe.EVAL_SEED_BASE + i for i in range(_PROBLEMS.value)]
  kw = dict(max_turns=1, max_new_tokens=_NEW.value, max_len=rc.max_len, chat_template=True)
  start = time.perf_counter()
  greedy, _ = engine.run(params, tok, [make_env() for _ in seeds], seeds, rng=jax.random.key(0),
                         greedy=True, **kw)
  group_seeds = [s for s in seeds for _ in range(_GROUP.value)]
  sampled, _ = engine.run(params, tok, [make_env() for _ in group_seeds], group_seeds,
                          rng=jax.random.key(1), temperature=rc.temperature, **kw)
  won_PG = np.asarray([collect.trajectory_success(t) for t in sampled],
                      np.float32).reshape(-1, _GROUP.value)
  return {"greedy": np.mean([collect.trajectory_success(t) for t in greedy]),
          "sampled": won_PG.mean(), "mixed": np.mean((won_PG.min(1) < won_PG.max(1))),
          "tokens": np.mean([float(t.loss_mask.sum()) for t in greedy]),
          # Used the whole budget: cut off, unless the stop token came exactly last.
          "cut": np.mean([float(t.loss_mask.sum()) >= _NEW.value for t in greedy]),
          "seconds": time.perf_counter() - start}


def main(argv):
  del argv
  tasks = [parse_task(spec) for spec in _TASKS.value]
  config = rl_config.rl_config("smollm2")
  config.rollout.slots = 64
  tok, graphdef, params = recipe.build_policy(config, sharding.make_mesh(config.mesh))
  engine = recipe.rollout_engine(config, graphdef, tok)
  print(f"SmolLM2-135M-Instruct, {_PROBLEMS.value} held-out problems, {_NEW.value} new tokens, "
        f"answer read as {_MODE.value}, system prompt {_SYSTEM.value!r}, temperature "
        f"{config.rollout.temperature}, groups of {_GROUP.value}")
  print("| task | greedy success | greedy answers cut by the budget | greedy tokens | "
        "sampled success | groups with signal | s |")
  print("|---|---:|---:|---:|---:|---:|---:|")
  for name, kwargs in tasks:
    r = survey(name, kwargs, config, tok, params, engine)
    label = f"{name} {json.dumps(kwargs)}" if kwargs else name
    print(f"| `{label}` | {r['greedy']:.1%} | {r['cut']:.0%} | {r['tokens']:.1f} | "
          f"{r['sampled']:.1%} | {r['mixed']:.1%} | {r['seconds']:.0f} |", flush=True)


if __name__ == "__main__":
  app.run(main)
