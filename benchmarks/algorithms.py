"""Each RL algorithm variant on the default task: held-out gain, its interval, wall time, peak memory.

    python benchmarks/algorithms.py [--variants V ...] [--seeds N] [--output F [--append]] [key=value ...]

Every variant trains the default demo (rl_times_table.yml: SmolLM2-135M-Instruct learning the times
table, 8 steps of 8 prompts x 8 samples) through train_rl, one process per run, once per rollout seed
(decode_seed 0..N-1; the data order and the held-out questions stay the same, so every run is scored on
the same 200 questions); `ppo` is its recipe, rl_ppo_times_table.yml (PPO with a learned critic at
the same 64 samples a step: 64 prompts x 1); `ppo_reward_model` is rl_ppo_times_table_reward_model.yml
(that PPO rewarded by a learned reward model alone), whose reward model train_reward_model trains first,
once, with its defaults (its time, peak memory and held-out pair accuracy are recorded beside the
runs). Per run it reads the run's eval.json (greedy accuracy
before and after, the gain and its paired-bootstrap 95% interval) and train_rl's "Trained N steps in X
s" and "Peak memory (RSS)" lines. The table gives, per variant, the mean gain over seeds with each
seed's gain and interval, the mean training wall time, the highest peak memory, and the gain per step
and per training minute. The load average over each run is recorded, since a
run sharing the CPU with other work takes longer. Extra key=value arguments reach every run.
Prints the table and writes benchmarks/results/algorithms.json (or --output); --append adds to it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import run_log
from model_benchmark import fmt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "algorithms.json")

VARIANTS = {  # name: the settings that select it (on top of rl_times_table.yml)
  "grpo": [],
  "dr_grpo": ["rl.advantage_estimator=dr_grpo"],
  "rloo": ["rl.advantage_estimator=rloo"],
  "reinforce_pp": ["rl.advantage_estimator=reinforce_pp"],
  "cispo": ["rl.policy_loss_fn=cispo", "rl.epsilon_high=4.0"],
  "gspo": ["rl.loss_algo=gspo-token", "rl.loss_agg_mode=sequence-mean-token-mean"],
  "dapo": ["rl.dynamic_sampling=true", "rl.epsilon_high=0.28", "rl.loss_agg_mode=token-mean"],
  "ppo": [],  # its own recipe (RECIPES)
  "ppo_reward_model": [],  # its own recipe, with the reward model trained first (train_reward_model)
}
RECIPES = {  # variants trained from a recipe of their own
  "ppo": "rl_ppo_times_table.yml",
  "ppo_reward_model": "rl_ppo_times_table_reward_model.yml",
}


def train_reward_model(out_dir: str) -> dict:
  """train_reward_model with its defaults on the default demo's task into out_dir/reward_model: its
  summary line, training wall time and peak memory."""
  path = os.path.join(out_dir, "reward_model")
  cmd = [
    sys.executable,
    "-m",
    "maxtext.trainers.post_train.rl.train_reward_model",
    "rl_times_table.yml",
    f"reward_training.output_path={path}",
    f"base_output_directory={out_dir}",
  ]
  start = time.monotonic()
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
  if proc.returncode != 0:
    raise RuntimeError(f"train_reward_model failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  summary = json.loads(proc.stdout.strip().splitlines()[-1])
  return {**summary, "wall_s": time.monotonic() - start, "peak_gb": run_log.peak_gb(proc.stderr)}


def run_one(variant: str, seed: int, extra: list[str], out_dir: str) -> dict:
  if variant == "ppo_reward_model":
    extra = [f"reward_model.load_parameters_path={os.path.join(out_dir, 'reward_model')}", *extra]
  run_name = f"{variant}_seed{seed}"
  cmd = [
    sys.executable,
    "-m",
    "maxtext.trainers.post_train.rl.train_rl",
    RECIPES.get(variant, "rl_times_table.yml"),
    f"decode_seed={seed}",
    f"base_output_directory={out_dir}",
    f"run_name={run_name}",
    "checkpoint_period=1000",
    *VARIANTS[variant],
    *extra,
  ]
  load_before = os.getloadavg()[0]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
  if proc.returncode != 0:
    raise RuntimeError(f"{variant} seed {seed} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  steps, train_s, compile_s = run_log.trained(proc.stderr)
  with open(os.path.join(out_dir, run_name, "eval.json"), encoding="utf-8") as f:
    evaluation = json.load(f)
  with open(os.path.join(out_dir, run_name, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  gain = evaluation["gain"]
  return {
    "variant": variant,
    "seed": seed,
    "steps": steps,
    "train_s": train_s,
    "peak_gb": run_log.peak_gb(proc.stderr),
    "before": evaluation["before"]["accuracy"],
    "after": evaluation["after"]["accuracy"],
    "gain": gain["gain"],
    "ci95_low": gain["ci95_low"],
    "ci95_high": gain["ci95_high"],
    "num_examples": gain["num_examples"],
    "mean_frac_reward_zero_std": sum(r.get("frac_reward_zero_std", 0.0) for r in rows) / len(rows),
    "load_average": (load_before + os.getloadavg()[0]) / 2,
  }


def summarize(results: list[dict]) -> list[dict]:
  rows = []
  for variant in VARIANTS:
    runs = [r for r in results if r["variant"] == variant]
    if not runs:
      continue
    gain = sum(r["gain"] for r in runs) / len(runs)
    train_s = sum(r["train_s"] for r in runs) / len(runs)
    rows.append(
      {
        "variant": variant,
        "seeds": len(runs),
        "mean_gain": gain,
        "seed_gains": [(r["gain"], r["ci95_low"], r["ci95_high"]) for r in runs],
        "significant_seeds": sum(r["ci95_low"] > 0 for r in runs),
        "mean_train_s": train_s,
        "peak_gb": max((r["peak_gb"] for r in runs if "peak_gb" in r), default=None),  # older results lack it
        "gain_per_step": gain / runs[0]["steps"],
        "gain_per_minute": gain / (train_s / 60),
      }
    )
  return rows


def table(rows: list[dict]) -> str:
  lines = [
    "| variant | mean gain | gain [95% interval] per seed | seeds with interval > 0 | mean training s "
    "| peak GB | gain per step | gain per training minute |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
  ]
  for r in rows:
    seeds = "; ".join(f"{g:+.3f} [{lo:+.3f}, {hi:+.3f}]" for g, lo, hi in r["seed_gains"])
    lines.append(
      f"| {r['variant']} | {r['mean_gain']:+.3f} | {seeds} | {r['significant_seeds']}/{r['seeds']} "
      f"| {fmt(r['mean_train_s'], '.0f')} | {fmt(r['peak_gb'], '.2f')} | {r['gain_per_step']:+.4f} "
      f"| {r['gain_per_minute']:+.3f} |"
    )
  return "\n".join(lines)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
  parser.add_argument("--seeds", type=int, default=3, help="rollout seeds per variant (decode_seed 0..N-1)")
  parser.add_argument("--output", default=RESULTS, help="where the JSON goes")
  parser.add_argument("--append", action="store_true", help="add to the results already at --output")
  args, extra = parser.parse_known_args()
  previous = []
  if args.append and os.path.exists(args.output):
    with open(args.output, encoding="utf-8") as f:
      old = json.load(f)
    if old["arguments"] != extra:
      raise SystemExit(f"--append: {args.output} was measured with {old['arguments']}, this run with {extra}")
    previous = [r for r in old["results"] if r["variant"] not in args.variants]
  results = []
  reward_model = None
  with tempfile.TemporaryDirectory() as out_dir:
    if "ppo_reward_model" in args.variants:
      reward_model = train_reward_model(out_dir)
      print(json.dumps({"reward_model": reward_model}), flush=True)
    for variant in args.variants:
      for seed in range(args.seeds):
        result = run_one(variant, seed, extra, out_dir)
        print(json.dumps(result), flush=True)
        results.append(result)
  results = previous + results
  rows = summarize(results)
  report = {
    "date": datetime.date.today().isoformat(),
    "device": f"CPU ({os.cpu_count()} cores), {platform.processor() or platform.machine()}",
    "arguments": extra,
    "results": results,
    "summary": rows,
  }
  if reward_model is not None:
    report["reward_model"] = reward_model
  os.makedirs(os.path.dirname(args.output), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)
  print(table(rows))


if __name__ == "__main__":
  main()
