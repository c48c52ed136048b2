"""Peak memory and time of the per-token log-prob implementations (kernels/README.md).

  python scripts/bench_logprob.py                      # SmolLM2 head + a Qwen2.5-0.5B head
  python scripts/bench_logprob.py --shapes=4096x576x49152 --repeats=5
  python scripts/bench_logprob.py --pallas_interpret_shape=256x576x4096   # + interpret timing

Each (shape, impl, mode) runs in a fresh subprocess, so one case's allocations cannot hide
another's peak. Memory is reported two ways:

  xla MB   `compiled.memory_analysis()`: temp + output bytes of XLA's buffer assignment for the
           jitted function (inputs excluded). Static and noise-free.
  rss MB   peak resident-set growth during the first execution: the kernel's peak-RSS counter
           (VmHWM) is reset after inputs are built and the function compiled
           (`/proc/self/clear_refs`), so it counts only execution-time allocations, whatever
           allocator XLA uses (later runs may reuse pages the allocator kept).

Time is the minimum (and median) wall time over `--repeats` runs after one warm-up; on a shared
machine the minimum is the least contended figure. "fwd" is the forward `token_logprobs`;
"fwd+bwd" is the value and gradient w.r.t. hidden and W of `sum(g * logp)` with random per-token
g (as an RL loss produces). Naive = impl="reference" (materialized [N, V] logits, autodiff).
"""
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from absl import app
from absl import flags

_SHAPES = flags.DEFINE_list("shapes", ["4096x576x49152", "2048x896x151936"],
                            "NxDxV triples (SmolLM2-135M head; Qwen2.5-0.5B head).")
_IMPLS = flags.DEFINE_list("impls", ["reference", "xla"], "Implementations to compare.")
_MODES = flags.DEFINE_list("modes", ["fwd", "fwd+bwd"], "fwd and/or fwd+bwd.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Input dtype (bf16 matmuls are emulated on CPU).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed runs per case after one warm-up.")
_PALLAS_SHAPE = flags.DEFINE_string(
    "pallas_interpret_shape", "", "If set (NxDxV), also time impl=pallas in interpret mode.")
_XLA_ROWS = flags.DEFINE_integer("xla_rows", 0, "xla.BlockSizes.rows; 0 keeps the default.")
_WORKER = flags.DEFINE_string("worker", "", "Internal: run one case given as JSON.")


def _rss_kb(field: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise RuntimeError(f"{field} not in /proc/self/status")


def _run_case(case: dict) -> dict:
  """One measurement in this (fresh) process."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from kernels.logprob import ops  # pylint: disable=g-import-not-at-top
  from kernels.logprob import xla  # pylint: disable=g-import-not-at-top

  n, d, v = case["shape"]
  k = jax.random.split(jax.random.key(0), 4)
  h = jax.random.normal(k[0], (n, d), case["dtype"])
  w = (0.05 * jax.random.normal(k[1], (d, v))).astype(case["dtype"])
  y = jax.random.randint(k[2], (n,), 0, v)
  g = jax.random.normal(k[3], (n,))
  kw = dict(impl=case["impl"], interpret=case.get("interpret", False))
  if case["impl"] == "reference":
    kw.pop("interpret")
  if case["impl"] == "xla" and case.get("rows"):
    kw["block_sizes"] = xla.BlockSizes(rows=case["rows"])
  if case["mode"] == "fwd":
    fn = jax.jit(lambda h, w: ops.token_logprobs(h, w, y, **kw))
  else:
    fn = jax.jit(jax.value_and_grad(lambda h, w: jnp.sum(g * ops.token_logprobs(h, w, y, **kw)),
                                    (0, 1)))
  compiled = fn.lower(h, w).compile()
  mem = compiled.memory_analysis()
  base_kb = _rss_kb("VmRSS")
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current RSS
  # The first run allocates; later runs may reuse pages the allocator kept, so measure it.
  jax.block_until_ready(compiled(h, w))
  peak_kb = _rss_kb("VmHWM")
  times = []
  for _ in range(case["repeats"]):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(h, w))
    times.append(time.perf_counter() - t0)
  return dict(case, xla_mb=(mem.temp_size_in_bytes + mem.output_size_in_bytes) / 2**20,
              rss_mb=(peak_kb - base_kb) / 1024, t_min=min(times),
              t_med=statistics.median(times))


def _spawn(case: dict) -> dict:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
       os.environ.get("PYTHONPATH", "")]))
  out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(case)],
                       capture_output=True, text=True, env=env, check=False)
  if out.returncode:
    raise RuntimeError(f"case {case} failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def _table(rows):
  print(f"{'NxDxV':>18} {'mode':>8} {'impl':>18} {'xla MB':>9} {'rss MB':>9} "
        f"{'min s':>8} {'median s':>9} {'mem/naive':>9} {'time/naive':>10}")
  naive = {(tuple(r["shape"]), r["mode"]): r for r in rows if r["impl"] == "reference"}
  for r in rows:
    base = naive.get((tuple(r["shape"]), r["mode"]))
    mem_ratio = f"{r['xla_mb'] / base['xla_mb']:.3f}" if base else "-"
    t_ratio = f"{r['t_min'] / base['t_min']:.2f}" if base else "-"
    name = r["impl"] + (" (interpret)" if r.get("interpret") else "")
    print(f"{'x'.join(map(str, r['shape'])):>18} {r['mode']:>8} {name:>18} {r['xla_mb']:9.1f} "
          f"{r['rss_mb']:9.1f} {r['t_min']:8.3f} {r['t_med']:9.3f} {mem_ratio:>9} {t_ratio:>10}")


def main(argv):
  del argv
  if _WORKER.value:
    print(json.dumps(_run_case(json.loads(_WORKER.value))))
    return
  import jax  # pylint: disable=g-import-not-at-top
  print(f"machine: {platform.machine()} {os.cpu_count()} CPUs, {platform.processor() or '?'}; "
        f"jax {jax.__version__}, backend {jax.default_backend()}, dtype {_DTYPE.value}")
  rows = []
  for shape in _SHAPES.value:
    for mode in _MODES.value:
      for impl in _IMPLS.value:
        case = dict(shape=[int(x) for x in shape.split("x")], mode=mode, impl=impl,
                    dtype=_DTYPE.value, repeats=_REPEATS.value, rows=_XLA_ROWS.value)
        rows.append(_spawn(case))
        print(json.dumps(rows[-1]), flush=True)
  if _PALLAS_SHAPE.value:
    for mode in _MODES.value:
      for impl, interpret in (("reference", False), ("pallas", True)):
        case = dict(shape=[int(x) for x in _PALLAS_SHAPE.value.split("x")], mode=mode,
                    impl=impl, interpret=interpret, dtype=_DTYPE.value, repeats=1)
        rows.append(_spawn(case))
        print(json.dumps(rows[-1]), flush=True)
  _table(rows)


if __name__ == "__main__":
  app.run(main)
