"""Model benchmark: forward+backward tokens/s (and MFU on a GPU), peak memory with and without
remat, and KV-cache decode tokens/s at several batch sizes against the memory-bandwidth roofline.

    python benchmarks/model_benchmark.py [--quick] [--model qwen3-0.6b] [--dtype bfloat16]

Random weights. Each measurement runs in its own process so peak memory is per configuration
(GPU: XLA's peak_bytes_in_use; CPU: the process's peak RSS). Prints a table and writes
benchmarks/results/model_benchmark.json.
"""

from __future__ import annotations

import argparse
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
  kv = 2 * cfg.num_decoder_layers * rows * cache_size * cfg.num_kv_heads * cfg.head_dim * dtype_bytes
  return rows * bandwidth / (n_params * dtype_bytes + kv)


def _build(args, remat="none"):
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
      f"model_name={args.model}",
      f"dtype={args.dtype}",
      f"weight_dtype={args.dtype}",
      f"remat_policy={remat}",
    ]
  )
  mesh, _ = create_meshes(cfg)
  model = builder.init_random(ModelConfig.from_config(cfg), mesh, seed=0)
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
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from maxtext.trainers.post_train.rl import footprint

  cfg, mesh, model, n_params = _build(args, args.remat)
  b, t = args.batch, args.seq
  tokens = jax.random.randint(jax.random.PRNGKey(0), (b, t + 1), 0, cfg.vocab_size)
  pos = jnp.broadcast_to(jnp.arange(t), (b, t))
  mask = jnp.tril(jnp.ones((t, t), bool))[None].repeat(b, 0)

  @nnx.jit
  def step(m, tokens):
    def loss_fn(m):
      logits, _ = m(tokens[:, :-1], pos, None, mask)
      logp = jax.nn.log_softmax(logits.astype(jnp.float32))
      return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()

    return nnx.value_and_grad(loss_fn)(m)

  rss_before = int(footprint.peak_rss_bytes())
  with jax.set_mesh(mesh):
    graphdef, state = nnx.split(model)
    planned = jax.jit(lambda s, t: step(nnx.merge(graphdef, s), t)).lower(state, tokens).compile().memory_analysis()
    jax.block_until_ready(step(model, tokens))  # compile
    start = time.perf_counter()
    for _ in range(args.iters):
      jax.block_until_ready(step(model, tokens))
    elapsed = (time.perf_counter() - start) / args.iters
  # 6 N per token for the dense layers plus 12 L T d_attn for attention scores (fwd+bwd).
  flops = b * t * (6 * n_params + 12 * cfg.num_decoder_layers * t * cfg.num_query_heads * cfg.head_dim)
  peak_flops = PEAKS.get(jax.devices()[0].device_kind, (None, None))[0]
  return {
    "params": n_params,
    "batch": b,
    "seq": t,
    "remat": args.remat,
    "step_s": elapsed,
    "tokens_per_s": b * t / elapsed,
    "tflops_per_s": flops / elapsed / 1e12,
    "mfu": flops / elapsed / peak_flops if peak_flops else None,
    "peak_memory_bytes": _peak_memory(),
    "rss_before_step_bytes": rss_before,
    # XLA's plan for the step: temporaries (activations kept for the backward pass and scratch).
    "xla_temp_bytes": int(planned.temp_size_in_bytes) if planned else None,
  }


def worker_decode(args) -> dict:
  import jax
  import jax.numpy as jnp
  from flax import nnx

  cfg, mesh, model, n_params = _build(args)
  b, p, n = args.batch, args.prompt, args.new_tokens
  size = p + n
  dtype = jnp.dtype(args.dtype)
  prompt = jax.random.randint(jax.random.PRNGKey(0), (b, p), 0, cfg.vocab_size)

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


def _spawn(kind: str, args, **extra) -> dict:
  cmd = [sys.executable, __file__, "--worker", kind, "--model", args.model, "--dtype", args.dtype]
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
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--quick", action="store_true", help="short sequences and fewer decode batches (CPU)")
  parser.add_argument("--model", default="qwen3-0.6b")
  parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
  parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", "model_benchmark.json"))
  parser.add_argument("--skip-decode", action="store_true", help="only the training-step measurements")
  parser.add_argument("--worker", choices=["train", "decode"], help=argparse.SUPPRESS)
  parser.add_argument("--remat", default="none")
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--seq", type=int, default=256)
  parser.add_argument("--iters", type=int, default=3)
  parser.add_argument("--prompt", type=int, default=64)
  parser.add_argument("--new-tokens", type=int, default=32)
  args = parser.parse_args()
  if args.worker:
    print(json.dumps((worker_train if args.worker == "train" else worker_decode)(args)))
    return

  seq, batch = (1024, 1) if args.quick else (1024, 8)
  iters = 2 if args.quick else 5
  train = [_spawn("train", args, remat=r, batch=batch, seq=seq, iters=iters) for r in ("none", "full")]
  decode = (
    []
    if args.skip_decode
    else [_spawn("decode", args, batch=b, prompt=64, new_tokens=16 if args.quick else 64) for b in (1, 16, 64)]
  )
  result = {"model": args.model, "dtype": args.dtype, **_versions(), "train": train, "decode": decode}

  print(
    f"{args.model} {args.dtype} on {result['device']} x{result['num_devices']} (jax {result['jax']}, {result['date']})"
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
