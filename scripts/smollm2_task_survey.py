# pylint: disable=invalid-name
r"""Base success of SmolLM2-135M-Instruct on reasoning-gym datasets: where RL can start.

  python scripts/smollm2_task_survey.py                      # the default list, 64 problems
  python scripts/smollm2_task_survey.py --datasets=leg_counting,gcd --problems=32

RL with a group baseline learns from groups whose samples disagree, so a task is in reach when
the base model solves some but not all of its problems. For each dataset this evaluates the
experiments' held-out seeds (the ones `recipe.evaluator` uses) with the smollm2 preset's
policy, chat template, token budget and rollout engine: greedy success, the success of one
sample at the rollout temperature, and the fraction of G-sample groups with both a success and
a failure (prompts that give a GRPO gradient). The table goes to stdout.
"""
import functools
import time

from absl import app
from absl import flags
import jax
import numpy as np

from agentrl import recipe
from agentrl import sharding
from agentrl.envs import registry
from agentrl.rollout import collect

_DATASETS = flags.DEFINE_list(
    "datasets", ["leg_counting", "basic_arithmetic", "chain_sum", "spell_backward",
                 "letter_counting", "number_sorting", "gcd", "decimal_arithmetic"],
    "reasoning-gym datasets (their default difficulty).")
_PROBLEMS = flags.DEFINE_integer("problems", 64, "Held-out problems per dataset.")
_GROUP = flags.DEFINE_integer("group", 4, "Samples per problem for the group statistics.")
_NEW = flags.DEFINE_integer("max_new_tokens", 0, "Per-answer budget (0: the preset's).")


def survey(name: str, config, tok, graphdef, params, engine) -> dict:
  rc = config.rollout
  make_env = functools.partial(registry.make, "reasoning_gym", name=name)
  seeds = [recipe.EVAL_SEED_BASE + i for i in range(_PROBLEMS.value)]
  kw = dict(max_turns=1, max_new_tokens=rc.max_new_tokens, max_len=rc.max_len,
            chat_template=True)
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
          "tokens": np.mean([float(t.loss_mask.sum()) for t in sampled]),
          "seconds": time.perf_counter() - start}


def main(argv):
  del argv
  config = recipe.rl_config("smollm2")
  if _NEW.value:
    config.rollout.max_new_tokens = _NEW.value
  tok, graphdef, params = recipe.build_policy(config, sharding.make_mesh(config.mesh))
  engine = recipe.rollout_engine(config, graphdef, tok)
  rc = config.rollout
  print(f"SmolLM2-135M-Instruct, {_PROBLEMS.value} held-out problems, {rc.max_new_tokens} new "
        f"tokens, temperature {rc.temperature}, groups of {_GROUP.value}")
  print("| dataset | greedy success | sampled success | groups with signal | sampled tokens | s |")
  print("|---|---:|---:|---:|---:|---:|")
  for name in _DATASETS.value:
    r = survey(name, config, tok, graphdef, params, engine)
    print(f"| {name} | {r['greedy']:.1%} | {r['sampled']:.1%} | {r['mixed']:.1%} | "
          f"{r['tokens']:.1f} | {r['seconds']:.0f} |", flush=True)


if __name__ == "__main__":
  app.run(main)
