"""Multi-process start-up: TPU pod slices and GPU clusters on JAX's own runtime.

Call `initialize_distributed()` first thing in `main()`, before anything touches a device;
every process then runs the same program on the global mesh (`agentrl.sharding`). A single
process (a laptop, one GPU host) is left alone.
"""
import os
import pathlib

from absl import logging
import jax


def _env_int(name: str) -> int | None:
  value = os.environ.get(name)
  if value in (None, ""):
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"Environment variable {name}={value!r} must be an integer.") from None


# PCI (vendor, device) ids of Cloud TPU chips, v3 to TPU7x, as in JAX's hardware_utils.
# Google's vendor id alone is not enough: GCE virtual NICs and disks carry it too.
_TPU_PCI_IDS = {("0x1ae0", d) for d in ("0x0027", "0x0056", "0x005e", "0x0062", "0x0063",
                                         "0x006f", "0x0076")}


def _on_cloud_tpu_vm() -> bool:
  """Whether a TPU chip is attached: a Cloud TPU VM, perhaps one host of a pod slice."""
  for dev in pathlib.Path("/sys/bus/pci/devices").glob("*"):
    try:
      ids = tuple((dev / f).read_text().strip() for f in ("vendor", "device"))
    except OSError:
      continue
    if ids in _TPU_PCI_IDS:
      return True
  return False


def cluster_launcher() -> str | None:
  """The multi-process launcher this process runs under, from standard env vars, or None."""
  env = os.environ
  if (_env_int("SLURM_NTASKS") or 1) > 1 and "SLURM_STEP_NODELIST" in env:
    return "slurm"
  if (_env_int("OMPI_COMM_WORLD_SIZE") or 1) > 1:
    return "openmpi"
  hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
  if len([h for h in hosts.split(",") if h]) > 1:
    return "tpu"
  if _on_cloud_tpu_vm():
    return "tpu-vm"  # pod slice or single host: JAX asks the VM metadata server
  return None


def initialize_distributed(coordinator_address: str | None = None,
                           num_processes: int | None = None, process_id: int | None = None,
                           **kwargs) -> bool:
  """Starts JAX's multi-process runtime if this is a multi-process run; returns whether it is.

  Call it first in `main()`, before anything touches a device. Arguments left None are read
  from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID; when none is set, a
  SLURM (`srun`), Open MPI or Cloud TPU launch is detected from the environment and JAX fills
  everything in (on a single-host TPU VM that is a one-process runtime). Otherwise (one
  process: a laptop, a GPU host, JAX_NUM_PROCESSES=1) it does nothing.
  Extra keyword arguments (e.g. `initialization_timeout`) go to `jax.distributed.initialize`.
  """
  if jax.distributed.is_initialized():
    return jax.process_count() > 1
  coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if num_processes is None:
    num_processes = _env_int("JAX_NUM_PROCESSES")
  if process_id is None:
    process_id = _env_int("JAX_PROCESS_ID")
  if num_processes == 1:
    return False
  explicit = (coordinator_address, num_processes, process_id) != (None, None, None)
  if not explicit and cluster_launcher() is None:
    return False
  jax.distributed.initialize(coordinator_address, num_processes, process_id, **kwargs)
  logging.info("Process %d of %d; %d local and %d global devices.", jax.process_index(),
               jax.process_count(), jax.local_device_count(), jax.device_count())
  return jax.process_count() > 1
