r"""Tile sweep of the GPU log-prob kernel's forward (`pallas_gpu.BlockSizes`), on a GPU.

  python scripts/sweep_pallas_gpu.py                       # SmolLM2 and Qwen2.5-0.5B heads
  python scripts/sweep_pallas_gpu.py --shapes=4096x576x49152 --inner=20

Each candidate `rows:vocab:depth:vocab_splits:num_warps:num_stages` is compiled, checked
against the XLA path's log-probs (largest absolute difference; a candidate over --atol is
marked), and timed like scripts/bench_logprob.py: --repeats rounds of --inner back-to-back
calls, every candidate in turn each round, with the naive head (`reference`) and the XLA path
in the same rounds for scale. bf16 inputs. The forward only: the default backward is the XLA
path's whatever the tiles. A candidate Triton cannot compile (too much shared memory, say)
is reported and skipped.
"""
import statistics
import time

from absl import app
from absl import flags

_SHAPES = flags.DEFINE_list("shapes", ["4096x576x49152", "2048x896x151936"], "NxDxV triples.")
_CANDIDATES = flags.DEFINE_list(
    "candidates",
    ["64:128:64:8:4:2", "128:128:64:8:4:2", "128:128:64:8:8:2", "64:256:64:8:4:2",
     "64:256:64:8:8:2", "128:256:64:8:8:2", "128:256:64:8:8:3", "64:128:128:8:4:2",
     "128:128:128:8:8:2", "64:128:64:16:4:2", "128:128:64:4:8:3", "64:128:64:8:4:3",
     "128:256:32:8:8:3"],
    "rows:vocab:depth:vocab_splits:num_warps:num_stages (the first is the default).")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed rounds.")
_INNER = flags.DEFINE_integer("inner", 10, "Back-to-back calls per timed round.")
_ATOL = flags.DEFINE_float("atol", 2e-2, "Largest accepted |logp - xla logp| (bf16 inputs).")
_INTERPRET = flags.DEFINE_bool("interpret", False,
                               "Interpret the kernel (checks this script on a CPU; no timing).")


def _sweep(shape):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from kernels.logprob import ops, pallas_gpu  # pylint: disable=g-import-not-at-top

  n, d, v = shape
  k = jax.random.split(jax.random.key(0), 3)
  h = jax.random.normal(k[0], (n, d), jnp.bfloat16)
  w = (0.05 * jax.random.normal(k[1], (d, v))).astype(jnp.bfloat16)
  y = jax.random.randint(k[2], (n,), 0, v)
  runs = {}
  for name, kw in [("reference", dict(impl="reference")), ("xla", dict(impl="xla"))]:
    runs[name] = jax.jit(lambda h, w, kw=kw: ops.token_logprobs(h, w, y, **kw))
  for cand in _CANDIDATES.value:
    r, tv, th, splits, warps, stages = map(int, cand.split(":"))
    blocks = pallas_gpu.BlockSizes(rows=r, vocab=tv, depth=th, vocab_splits=splits,
                                   num_warps=warps, num_stages=stages)
    runs[cand] = jax.jit(lambda h, w, b=blocks: ops.token_logprobs(
        h, w, y, impl="pallas_gpu", block_sizes=b, interpret=_INTERPRET.value))
  want = np.asarray(jax.block_until_ready(runs["xla"](h, w)))
  errors = {}
  for name in list(runs):
    try:
      errors[name] = float(np.abs(np.asarray(jax.block_until_ready(runs[name](h, w))) - want)
                           .max())
    except Exception as e:  # pylint: disable=broad-except
      print(f"{name}: does not compile or run: {str(e).splitlines()[0][:200]}", flush=True)
      del runs[name]
  times = {name: [] for name in runs}
  for _ in range(_REPEATS.value):
    for name, fn in runs.items():
      t0 = time.perf_counter()
      for _ in range(_INNER.value):
        out = fn(h, w)
      jax.block_until_ready(out)
      times[name].append((time.perf_counter() - t0) / _INNER.value)
  naive = min(times["reference"])
  print(f"\n{'x'.join(map(str, shape))}, {jax.devices()[0].device_kind}, jax {jax.__version__}")
  print(f"{'candidate':>20} {'min ms':>8} {'median ms':>9} {'time/naive':>10} {'max |err|':>9}")
  for name in sorted(runs, key=lambda x: min(times[x])):
    flag = "" if errors[name] <= _ATOL.value else "  > atol"
    print(f"{name:>20} {1e3 * min(times[name]):8.3f} {1e3 * statistics.median(times[name]):9.3f} "
          f"{min(times[name]) / naive:10.2f} {errors[name]:9.2e}{flag}", flush=True)


def main(argv):
  del argv
  import jax  # pylint: disable=g-import-not-at-top
  if jax.default_backend() != "gpu" and not _INTERPRET.value:
    raise app.UsageError(f"this sweep needs a GPU (found {jax.default_backend()}); "
                         "--interpret checks the script elsewhere with a small --shapes")
  for shape in _SHAPES.value:
    _sweep([int(x) for x in shape.split("x")])


if __name__ == "__main__":
  app.run(main)
