"""Cost of bounding answer verification: scorers in-process vs in `rewards.bounded` workers.

  python scripts/bench_verify.py                                   # chain_sum, simple_integration
  python scripts/bench_verify.py --datasets=countdown --n=200 --threads=1,4

`round trip` times `Pool.call(int)`, a call that does nothing,, in a trusted pool and in the
untrusted pool the verifiers use (its guards are checked on every call). For each
reasoning-gym dataset, `n` gold answers are scored by the generator's `score_answer` in this
process (what scoring cost before it was bounded), then through `ReasoningGymTask.score` from
1 and more threads at once (the env worker threads of a rollout): the pool grows to one worker
per thread, up to its cap. Worker start-up (interpreter, imports, the dataset block) is paid
once per worker and left out: each case runs once untimed to warm its workers.
"""
import concurrent.futures
import os
import platform
import time

from absl import app
from absl import flags

from agentrl.envs import reasoning_gym_env
from agentrl.rewards import bounded

_DATASETS = flags.DEFINE_list("datasets", ["chain_sum", "simple_integration"],
                              "reasoning-gym datasets to score.")
_N = flags.DEFINE_integer("n", 1000, "Gold answers scored per case.")
_THREADS = flags.DEFINE_list("threads", ["1", "8"], "Threads scoring at once.")


def _round_trip_us(pool: bounded.Pool, calls: int = 2000) -> float:
  pool.call(int)  # int() does nothing, and a worker can unpickle it
  start = time.perf_counter()
  for _ in range(calls):
    pool.call(int)
  return 1e6 * (time.perf_counter() - start) / calls


def _timed(fn, items, threads: int) -> float:
  with concurrent.futures.ThreadPoolExecutor(threads) as executor:
    list(executor.map(fn, items))  # warms every worker
    start = time.perf_counter()
    scores = list(executor.map(fn, items))
  elapsed = time.perf_counter() - start
  if min(scores) < 1.0:
    raise SystemExit(f"a gold answer scored {min(scores)}: the benchmark is not measuring "
                     "what it says")
  return elapsed


def main(argv):
  del argv
  print(f"machine: {platform.machine()} {os.cpu_count()} CPUs")
  rows = []
  for untrusted in (False, True):
    pool = bounded.Pool(untrusted=untrusted)
    rows.append((f"round trip, {'untrusted' if untrusted else 'trusted'} pool", "1 call",
                 f"{_round_trip_us(pool):.0f} us"))
    pool.close()
  for name in _DATASETS.value:
    dataset = reasoning_gym_env.import_reasoning_gym().create_dataset(name, size=_N.value,
                                                                       seed=0)
    here = lambda e: float(dataset.score_answer(answer=e["answer"], entry=e))  # pylint: disable=cell-var-from-loop
    rows.append((f"{name}: in-process, 1 thread", f"{_N.value} scores",
                 f"{_timed(here, list(dataset), 1):.2f} s"))
    task = reasoning_gym_env.ReasoningGymTask(name)
    entries = [task.entry(seed) for seed in range(_N.value)]
    bounded_score = lambda e: task.score(e["answer"], e)[0]  # pylint: disable=cell-var-from-loop
    for threads in map(int, _THREADS.value):
      rows.append((f"{name}: bounded, {threads} thread{'s' * (threads > 1)}",
                   f"{_N.value} scores", f"{_timed(bounded_score, entries, threads):.2f} s"))
  width = max(len(r[0]) for r in rows)
  print(f"{'case':{width}s}  {'work':>12s}  {'time':>10s}")
  for case, work, elapsed in rows:
    print(f"{case:{width}s}  {work:>12s}  {elapsed:>10s}")


if __name__ == "__main__":
  app.run(main)
