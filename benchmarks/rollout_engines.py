"""Rollout engines alone: Tunix's sampler (vanilla) against our continuous batcher (batched).

    python benchmarks/rollout_engines.py [--model smollm2-135m] [--dtype float32] [--prompts 2]
        [--samples 4] [--prompt-length 150] [--new-tokens 64] [--rounds 3] [--output F]

Random weights (they never stop early, so every sample uses the whole budget). Two call patterns,
each timed per round after one warm-up round that compiles, the engines alternating round by round
on the same prompts:
- group: one generate call with prompts x samples prompts (standard GRPO's rollout);
- agentic: prompts x samples threads, each calling generate with one prompt (the agentic learner's
  pattern: one call per conversation turn).
Per engine and pattern: median round seconds, generated tokens/s, ms per generated position (round
time / new tokens: one decode step of the whole batch, prefill included) and, for the batched
engine, its decode steps per round. On a GPU, decode tokens/s is compared with the HBM roofline
(every weight and the cache rows of one decode step read once per step).

Then a decode step by busy rows (1, 2, 4, 8): the continuous batcher's own timing of its decode
steps (ContinuousBatcher.decode_rate, compiling steps excluded) with as many requests as rows, beside
the model's forward for the same rows without a cache (the projections and output layer alone: the
part of a step that reads every weight), each as ms and as a ratio to 1 row. Prints tables and writes
benchmarks/results/rollout_engines.json (or --output).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import statistics
import sys
import time

from model_benchmark import decode_roofline, fmt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "rollout_engines.json")


def _engines(args):
  """(config, rollout config, {engine name: engine}) on one randomly initialised model."""
  import jax

  from maxtext.configs import pyconfig
  from maxtext.input_pipeline.tokenizer import tokenizer_for
  from maxtext.integration.tunix import rollout as engines_lib
  from maxtext.integration.tunix import rollout_setup
  from maxtext.models import builder
  from maxtext.models.decoder import ModelConfig
  from maxtext.utils.mesh import create_meshes

  cfg = pyconfig.initialize(
    [
      "bench",
      "rl.yml",
      f"model_name={args.model}",
      f"dtype={args.dtype}",
      f"weight_dtype={args.dtype}",
      f"max_prompt_length={args.prompt_length}",
      f"max_response_length={args.new_tokens}",
      "decode_sampling_temperature=1.0",
    ]
  )
  _, mesh = create_meshes(cfg.mesh, agentic=False)
  model = builder.init_random(ModelConfig.from_config(cfg.model), mesh, seed=0)
  tokenizer = tokenizer_for(cfg.model)
  rollout = rollout_setup.rollout_configs(cfg.sampling, "greedy", False, tokenizer.eos_token_id)[
    rollout_setup.Mode.TRAIN
  ]
  engines = {
    "vanilla": engines_lib.RolloutEngine(model, tokenizer, mesh, rollout, seed=0),
    "batched": engines_lib.BatchedRolloutEngine(
      model, tokenizer, mesh, rollout, seed=0, max_batch_size=cfg.sampling.rollout_max_batch_size
    ),
  }
  return cfg, rollout, engines, jax.devices()[0].device_kind


def _round(engine, prompts, rollout, pattern: str) -> int:
  """Generates for every prompt; returns the number of tokens generated."""
  if pattern == "group":
    return sum(len(t) for t in engine.generate(prompts, rollout).tokens)
  with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
    outs = list(pool.map(lambda p: engine.generate([p], rollout), prompts))
  return sum(len(t) for out in outs for t in out.tokens)


def _decode_by_rows(cfg, model, rollout, rows_list=(1, 2, 4, 8), new_tokens: int = 32) -> list[dict]:
  """Per busy-row count: ms per decode step of the batcher, and of the model's cacheless forward."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from maxtext.inference import continuous_batching

  params = continuous_batching.SamplingParams(
    max_new_tokens=new_tokens, temperature=rollout.temperature, top_p=rollout.top_p or 1.0, top_k=rollout.top_k
  )
  graphdef, state = nnx.split(model)
  forward = jax.jit(
    lambda state, tokens: nnx.merge(graphdef, state)(
      tokens, jnp.zeros_like(tokens), None, jnp.ones((*tokens.shape, 1), bool)
    )[0]
  )
  rng = np.random.default_rng(1)
  out = []
  for rows in rows_list:
    batcher = continuous_batching.ContinuousBatcher(model, cfg.sampling.kv_cache_size, rows)
    for _ in range(2):  # the first round compiles; decode_rate leaves compiling steps out
      prompts = [rng.integers(100, cfg.model.vocab_size - 100, cfg.sampling.max_prompt_length) for _ in range(rows)]
      for future in batcher.submit_many(prompts, params, list(jax.random.split(jax.random.PRNGKey(rows), rows))):
        future.result()
    batcher.close()
    tokens = jnp.ones((rows, 1), jnp.int32)
    jax.block_until_ready(forward(state, tokens))
    times = []
    for _ in range(20):
      started = time.perf_counter()
      jax.block_until_ready(forward(state, tokens))
      times.append(time.perf_counter() - started)
    out.append(
      {
        "rows": rows,
        "decode_step_ms": 1e3 * rows / batcher.decode_rate()[0],
        "forward_no_cache_ms": 1e3 * statistics.median(times),
      }
    )
  for r in out:
    r["decode_step_ratio"] = r["decode_step_ms"] / out[0]["decode_step_ms"]
    r["forward_no_cache_ratio"] = r["forward_no_cache_ms"] / out[0]["forward_no_cache_ms"]
  return out


def main() -> None:
  from maxtext.utils import xla_flags

  xla_flags.use_sequential_cpu_scheduler()  # as train_rl does, before JAX starts
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="smollm2-135m")
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--prompts", type=int, default=2)
  parser.add_argument("--samples", type=int, default=4)
  parser.add_argument("--prompt-length", type=int, default=150)
  parser.add_argument("--new-tokens", type=int, default=64)
  parser.add_argument("--rounds", type=int, default=3, help="timed rounds after the warm-up")
  parser.add_argument("--output", default=RESULTS)
  args = parser.parse_args()

  import jax
  import numpy as np
  from flax import nnx

  cfg, rollout, engines, device = _engines(args)
  n_params = sum(x.size for x in jax.tree.leaves(nnx.state(engines["vanilla"].model(), nnx.Param)))
  rng = np.random.default_rng(0)
  rows = args.prompts * args.samples
  results = []
  for pattern in ("group", "agentic"):
    times = {name: [] for name in engines}
    tokens = dict.fromkeys(engines, 0)
    for i in range(args.rounds + 1):  # engines alternate round by round, on the same prompts
      group = [
        rng.integers(100, cfg.model.vocab_size - 100, args.prompt_length).astype(np.int32) for _ in range(args.prompts)
      ]
      for name, engine in engines.items():
        started = time.perf_counter()
        made = _round(engine, [p for p in group for _ in range(args.samples)], rollout, pattern)
        if i == 0:  # warm-up: compiles
          steps_before = engines["batched"].batcher.decode_steps
          continue
        times[name].append(time.perf_counter() - started)
        tokens[name] += made
    steps = (engines["batched"].batcher.decode_steps - steps_before) / args.rounds
    for name in engines:
      results.append(
        {
          "pattern": pattern,
          "engine": name,
          "round_s": statistics.median(times[name]),
          "tokens_per_s": tokens[name] / sum(times[name]),
          "ms_per_position": 1e3 * statistics.median(times[name]) / args.new_tokens,
          "decode_steps_per_round": steps if name == "batched" else None,
          "roofline_tokens_per_s": decode_roofline(
            cfg, rows, cfg.sampling.kv_cache_size, np.dtype(args.dtype).itemsize, n_params
          ),
        }
      )
      print(f"  done: {pattern} / {name}: {results[-1]['round_s']:.2f} s per round", file=sys.stderr, flush=True)
  for r in results:
    base = next(x for x in results if x["pattern"] == r["pattern"] and x["engine"] == "vanilla")
    r["ratio_to_vanilla"] = r["round_s"] / base["round_s"]

  by_rows = _decode_by_rows(cfg, engines["batched"].model(), rollout)

  from importlib import metadata

  report = {
    "date": datetime.date.today().isoformat(),
    "device": device,
    "cpu_count": os.cpu_count(),
    "python": platform.python_version(),
    "versions": {p: metadata.version(p) for p in ("jax", "jaxlib", "flax", "google-tunix")},
    "arguments": vars(args),
    "params": n_params,
    "results": results,
    "decode_by_rows": by_rows,
  }
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)
  print(
    f"{args.model} {args.dtype}, {args.prompts} prompts x {args.samples} samples, {args.prompt_length}-token "
    f"prompts, {args.new_tokens} new tokens, on {device}"
  )
  print(
    "| pattern | engine | s per round | tokens/s | ms per position | decode steps per round "
    "| HBM roofline tokens/s | / vanilla |"
  )
  print("| --- | --- | --- | --- | --- | --- | --- | --- |")
  for r in results:
    print(
      f"| {r['pattern']} | {r['engine']} | {r['round_s']:.2f} | {r['tokens_per_s']:.1f} | "
      f"{r['ms_per_position']:.1f} | {fmt(r['decode_steps_per_round'], '.0f')} | "
      f"{fmt(r['roofline_tokens_per_s'], '.0f')} | "
      f"{r['ratio_to_vanilla']:.2f} |"
    )
  print("\n| busy rows | decode step ms | / 1 row | forward without cache ms | / 1 row |")
  print("| --- | --- | --- | --- | --- |")
  for r in by_rows:
    print(
      f"| {r['rows']} | {r['decode_step_ms']:.1f} | {r['decode_step_ratio']:.2f} | "
      f"{r['forward_no_cache_ms']:.1f} | {r['forward_no_cache_ratio']:.2f} |"
    )
  print(f"wrote {args.output}")


if __name__ == "__main__":
  main()
