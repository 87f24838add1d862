"""What bounds a rollout decode step on this machine: the GSM8K shape's step (8 rows, a 320-position KV
cache, SmolLM2-135M in float32, top-k 50) against reading its weights and cache once, and the parts
it is made of.

    python benchmarks/decode_step.py [--model smollm2-135m] [--rows 8] [--cache 320] [--iters 5]

In one process, each timed as the median of --iters runs of 10 calls after one that compiles:
- the decode step train_rl runs (kv_programs._decode: the model on one position per row
  with its KV cache, then sampling) on the unrolled copy of a scanned model's layers
  (decoder.DecodeCopy: rollout_layers=unrolled, what auto takes on a GPU or TPU), and the time to
  remake that copy;
- the same step on the scanned model's stacked layers and cache (rollout_layers=stacked, what auto
  takes on a CPU), and each step's copies of a layer's weights or cache in its optimized HLO
  (program_census.layer_copies);
- its read floor: summing as many bytes as the step reads (every weight and the cache);
- the same step with rollout_dtype=bfloat16 (on decoder.DecodeCopy), its read floor, and the time
  to remake that copy from the float32 weights;
- the model's weight matmuls alone (every weight matrix times `rows` inputs), with 1 and with `rows`
  rows (float32), and with `rows` rows on bfloat16 copies of the weights accumulating in float32;
- the sampling alone (top-k 50 at temperature 0.9 over the vocabulary).
Random weights. Prints a table and writes benchmarks/results/decode_step.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))


def _median_ms(fn, iters: int, calls: int = 10) -> float:
  import jax

  jax.block_until_ready(fn())
  times = []
  for _ in range(iters):
    start = time.perf_counter()
    for _ in range(calls):
      out = fn()
    jax.block_until_ready(out)
    times.append((time.perf_counter() - start) / calls * 1e3)
  return statistics.median(times)


def decode_inputs(rows: int, position: int, chunk: int) -> tuple:
  """kv_programs._decode's arguments after the graph, state and cache: `chunk` steps of `rows` rows
  from `position`, sampled as the GSM8K shape samples (temperature 0.9, top-k 50), no EOS, no limit."""
  import jax.numpy as jnp

  return (
    jnp.ones((rows,), jnp.int32),  # tokens
    jnp.full((rows,), position, jnp.int32),
    jnp.arange(rows),  # steps
    jnp.zeros((rows, 2), jnp.uint32),  # keys
    jnp.stack([jnp.full((rows,), 0.9), jnp.ones((rows,))], axis=1),  # temperature, top_p
    jnp.full((rows,), 50, jnp.int32),  # top_k
    50,
    jnp.full((rows,), 1 << 20, jnp.int32),  # limits
    jnp.full((rows, 1), -1, jnp.int32),  # no EOS
    jnp.array([chunk, 0]),
    chunk,
  )


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="smollm2-135m")
  parser.add_argument("--rows", type=int, default=8)
  parser.add_argument("--cache", type=int, default=320)
  parser.add_argument("--iters", type=int, default=5)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "decode_step.json"))
  args = parser.parse_args()

  from maxtext.utils import xla_flags

  xla_flags.use_sequential_cpu_scheduler()  # as train_rl runs
  import jax
  import jax.numpy as jnp
  import model_benchmark
  from flax import nnx

  from maxtext.inference import kv_programs as kv
  from maxtext.inference import program_census
  from maxtext.models.decoder import DecodeCopy

  cfg, mesh, model, n_params = model_benchmark._build(args.model, "float32")
  rows, size = args.rows, args.cache
  rows_of = {"float32, 1 row": 1, f"float32, {rows} rows": rows, f"bfloat16 weights, {rows} rows": rows}
  result: dict = {"model": args.model, "rows": rows, "cache": size, "params": n_params, "ms": {}}
  with jax.set_mesh(mesh):
    graph, stacked_state = nnx.split(model)
    unrolled = DecodeCopy(model)  # what the batcher decodes from (the model's layers are scanned)
    static, state = kv._StaticGraph(unrolled.graphdef), unrolled.state()
    cache = unrolled.init_cache(rows, size, jnp.float32)
    inputs = decode_inputs(rows, size - 1, 1)
    held = {"unrolled": cache, "stacked": model.init_cache(rows, size, jnp.float32)}

    def arguments(static, state, layout):
      return (static, state, held[layout], *inputs)

    def step(static, state, layout="unrolled"):
      """One decode step (a chunk of 1), as decode_steps_per_dispatch=1 runs it."""
      out = kv._decode(*arguments(static, state, layout))
      held[layout] = out[-1]  # the step donates its cache, as the batcher's does
      return out[:2]

    def decode():
      return step(static, state)

    layer = program_census.layer_buffers(model.config, rows, size)
    stacked_static = kv._StaticGraph(graph)
    result["layer_copies"] = {
      layout: program_census.layer_copies(kv._decode.lower(*arguments(s, w, layout)).compile().as_text(), layer)
      for layout, s, w in (("unrolled", static, state), ("stacked", stacked_static, stacked_state))
    }
    weights = [x for x in jax.tree.leaves(state) if x.ndim >= 2]
    step_bytes = sum(x.nbytes for x in jax.tree.leaves(state)) + sum(x.nbytes for x in jax.tree.leaves(cache))
    flat = jnp.ones((step_bytes // 4,), jnp.float32)
    total = jax.jit(jnp.sum)
    timings = result["ms"]
    timings["decode step on the unrolled copy"] = _median_ms(decode, args.iters)
    timings["decode step on the stacked layers"] = _median_ms(
      lambda: step(stacked_static, stacked_state, "stacked"), args.iters
    )
    timings["read floor (its weights and cache summed)"] = _median_ms(lambda: total(flat), args.iters)
    timings["remaking the unrolled copy (once per training step)"] = _median_ms(unrolled.state, args.iters, calls=3)
    copy = DecodeCopy(model, jnp.bfloat16)
    copy_static, copy_state = kv._StaticGraph(copy.graphdef), copy.state()

    def decode_bf16():
      return step(copy_static, copy_state)

    copy_bytes = copy.nbytes + sum(x.nbytes for x in jax.tree.leaves(cache))
    flat_copy = jnp.ones((copy_bytes // 4,), jnp.float32)
    timings["decode step, rollout_dtype=bfloat16"] = _median_ms(decode_bf16, args.iters)
    timings["its read floor (bfloat16 copy and cache summed)"] = _median_ms(lambda: total(flat_copy), args.iters)
    timings["remaking the bfloat16 copy (once per training step)"] = _median_ms(copy.state, args.iters, calls=3)

    # The weight matrices as the decode step multiplies by them: [inputs, outputs] (the tied
    # embedding as the output layer).
    mats = [w.T if w.shape[0] == cfg.model.vocab_size else w.reshape(-1, w.shape[-1]) for w in weights]
    widest = max(m.shape[0] for m in mats)

    @jax.jit
    def matmuls(x, ws):
      return [jnp.dot(x[:, : w.shape[0]].astype(w.dtype), w, preferred_element_type=jnp.float32) for w in ws]

    half = [m.astype(jnp.bfloat16) for m in mats]
    for name, count in rows_of.items():
      ws = half if name.startswith("bfloat16") else mats
      x = jnp.ones((count, widest), jnp.float32)
      timings[f"weight matmuls alone ({name})"] = _median_ms(lambda x=x, ws=ws: matmuls(x, ws), args.iters)
    logits = jax.random.normal(jax.random.PRNGKey(0), (rows, cfg.model.vocab_size)) * 3
    steps, keys, sampling, top_k = inputs[2:6]
    sample = jax.jit(lambda lg: kv._sample(lg, keys, steps, sampling[:, 0], sampling[:, 1], top_k, 50))
    timings["sampling alone (top-k 50)"] = _median_ms(lambda: sample(logits), args.iters)
  floor = timings["read floor (its weights and cache summed)"]
  result["step_bytes"] = step_bytes
  result["bfloat16_step_bytes"] = copy_bytes
  print(f"{args.model}, {rows} rows, {size}-position cache: a step reads {step_bytes / 1e6:.0f} MB")
  print("| part | ms | over the read floor |\n| --- | --- | --- |")
  for name, value in timings.items():
    print(f"| {name} | {value:.1f} | {value / floor:.2f}x |")
  own = timings["decode step, rollout_dtype=bfloat16"] / timings["its read floor (bfloat16 copy and cache summed)"]
  result["bfloat16_over_own_floor"] = own
  print(f"rollout_dtype=bfloat16: the step reads {copy_bytes / 1e6:.0f} MB, {own:.2f}x its own read floor")
  stacked = timings["decode step on the stacked layers"] / timings["decode step on the unrolled copy"]
  result["stacked_over_unrolled"] = stacked
  print(f"the stacked layers' step takes {stacked:.2f}x the unrolled copy's; layer copies: {result['layer_copies']}")
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
