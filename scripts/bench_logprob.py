"""Peak memory and time of the per-token log-prob implementations (kernels/README.md).

  python scripts/bench_logprob.py                      # SmolLM2 head + a Qwen2.5-0.5B head
  python scripts/bench_logprob.py --shapes=4096x576x49152 --repeats=5
  python scripts/bench_logprob.py --shapes= --pallas_interpret_shape=256x576x4096
  python scripts/bench_logprob.py --dtype=bfloat16 --repeats=10 --inner=10 \
      --impls=reference,xla,pallas,torch,torch_compile --torch_python=python3   # on a GPU

Memory: each (shape, mode, impl) is compiled and run once in a fresh subprocess, so one case's
allocations cannot hide another's peak. Two figures:

  xla MB   `compiled.memory_analysis()`: temp + output bytes of XLA's buffer assignment for the
           jitted function (inputs excluded). Static and noise-free.
  peak MB  CPU: peak resident-set growth during the first execution: the kernel's peak-RSS
           counter (VmHWM) is reset after inputs are built and the function compiled
           (`/proc/self/clear_refs`), so it counts only execution-time allocations, whatever
           allocator XLA uses (later runs may reuse pages the allocator kept).
           GPU: the device allocator's peak bytes in use minus the bytes in use before the
           execution (an upper bound: XLA's compile-time autotuning allocates from the same
           pool, and its peak cannot be reset).

Time: for each (shape, mode) one subprocess compiles every impl, warms each up once, then runs
`--repeats` rounds that time each impl in turn (interleaved, so load from other processes on a
shared machine hits all impls alike); the minimum and median per impl are reported. A round
times `--inner` back-to-back calls and divides (on a GPU one call is too short for the host
clock and launch overhead to vanish).

PyTorch, what users would otherwise run (`--torch_python`, a Python with torch; it never
becomes an agentrl dependency): `torch` is the naive head as verl and TRL compute it
(`log_softmax(h @ W).gather`, float32 logits, autograd), `torch_compile` the same function
under `torch.compile`. Each runs in its own process under that interpreter, on CUDA when
torch sees a GPU: its "xla MB" and "peak MB" are both `torch.cuda.max_memory_allocated()`
growth over the inputs (CPU: peak RSS growth). A case that fails (a kernel that does not
compile, say) prints its error and shows as "failed" in the table; the others still run.

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

# On a GPU, JAX would otherwise reserve most of the device's memory in the parent, which only
# reads the device's name, and leave too little to each measured child process.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

_SHAPES = flags.DEFINE_list("shapes", ["4096x576x49152", "2048x896x151936"],
                            "NxDxV triples (SmolLM2-135M head; Qwen2.5-0.5B head).")
_IMPLS = flags.DEFINE_list("impls", ["reference", "xla"], "Implementations to compare.")
_MODES = flags.DEFINE_list("modes", ["fwd", "fwd+bwd"], "fwd and/or fwd+bwd.")
_DTYPE = flags.DEFINE_string("dtype", "float32", "Input dtype (bf16 matmuls are emulated on CPU).")
_REPEATS = flags.DEFINE_integer("repeats", 3, "Timed rounds after one warm-up.")
_XLA_ROWS = flags.DEFINE_integer("xla_rows", 0, "xla.BlockSizes.rows; 0 keeps the default.")
_XLA_BACKWARD = flags.DEFINE_enum("xla_backward", "auto", ["auto", "tokens", "vocab"],
                                  "xla.BlockSizes.backward: the backward's loop order.")
_INNER = flags.DEFINE_integer("inner", 1, "Back-to-back calls per timed round.")
_TORCH_PYTHON = flags.DEFINE_string(
    "torch_python", "", "A Python with torch, for the torch and torch_compile impls.")
_PALLAS_SHAPE = flags.DEFINE_string(
    "pallas_interpret_shape", "", "If set (NxDxV), also run impl=pallas in interpret mode there.")
_WORKER = flags.DEFINE_string("worker", "", "Internal: run one job given as JSON.")


def _rss_kb(field: str) -> int:
  with open("/proc/self/status") as f:
    for line in f:
      if line.startswith(field + ":"):
        return int(line.split()[1])
  raise RuntimeError(f"{field} not in /proc/self/status")


def _peak_rss_growth_mb(run) -> float:
  """Calls `run()` and returns its peak resident-set growth in MiB (VmHWM reset first)."""
  base_kb = _rss_kb("VmRSS")
  with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset VmHWM to the current RSS
  run()
  return (_rss_kb("VmHWM") - base_kb) / 1024


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
  if impl.startswith("pallas"):
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
  xla_mb = (mem.temp_size_in_bytes + mem.output_size_in_bytes) / 2**20
  if jax.default_backend() != "cpu":
    device = jax.devices()[0]
    base = device.memory_stats()["bytes_in_use"]
    jax.block_until_ready(compiled(*args))
    return dict(xla_mb=xla_mb, peak_mb=(device.memory_stats()["peak_bytes_in_use"] - base) / 2**20)
  peak_mb = _peak_rss_growth_mb(lambda: jax.block_until_ready(compiled(*args)))
  return dict(xla_mb=xla_mb, peak_mb=peak_mb)


def _time_job(job: dict) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  runs = {impl: _compile(job, impl) for impl in job["impls"]}
  for compiled, args in runs.values():
    jax.block_until_ready(compiled(*args))
  times = {impl: [] for impl in runs}
  for _ in range(job["repeats"]):
    for impl, (compiled, args) in runs.items():
      t0 = time.perf_counter()
      for _ in range(job["inner"]):
        out = compiled(*args)
      jax.block_until_ready(out)
      times[impl].append((time.perf_counter() - t0) / job["inner"])
  return {impl: (min(t), statistics.median(t)) for impl, t in times.items()}


def _torch_job(job: dict) -> dict:
  """Memory and time of the naive PyTorch head (eager or torch.compile), in this process."""
  import torch  # pylint: disable=g-import-not-at-top
  dev = "cuda" if torch.cuda.is_available() else "cpu"
  sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
  n, d, v = job["shape"]
  gen = torch.Generator(dev).manual_seed(0)
  dtype = getattr(torch, job["dtype"])
  h = torch.randn(n, d, device=dev, generator=gen).to(dtype).requires_grad_()
  w = (0.05 * torch.randn(d, v, device=dev, generator=gen)).to(dtype).requires_grad_()
  y = torch.randint(0, v, (n,), device=dev, generator=gen)
  g = torch.randn(n, device=dev, generator=gen)

  def logp(h, w):
    return torch.log_softmax((h @ w).float(), dim=-1).gather(-1, y[:, None])[:, 0]

  if job["impl"] == "torch_compile":
    logp = torch.compile(logp)
  if job["mode"] == "fwd":
    def run():
      with torch.no_grad():
        return logp(h, w)
  else:
    def run():
      return torch.autograd.grad((g * logp(h, w)).sum(), (h, w))

  run()  # compiles under torch.compile
  sync()
  if dev == "cuda":
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    run()
    sync()
    peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
  else:
    peak_mb = _peak_rss_growth_mb(run)
  times = []
  for _ in range(job["repeats"]):
    t0 = time.perf_counter()
    for _ in range(job["inner"]):
      run()
    sync()
    times.append((time.perf_counter() - t0) / job["inner"])
  return dict(xla_mb=peak_mb, peak_mb=peak_mb, t_min=min(times), t_med=statistics.median(times),
              device=torch.cuda.get_device_name() if dev == "cuda" else "cpu",
              torch=torch.__version__)


def _spawn(job: dict, python: str = sys.executable) -> dict | None:
  """Runs one job in a fresh process; None (after printing its error) if it failed."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
       os.environ.get("PYTHONPATH", "")]))
  out = subprocess.run([python, os.path.abspath(__file__), "--worker", json.dumps(job)],
                       capture_output=True, text=True, env=env, check=False)
  if out.returncode:
    print(f"job {json.dumps(job)} failed:\n{out.stderr[-3000:]}", flush=True)
    return None
  return json.loads(out.stdout.strip().splitlines()[-1])


def _measure(shape, mode, impls, repeats):
  """Rows for one (shape, mode): memory per impl (fresh processes), then interleaved time."""
  base = dict(shape=shape, mode=mode, dtype=_DTYPE.value, rows=_XLA_ROWS.value,
              backward=_XLA_BACKWARD.value, repeats=repeats, inner=_INNER.value)
  jax_impls = [i for i in impls if not i.startswith("torch")]
  times = _spawn(dict(base, kind="time", impls=jax_impls)) if jax_impls else {}
  rows = []
  for impl in impls:
    if impl.startswith("torch"):
      row = dict(base, impl=impl, **(_spawn(dict(base, kind="torch", impl=impl),
                                            _TORCH_PYTHON.value) or {}))
    else:
      row = dict(base, impl=impl, **(_spawn(dict(base, kind="memory", impl=impl)) or {}))
      if times:
        row["t_min"], row["t_med"] = times[impl]
    rows.append(row)
    print(json.dumps(row), flush=True)
  return rows


def _table(rows, backend: str):
  print(f"{'NxDxV':>16} {'mode':>8} {'impl':>20} {'xla MB':>9} {'peak MB':>9} {'min ms':>9} "
        f"{'median ms':>9} {'xla MB/naive':>12} {'peak/naive':>10} {'time/naive':>10}")
  naive = {(tuple(r["shape"]), r["mode"]): r for r in rows if r["impl"] == "reference"}
  ok = lambda r: "t_min" in r and "xla_mb" in r
  for r in rows:
    base = naive.get((tuple(r["shape"]), r["mode"]))
    base = base if base and ok(base) else None
    name = r["impl"] + (" (interpret)" if r["impl"] == "pallas" and backend == "cpu" else "")
    if r["impl"] == "xla" and r["rows"]:
      name += f" rows={r['rows']}"
    if r["impl"] == "xla" and r.get("backward", "auto") != "auto" and r["mode"] != "fwd":
      name += f" bwd={r['backward']}"
    head = f"{'x'.join(map(str, r['shape'])):>16} {r['mode']:>8} {name:>20}"
    if not ok(r):
      print(f"{head} {'failed (its error is printed above)':>40}")
      continue
    ratios = [f"{r[key] / base[key]:.3f}" if base else "-" for key in ("xla_mb", "peak_mb")]
    t_ratio = f"{r['t_min'] / base['t_min']:.2f}" if base else "-"
    print(f"{head} {r['xla_mb']:9.1f} {r['peak_mb']:9.1f} {1e3 * r['t_min']:9.3f} "
          f"{1e3 * r['t_med']:9.3f} {ratios[0]:>12} {ratios[1]:>10} {t_ratio:>10}")


def main(argv):
  del argv
  if _WORKER.value:
    job = json.loads(_WORKER.value)
    worker = {"time": _time_job, "memory": _memory_job, "torch": _torch_job}[job["kind"]]
    print(json.dumps(worker(job)))
    return
  if any(i.startswith("torch") for i in _IMPLS.value) and not _TORCH_PYTHON.value:
    raise app.UsageError("--impls names torch or torch_compile: give --torch_python, a Python "
                         "with torch (e.g. --torch_python=/path/to/venv/bin/python)")
  import jax  # pylint: disable=g-import-not-at-top
  device = jax.devices()[0]
  print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}; jax {jax.__version__}, backend {jax.default_backend()} "
        f"({device.device_kind}), dtype {_DTYPE.value}", flush=True)
  rows = []
  for shape in _SHAPES.value:
    for mode in _MODES.value:
      rows += _measure([int(x) for x in shape.split("x")], mode, _IMPLS.value, _REPEATS.value)
  if _PALLAS_SHAPE.value:  # interpret mode is an emulator: one timed run is plenty
    shape = [int(x) for x in _PALLAS_SHAPE.value.split("x")]
    for mode in _MODES.value:
      rows += _measure(shape, mode, ["reference", "xla", "pallas"], 1)
  torch_rows = [r for r in rows if r["impl"].startswith("torch") and "torch" in r]
  if torch_rows:
    print(f"PyTorch {torch_rows[0]['torch']} on {torch_rows[0]['device']}")
  _table(rows, jax.default_backend())


if __name__ == "__main__":
  app.run(main)
