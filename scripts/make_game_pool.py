# pylint: disable=invalid-name
r"""Generates the TextWorld games of an experiment's task once, for every run that plays them.

  python scripts/make_game_pool.py           # the credit study's pool (agent.py:textworld)
  python scripts/make_game_pool.py --config=experiments/agents/agent.py:textworld \
      --config.task.pool_size=500 --config.task.game_pool=/data/tw_pool

The games are those the config's task (`config.task`, task.name=textworld) can play: its
training pool (task.pool_size games) and its held-out and validation pools
(task.heldout_pool_size games each; agentrl.envs.textworld_env.game_seed), written to
task.game_pool ("": $AGENTRL_GAME_POOL, else <tmp>/agentrl_game_pool), where every run of the
same task finds them. Generation takes 1-5 s per game, one game at a time; games already in
the pool are skipped, so an interrupted run resumes.
"""
import os
import time

from absl import app
from ml_collections import config_flags

from agentrl.envs import registry
from agentrl.envs import textworld_env

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_CONFIG = config_flags.DEFINE_config_file(
    "config", os.path.join(_ROOT, "experiments", "agents", "agent.py") + ":textworld",
    "The experiment config whose task's games to generate (--config.task.<key> overrides).")


def main(argv):
  del argv
  tc = _CONFIG.value.task
  if tc.name != "textworld":
    raise app.UsageError(f"--config's task.name is {tc.name!r}; game pools are for "
                         "task.name=textworld")
  env = textworld_env.TextWorldEnv(**registry.constructor_kwargs(tc))
  start = time.perf_counter()

  def log(done: int, total: int) -> None:
    if done % 20 == 0 or done == total:
      print(f"{done}/{total} games, {time.perf_counter() - start:.0f}s", flush=True)

  try:
    paths = env.make_pool(log=log)
  except ValueError as e:
    raise app.UsageError(f"{e} (--config.task.pool_size, --config.task.heldout_pool_size)")
  print(f"{len(paths)} games in {os.path.dirname(paths[0])}")


if __name__ == "__main__":
  app.run(main)
