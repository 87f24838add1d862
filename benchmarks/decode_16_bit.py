"""Decode with 16-bit floats on XLA:CPU: the decoder moves 16-bit weights and a stacked KV cache as their
bits (decoder._bits) in the sampler's programs, where XLA:CPU converted them whole to float32 to gather,
slice or scatter them. Times the sampler's decode step both ways, in one process.

    python benchmarks/decode_16_bit.py [--model smollm2-135m] [--rows 8] [--cache 320] [--iters 5]

For a model with float32 weights (the reference), the same with rollout_dtype=bfloat16 (the
sampler's bfloat16 decoder.DecodeCopy) and a model in bfloat16 (dtype and weight_dtype), each on the
stacked layers (rollout_layers=stacked, what auto takes on a CPU) and on the unrolled copy: the decode
program train_rl runs (kv_programs._decode, chunks of decode_steps_per_dispatch=16 steps, top-k 50),
its milliseconds per step (the median of --iters calls after one that compiles), and the whole
embeddings, stacked weights and stacked caches its optimized HLO converts
(program_census.conversions); with 16-bit floats also "as floats", the decoder's `_bits` replaced by
the identity, which is how it decoded before. Random weights. Prints a table and writes
benchmarks/results/decode_16_bit.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))

CHUNK = 16


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="smollm2-135m")
  parser.add_argument("--rows", type=int, default=8)
  parser.add_argument("--cache", type=int, default=320)
  parser.add_argument("--iters", type=int, default=5)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "decode_16_bit.json"))
  args = parser.parse_args()

  from maxtext.utils import xla_flags

  xla_flags.use_sequential_cpu_scheduler()  # as train_rl runs
  import jax
  import jax.numpy as jnp
  import model_benchmark
  from decode_step import decode_inputs
  from flax import nnx

  from maxtext.inference import kv_programs as kv
  from maxtext.inference import program_census
  from maxtext.models import decoder

  rows, size = args.rows, args.cache
  inputs = decode_inputs(rows, size // 2, CHUNK)
  bits = decoder._bits
  result: dict = {"model": args.model, "rows": rows, "cache": size, "steps_per_dispatch": CHUNK, "runs": []}
  models = {"float32": ("float32", None), "float32, rollout_dtype=bfloat16": ("float32", jnp.bfloat16)}
  models["bfloat16 (dtype, weight_dtype)"] = ("bfloat16", None)
  for name, (dtype, rollout_dtype) in models.items():
    _, mesh, model, _ = model_benchmark._build(args.model, dtype, overrides=("scan_layers=true",))
    with jax.set_mesh(mesh):
      stacked_cache = model.init_cache(rows, size, model.config.dtype)["layers"]
      whole = [x for x in jax.tree.leaves(nnx.state(model)) if x.ndim >= 2] + list(stacked_cache.values())[:2]
      for layout in ("stacked", "unrolled"):
        copy = decoder.DecodeCopy(model, rollout_dtype, unrolled=layout == "unrolled")
        static, state = kv._StaticGraph(copy.graphdef), copy.state()
        for moved in ("bits", "as floats") if dtype == "bfloat16" or rollout_dtype else ("bits",):
          decoder._bits = bits if moved == "bits" else (lambda x: x)
          jax.clear_caches()
          held = [copy.init_cache(rows, size, model.config.dtype)]
          hlo = kv._decode.lower(static, state, held[0], *inputs).compile().as_text()
          times = []
          for i in range(args.iters + 1):
            start = time.perf_counter()
            out = kv._decode(static, state, held[0], *inputs)
            held[0] = out[-1]  # the program donates its cache, as the batcher's does
            jax.block_until_ready(out)
            if i:  # the first call compiles
              times.append((time.perf_counter() - start) / CHUNK * 1e3)
          run = {
            "weights": name,
            "layers": layout,
            "moved": moved,
            "ms_per_step": statistics.median(times),
            "whole_conversions": program_census.conversions(hlo or "", whole),
          }
          result["runs"].append(run)
          print(run, flush=True)
  decoder._bits = bits
  print(f"\n{args.model}, {rows} rows, {size}-position cache, chunks of {CHUNK} steps")
  print("| weights | layers | moved | ms per step | whole arrays converted |\n| --- | --- | --- | --- | --- |")
  for run in result["runs"]:
    print(
      f"| {run['weights']} | {run['layers']} | {run['moved']} | {run['ms_per_step']:.1f} | {run['whole_conversions']} |"
    )
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
