"""Device meshes for the trainer and the sampler, built from the ici_* parallelism keys."""

from __future__ import annotations

import math

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from maxtext.configs.sections import MESH_AXES, MeshSection
from maxtext.utils import distributed

# Mesh axes that split the batch of training examples.
DATA_AXES = ("data", "fsdp")


def _mesh(mesh: MeshSection, devices: list) -> Mesh:
  return Mesh(np.array(devices).reshape(mesh.shape(len(devices))), MESH_AXES)


def create_meshes(mesh: MeshSection, agentic: bool) -> tuple[Mesh, Mesh]:
  """(trainer mesh, sampler mesh) of a config checked against this job (checks.check_job); the same mesh
  unless the device fractions split the devices, or `agentic` GRPO runs across processes: there each
  process samples on its own devices (`process_local`), for its share of each batch."""
  devices = jax.devices()
  if not mesh.split:
    whole = _mesh(mesh, devices)
    if agentic and jax.process_count() > 1:
      return whole, _mesh(mesh, jax.local_devices())
    return whole, whole
  n_train, n_sample = mesh.device_counts(len(devices))
  return _mesh(mesh, devices[:n_train]), _mesh(mesh, devices[n_train : n_train + n_sample])


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
