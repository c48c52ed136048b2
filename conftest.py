"""pytest start-up: give JAX 8 host CPU devices before anything imports it.

The sharding tests need a multi-device mesh, and XLA reads this flag once, at backend start.
Single-device code is unaffected (it runs on device 0).
"""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("MPLBACKEND", "Agg")
# Every test runs with implicit rank promotion as an error. Many test modules also set it at
# import (so they hold when run alone); since the setting is process-wide, setting it here for
# all keeps a test's outcome independent of which modules shared its worker.
os.environ.setdefault("JAX_NUMPY_RANK_PROMOTION", "raise")
