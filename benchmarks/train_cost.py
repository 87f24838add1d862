"""What a training step costs as the work grows: train_rl's warm step time and peak RSS for a base
config and variants of it, each in its own process, with the start-of-run memory estimate beside
the measured peak.

    python benchmarks/train_cost.py --variants scaling [--steps 3] [key=value ...]
    python benchmarks/train_cost.py --variants lora [--steps 3] [key=value ...]
    python benchmarks/train_cost.py --variants base [--steps 3] [key=value ...]

`scaling`: the base, then the group size (rl.num_generations), the prompts per step (batch_size)
and the response length (max_response_length) each doubled alone. `lora`: full fine-tuning against
rank-16 LoRA adapters (lora_alpha 32). `base`: the base alone (its estimate against its peak). The
base is the default demo (rl_times_table.yml) unless
key=value arguments change it (a .yml first replaces the recipe; e.g. model_name=qwen3-0.6b
random_weights=true measures that model's shape). No evaluation; no JAX compilation cache, so the
first step compiles and the warm step is the median of the later ones. Prints a table with each
variant's ratio to the base and writes benchmarks/results/train_cost_<variants>.json (or --output).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile

from vs_trl import PEAK_PRELUDE, peak_gb  # this folder's vs_trl.py (sys.path[0] when run as a script)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _variants(kind: str, base: dict) -> dict[str, list[str]]:
  if kind == "base":
    return {"base": []}
  if kind == "lora":
    return {"full fine-tuning": [], "LoRA rank 16": ["lora_rank=16", "lora_alpha=32"]}
  return {
    "base": [],
    "2x group size": [f"rl.num_generations={2 * base['rl.num_generations']}"],
    "2x prompts per step": [f"batch_size={2 * base['batch_size']}"],
    "2x response length": [f"max_response_length={2 * base['max_response_length']}"],
  }


def _run(args: list[str], work: str, name: str) -> dict:
  code = PEAK_PRELUDE + (
    "import runpy; sys.argv = ['train_rl', *sys.argv[1:]]; "
    "runpy.run_module('maxtext.trainers.post_train.rl.train_rl', run_name='__main__')"
  )
  proc = subprocess.run(
    [sys.executable, "-c", code, *args, f"base_output_directory={work}", f"run_name={name}"],
    capture_output=True,
    text=True,
    check=False,
    cwd=ROOT,
  )
  if proc.returncode != 0:
    raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  with open(os.path.join(work, name, "metrics.jsonl"), encoding="utf-8") as f:
    steps = [json.loads(line)["step_time_s"] for line in f]
  estimate = [line for line in proc.stderr.splitlines() if line.strip().startswith("total ")]
  return {
    "step_s": steps,
    "warm_step_s": statistics.median(steps[1:] or steps),
    "peak_rss_gb": peak_gb(proc.stderr),
    "estimate_gb": float(estimate[0].split()[1]) if estimate else None,
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--variants", choices=("scaling", "lora", "base"), required=True)
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--output", default="")
  parser.add_argument("overrides", nargs="*", help="key=value for every run (a .yml first replaces the recipe)")
  args = parser.parse_args()
  sys.path.insert(0, os.path.join(ROOT, "src"))
  from maxtext.configs import pyconfig

  overrides = list(args.overrides)
  yml = overrides.pop(0) if overrides and overrides[0].endswith(".yml") else "rl_times_table.yml"
  common = [
    yml,
    f"num_batches={args.steps}",
    "num_test_batches=0",
    "eval_batch_size=8",
    "checkpoint_period=100000",
    "jax_cache_dir=",
    *overrides,
  ]
  flat = pyconfig.initialize(["train_cost", *common]).flat()
  work = tempfile.mkdtemp(prefix="train_cost_")
  results = {}
  for name, extra in _variants(args.variants, flat).items():
    print(f"{name} ...", file=sys.stderr, flush=True)
    results[name] = {"args": extra, **_run([*common, *extra], work, name.replace(" ", "_"))}
  base = next(iter(results.values()))
  print(f"\n{'variant':22} {'warm step s':>12} {'x base':>7} {'peak RSS GB':>12} {'x base':>7} {'estimate GB':>12}")
  for name, r in results.items():
    r["step_ratio"], r["rss_ratio"] = r["warm_step_s"] / base["warm_step_s"], r["peak_rss_gb"] / base["peak_rss_gb"]
    print(
      f"{name:22} {r['warm_step_s']:12.2f} {r['step_ratio']:7.2f} {r['peak_rss_gb']:12.2f} {r['rss_ratio']:7.2f} "
      f"{r['estimate_gb'] or float('nan'):12.2f}"
    )
  import jax

  output = args.output or os.path.join(ROOT, "benchmarks", "results", f"train_cost_{args.variants}.json")
  os.makedirs(os.path.dirname(output), exist_ok=True)
  with open(output, "w", encoding="utf-8") as f:
    json.dump(
      {
        "date": datetime.date.today().isoformat(),
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "device": str(jax.devices()[0].device_kind),
        "jax": jax.__version__,
        "base_args": common,
        "results": results,
      },
      f,
      indent=1,
    )
  shutil.rmtree(work)  # the runs' checkpoints
  print(f"wrote {output}")


if __name__ == "__main__":
  main()
