"""Compile time of the programs a run compiles, with the decoder's layers unrolled and scanned
(scan_layers=false and true), in one process.

    python benchmarks/compile_time.py [--model qwen3-0.6b] [--dtype float32]

The programs, for the GSM8K shape (vs_trl.py --shape gsm8k: 2 prompts x 4 samples, 192-token
prompts, 128-token replies) and the continuous batcher's (8 rows, a 320-position KV cache):
- train step: the policy loss's log-probs (scoring.py, each group's prompt once: SharedPrefix),
  their gradient and an AdamW update, in one program;
- reference log-probs: the same log-probs without gradient;
- prefill: the batcher's chunk of 64 tokens per row written into the cache (continuous_batching._extend);
- decode: the batcher's decode step with top-k sampling (continuous_batching._decode).
Each is traced, lowered and compiled from abstract weights and inputs (compiling depends on shapes
only, not on values), with the persistent compilation cache off. Prints a table and writes
benchmarks/results/compile_time.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time


def _programs(args, scan_layers: bool) -> dict:
  """Program name -> (jitted function, abstract arguments) for one decoder layout."""
  import jax
  import jax.numpy as jnp
  import optax
  from flax import nnx

  from maxtext.configs import pyconfig
  from maxtext.inference import continuous_batching as cb
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
  static = cb._StaticGraph(graphdef)
  sampling = jax.ShapeDtypeStruct((rows, 2), jnp.float32)
  return mesh, {
    "train step": (train_step, (state, opt_state, i32(rows, p + n))),
    "reference log-probs": (jax.jit(logps), (state, i32(rows, p + n))),
    "prefill": (cb._extend, (static, state, cache, i32(rows, chunk), i32(rows))),
    "decode": (
      cb._decode,
      (static, state, cache, i32(rows), i32(rows), i32(rows), jax.ShapeDtypeStruct((rows, 2), jnp.uint32), sampling),
      {"top_k": i32(rows), "top_width": 50},
    ),
  }


def _measure(args, scan_layers: bool) -> dict:
  """Program name -> {"lower_s": tracing and lowering, "compile_s": XLA's compile} for one layout."""
  import jax

  mesh, programs = _programs(args, scan_layers)
  out = {}
  with jax.set_mesh(mesh):
    for name, (fn, abstract, *kwargs) in programs.items():
      start = time.perf_counter()
      lowered = fn.lower(*abstract, **(kwargs[0] if kwargs else {}))
      lowered_at = time.perf_counter()
      lowered.compile()
      out[name] = {"lower_s": lowered_at - start, "compile_s": time.perf_counter() - lowered_at}
      print(f"  scan_layers={str(scan_layers).lower()}: {name} {out[name]}", flush=True)
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="qwen3-0.6b")
  parser.add_argument("--dtype", default="float32")
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "compile_time.json"))
  args = parser.parse_args()

  from maxtext.utils import xla_flags

  xla_flags.use_sequential_cpu_scheduler()  # as train_rl runs
  import jax

  jax.config.update("jax_enable_compilation_cache", False)
  unrolled, scanned = _measure(args, False), _measure(args, True)
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
  }
  where = f"{result['device']} ({result['cpu_count']} cores)"
  print(f"{args.model} {args.dtype} on {where}: seconds to trace, lower and compile")
  print("| program | unrolled | scanned | scanned / unrolled |\n| --- | --- | --- | --- |")
  for name in unrolled:
    u, s = total(unrolled[name]), total(scanned[name])
    print(f"| {name} | {u:.1f} | {s:.1f} | {s / u:.2f} |")
  u, s = result["total_unrolled_s"], result["total_scanned_s"]
  print(f"| all | {u:.1f} | {s:.1f} | {s / u:.2f} |")
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
