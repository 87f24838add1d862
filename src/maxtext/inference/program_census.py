"""What a compiled program does to one layer's buffers: `layer_copies` counts, in the optimized HLO
text of a program (jax's `Compiled.as_text()`), the instructions that copy, slice or dynamic-slice a
buffer the size of one layer's weight matrix or KV cache. A decode step that reads each layer's
weights and cache where they lie has none; one that slices them out of stacked arrays (a scanned
layer's) has a few per layer, each a copy of the buffer (XLA:CPU and XLA:GPU, benchmarks/RESULTS.md,
"The device suite")."""

from __future__ import annotations

import collections
import re
from collections.abc import Iterable

import numpy as np

# `%name = f32[8,1,2,32,48]{4,3,2,1,0} dynamic-slice(` (the layout and a tuple's parts vary).
_INSTRUCTION = re.compile(r"=\s*([a-z0-9]+)\[([0-9,]*)\](?:\{[^}]*\})?\s+(copy|slice|dynamic-slice|copy-start)\(")


def _key(dtype: str, shape: Iterable[int]) -> tuple[str, tuple[int, ...]]:
  """A buffer's HLO dtype name and its dims, sorted, without those of size 1: a slice of a stacked
  array keeps the layer axis as a 1 (then bitcast away), and a transposing copy permutes the dims."""
  return dtype, tuple(sorted(d for d in shape if d != 1))


_HLO_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "int32": "s32"}


def layer_copies(hlo_text: str, layer_arrays: Iterable) -> dict[str, int]:
  """{opcode: count} of the copy, slice, dynamic-slice and copy-start instructions (fused or not) in
  the optimized HLO `hlo_text` whose result has the dtype and dims (in any order, size-1 dims aside) of one of
  `layer_arrays` (arrays or ShapeDtypeStructs: one layer's weight matrices and KV cache)."""
  sizes = {_key(_HLO_DTYPES[np.dtype(a.dtype).name], a.shape) for a in layer_arrays}
  found: collections.Counter[str] = collections.Counter()
  for dtype, dims, opcode in _INSTRUCTION.findall(hlo_text):
    if _key(dtype, (int(d) for d in dims.split(",") if d)) in sizes:
      found[opcode] += 1
  return dict(found)
