"""Peak memory and time of the per-token log-prob implementations (kernels/README.md).

  python scripts/bench_logprob.py                      # SmolLM2 head + a Qwen2.5-0.5B head
  python scripts/bench_logprob.py --shapes=4096x576x49152 --repeats=5
  python scripts/bench_logprob.py --shapes= --pallas_interpret_shape=256x576x4096

Memory: each (shape, mode, impl) is compiled and run once in a fresh subprocess, so one case's
allocations cannot hide another's peak. Two figures:

  xla MB   `compiled.memory_analysis()`: temp + output bytes of XLA's buffer assignment for the
           jitted function (inputs excluded). Static and noise-free.
  rss MB   peak resident-set growth during the first execution: the kernel's peak-RSS counter
           (VmHWM) is reset after inputs are built and the function compiled
           (`/proc/self/clear_refs`), so it counts only execution-time allocations, whatever
           allocator XLA uses (later runs may reuse pages the allocator kept).

Time: for each (shape, mode) one subprocess compiles every impl, warms each up once, then runs
`--repeats` rounds that time each impl in turn (interleaved, so load from other processes on a
shared machine hits all impls alike); the minimum and median per impl are reported.

"fwd" is the forward `token_logprobs`; "fwd+bwd" is the value and gradient w.r.t. hidden and W
of `sum(g * logp)` with random per-token g (as an RL loss produces). Naive = impl="reference"
(materialized [N, V] float32 logits, plain autodiff).
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
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds after one warm-up.")
_XLA_ROWS = flags.DEFINE_integer("xla_rows", 0, "xla.BlockSizes.rows; 0 keeps the default.")
_XLA_BACKWARD = flags.DEFINE_enum("xla_backward", "auto", ["auto", "tokens", "vocab"],
                                  "xla.BlockSizes.backward: the backward's loop order.")
_PALLAS_SHAPE = flags.DEFINE_string(
    "pallas_interpret_shape", "", "If set (NxDxV), also run impl=pallas in interpret mode there.")
_WORKER = flags.DEFINE_string("worker", "", "Internal: run one job given as JSON.")


def _rss_kb(field: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise RuntimeError(f"{field} not in /proc/self/status")


def _compile(job: dict, impl: str):
  """Returns (compiled fn, args) for one impl of the job's shape and mode."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from kernels.logprob import ops  # pylint: disable=g-import-not-at-top
  from kernels.logprob import xla  # pylint: disable=g-import-not-at-top

  n, d, v = job["shape"]
  k = jax.random.split(jax.random.key(0), 4)
  h = jax.random.normal(k[0], (n, d), job["dtype"])
  w = (0.05 * jax.random.normal(k[1], (d, v))).astype(job["dtype"])
  y = jax.random.randint(k[2], (n,), 0, v)
  g = jax.random.normal(k[3], (n,))
  kw = dict(impl=impl)
  if impl == "pallas":
    kw["interpret"] = jax.default_backend() == "cpu"
  if impl == "xla":
    kw["block_sizes"] = xla.BlockSizes(rows=job.get("rows") or None,
                                       backward=job.get("backward", "auto"))
  if job["mode"] == "fwd":
    fn = jax.jit(lambda h, w: ops.token_logprobs(h, w, y, **kw))
  else:
    fn = jax.jit(jax.value_and_grad(lambda h, w: jnp.sum(g * ops.token_logprobs(h, w, y, **kw)),
                                    (0, 1)))
  return fn.lower(h, w).compile(), (h, w)


def _memory_job(job: dict) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  compiled, args = _compile(job, job["impl"])
  mem = compiled.memory_analysis()
  base_kb = _rss_kb("VmRSS")
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current RSS
  jax.block_until_ready(compiled(*args))
  return dict(xla_mb=(mem.temp_size_in_bytes + mem.output_size_in_bytes) / 2**20,
              rss_mb=(_rss_kb("VmHWM") - base_kb) / 1024)


def _time_job(job: dict) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  runs = {impl: _compile(job, impl) for impl in job["impls"]}
  for compiled, args in runs.values():
    jax.block_until_ready(compiled(*args))
  times = {impl: [] for impl in runs}
  for _ in range(job["repeats"]):
    for impl, (compiled, args) in runs.items():
      t0 = time.perf_counter()
      jax.block_until_ready(compiled(*args))
      times[impl].append(time.perf_counter() - t0)
  return {impl: (min(t), statistics.median(t)) for impl, t in times.items()}


def _spawn(job: dict) -> dict:
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
       os.environ.get("PYTHONPATH", "")]))
  out = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(job)],
                       capture_output=True, text=True, env=env, check=False)
  if out.returncode:
    raise RuntimeError(f"job {job} failed:\n{out.stderr[-3000:]}")
  return json.loads(out.stdout.strip().splitlines()[-1])


def _measure(shape, mode, impls, repeats):
  """Rows for one (shape, mode): memory per impl (fresh processes), then interleaved time."""
  base = dict(shape=shape, mode=mode, dtype=_DTYPE.value, rows=_XLA_ROWS.value,
              backward=_XLA_BACKWARD.value)
  times = _spawn(dict(base, kind="time", impls=impls, repeats=repeats))
  rows = []
  for impl in impls:
    row = dict(base, impl=impl, **_spawn(dict(base, kind="memory", impl=impl)))
    row["t_min"], row["t_med"] = times[impl]
    rows.append(row)
    print(json.dumps(row), flush=True)
  return rows


def _table(rows):
  print(f"{'NxDxV':>16} {'mode':>8} {'impl':>20} {'xla MB':>9} {'rss MB':>9} {'min s':>8} "
        f"{'median s':>9} {'xla MB/naive':>12} {'rss/naive':>9} {'time/naive':>10}")
  naive = {(tuple(r["shape"]), r["mode"]): r for r in rows if r["impl"] == "reference"}
  for r in rows:
    base = naive.get((tuple(r["shape"]), r["mode"]))
    ratios = [f"{r[key] / base[key]:.3f}" if base else "-" for key in ("xla_mb", "rss_mb")]
    t_ratio = f"{r['t_min'] / base['t_min']:.2f}" if base else "-"
    name = r["impl"] + (" (interpret)" if r["impl"] == "pallas" else "")
    if r["impl"] == "xla" and r["rows"]:
      name += f" rows={r['rows']}"
    if r["impl"] == "xla" and r.get("backward", "auto") != "auto" and r["mode"] != "fwd":
      name += f" bwd={r['backward']}"
    print(f"{'x'.join(map(str, r['shape'])):>16} {r['mode']:>8} {name:>20} {r['xla_mb']:9.1f} "
          f"{r['rss_mb']:9.1f} {r['t_min']:8.3f} {r['t_med']:9.3f} {ratios[0]:>12} "
          f"{ratios[1]:>9} {t_ratio:>10}")


def main(argv):
  del argv
  if _WORKER.value:
    job = json.loads(_WORKER.value)
    print(json.dumps(_time_job(job) if job["kind"] == "time" else _memory_job(job)))
    return
  import jax  # pylint: disable=g-import-not-at-top
  print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}; jax {jax.__version__}, backend {jax.default_backend()}, "
        f"dtype {_DTYPE.value}", flush=True)
  rows = []
  for shape in _SHAPES.value:
    for mode in _MODES.value:
      rows += _measure([int(x) for x in shape.split("x")], mode, _IMPLS.value, _REPEATS.value)
  if _PALLAS_SHAPE.value:  # interpret mode is an emulator: one timed run is plenty
    shape = [int(x) for x in _PALLAS_SHAPE.value.split("x")]
    for mode in _MODES.value:
      rows += _measure(shape, mode, ["reference", "xla", "pallas"], 1)
  _table(rows)


if __name__ == "__main__":
  app.run(main)
