"""Creates a decoder sharded on a mesh, randomly initialised or filled from named arrays."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from maxtext.models.decoder import LORA_INPUT_AXES, Decoder, ModelConfig
from maxtext.utils import distributed, errors


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


def _check_names(source: str, expected: set[str], arrays: dict, what: str) -> None:
  """An InputError naming `source` and `what` unless `arrays` holds exactly the names `expected`."""
  missing, unexpected = expected - set(arrays), set(arrays) - expected
  if missing or unexpected:
    raise errors.InputError(f"{source}: {what}; missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")


def from_arrays(mcfg: ModelConfig, mesh: Mesh, arrays: dict[str, np.ndarray], source: str) -> Decoder:
  """A decoder whose parameters are `arrays` (dotted name -> array), placed on the mesh."""
  graphdef, abstract_state, _ = _abstract(mcfg, mesh)
  flat_abstract = dict(nnx.to_flat_state(abstract_state))
  _check_names(
    source, {param_name(p) for p in flat_abstract}, arrays, f"parameters do not match the {mcfg.family} architecture"
  )
  leaves = []
  for path, var in flat_abstract.items():
    name = param_name(path)
    arr = arrays[name]
    if tuple(arr.shape) != tuple(var.shape):
      raise errors.InputError(
        f"{source}: parameter {name} has shape {tuple(arr.shape)}, the model expects {tuple(var.shape)}"
      )
    pspec = nnx.spmd.get_var_pspec(var)
    assert pspec is not None  # every parameter has a shape
    sharding = jax.sharding.NamedSharding(mesh, pspec)
    value = jax.device_put(np.asarray(arr).astype(var.dtype), sharding)
    leaves.append((path, var.replace(value)))
  return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def is_adapter(name: str) -> bool:
  """Whether a dotted parameter name is a LoRA adapter's (layers.0.attn.q_proj_lora_a)."""
  return name.endswith(("_lora_a", "_lora_b"))


def _mesh_of(model: Decoder) -> Mesh:
  return jax.tree.leaves(nnx.state(model))[0].sharding.mesh


def with_lora(base: Decoder, mcfg: ModelConfig, seed: int) -> Decoder:
  """`base` with LoRA adapters (mcfg.lora_*) on the weights mcfg.lora_module_path names; the base
  weights are the same arrays as base's (no copy), the adapters seeded, B at zero."""
  weights = [param_name(p) for p, _ in nnx.to_flat_state(nnx.state(base, nnx.Param))]
  if not any(mcfg.adapts(w) for w in weights):
    adaptable = [w for w in weights if w.rsplit(".", 1)[-1] in LORA_INPUT_AXES]
    raise errors.ConfigError(
      f"lora_module_path={mcfg.lora_module_path!r} matches no weight that takes a LoRA "
      f"adapter (dotted names such as {', '.join(adaptable[:7])})"
    )
  mesh = _mesh_of(base)
  graphdef, abstract, _ = _abstract(mcfg, mesh)
  lora_shardings = nnx.get_named_sharding(nnx.filter_state(abstract, nnx.LoRAParam), mesh)

  @jax.jit
  def init():
    return jax.lax.with_sharding_constraint(
      nnx.state(Decoder(mcfg, rngs=nnx.Rngs(seed)), nnx.LoRAParam), lora_shardings
    )

  with jax.set_mesh(mesh):
    return nnx.merge(graphdef, nnx.state(base), init())


def base_of(model: Decoder) -> Decoder:
  """The frozen base of an adapted decoder: its base weights (the same arrays) without adapters."""
  mcfg = dataclasses.replace(model.config, lora_rank=0)
  graphdef, _, _ = _abstract(mcfg, _mesh_of(model))
  return nnx.merge(graphdef, nnx.state(model, nnx.Not(nnx.LoRAParam)))


def adapters(model: Decoder) -> dict[str, np.ndarray]:
  """Dotted adapter name (layers.0.attn.q_proj_lora_a) -> host array."""
  return {
    param_name(path): distributed.host_array(var[...])
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))
  }


def set_adapters(model: Decoder, arrays: dict[str, np.ndarray], source: str) -> None:
  """Replaces the model's adapters with `arrays` (dotted name -> array, as `adapters` returns)."""
  current = dict(nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)))
  names = {param_name(p): p for p in current}
  _check_names(source, set(names), arrays, "LoRA adapters do not match lora_rank/lora_module_path")
  leaves = []
  for name, path in names.items():
    var = current[path]
    if tuple(arrays[name].shape) != tuple(var.shape):
      raise errors.InputError(
        f"{source}: adapter {name} has shape {tuple(arrays[name].shape)}, lora_rank="
        f"{model.config.lora_rank} expects {tuple(var.shape)}"
      )
    leaves.append((path, var.replace(jax.device_put(np.asarray(arrays[name], var.dtype), var[...].sharding))))
  nnx.update(model, nnx.from_flat_state(leaves))


def to_arrays(model: Decoder) -> dict[str, np.ndarray]:
  """Dotted parameter name -> host array (gathered from the mesh; every process calls it), adapters
  merged into their weights (W + alpha / rank A B): the inverse of `from_arrays` for the plain decoder."""
  flat = {param_name(path): var[...] for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  out = {}
  for name, value in flat.items():
    if is_adapter(name):
      continue
    if f"{name}_lora_a" in flat:
      a, b = flat[f"{name}_lora_a"], flat[f"{name}_lora_b"]
      delta = jax.numpy.tensordot(a, b, 1, precision=model.config.precision) * model.config.lora_scale
      value = (value.astype(np.float32) + delta).astype(value.dtype)
    out[name] = distributed.host_array(value)
  return out
