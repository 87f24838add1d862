"""Peak memory and time of a training run under XLA's two CPU schedulers, with and without remat.

    python benchmarks/cpu_scheduler.py [--steps N] [--output F] [key=value ...]

Runs train_rl on the default demo (rl_times_table.yml, SmolLM2-135M-Instruct) for --steps steps,
each configuration in its own process with no compilation cache, one after the other:
XLA's default concurrency-optimised CPU scheduler (what a run got before maxtext selected the
sequential one) and the sequential scheduler maxtext selects on import, each with remat_policy
none and full. Per run: peak RSS of the process, training wall time (train_rl's "Trained N steps
in X s") and the part spent compiling, the median step time after the first step, and the ratios to
the first configuration. Extra key=value arguments reach every run (e.g. a longer
max_response_length, where activations matter more). Prints a table and writes
benchmarks/results/cpu_scheduler.json (or --output).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile

import run_log  # this folder's (sys.path[0] when run as a script)
from vs_trl import PEAK_PRELUDE, peak_gb  # this folder's vs_trl.py (sys.path[0] when run as a script)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "cpu_scheduler.json")
FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"
CONFIGS = (  # (name, scheduler flag value, remat_policy)
  ("XLA default scheduler, no remat", "true", "none"),
  ("sequential scheduler, no remat", "false", "none"),
  ("sequential scheduler, remat full", "false", "full"),
  ("XLA default scheduler, remat full", "true", "full"),
)
# train_rl as a `python -c` program that reports its peak RSS on exit (it leaves through sys.exit).
_WRAPPER = PEAK_PRELUDE + (
  "import runpy; sys.argv = ['train_rl', *sys.argv[1:]]; "
  "runpy.run_module('maxtext.trainers.post_train.rl.train_rl', run_name='__main__')"
)


def _run(name: str, flag: str, remat: str, args, out_dir: str) -> dict:
  run_name = re.sub(r"[^a-z0-9]+", "_", name.lower())
  env = {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {FLAG}={flag}".strip()}
  cmd = [
    sys.executable,
    "-c",
    _WRAPPER,
    "rl_times_table.yml",
    f"num_batches={args.steps}",
    "num_test_batches=1",
    "checkpoint_period=1000",
    "jax_cache_dir=",
    f"remat_policy={remat}",
    f"base_output_directory={out_dir}",
    f"run_name={run_name}",
    *args.overrides,
  ]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT, env=env)
  if proc.returncode != 0:
    raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  steps, train_s, compile_s = run_log.trained(proc.stderr)
  with open(os.path.join(out_dir, run_name, "metrics.jsonl"), encoding="utf-8") as f:
    later = sorted(json.loads(line)["step_time_s"] for line in f)[:-1] or [None]  # the first step compiles most
  return {
    "config": name,
    "scheduler_flag": f"{FLAG}={flag}",
    "remat_policy": remat,
    "peak_rss_gb": peak_gb(proc.stderr),
    "train_s": train_s,
    "compile_s": compile_s,
    "later_step_s": later[len(later) // 2],
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=3)
  parser.add_argument("--output", default=RESULTS)
  parser.add_argument("overrides", nargs="*", help="key=value arguments for every run")
  args = parser.parse_args()
  results = []
  with tempfile.TemporaryDirectory() as out_dir:
    for name, flag, remat in CONFIGS:
      results.append(_run(name, flag, remat, args, out_dir))
      print(
        f"  done: {name}: {results[-1]['peak_rss_gb']:.2f} GB, {results[-1]['train_s']:.1f} s",
        file=sys.stderr,
        flush=True,
      )
  first = results[0]
  for r in results:
    r["rss_ratio"] = r["peak_rss_gb"] / first["peak_rss_gb"]
    r["train_ratio"] = r["train_s"] / first["train_s"]
  from importlib import metadata

  report = {
    "date": datetime.date.today().isoformat(),
    "device": "cpu",
    "cpu_count": os.cpu_count(),
    "python": platform.python_version(),
    "versions": {p: metadata.version(p) for p in ("jax", "jaxlib", "flax", "google-tunix")},
    "arguments": [f"num_batches={args.steps}", *args.overrides],
    "results": results,
  }
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)
  print("| configuration | peak RSS GB | x first | training s | x first | compiling s | later steps s/step |")
  print("| --- " * 7 + "|")
  for r in results:
    later = "-" if r["later_step_s"] is None else f"{r['later_step_s']:.1f}"
    print(
      f"| {r['config']} | {r['peak_rss_gb']:.2f} | {r['rss_ratio']:.2f} | {r['train_s']:.1f} | "
      f"{r['train_ratio']:.2f} | {r['compile_s']:.1f} | {later} |"
    )
  print(f"wrote {args.output}")


if __name__ == "__main__":
  main()
