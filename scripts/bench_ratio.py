"""Time of the CTPO ratio math (kernels/ratio): XLA fusion vs the Pallas kernel.

  python scripts/bench_ratio.py                       # B x T = 64x4096 and 256x8192
  python scripts/bench_ratio.py --shapes=64x4096 --repeats=20

"fwd" computes every `ratio_stats` output; "fwd+grad" also differentiates
`sum(w * log_ratio)` w.r.t. logp (what a loss adds). Time is the minimum and median wall time
over `--repeats` runs after a warm-up, of one jitted function. `xla MB` is temp + output bytes
from `compiled.memory_analysis()`; `fusions` counts fusion computations in XLA's optimized HLO.

Without a TPU the Pallas kernel can only run in interpret mode (an emulator that runs the grid
as a loop); its times are printed labelled "(interpret)" and say nothing about the compiled
kernel's speed.
"""
import os
import platform
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp

from kernels.ratio import ops

_SHAPES = flags.DEFINE_list("shapes", ["64x4096", "256x8192"], "BxT shapes.")
_REPEATS = flags.DEFINE_integer("repeats", 10, "Timed runs per case after one warm-up.")
_PALLAS = flags.DEFINE_bool("pallas", True, "Also time impl=pallas (interpret mode off TPU).")


def _inputs(b, t):
  k = jax.random.split(jax.random.key(0), 4)
  logp = -2.0 * jax.random.uniform(k[0], (b, t))
  old = logp + 0.05 * jax.random.normal(k[1], (b, t))
  mask = (jax.random.uniform(k[2], (b, t)) > 0.3).astype(jnp.float32)
  return logp, old, mask, jax.random.normal(k[3], (b,))


def _measure(fn, args, repeats):
  compiled = jax.jit(fn).lower(*args).compile()
  mem = compiled.memory_analysis()
  fusions = compiled.as_text().count("fused_computation")
  jax.block_until_ready(compiled(*args))
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    jax.block_until_ready(compiled(*args))
    times.append(time.perf_counter() - t0)
  return ((mem.temp_size_in_bytes + mem.output_size_in_bytes) / 2**20, fusions, min(times),
          statistics.median(times))


def main(argv):
  del argv
  backend = jax.default_backend()
  print(f"machine: {platform.machine()} {os.cpu_count()} CPUs; jax {jax.__version__}, "
        f"backend {backend}")
  impls = [("xla", {})]
  if _PALLAS.value:
    impls.append(("pallas", {} if backend == "tpu" else {"interpret": True}))
  print(f"{'BxT':>10} {'mode':>9} {'impl':>20} {'xla MB':>8} {'fusions':>8} {'min ms':>9} "
        f"{'median ms':>10}")
  for shape in _SHAPES.value:
    b, t = (int(x) for x in shape.split("x"))
    logp, old, mask, adv = _inputs(b, t)
    w = jnp.cos(jnp.arange(b * t, dtype=jnp.float32)).reshape(b, t)
    for impl, kw in impls:
      # Every array is an argument: closed-over constants would let XLA constant-fold the
      # mask's cumsum at compile time.
      def stats(lp, old, mask, adv, impl=impl, kw=kw):
        return ops.ratio_stats(lp, old, mask, adv, impl=impl, **kw)

      def fwd_grad(lp, old, mask, adv, stats=stats):
        loss = lambda x: jnp.sum(w * stats(x, old, mask, adv).log_ratio_BT)
        return stats(lp, old, mask, adv), jax.grad(loss)(lp)

      for mode, fn in (("fwd", stats), ("fwd+grad", fwd_grad)):
        repeats = _REPEATS.value if "interpret" not in kw else 1
        mb, fusions, t_min, t_med = _measure(fn, (logp, old, mask, adv), repeats)
        name = impl + (" (interpret)" if "interpret" in kw else "")
        print(f"{shape:>10} {mode:>9} {name:>20} {mb:8.1f} {fusions:8d} {t_min * 1e3:9.2f} "
              f"{t_med * 1e3:10.2f}", flush=True)


if __name__ == "__main__":
  app.run(main)
