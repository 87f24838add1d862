"""Creates a decoder sharded on a mesh, randomly initialised or filled from named arrays.

Arrays are named per layer (layers.3.attn.q_proj) going in and out, whichever the decoder's layout:
a decoder with scan_layers holds each weight of every layer as one stacked parameter
(layers.attn.q_proj [layers, ...]), which `from_arrays` and `set_adapters` stack from per-layer
arrays and `to_arrays` and `adapters` split again; arrays named in the stacked layout (a scanned
run's Orbax checkpoint) load into either decoder too.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh

from maxtext.models.decoder import LORA_INPUT_AXES, Decoder, ModelConfig
from maxtext.utils import distributed, errors, lora_names

log = logging.getLogger(__name__)


def param_name(path) -> str:
  """Dotted name of a parameter from its nnx state path, e.g. layers.0.attn.q_proj (layers.attn.q_proj
  for stacked layers)."""
  return ".".join(str(p) for p in path)


def _stacked_part(name: str) -> str | None:
  """A stacked layers' parameter's name after `layers.` (layers.attn.q_proj -> attn.q_proj); None for
  any other name (layers.3.attn.q_proj, embed)."""
  head, _, rest = name.partition(".")
  return rest if head == "layers" and rest and not rest.split(".", 1)[0].isdigit() else None


def _layer_names(name: str, num_layers: int) -> list[str]:
  """The per-layer names a parameter's name stands for: a stacked layers' parameter's one per layer,
  any other name itself."""
  rest = _stacked_part(name)
  return [name] if rest is None else [f"layers.{i}.{rest}" for i in range(num_layers)]


def per_layer(arrays: dict) -> dict:
  """`arrays` named per layer: a stacked layers' array (layers.attn.q_proj [layers, ...]) split into
  one per layer (layers.0.attn.q_proj, ..., views of it); the others as they are."""
  out = {}
  for name, value in arrays.items():
    rest = _stacked_part(name)
    if rest is None:
      out[name] = value
    else:
      out.update((f"layers.{i}.{rest}", layer) for i, layer in enumerate(value))
  return out


def _abstract(mcfg: ModelConfig, mesh: Mesh):
  with jax.set_mesh(mesh):
    graphdef, abstract_state = nnx.split(nnx.eval_shape(lambda: Decoder(mcfg, rngs=nnx.Rngs(0))))
  return graphdef, abstract_state, nnx.get_named_sharding(abstract_state, mesh)


def _unrolled_state(mcfg: ModelConfig, seed: int, abstract: nnx.State) -> nnx.State:
  """The state of a decoder with layers unrolled seeded with `seed`, in the layout of `abstract` (the
  state of mcfg's decoder, or a filtered part of it): stacked layers' values stacked from the
  layers', so a seed gives the same weights with scan_layers or without. Traced (call under jit)."""
  state = nnx.state(Decoder(dataclasses.replace(mcfg, scan_layers=False), rngs=nnx.Rngs(seed)))
  values = {param_name(path): var[...] for path, var in nnx.to_flat_state(state)}
  leaves = []
  for path, var in nnx.to_flat_state(abstract):
    names = _layer_names(param_name(path), mcfg.num_layers)
    value = values[names[0]] if _stacked_part(param_name(path)) is None else jnp.stack([values[n] for n in names])
    leaves.append((path, var.replace(value)))
  return nnx.from_flat_state(leaves)


def init_random(mcfg: ModelConfig, mesh: Mesh, seed: int) -> Decoder:
  """A decoder with seeded random weights (the same with scan_layers or without), created directly in
  its sharded layout."""
  graphdef, abstract, shardings = _abstract(mcfg, mesh)

  @jax.jit
  def init():
    return jax.lax.with_sharding_constraint(_unrolled_state(mcfg, seed, abstract), shardings)

  with jax.set_mesh(mesh):
    return nnx.merge(graphdef, init())


def _check_names(source: str, expected: set[str], arrays: dict, what: str) -> None:
  """An InputError naming `source` and `what` unless `arrays` holds exactly the names `expected`."""
  missing, unexpected = expected - set(arrays), set(arrays) - expected
  if missing or unexpected:
    raise errors.InputError(f"{source}: {what}; missing {sorted(missing)[:5]}, unexpected {sorted(unexpected)[:5]}")


def _host_value(arrays: dict, name: str, var, num_layers: int, source: str, what: tuple[str, str]) -> np.ndarray:
  """The value of the model's parameter `name` (abstract `var`) from per-layer `arrays`, in var's
  dtype: a stacked layers' parameter stacked from its layers'. An InputError naming `source` and the
  array when a shape differs from the model's (`what`: parameter or adapter, and why it has its shape)."""
  names = _layer_names(name, num_layers)
  shape = tuple(var.shape) if _stacked_part(name) is None else tuple(var.shape[1:])
  for n in names:
    if tuple(arrays[n].shape) != shape:
      raise errors.InputError(f"{source}: {what[0]} {n} has shape {tuple(arrays[n].shape)}, {what[1]} expects {shape}")
  if _stacked_part(name) is None:
    return np.asarray(arrays[name]).astype(var.dtype)
  return np.stack([np.asarray(arrays[n]).astype(var.dtype) for n in names])


def _expected_names(paths, num_layers: int) -> list[str]:
  """The per-layer names of the parameters at state paths `paths`, in their order."""
  return [n for path in paths for n in _layer_names(param_name(path), num_layers)]


def from_arrays(mcfg: ModelConfig, mesh: Mesh, arrays: dict[str, np.ndarray], source: str) -> Decoder:
  """A decoder whose parameters are `arrays` (dotted name -> array, named per layer or stacked), placed
  on the mesh."""
  graphdef, abstract_state, _ = _abstract(mcfg, mesh)
  flat_abstract = dict(nnx.to_flat_state(abstract_state))
  arrays = per_layer(arrays)
  _check_names(
    source,
    set(_expected_names(flat_abstract, mcfg.num_layers)),
    arrays,
    f"parameters do not match the {mcfg.family} architecture",
  )
  leaves = []
  for path, var in flat_abstract.items():
    value = _host_value(arrays, param_name(path), var, mcfg.num_layers, source, ("parameter", "the model"))
    pspec = nnx.spmd.get_var_pspec(var)
    assert pspec is not None  # every parameter has a shape
    leaves.append((path, var.replace(jax.device_put(value, jax.sharding.NamedSharding(mesh, pspec)))))
  return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def is_adapter(name: str) -> bool:
  """Whether a dotted parameter name is a LoRA adapter's (layers.0.attn.q_proj_lora_a)."""
  return name.endswith(("_lora_a", "_lora_b"))


def mesh_of(model: Decoder) -> Mesh:
  """The mesh the model's parameters are laid out on."""
  return jax.tree.leaves(nnx.state(model))[0].sharding.mesh


def with_lora(base: Decoder, mcfg: ModelConfig, seed: int) -> Decoder:
  """`base` with LoRA adapters (mcfg.lora_*) on the weights mcfg.lora_module_path names; the base
  weights are the same arrays as base's (no copy), the adapters seeded, B at zero."""
  weights = _expected_names([path for path, _ in nnx.to_flat_state(nnx.state(base, nnx.Param))], mcfg.num_layers)
  if not any(mcfg.adapts(w) for w in weights):
    adaptable = [w for w in weights if w.rsplit(".", 1)[-1] in LORA_INPUT_AXES]
    raise ValueError(
      f"lora_module_path={mcfg.lora_module_path!r} matches no weight that takes a LoRA "
      f"adapter (dotted names such as {', '.join(adaptable[:7])})"
    )
  log.info(
    "LoRA adapters (rank %d, alpha %g) on %s (lora_module_path=%r)",
    mcfg.lora_rank,
    mcfg.lora_alpha,
    lora_names.describe(mcfg.lora_module_path, mcfg.num_layers),
    mcfg.lora_module_path,
  )
  mesh = mesh_of(base)
  graphdef, abstract, _ = _abstract(mcfg, mesh)
  lora_shardings = nnx.get_named_sharding(nnx.filter_state(abstract, nnx.LoRAParam), mesh)

  @jax.jit
  def init():
    return jax.lax.with_sharding_constraint(
      _unrolled_state(mcfg, seed, nnx.filter_state(abstract, nnx.LoRAParam)), lora_shardings
    )

  with jax.set_mesh(mesh):
    return nnx.merge(graphdef, nnx.state(base), init())


def base_of(model: Decoder) -> Decoder:
  """The frozen base of an adapted decoder: its base weights (the same arrays) without adapters."""
  mcfg = dataclasses.replace(model.config, lora_rank=0)
  graphdef, _, _ = _abstract(mcfg, mesh_of(model))
  return nnx.merge(graphdef, nnx.state(model, nnx.Not(nnx.LoRAParam)))


def adapters(model: Decoder) -> dict[str, np.ndarray]:
  """Dotted adapter name, per layer (layers.0.attn.q_proj_lora_a) -> host array."""
  return per_layer(
    {
      param_name(path): distributed.host_array(var[...])
      for path, var in nnx.to_flat_state(nnx.state(model, nnx.LoRAParam))
    }
  )


def set_adapters(model: Decoder, arrays: dict[str, np.ndarray], source: str) -> None:
  """Replaces the model's adapters with `arrays` (dotted name -> array, as `adapters` returns, or
  stacked as a scanned run's checkpoint holds them)."""
  current = dict(nnx.to_flat_state(nnx.state(model, nnx.LoRAParam)))
  num_layers = model.config.num_layers
  arrays = per_layer(arrays)
  _check_names(
    source, set(_expected_names(current, num_layers)), arrays, "LoRA adapters do not match lora_rank/lora_module_path"
  )
  what = ("adapter", f"lora_rank={model.config.lora_rank}")
  leaves = []
  for path, var in current.items():
    value = _host_value(arrays, param_name(path), var, num_layers, source, what)
    leaves.append((path, var.replace(jax.device_put(value, var[...].sharding))))
  nnx.update(model, nnx.from_flat_state(leaves))


def to_arrays(model: Decoder) -> dict[str, np.ndarray]:
  """Dotted parameter name, per layer -> host array (gathered from the mesh; every process calls it),
  adapters merged into their weights (W + alpha / rank A B): the inverse of `from_arrays` for the plain
  decoder."""
  flat = {param_name(path): var[...] for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param))}
  out = {}
  for name, value in flat.items():
    if is_adapter(name):
      continue
    if f"{name}_lora_a" in flat:
      product = lambda a, b: jnp.tensordot(a, b, 1, precision=model.config.precision)
      if _stacked_part(name) is not None:  # one product per layer
        product = jax.vmap(product)
      delta = product(flat[f"{name}_lora_a"], flat[f"{name}_lora_b"]) * model.config.lora_scale
      value = (value.astype(np.float32) + delta).astype(value.dtype)
    out[name] = distributed.host_array(value)
  return per_layer(out)
