"""Peak memory and time of the teacher-student KL implementations (kernels/README.md).

  python scripts/bench_distill_kl.py                                   # ~1-2 min on 2 CPU cores
  python scripts/bench_distill_kl.py --shapes=4096x576x49152 --repeats=3   # SmolLM2 head
  python scripts/bench_distill_kl.py --kind=forward --top_k=50

Both models get the shape's D (self-distillation, as OPSD), float32 inputs. Naive =
impl="reference" (both models' [N, V] float32 logits, plain autodiff). "fwd" is
`distill_kl(...)`; "fwd+bwd" the value and gradient w.r.t. the student's h and W of
`sum(g * kl)` with random per-token g.

Memory, as scripts/bench_logprob.py: each (shape, mode, impl) runs once in a fresh subprocess;
`xla MB` = temp + output bytes of `compiled.memory_analysis()` (inputs excluded, static),
`rss MB` = peak RSS growth during the first execution (VmHWM reset after compiling). Time: one
subprocess per (shape, mode) compiles every impl, warms each up, then times `--repeats`
interleaved rounds (shared machines load all impls alike); minimum and median per impl.
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

_SHAPES = flags.DEFINE_list("shapes", ["1024x256x32768"],
                            "NxDxV triples (the SmolLM2-135M head is 4096x576x49152).")
_IMPLS = flags.DEFINE_list("impls", ["reference", "xla"], "Implementations to compare.")
_MODES = flags.DEFINE_list("modes", ["fwd", "fwd+bwd"], "fwd and/or fwd+bwd.")
_KIND = flags.DEFINE_enum("kind", "reverse", ["forward", "reverse"], "distill_kl kind.")
_TOP_K = flags.DEFINE_integer("top_k", 0, "distill_kl top_k; 0 = the full vocabulary.")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds after one warm-up.")
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
  from kernels.logprob import kl  # pylint: disable=g-import-not-at-top

  n, d, v = job["shape"]
  k = jax.random.split(jax.random.key(0), 5)
  args = (jax.random.normal(k[0], (n, d)), 0.05 * jax.random.normal(k[1], (d, v)),
          jax.random.normal(k[2], (n, d)), 0.05 * jax.random.normal(k[3], (d, v)),
          jax.random.normal(k[4], (n,)))
  op = lambda hs, ws, ht, wt: kl.distill_kl(hs, ws, ht, wt, kind=job["kind"],
                                            top_k=job["top_k"] or None, impl=impl)
  if job["mode"] == "fwd":
    fn = jax.jit(lambda hs, ws, ht, wt, g: op(hs, ws, ht, wt))
  else:
    fn = jax.jit(jax.value_and_grad(lambda hs, ws, ht, wt, g: jnp.sum(g * op(hs, ws, ht, wt)),
                                    (0, 1)))
  return fn.lower(*args).compile(), args


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


def _measure(shape, mode):
  """Rows for one (shape, mode): memory per impl (fresh processes), then interleaved time."""
  base = dict(shape=shape, mode=mode, kind=_KIND.value, top_k=_TOP_K.value)
  times = _spawn(dict(base, job="time", impls=_IMPLS.value, repeats=_REPEATS.value))
  rows = []
  for impl in _IMPLS.value:
    row = dict(base, impl=impl, **_spawn(dict(base, job="memory", impl=impl)))
    row["t_min"], row["t_med"] = times[impl]
    rows.append(row)
    print(json.dumps(row), flush=True)
  return rows


def _table(rows):
  print(f"{'NxDxV':>16} {'mode':>8} {'impl':>10} {'xla MB':>9} {'rss MB':>9} {'min s':>8} "
        f"{'median s':>9} {'xla MB/naive':>12} {'rss/naive':>9} {'time/naive':>10}")
  naive = {(tuple(r["shape"]), r["mode"]): r for r in rows if r["impl"] == "reference"}
  for r in rows:
    base = naive.get((tuple(r["shape"]), r["mode"]))
    ratios = [f"{r[key] / base[key]:.3f}" if base else "-" for key in ("xla_mb", "rss_mb")]
    t_ratio = f"{r['t_min'] / base['t_min']:.2f}" if base else "-"
    print(f"{'x'.join(map(str, r['shape'])):>16} {r['mode']:>8} {r['impl']:>10} "
          f"{r['xla_mb']:9.1f} {r['rss_mb']:9.1f} {r['t_min']:8.3f} {r['t_med']:9.3f} "
          f"{ratios[0]:>12} {ratios[1]:>9} {t_ratio:>10}")


def main(argv):
  del argv
  if _WORKER.value:
    job = json.loads(_WORKER.value)
    print(json.dumps(_time_job(job) if job["job"] == "time" else _memory_job(job)))
    return
  import jax  # pylint: disable=g-import-not-at-top
  print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}; jax {jax.__version__}, backend {jax.default_backend()}; "
        f"kind={_KIND.value}, top_k={_TOP_K.value or None}, float32", flush=True)
  rows = []
  for shape in _SHAPES.value:
    for mode in _MODES.value:
      rows += _measure([int(x) for x in shape.split("x")], mode)
  _table(rows)


if __name__ == "__main__":
  app.run(main)
