"""Model benchmark: forward+backward tokens/s (and MFU on a GPU), peak memory with and without
remat, and KV-cache decode tokens/s at several batch sizes against the memory-bandwidth roofline.

    python benchmarks/model_benchmark.py [--quick] [--model qwen3-0.6b] [--dtype bfloat16]
        [--weight-dtype float32] [--attention autoselected]

Random weights; --weight-dtype (default: --dtype) float32 with --dtype bfloat16 is MaxText's mixed
precision, --attention the config key (autoselected: dot_product; cudnn_flash when named). The
training step's loss takes its log-probs through models/token_logps.py, a vocabulary slice at a
time, as train_rl's does. Each measurement runs in its own process so peak memory is per configuration
(GPU: XLA's peak_bytes_in_use; CPU: the process's peak RSS). Prints a table and writes
benchmarks/results/model_benchmark.json.

    python benchmarks/model_benchmark.py --phases [--model smollm2-135m] [--dtype float32]

is the roofline of a GRPO step on this machine: it measures the matmul peak (float32 and bfloat16
square matmuls) and the memory read bandwidth, then runs each phase of a step of the GSM8K shape
(vs_trl.py --shape gsm8k: 2 prompts x 4 samples, 192-token prompts, 128-token replies) through the
programs train_rl runs (worker_phases): rollout prefill and decode on the continuous batcher,
reference forward (rollout.per_token_logps, as the cluster scores the reference) and trainer
forward+backward (the policy loss's scoring.py) scoring each prompt once, and an AdamW update. Each
phase is reported as achieved FLOP/s and bytes/s against the peak of its dtype, and decode against
its read floor (every weight and the cached keys and values read once per step at the measured
bandwidth). Random weights; TRL and Tunix's own step code are not in it. Writes
benchmarks/results/roofline.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time

# Dense bf16 peak FLOP/s and HBM bandwidth (bytes/s) per device kind, from the vendors' data sheets.
PEAKS = {
  "NVIDIA H100 80GB HBM3": (989e12, 3.35e12),
  "NVIDIA H200": (989e12, 4.8e12),
}


def fmt(value, spec: str = ".2f") -> str:
  """`value` formatted with `spec`, or n/a where it was not measured (None)."""
  return "n/a" if value is None else format(value, spec)


def decode_roofline(cfg, rows: int, cache_size: int, dtype_bytes: int, n_params: int) -> float | None:
  """Decode tokens/s on this device if a step only read every weight and `rows` cache rows of
  cache_size positions once (None without a known HBM bandwidth)."""
  import jax

  bandwidth = PEAKS.get(jax.devices()[0].device_kind, (None, None))[1]
  if not bandwidth:
    return None
  kv = 2 * cfg.model.num_decoder_layers * rows * cache_size * cfg.model.num_kv_heads * cfg.model.head_dim * dtype_bytes
  return rows * bandwidth / (n_params * dtype_bytes + kv)


def _build(
  model_name: str, dtype: str, remat="none", weight_dtype: str | None = None, attention="autoselected", overrides=()
):
  """The rl.yml config of model_name in dtype (weights in weight_dtype, default dtype), its mesh, a
  random-weight model and its parameter count; overrides: more key=value arguments for the config
  (e.g. scan_layers=true), applied last."""
  import jax
  from flax import nnx

  from maxtext.configs import pyconfig
  from maxtext.models import builder
  from maxtext.models.decoder import ModelConfig
  from maxtext.utils.mesh import create_meshes

  cfg = pyconfig.initialize(
    [
      "bench",
      "rl.yml",
      f"model_name={model_name}",
      f"dtype={dtype}",
      f"weight_dtype={weight_dtype or dtype}",
      f"attention={attention}",
      f"remat_policy={remat}",
      *overrides,
    ]
  )
  mesh, _ = create_meshes(cfg.mesh, agentic=False)
  model = builder.init_random(ModelConfig.from_config(cfg.model), mesh, seed=0)
  n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  return cfg, mesh, model, n_params


def _peak_memory() -> int:
  import jax

  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"])
  from maxtext.trainers.post_train.rl import footprint

  return int(footprint.peak_rss_bytes())


def worker_train(args) -> dict:
  """A training step (forward, cross-entropy over every next token, backward) on random tokens of
  args.batch x args.seq: its program compiled once ahead of time (lowering and compiling timed
  apart), then args.iters timed runs after one untimed one. getattr(args, "overrides", ()): more
  key=value config arguments."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from maxtext.models.token_logps import token_logps
  from maxtext.trainers.post_train.rl import footprint

  overrides = tuple(getattr(args, "overrides", None) or ())
  began = time.perf_counter()
  progress = lambda phase: print(
    f"train {' '.join(overrides)}: {phase} at {time.perf_counter() - began:.1f} s", file=sys.stderr, flush=True
  )
  cfg, mesh, model, n_params = _build(
    args.model,
    args.dtype,
    args.remat,
    getattr(args, "weight_dtype", None),
    getattr(args, "attention", "autoselected"),
    overrides,
  )
  b, t = args.batch, args.seq
  tokens = jax.random.randint(jax.random.PRNGKey(0), (b, t + 1), 0, cfg.model.vocab_size)
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  mask = jnp.tril(jnp.ones((t, t), bool))[None].repeat(b, 0)
  graphdef, state = nnx.split(model)

  def train_step(state, tokens):
    def loss_fn(m):
      hidden, _ = m.hidden_states(tokens[:, :-1], pos, None, mask)
      logps, _ = token_logps(hidden, m.output_head(), tokens[:, 1:], 1.0, m.config.precision)
      return -logps.mean()

    return nnx.value_and_grad(loss_fn)(nnx.merge(graphdef, state))

  rss_before = int(footprint.peak_rss_bytes())
  progress("model built")
  with jax.set_mesh(mesh):
    start = time.perf_counter()
    lowered = jax.jit(train_step).lower(state, tokens)
    lowered_at = time.perf_counter()
    progress("step lowered")
    step = lowered.compile()
    compiled_at = time.perf_counter()
    progress("step compiled")
    planned = step.memory_analysis()
    jax.block_until_ready(step(state, tokens))
    start_timing = time.perf_counter()
    for _ in range(args.iters):
      jax.block_until_ready(step(state, tokens))
    elapsed = (time.perf_counter() - start_timing) / args.iters
    progress("steps timed")
    profile_error = _profile(getattr(args, "profile_dir", None), lambda: jax.block_until_ready(step(state, tokens)))
  # 6 N per token for the dense layers plus 12 L T d_attn for attention scores (fwd+bwd).
  flops = (
    b * t * (6 * n_params + 12 * cfg.model.num_decoder_layers * t * cfg.model.num_query_heads * cfg.model.head_dim)
  )
  peak_flops = PEAKS.get(jax.devices()[0].device_kind, (None, None))[0]
  return {
    "params": n_params,
    "attention": model.config.attention,
    "batch": b,
    "seq": t,
    "remat": args.remat,
    "overrides": list(overrides),
    "step_s": elapsed,
    "tokens_per_s": b * t / elapsed,
    "tflops_per_s": flops / elapsed / 1e12,
    "mfu": flops / elapsed / peak_flops if peak_flops else None,
    "lower_s": lowered_at - start,  # tracing and lowering to StableHLO
    "compile_s": compiled_at - lowered_at,  # XLA's compilation
    "peak_memory_bytes": _peak_memory(),
    "rss_before_step_bytes": rss_before,
    # XLA's plan for the step: temporaries (activations kept for the backward pass and scratch).
    "xla_temp_bytes": int(planned.temp_size_in_bytes) if planned else None,
    **({"profile_error": profile_error} if profile_error else {}),
  }


def _profile(directory: str | None, run) -> str | None:
  """Runs `run` once more under JAX's profiler, its trace written under `directory` (nothing when
  None); the profiler's error as text when it could not trace (the measurement stands without it)."""
  if not directory:
    return None
  import jax

  try:
    with jax.profiler.trace(directory):
      run()
  except Exception as e:  # a profiler missing on the device leaves the measurement
    return f"{type(e).__name__}: {e}"[-500:]
  return None


def worker_decode(args) -> dict:
  import jax
  import jax.numpy as jnp
  from flax import nnx

  cfg, mesh, model, n_params = _build(args.model, args.dtype, weight_dtype=args.weight_dtype, attention=args.attention)
  b, p, n = args.batch, args.prompt, args.new_tokens
  size = p + n
  dtype = jnp.dtype(args.dtype)
  prompt = jax.random.randint(jax.random.PRNGKey(0), (b, p), 0, cfg.model.vocab_size)

  @nnx.jit(donate_argnums=2)
  def prefill(m, tokens, cache):
    mask = jnp.pad(jnp.tril(jnp.ones((p, p), bool))[None].repeat(b, 0), ((0, 0), (0, 0), (0, size - p)))
    logits, cache = m(tokens, jnp.broadcast_to(jnp.arange(p), (b, p)), cache, mask)
    return jnp.argmax(logits[:, -1], -1), cache

  @nnx.jit(donate_argnums=2)
  def decode_step(m, tok, cache, i):
    mask = jnp.broadcast_to(jnp.arange(size) <= i, (b, 1, size))
    logits, cache = m(tok[:, None], jnp.full((b, 1), i), cache, mask)
    return jnp.argmax(logits[:, -1], -1), cache

  def run():
    tok, cache = prefill(model, prompt, model.init_cache(b, size, dtype))
    jax.block_until_ready(tok)
    start = time.perf_counter()
    for i in range(p, size - 1):
      tok, cache = decode_step(model, tok, cache, jnp.int32(i))
    jax.block_until_ready(tok)
    return time.perf_counter() - start

  with jax.set_mesh(mesh):
    run()  # compile
    elapsed = run()
  steps = n - 1
  roofline = decode_roofline(cfg, b, size, dtype.itemsize, n_params)
  tps = b * steps / elapsed
  return {
    "batch": b,
    "prompt": p,
    "new_tokens": n,
    "tokens_per_s": tps,
    "step_ms": 1e3 * elapsed / steps,
    "roofline_tokens_per_s": roofline,
    "fraction_of_roofline": tps / roofline if roofline else None,
  }


def _best_time(fn, repeats: int) -> float:
  """The fastest of `repeats` timed calls of fn (after one untimed call that compiles)."""
  import jax

  jax.block_until_ready(fn())
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    best = min(best, time.perf_counter() - start)
  return best


def machine_peaks(repeats: int = 5) -> dict:
  """FLOP/s of a 2048-square matmul in float32 and bfloat16, and the bytes/s of summing 512 MB."""
  import jax
  import jax.numpy as jnp

  out = {}
  n = 2048
  for name, dtype in (("float32", jnp.float32), ("bfloat16", jnp.bfloat16)):
    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
    matmul = jax.jit(jnp.matmul)
    out[f"matmul_flops_{name}"] = 2 * n**3 / _best_time(lambda a=a, b=b, f=matmul: f(a, b), repeats)
  x = jnp.ones((128 * 2**20,), jnp.float32)
  total = jax.jit(jnp.sum)
  out["read_bytes_per_s"] = x.nbytes / _best_time(lambda: total(x), repeats)
  return out


def worker_phases(args) -> dict:
  """Each phase of a GRPO step of the GSM8K shape through the programs train_rl runs: the rollout on
  the continuous batcher (its prefill and decode told apart by the batcher's own decode clock),
  the reference (rollout.per_token_logps, as the cluster scores it) and the trainer (the policy loss's
  log-probs, scoring.py) scoring each group's prompt once (SharedPrefix), both through the output
  layer a vocabulary slice at a time, and AdamW. Best of
  args.iters timed runs after one that compiles."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  import optax
  from flax import nnx

  from maxtext.inference.continuous_batching import ContinuousBatcher, SamplingParams
  from maxtext.integration.tunix import rollout as rollout_lib
  from maxtext.integration.tunix import scoring
  from maxtext.models.shared_prefix import SharedPrefix

  peaks = machine_peaks()
  cfg, mesh, model, n_params = _build(args.model, args.dtype, weight_dtype=args.weight_dtype, attention=args.attention)
  prompts, group, p, n = 2, 4, 192, 128
  rows, size = prompts * group, p + n
  dtype = jnp.dtype(args.dtype)
  weight_bytes = n_params * dtype.itemsize
  layers, attn = cfg.model.num_decoder_layers, cfg.model.num_query_heads * cfg.model.head_dim
  kv_per_position = 2 * layers * cfg.model.num_kv_heads * cfg.model.head_dim * dtype.itemsize
  rng = np.random.default_rng(0)
  seqs = jnp.asarray(rng.integers(0, cfg.model.vocab_size, (rows, size)), jnp.int32)

  def flops(batch: int, tokens: int, context: float) -> float:
    # 2 N per token for the matmuls (the tied head included) and 4 L d_attn per attended position
    return batch * tokens * (2 * n_params + 4 * layers * context * attn)

  scored = flops(prompts, p, p / 2) + flops(rows, n, p + n / 2)  # prompts once, then each completion
  shared = SharedPrefix(model, p, group)

  def reference(m, tokens):  # the reference's log-probs as the cluster scores them (pad id -1: none)
    return rollout_lib.per_token_logps(m, tokens[:, :p], tokens[:, p:], -1, -1, 1.0)

  def loss(m, tokens):  # the policy loss's log-probs (scoring.py; pad id -1: every token is real)
    logps, _ = scoring.completion_logps(m, tokens[:, :p], tokens[:, p:], -1, -1, 1.0)
    return -logps.mean()

  train = nnx.jit(lambda m, t: nnx.value_and_grad(lambda m: loss(m, t))(m))
  params = nnx.state(shared, nnx.Param)
  adamw = optax.adamw(1e-6, weight_decay=0.1)
  opt_state = adamw.init(params)

  @jax.jit
  def update(params, grads, state):
    updates, state = adamw.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  sampling = SamplingParams(max_new_tokens=n, temperature=0.9, top_k=50, eos_ids=())
  result = {
    "model": args.model,
    "dtype": args.dtype,
    "weight_dtype": cfg.model.weight_dtype,
    "attention": model.config.attention,
    "params": n_params,
    **peaks,
    "phases": [],
  }

  def add(name: str, seconds: float, phase_flops: float, phase_bytes: float, floor_s: float | None = None):
    result["phases"].append(
      {
        "phase": name,
        "seconds": seconds,
        "flops": phase_flops,
        "bytes": phase_bytes,
        "flops_per_s": phase_flops / seconds,
        "of_matmul_peak": phase_flops / seconds / peaks[f"matmul_flops_{args.dtype}"],
        "bytes_per_s": phase_bytes / seconds,
        "of_read_bandwidth": phase_bytes / seconds / peaks["read_bytes_per_s"],
        "over_read_floor": seconds / floor_s if floor_s else None,
      }
    )

  with jax.set_mesh(mesh):
    batcher = ContinuousBatcher(model, size, rows)

    def rollout(i: int, tokens: int) -> float:
      """Seconds to sample `tokens` tokens for each of the step's rows, from fresh prompts."""
      keys = [jax.random.PRNGKey(i * rows + r) for r in range(rows)]
      prompt_ids = [rng.integers(0, cfg.model.vocab_size, p).astype(np.int32) for _ in range(prompts)]  # none cached
      params = dataclasses.replace(sampling, max_new_tokens=tokens)
      start = time.perf_counter()
      futures = batcher.submit_many([ids for ids in prompt_ids for _ in range(group)], params, keys)
      assert all(len(f.result().tokens) == tokens for f in futures)
      return time.perf_counter() - start

    # The batcher dispatches prefill asynchronously, so its decode clock holds it: a one-token rollout
    # (prefill and one decode step) and a whole one tell them apart.
    first, whole = (min(rollout(2 * i + k, t) for i in range(args.iters + 1)) for k, t in ((0, 1), (1, n)))
    step = (whole - first) / (n - 1)
    batcher.close()
    add("rollout prefill", first - step, flops(prompts, p - 1, p / 2), weight_bytes)
    cache_bytes = rows * size * kv_per_position  # a decode step reads every cached position (masked)
    floor = (weight_bytes + cache_bytes) / peaks["read_bytes_per_s"]
    add("rollout decode", n * step, flops(rows, n, size), n * (weight_bytes + cache_bytes), n * floor)
    add("reference forward", _best_time(lambda: reference(shared, seqs), args.iters), scored, weight_bytes)
    grads = train(shared, seqs)[1]
    add("trainer forward+backward", _best_time(lambda: train(shared, seqs), args.iters), 3 * scored, 3 * weight_bytes)
    add(
      "optimizer (AdamW)",
      _best_time(lambda: update(params, grads, opt_state), args.iters),
      10 * n_params,
      7 * n_params * 4,  # reads weights, gradients and both moments; writes weights and moments
    )
  return result


def _print_phases(result: dict) -> None:
  peak = result[f"matmul_flops_{result['dtype']}"]
  print(
    f"{result['model']} {result['dtype']} (weights {result['weight_dtype']}, attention {result['attention']}) on "
    f"{result['device']} x{result['num_devices']}: matmul peak "
    f"{result['matmul_flops_float32'] / 1e9:.0f} GFLOP/s float32, {result['matmul_flops_bfloat16'] / 1e9:.0f} "
    f"bfloat16; read bandwidth {result['read_bytes_per_s'] / 1e9:.1f} GB/s"
  )
  print(
    f"{'phase':<26} {'s':>7} {'GFLOP':>8} {'GFLOP/s':>8} {'of peak':>8} {'GB/s':>7} {'of bandwidth':>13} "
    f"{'/ read floor':>12}"
  )
  for r in result["phases"]:
    print(
      f"{r['phase']:<26} {r['seconds']:>7.3f} {r['flops'] / 1e9:>8.1f} {r['flops_per_s'] / 1e9:>8.1f} "
      f"{r['flops_per_s'] / peak:>8.1%} {r['bytes_per_s'] / 1e9:>7.2f} {r['of_read_bandwidth']:>13.1%} "
      f"{fmt(r['over_read_floor'], '.1f'):>12}"
    )


def _spawn(kind: str, args, **extra) -> dict:
  cmd = [sys.executable, __file__, "--worker", kind, "--model", args.model, "--dtype", args.dtype]
  cmd += ["--weight-dtype", args.weight_dtype or args.dtype, "--attention", args.attention]
  for k, v in extra.items():
    cmd += [f"--{k.replace('_', '-')}", str(v)]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def _versions() -> dict:
  import flax
  import jax

  dev = jax.devices()[0]
  return {
    "device": f"{dev.platform}:{dev.device_kind}",
    "num_devices": jax.device_count(),
    "cpu_count": os.cpu_count(),
    "jax": jax.__version__,
    "flax": flax.__version__,
    "python": platform.python_version(),
    "date": datetime.date.today().isoformat(),
  }


def main() -> None:
  from maxtext.utils import xla_flags

  xla_flags.use_sequential_cpu_scheduler()  # as train_rl does, before JAX starts
  from maxtext.configs import sections

  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true", help="short sequences and fewer decode batches (CPU)")
  parser.add_argument("--model", default="qwen3-0.6b")
  parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
  parser.add_argument("--weight-dtype", choices=["bfloat16", "float32"], help="parameter dtype (default: --dtype)")
  parser.add_argument("--attention", default="autoselected", choices=sections.choices()["attention"])
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "model_benchmark.json"))
  parser.add_argument("--skip-decode", action="store_true", help="only the training-step measurements")
  parser.add_argument("--phases", action="store_true", help="the roofline of a GRPO step (see the docstring)")
  parser.add_argument("--worker", choices=["train", "decode", "phases"], help=argparse.SUPPRESS)
  parser.add_argument("--remat", default="none")
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--seq", type=int, default=256)
  parser.add_argument("--iters", type=int, default=3)
  parser.add_argument("--prompt", type=int, default=64)
  parser.add_argument("--new-tokens", type=int, default=32)
  args = parser.parse_args()
  if args.worker:
    workers = {"train": worker_train, "decode": worker_decode, "phases": worker_phases}
    print(json.dumps(workers[args.worker](args)))
    return
  if args.phases:
    result = {**_spawn("phases", args, iters=args.iters), **_versions()}
    _print_phases(result)
    out = os.path.join(os.path.dirname(args.out), "roofline.json")
    with open(out, "w", encoding="utf-8") as f:
      json.dump(result, f, indent=1)
    print(f"wrote {out}")
    return

  seq, batch = (1024, 1) if args.quick else (1024, 8)
  iters = 2 if args.quick else 5
  train = [_spawn("train", args, remat=r, batch=batch, seq=seq, iters=iters) for r in ("none", "full")]
  decode = (
    []
    if args.skip_decode
    else [_spawn("decode", args, batch=b, prompt=64, new_tokens=16 if args.quick else 64) for b in (1, 16, 64)]
  )
  result = {
    "model": args.model,
    "dtype": args.dtype,
    "weight_dtype": args.weight_dtype or args.dtype,
    "attention": train[0]["attention"],
    **_versions(),
    "train": train,
    "decode": decode,
  }

  print(
    f"{args.model} {args.dtype} (weights {result['weight_dtype']}, attention {result['attention']}) on "
    f"{result['device']} x{result['num_devices']} (jax {result['jax']}, {result['date']})"
  )
  print(
    f"{'remat':<6} {'batch x seq':>11} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'peak memory GiB':>16} "
    f"{'XLA temp GiB':>13}"
  )
  for r in train:
    temp = f"{r['xla_temp_bytes'] / 2**30:.2f}" if r["xla_temp_bytes"] is not None else "n/a"
    print(
      f"{r['remat']:<6} {r['batch']:>4} x {r['seq']:<4} {r['tokens_per_s']:>10.1f} {r['tflops_per_s']:>8.3f} "
      f"{fmt(r['mfu'], '.1%'):>6} {r['peak_memory_bytes'] / 2**30:>16.2f} {temp:>13}"
    )
  print(f"{'decode batch':<12} {'tokens/s':>10} {'ms/step':>8} {'roofline tokens/s':>18} {'of roofline':>11}")
  for r in decode:
    print(
      f"{r['batch']:<12} {r['tokens_per_s']:>10.1f} {r['step_ms']:>8.1f} "
      f"{fmt(r['roofline_tokens_per_s'], '.0f'):>18} {fmt(r['fraction_of_roofline'], '.1%'):>11}"
    )
  os.makedirs(os.path.dirname(args.out), exist_ok=True)
  with open(args.out, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
