"""Compile time of the programs a run compiles, with the decoder's layers unrolled and scanned
(scan_layers=false and true), in one process.

    python benchmarks/compile_time.py [--model qwen3-0.6b] [--dtype float32]

The programs, for the GSM8K shape (vs_trl.py --shape gsm8k: 2 prompts x 4 samples, 192-token
prompts, 128-token replies) and the continuous batcher's (8 rows, a 320-position KV cache):
- train step: the policy loss's log-probs (scoring.py, each group's prompt once: SharedPrefix),
  their gradient and an AdamW update, in one program;
- reference log-probs: the same log-probs without gradient;
- prefill: the batcher's chunk of 64 tokens per row written into the cache (kv_programs._extend);
- decode: the batcher's decode step with top-k sampling (kv_programs._decode).
Each is traced, lowered and compiled from abstract weights and inputs (compiling depends on shapes
only, not on values), with the persistent compilation cache off; timed as wall-clock seconds and as
the process's CPU seconds (which other processes on a shared machine do not stretch). Then the decode
step runs on random weights in both layouts, alternately, so what scanning costs or saves per step
shows beside what it saves in compiling (--decode-iters 0: not run). Prints tables and writes
benchmarks/results/compile_time.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time


def _programs(args, scan_layers: bool) -> dict:
  """Program name -> (jitted function, abstract arguments) for one decoder layout."""
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx

  from maxtext.configs import pyconfig
  from maxtext.inference import kv_programs as kv
  from maxtext.integration.tunix import scoring
  from maxtext.models import builder
  from maxtext.models.decoder import ModelConfig
  from maxtext.models.shared_prefix import SharedPrefix
  from maxtext.utils.mesh import create_meshes

  cfg = pyconfig.initialize(
    [
      "bench",
      "rl.yml",
      f"model_name={args.model}",
      f"dtype={args.dtype}",
      f"weight_dtype={args.dtype}",
      f"scan_layers={str(scan_layers).lower()}",
    ]
  )
  mesh, _ = create_meshes(cfg.mesh, agentic=False)
  graphdef, state, _ = builder._abstract(ModelConfig.from_config(cfg.model), mesh)
  prompts, group, p, n = 2, 4, 192, 128
  rows, size, chunk = prompts * group, 320, 64
  i32 = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.int32)
  adamw = optax.adamw(1e-6, weight_decay=0.1)

  def logps(params, tokens):
    model = SharedPrefix(nnx.merge(graphdef, params), p, group)
    return scoring.completion_logps(model, tokens[:, :p], tokens[:, p:], -1, -1, 1.0)[0]

  @jax.jit
  def train_step(params, opt_state, tokens):
    loss, grads = jax.value_and_grad(lambda w: -logps(w, tokens).mean())(params)
    updates, opt_state = adamw.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  with jax.set_mesh(mesh):
    cache = jax.eval_shape(lambda: nnx.merge(graphdef, state).init_cache(rows, size, jnp.dtype(args.dtype)))
    opt_state = jax.eval_shape(adamw.init, state)
  static = kv._StaticGraph(graphdef)
  sampling = jax.ShapeDtypeStruct((rows, 2), jnp.float32)
  return mesh, {
    "train step": (train_step, (state, opt_state, i32(rows, p + n))),
    "reference log-probs": (jax.jit(logps), (state, i32(rows, p + n))),
    "prefill": (kv._extend, (static, state, cache, i32(rows, chunk), i32(rows))),
    "decode": (
      kv._decode,
      (
        static,
        state,
        cache,
        *(i32(rows),) * 3,
        jax.ShapeDtypeStruct((rows, 2), jnp.uint32),
        sampling,
        i32(rows),
        50,
        i32(rows),
        i32(rows, 1),
        i32(2),
        1,  # one step per dispatch: the program decode_steps_per_dispatch=1 runs
      ),
    ),
  }


def _measure(args, scan_layers: bool) -> dict:
  """Program name -> {"lower_s": tracing and lowering, "compile_s": XLA's compile (wall-clock),
  "cpu_s": the process's CPU seconds for both} for one layout."""
  import jax

  mesh, programs = _programs(args, scan_layers)
  out = {}
  with jax.set_mesh(mesh):
    for name, (fn, abstract, *kwargs) in programs.items():
      start, cpu = time.perf_counter(), time.process_time()
      lowered = fn.lower(*abstract, **(kwargs[0] if kwargs else {}))
      lowered_at = time.perf_counter()
      lowered.compile()
      out[name] = {
        "lower_s": lowered_at - start,
        "compile_s": time.perf_counter() - lowered_at,
        "cpu_s": time.process_time() - cpu,
      }
      print(f"  scan_layers={str(scan_layers).lower()}: {name} {out[name]}", flush=True)
  return out


def _decode_step(static, state, cache, inputs):
  """A function running the batcher's decode step once on `inputs`, keeping the cache it donates
  and returns, as the batcher does; it returns the sampled tokens and log-probs."""
  from maxtext.inference import kv_programs as kv

  held = {"cache": cache}

  def step():
    tokens, logps, _, _, held["cache"] = kv._decode(static, state, held["cache"], *inputs)
    return tokens, logps

  return step


def _decode_ms(args) -> dict:
  """Layout -> median milliseconds of the batcher's decode step (8 rows, 320-position cache, random
  weights), the two layouts' steps timed alternately, args.decode_iters rounds of 5 steps."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from maxtext.configs import pyconfig
  from maxtext.inference import kv_programs as kv
  from maxtext.models import builder
  from maxtext.models.decoder import ModelConfig
  from maxtext.utils.mesh import create_meshes

  rows, size = 8, 320
  steps = {}
  for layout, scan in (("unrolled", "false"), ("scanned", "true")):
    cfg = pyconfig.initialize(
      ["bench", "rl.yml", f"model_name={args.model}", f"dtype={args.dtype}", f"weight_dtype={args.dtype}"]
      + [f"scan_layers={scan}"]
    )
    mesh, _ = create_meshes(cfg.mesh, agentic=False)
    model = builder.init_random(ModelConfig.from_config(cfg.model), mesh, seed=0)
    graph, state = nnx.split(model)
    inputs = (
      jnp.ones((rows,), jnp.int32),
      jnp.full((rows,), size - 1, jnp.int32),  # every row attends to the whole cache
      jnp.arange(rows, dtype=jnp.int32),
      jnp.zeros((rows, 2), jnp.uint32),
      jnp.stack([jnp.full((rows,), 0.9), jnp.ones((rows,))], axis=1),
      jnp.full((rows,), 50, jnp.int32),
      50,  # top_width
      jnp.full((rows,), 1 << 20, jnp.int32),  # no budget ends a row
      jnp.full((rows, 1), -1, jnp.int32),  # nor an EOS id
      jnp.array([1, 0]),
      1,  # one step per dispatch
    )
    step = _decode_step(kv._StaticGraph(graph), state, model.init_cache(rows, size, jnp.dtype(args.dtype)), inputs)
    jax.block_until_ready(step())
    steps[layout] = step
  times: dict[str, list[float]] = {layout: [] for layout in steps}
  for _ in range(args.decode_iters):
    for layout, step in steps.items():
      start = time.perf_counter()
      for _ in range(5):
        out = step()
      jax.block_until_ready(out)
      times[layout].append((time.perf_counter() - start) / 5 * 1e3)
  return {layout: statistics.median(t) for layout, t in times.items()}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="qwen3-0.6b")
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--decode-iters", type=int, default=15)
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "compile_time.json"))
  args = parser.parse_args()

  from maxtext.utils import xla_flags

  xla_flags.use_sequential_cpu_scheduler()  # as train_rl runs
  import jax

  jax.config.update("jax_enable_compilation_cache", False)
  unrolled, scanned = _measure(args, False), _measure(args, True)
  decode_ms = _decode_ms(args) if args.decode_iters else None
  total = lambda t: t["lower_s"] + t["compile_s"]
  result = {
    "model": args.model,
    "dtype": args.dtype,
    "device": jax.devices()[0].device_kind,
    "cpu_count": os.cpu_count(),
    "machine": platform.machine(),
    "jax": jax.__version__,
    "unrolled": unrolled,
    "scanned": scanned,
    "total_unrolled_s": sum(map(total, unrolled.values())),
    "total_scanned_s": sum(map(total, scanned.values())),
    "total_unrolled_cpu_s": sum(t["cpu_s"] for t in unrolled.values()),
    "total_scanned_cpu_s": sum(t["cpu_s"] for t in scanned.values()),
    "decode_step_ms": decode_ms,
  }
  where = f"{result['device']} ({result['cpu_count']} cores)"
  print(f"{args.model} {args.dtype} on {where}: seconds to trace, lower and compile (wall-clock; CPU)")
  print("| program | unrolled | scanned | scanned / unrolled |\n| --- | --- | --- | --- |")
  rows = [
    (name, total(unrolled[name]), total(scanned[name]), unrolled[name]["cpu_s"], scanned[name]["cpu_s"])
    for name in unrolled
  ]
  rows.append(
    (
      "all",
      result["total_unrolled_s"],
      result["total_scanned_s"],
      result["total_unrolled_cpu_s"],
      result["total_scanned_cpu_s"],
    )
  )
  for name, u, s, u_cpu, s_cpu in rows:
    print(f"| {name} | {u:.1f}; {u_cpu:.1f} | {s:.1f}; {s_cpu:.1f} | {s / u:.2f}; {s_cpu / u_cpu:.2f} |")
  if decode_ms:
    ms = ", ".join(f"{layout} {value:.1f} ms" for layout, value in decode_ms.items())
    print(f"decode step (8 rows, 320-position cache): {ms}")
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
