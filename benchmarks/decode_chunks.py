"""Host overhead of the continuous batcher's decode steps, by decode_steps_per_dispatch: the demo's
rollout shape (SmolLM2-135M in float32, 64 rows: 8 prompts x 8 samples of 40 tokens, 12-token
replies, top-k off) through the real ContinuousBatcher, against the decode program's own time.

    python benchmarks/decode_chunks.py [--model smollm2-135m] [--rows 64] [--prompt 40] [--reply 12]
                                       [--chunks 1 4 16] [--rounds 3] [--dtype float32]

For each chunk size, in one process: a round that compiles, then --rounds rounds of fresh prompts,
every row decoding its whole reply (no EOS). A step's time is the batcher's decode time per decode
step (its decode_rate: busy-row tokens per second, every row busy throughout); the program's own
time per step is the same decode program run back to back as one chunk of --reply steps, divided by
them. Host overhead = step time - own time (dispatch, the copy to the host, Python per token and
row), reported per step and as a share of the step. Random weights. Prints a table and writes
benchmarks/results/decode_chunks.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))


def batcher_decode(
  model,
  rows: int,
  prompt: int,
  reply: int,
  chunk: int,
  rounds: int,
  rng,
  profile_dir: str | None = None,
  unrolled_layers: bool = True,
) -> dict:
  """The continuous batcher's decode speed with steps_per_dispatch=chunk: rounds + 1 rounds (the
  first compiles) of `rows` requests, groups of 8 sharing a fresh random prompt of `prompt` tokens
  (as GRPO samples them; single requests when rows is not a multiple of 8), every row decoding
  `reply` tokens (no EOS, top-k off). Returns the busy-row tokens/s of the decode dispatches that
  did not compile (every row busy in every step), the step time, the bytes read per second, the
  dispatches and `tokens_sha256`, a digest of every sampled token in order (equal for two chunk
  sizes given the same rng state: the samples do not depend on the chunk). With profile_dir, one
  more round runs after the measurement under JAX's profiler, its trace written there
  (`profile_error` when it could not trace). unrolled_layers: a scanned model's layers are sampled
  unrolled (ContinuousBatcher's)."""
  import hashlib

  import jax
  import numpy as np

  from maxtext.inference import continuous_batching as cb

  group = 8 if rows % 8 == 0 else 1
  vocab = model.config.vocab_size
  digest = hashlib.sha256()
  profile_error = None
  batcher = cb.ContinuousBatcher(model, prompt + reply, rows, steps_per_dispatch=chunk, unrolled_layers=unrolled_layers)
  params = cb.SamplingParams(reply, temperature=1.0)

  def round_of_requests(round_: int) -> list:
    prompts = [rng.integers(1, vocab, size=prompt).tolist() for _ in range(rows // group)]
    requests = [p for p in prompts for _ in range(group)]
    keys = [jax.random.PRNGKey(1000 * round_ + i) for i in range(len(requests))]
    return [f.result() for f in batcher.submit_many(requests, params, keys)]

  try:
    for round_ in range(rounds + 1):  # the first dispatch compiles; decode_rate leaves it out
      for r in round_of_requests(round_):
        digest.update(np.asarray(r.tokens, np.int64).tobytes())
    tokens_s, bytes_s = batcher.decode_rate()
    dispatches = batcher.decode_dispatches
    if profile_dir:  # one more round, traced, outside the measurement
      try:
        with jax.profiler.trace(profile_dir):
          round_of_requests(rounds + 1)
      except Exception as e:  # a profiler missing on the device leaves the measurement
        profile_error = f"{type(e).__name__}: {e}"[-500:]
  finally:
    batcher.close()
  return {
    "rows": rows,
    "decode_steps_per_dispatch": chunk,
    "tokens_per_s": tokens_s,
    "step_ms": rows / tokens_s * 1e3,
    "gb_per_s": bytes_s / 1e9,
    "dispatches": dispatches,
    "tokens_sha256": digest.hexdigest(),
    **({"profile_error": profile_error} if profile_error else {}),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--model", default="smollm2-135m")
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--prompt", type=int, default=40)
  parser.add_argument("--reply", type=int, default=12)
  parser.add_argument("--chunks", type=int, nargs="+", default=[1, 4, 16])
  parser.add_argument("--rounds", type=int, default=3)
  parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "decode_chunks.json"))
  parser.add_argument("overrides", nargs="*", help="more key=value config arguments (scan_layers=false, say)")
  args = parser.parse_args()

  from maxtext.utils import xla_flags

  xla_flags.use_sequential_cpu_scheduler()  # as train_rl runs
  import jax
  import jax.numpy as jnp
  import model_benchmark
  import numpy as np
  from flax import nnx

  from maxtext.inference import kv_programs as kv

  cfg, mesh, model, n_params = model_benchmark._build(args.model, args.dtype, overrides=tuple(args.overrides))
  rows, cache_size = args.rows, args.prompt + args.reply
  rng = np.random.default_rng(0)
  vocab = cfg.model.vocab_size
  result: dict = {
    "model": args.model,
    "rows": rows,
    "prompt": args.prompt,
    "reply": args.reply,
    "dtype": args.dtype,
    "overrides": args.overrides,
    "device": jax.devices()[0].device_kind,
    "chunks": [],
  }

  with jax.set_mesh(mesh):
    # The decode program's own time per step: one chunk of `reply` steps, dispatched back to back.
    static, state = kv._StaticGraph(nnx.split(model)[0]), nnx.state(model)
    held = {"cache": model.init_cache(rows, cache_size, jnp.dtype(args.dtype))}
    tokens = jnp.ones((rows,), jnp.int32)
    positions = jnp.full((rows,), args.prompt - 1, jnp.int32)
    steps, keys = jnp.zeros((rows,), jnp.int32), jnp.zeros((rows, 2), jnp.uint32)
    sampling = jnp.stack([jnp.full((rows,), 1.0), jnp.ones((rows,))], axis=1)
    top_k, limits = jnp.full((rows,), vocab, jnp.int32), jnp.full((rows,), args.reply, jnp.int32)
    eos, until = jnp.full((rows, 1), -1, jnp.int32), jnp.array([args.reply, 0])

    def chunk():
      out = kv._decode(
        static,
        state,
        held["cache"],
        tokens,
        positions,
        steps,
        keys,
        sampling,
        top_k,
        None,
        limits,
        eos,
        until,
        args.reply,
      )
      held["cache"] = out[-1]
      return out[:2]

    jax.block_until_ready(chunk())
    times = []
    for _ in range(5):
      start = time.perf_counter()
      jax.block_until_ready(chunk())
      times.append((time.perf_counter() - start) / args.reply)
    own = statistics.median(times)

    roofline = model_benchmark.decode_roofline(cfg, rows, cache_size, jnp.dtype(args.dtype).itemsize, n_params)
    result["roofline_tokens_per_s"] = roofline
    result["program_fraction_of_roofline"] = rows / own / roofline if roofline else None
    for size in args.chunks:
      measured = batcher_decode(model, rows, args.prompt, args.reply, size, args.rounds, rng)
      step = measured["step_ms"] / 1e3
      result["chunks"].append(
        {
          "decode_steps_per_dispatch": size,
          "step_ms": step * 1e3,
          "program_ms_per_step": own * 1e3,
          "host_overhead_ms_per_step": (step - own) * 1e3,
          "host_overhead_fraction": (step - own) / step,
          "dispatches": measured["dispatches"],
          "tokens_per_s": measured["tokens_per_s"],
          "fraction_of_roofline": measured["tokens_per_s"] / roofline if roofline else None,
        }
      )
  print(
    f"{args.model}, {rows} rows, {args.prompt}-token prompts, {args.reply}-token replies, {result['device']}; "
    f"the decode program's own time: {own * 1e3:.2f} ms per step"
    + (f" ({result['program_fraction_of_roofline']:.1%} of the HBM roofline)" if roofline else "")
  )
  print(
    "| decode_steps_per_dispatch | step ms | host overhead ms | share of the step | of the roofline |\n"
    "| --- | --- | --- | --- | --- |"
  )
  for c in result["chunks"]:
    print(
      f"| {c['decode_steps_per_dispatch']} | {c['step_ms']:.2f} | {c['host_overhead_ms_per_step']:.2f} | "
      f"{100 * c['host_overhead_fraction']:.1f}% | {model_benchmark.fmt(c['fraction_of_roofline'], '.1%')} |"
    )
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w") as f:
    json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
