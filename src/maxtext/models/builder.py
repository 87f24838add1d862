"""Creates a decoder sharded on a mesh, randomly initialised or filled from named arrays."""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from maxtext.models.decoder import Decoder, ModelConfig
from maxtext.utils import errors


def param_name(path) -> str:
  """Dotted name of a parameter from its nnx state path, e.g. layers.0.attn.q_proj."""
  return ".".join(str(p) for p in path)


def _abstract(mcfg: ModelConfig, mesh: Mesh):
  with jax.set_mesh(mesh):
    graphdef, abstract_state = nnx.split(nnx.eval_shape(lambda: Decoder(mcfg, rngs=nnx.Rngs(0))))
  return graphdef, abstract_state, nnx.get_named_sharding(abstract_state, mesh)


def init_random(mcfg: ModelConfig, mesh: Mesh, seed: int) -> Decoder:
  """A decoder with seeded random weights, created directly in its sharded layout."""
  graphdef, _, shardings = _abstract(mcfg, mesh)

  @jax.jit
  def init():
    return jax.lax.with_sharding_constraint(nnx.state(Decoder(mcfg, rngs=nnx.Rngs(seed))), shardings)

  with jax.set_mesh(mesh):
    return nnx.merge(graphdef, init())


def from_arrays(mcfg: ModelConfig, mesh: Mesh, arrays: dict[str, np.ndarray], source: str) -> Decoder:
  """A decoder whose parameters are `arrays` (dotted name -> array), placed on the mesh."""
  graphdef, abstract_state, _ = _abstract(mcfg, mesh)
  flat_abstract = dict(nnx.to_flat_state(abstract_state))
  expected = {param_name(p) for p in flat_abstract}
  missing, unexpected = expected - set(arrays), set(arrays) - expected
  if missing or unexpected:
    raise errors.InputError(
        f"{source}: parameters do not match the {mcfg.family} architecture; "
        f"missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}"
    )
  leaves = []
  for path, var in flat_abstract.items():
    name = param_name(path)
    arr = arrays[name]
    if tuple(arr.shape) != tuple(var.shape):
      raise errors.InputError(f"{source}: parameter {name} has shape {tuple(arr.shape)}, the model expects {tuple(var.shape)}")
    sharding = jax.sharding.NamedSharding(mesh, nnx.spmd.get_var_pspec(var))
    value = jax.device_put(np.asarray(arr).astype(var.dtype), sharding)
    leaves.append((path, var.replace(value)))
  return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def to_arrays(model: Decoder) -> dict[str, np.ndarray]:
  """Dotted parameter name -> host array (gathered from the mesh); the inverse of `from_arrays`."""
  return {param_name(path): np.asarray(var[...]) for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
