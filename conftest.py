"""pytest start-up: 8 host CPU devices for JAX before anything imports it, and one compile cache.

The sharding tests need a multi-device mesh, and XLA reads this flag once, at backend start.
Single-device code is unaffected (it runs on device 0).

Compiles dominate the suite on a small CPU, and the tiny models' programs (init, sampler,
engine, score and update steps) recur across test files, pytest-xdist workers and the
experiment processes that tests start. One persistent XLA compilation cache, set through the
environment so that every worker and subprocess inherits it, turns those repeats into loads;
it is keyed by the program, the compile options and the jax/jaxlib versions, so a hit is the
same executable a compile would give. It lives in the temp directory and is kept between runs
(a second run of the suite compiles almost nothing); each run adds entries for the code it has
not seen before, and deleting the folder is always safe. AGENTRL_TEST_CACHE picks another
place, and AGENTRL_TEST_CACHE=off turns it off.
"""
import os
import tempfile

# LLVM's optimisation level 0 for the CPU code XLA emits: the suite's programs are tiny and
# compiled once each, so compile time dominates, and level 0 compiles them in much less CPU
# time (XLA's own HLO passes, fusion included, still run; results agree within every
# test's tolerance). Runs outside pytest keep XLA's defaults.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                      "--xla_backend_optimization_level=0")
os.environ.setdefault("MPLBACKEND", "Agg")
# Every test runs with implicit rank promotion as an error. Many test modules also set it at
# import (so they hold when run alone); since the setting is process-wide, setting it here for
# all keeps a test's outcome independent of which modules shared its worker.
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")

_cache = os.environ.get("AGENTRL_TEST_CACHE") or os.path.join(
    tempfile.gettempdir(), f"agentrl-test-xla-cache-{os.getuid()}")
if _cache != "off":
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _cache)
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
