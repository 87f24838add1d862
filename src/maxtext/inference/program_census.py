"""What a compiled program does to a model's buffers, read from its optimized HLO text (jax's
`Compiled.as_text()`). `layer_copies` counts the instructions that copy, slice or dynamic-slice a
buffer the size of one layer's weight matrix or KV cache (`layer_buffers`). A decode step that reads each layer's
weights and cache where they lie has none; one that slices them out of stacked arrays (a scanned
layer's) has a few per layer, each a copy of the buffer (XLA:CPU and XLA:GPU, benchmarks/RESULTS.md,
"The device suite"). `conversions` counts the converts of whole arrays (an embedding, a stacked
weight, a stacked cache): XLA:CPU widens a 16-bit float operand of a gather, slice or scatter to
float32 whole, which a decode step should never do."""

from __future__ import annotations

import collections
import dataclasses
import re
from collections.abc import Iterable

import jax
import jax.numpy as jnp
from flax import nnx

from maxtext.models.decoder import Decoder, ModelConfig, init_cache

# `%name = f32[8,1,2,32,48]{4,3,2,1,0} dynamic-slice(` (the layout and a tuple's parts vary).
_INSTRUCTION = re.compile(r"=\s*[a-z0-9]+\[([0-9,]*)\](?:\{[^}]*\})?\s+(copy|slice|dynamic-slice|copy-start)\(")


def _key(shape: Iterable[int]) -> tuple[int, ...]:
  """A buffer's dims, sorted, without those of size 1: a slice of a stacked array keeps the layer axis
  as a 1 (then bitcast away), and a transposing copy permutes the dims. The dtype is left out: the
  decoder slices 16-bit weights as their bits (uint16)."""
  return tuple(sorted(d for d in shape if d != 1))


def layer_copies(hlo_text: str, layer_arrays: Iterable) -> dict[str, int]:
  """{opcode: count} of the copy, slice, dynamic-slice and copy-start instructions (fused or not) in
  the optimized HLO `hlo_text` whose result has the dims (in any order, size-1 dims aside; any dtype)
  of one of `layer_arrays` (arrays or ShapeDtypeStructs: one layer's weight matrices and KV cache)."""
  sizes = {_key(a.shape) for a in layer_arrays}
  found: collections.Counter[str] = collections.Counter()
  for dims, opcode in _INSTRUCTION.findall(hlo_text):
    if _key(int(d) for d in dims.split(",") if d) in sizes:
      found[opcode] += 1
  return dict(found)


_CONVERT = re.compile(r"=\s*[a-z0-9]+\[([0-9,]*)\](?:\{[^}]*\})?\s+convert\(")


def conversions(hlo_text: str, arrays: Iterable) -> int:
  """How many convert instructions (fused or not) in the optimized HLO `hlo_text` make an array with
  the dims of one of `arrays` (size-1 dims aside; any dtype)."""
  sizes = {_key(a.shape) for a in arrays}
  return sum(_key(int(d) for d in dims.split(",") if d) in sizes for dims in _CONVERT.findall(hlo_text))


def layer_buffers(cfg: ModelConfig, rows: int, cache_size: int) -> list[jax.ShapeDtypeStruct]:
  """One layer's weight matrices and its KV cache's keys and values (`rows` rows of `cache_size`
  positions) as a decoder of `cfg` with unrolled layers holds them (abstract arrays: their dims are
  what layer_copies matches, in either layout)."""
  unrolled = dataclasses.replace(cfg, scan_layers=False)
  state = nnx.state(nnx.eval_shape(lambda: Decoder(unrolled, rngs=nnx.Rngs(0))))
  weights = [x for x in jax.tree.leaves(state["layers"][0]) if x.ndim >= 2]
  cache = jax.eval_shape(lambda: init_cache(unrolled, rows, cache_size, jnp.float32))["layer_0"]
  return [*weights, cache["k"], cache["v"]]
