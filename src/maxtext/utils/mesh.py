"""Device meshes for the trainer and the sampler, built from the ici_* parallelism keys."""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from maxtext.configs.sections import MESH_AXES, MeshSection
from maxtext.utils import distributed
from maxtext.utils.errors import ConfigError

# Mesh axes that split the batch of training examples.
DATA_AXES = ("data", "fsdp")


def mesh_shape(mesh: MeshSection, num_devices: int) -> tuple[int, int, int]:
  """(data, fsdp, tensor) sizes for num_devices; one -1 entry fills the remaining devices."""
  keys = ("ici_data_parallelism", "ici_fsdp_parallelism", "ici_tensor_parallelism")
  sizes = [getattr(mesh, k) for k in keys]
  fills = [i for i, s in enumerate(sizes) if s == -1]
  if len(fills) > 1:
    raise ConfigError(f"{', '.join(keys[i] for i in fills)}: at most one parallelism may be -1")
  fixed = math.prod(s for s in sizes if s != -1)
  if any(s == 0 or s < -1 for s in sizes):
    raise ConfigError(f"{dict(zip(keys, sizes))}: parallelism sizes must be positive or -1")
  if fills:
    if num_devices % fixed:
      raise ConfigError(
        f"{dict(zip(keys, sizes))}: {num_devices} devices are not divisible by the fixed sizes ({fixed})"
      )
    sizes[fills[0]] = num_devices // fixed
  if math.prod(sizes) != num_devices:
    raise ConfigError(
      f"{dict(zip(keys, sizes))}: product {math.prod(sizes)} does not match the {num_devices} devices available"
    )
  return tuple(sizes)


def _mesh(mesh: MeshSection, devices: list) -> Mesh:
  return Mesh(np.array(devices).reshape(mesh_shape(mesh, len(devices))), MESH_AXES)


def create_meshes(cfg: MeshSection, agentic: bool) -> tuple[Mesh, Mesh]:
  """(trainer mesh, sampler mesh); the same mesh unless the device fractions split the devices, or
  `agentic` GRPO runs across processes: there each process samples on its own devices
  (`process_local`), for its share of each batch."""
  devices = jax.devices()
  tf, sf = cfg.trainer_devices_fraction, cfg.sampler_devices_fraction
  if tf == 1.0 and sf == 1.0:
    mesh = _mesh(cfg, devices)
    if agentic and jax.process_count() > 1:
      return mesh, _process_mesh(cfg)
    return mesh, mesh
  if jax.process_count() > 1:
    raise ConfigError(
      f"trainer_devices_fraction={tf}, sampler_devices_fraction={sf}: trainer and sampler on separate devices "
      f"are not supported across {jax.process_count()} processes (each program would run on some processes' "
      "devices only, while every process runs every program); leave both at 1.0"
    )
  n_train, n_sample = int(len(devices) * tf), int(len(devices) * sf)
  if n_train < 1 or n_sample < 1 or n_train + n_sample > len(devices):
    raise ConfigError(
      f"trainer_devices_fraction={tf}, sampler_devices_fraction={sf}: need at least one device each "
      f"and no more than the {len(devices)} available (got {n_train} + {n_sample})"
    )
  return _mesh(cfg, devices[:n_train]), _mesh(cfg, devices[n_train : n_train + n_sample])


def _process_mesh(mesh: MeshSection) -> Mesh:
  local = jax.local_devices()
  try:
    return _mesh(mesh, local)
  except ConfigError as e:
    raise ConfigError(
      f"{e} (agentic GRPO across {jax.process_count()} processes samples on each process's "
      f"{len(local)} devices with the same parallelism keys: set the one to fill to -1)"
    ) from None


def process_local(mesh: Mesh) -> bool:
  """Whether `mesh` is one process's devices in a job of several processes."""
  return jax.process_count() > 1 and all(d.process_index == jax.process_index() for d in mesh.devices.flat)


def placed(tree, shardings):
  """tree's arrays placed with `shardings` (a matching tree); an array spanning processes is
  gathered whole first (a collective: every process must place the same arrays in the same order)."""

  def place(x, sharding):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      x = distributed.host_array(x)
    return jax.device_put(x, sharding)

  return jax.tree.map(place, tree, shardings)


def global_batch(tree, mesh: Mesh):
  """tree's arrays, which every process holds whole and alike (the global batch: every process runs
  the sampler on all of it), as global arrays whose first dimension is split over the data axes
  (replicated where it does not divide); each process places only the rows its own devices hold, so
  every example reaches the trainer once. Arrays already spanning processes are left as they are."""
  parts = math.prod(mesh.shape[a] for a in DATA_AXES)

  def place(x):
    if not isinstance(x, (np.ndarray, jax.Array)) or (isinstance(x, jax.Array) and not x.is_fully_addressable):
      return x
    split = x.ndim >= 1 and x.shape[0] % parts == 0
    sharding = NamedSharding(mesh, PartitionSpec(DATA_AXES) if split else PartitionSpec())
    return jax.make_array_from_process_local_data(sharding, x, x.shape)

  return jax.tree.map(place, tree)
