"""JAX's multi-controller runtime: every process runs the same program on its own devices.

`initialize` starts it from the environment a cluster sets (see its docstring). The rest are the
agreements a run needs where processes could otherwise take different branches and then wait for each
other forever: a run's text files are written by process 0 alone (`is_main`), and a decision one
process sees (a signal, a non-finite metric only process 0 logs) is shared before anyone acts on it.
Each is a no-op in a single process.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pickle

import jax
import jax.extend
import numpy as np

log = logging.getLogger(__name__)

# Environment variables of the usual cluster launchers; when one is set, jax.distributed starts.
_COORDINATOR_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "MEGASCALE_COORDINATOR_ADDRESS")
# A process that stops sending heartbeats (killed, its host lost) ends the job after this long.
HEARTBEAT_TIMEOUT_S = 30


@dataclasses.dataclass(frozen=True)
class Job:
  """The processes and devices a run has: every process's devices and this process's, and JAX's
  backend as messages name it (a GPU with its platform version, which tells NVIDIA's apart)."""

  processes: int
  devices: int
  local_devices: int
  backend: str
  nvidia: bool = False


def job() -> Job:
  """The job this process is part of (after `initialize`)."""
  name, nvidia = jax.default_backend(), False
  if name == "gpu":
    version = jax.extend.backend.get_backend().platform_version
    name, nvidia = f"gpu ({version})", version.lower().startswith("cuda")
  return Job(jax.process_count(), jax.device_count(), jax.local_device_count(), name, nvidia)


def initialize() -> Job:
  """Starts multi-host JAX when a coordinator address is in the environment; returns the job.

  JAX_COORDINATOR_ADDRESS (host:port) with JAX_NUM_PROCESSES and JAX_PROCESS_ID start it
  explicitly, as do the variables XPK sets on GKE GPU node pools (JAX_COORDINATOR_ADDRESS and
  JAX_COORDINATOR_PORT, NNODES, NODE_RANK); otherwise jax.distributed detects the cluster itself
  (Cloud TPU slices, SLURM, Open MPI). CPU processes talk over gloo unless JAX_CPU_COLLECTIVES_IMPLEMENTATION says
  otherwise (without it they cannot run a collective at all). A process whose peer dies ends within
  HEARTBEAT_TIMEOUT_S plus the coordination service's polling, with the service's error.
  """
  if not any(os.environ.get(v) for v in _COORDINATOR_VARIABLES) or jax.distributed.is_initialized():
    return job()
  if not os.environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION"):
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(**_explicit(os.environ), heartbeat_timeout_seconds=HEARTBEAT_TIMEOUT_S)
  log.info("Process %d of %d, %d local devices", jax.process_index(), jax.process_count(), jax.local_device_count())
  return job()


def _explicit(env) -> dict:
  """jax.distributed.initialize's arguments from the environment; none where JAX detects the cluster."""
  if env.get("JAX_NUM_PROCESSES"):
    return dict(
      coordinator_address=env["JAX_COORDINATOR_ADDRESS"],
      num_processes=int(env["JAX_NUM_PROCESSES"]),
      process_id=int(env["JAX_PROCESS_ID"]),
    )
  if env.get("NNODES") and env.get("NODE_RANK"):  # XPK's GPU workloads
    return dict(
      coordinator_address=f"{env['JAX_COORDINATOR_ADDRESS']}:{env.get('JAX_COORDINATOR_PORT', '1234')}",
      num_processes=int(env["NNODES"]),
      process_id=int(env["NODE_RANK"]),
    )
  return {}


def is_main() -> bool:
  """Whether this process writes the run's text files (config, metrics, evaluations, report)."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process reaches the barrier of this name."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices(name)


def gather(values: np.ndarray) -> np.ndarray:
  """Every process's `values` (same shape and dtype everywhere), stacked in process order."""
  if jax.process_count() == 1:
    return np.asarray(values)[None]
  from jax.experimental import multihost_utils

  return np.asarray(multihost_utils.process_allgather(np.asarray(values)))


def gather_objects(obj) -> list:
  """Every process's `obj` (any picklable value), in process order; every process must call it."""
  if jax.process_count() == 1:
    return [obj]
  data = np.frombuffer(pickle.dumps(obj), np.uint8)
  sizes = gather(np.array([data.size], np.int64))[:, 0]
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[: data.size] = data
  blobs = gather(padded)
  return [pickle.loads(blobs[i, :size].tobytes()) for i, size in enumerate(sizes)]


def main_object(obj):
  """Process 0's `obj` (any picklable value), on every process; every process must call it."""
  return gather_objects(obj)[0]


def from_main(value: int) -> int:
  """Process 0's value of an integer, on every process."""
  return int(gather(np.array([value], np.int64))[0, 0])


def host_array(x: jax.Array) -> np.ndarray:
  """The whole of a (possibly multi-process) array on this host; every process must call it."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(x)
