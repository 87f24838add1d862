"""The calculator agent through HTTP against the run's own agent in process, on the same work.

    python benchmarks/agent_over_http.py [--steps N] [--output F] [key=value ...]

Both train SmolLM2-135M-Instruct on the calculator_products task with agentic GRPO as the slow
suite's calculator learning tests do (2 prompts x 8 samples per step, rl.off_policy_steps=1, two
model turns, the same data order, seeds and sampling): "in process" gives the run's own agent the
calculator (rl.tools=[calculator] rl.max_turns=2: conversations rendered and sampled in the trainer,
the tool in a worker process); "over HTTP" runs src/maxtext/agents/calculator.py (rl.agent: the same
conversation through the `openai` client and function calling, the policy served over HTTP, the
agent in worker processes). Each run is a process of its own with no compilation cache.
Per run: the training wall time and the part of it compiling (train_rl's "Trained steps A to B in
W s" line), each step's time, the median step time after the first, the rewarded share per step and
the mean calls per episode; and the wall-time ratio over HTTP / in process, whole and with
compiling left out of both. Prints a table and writes benchmarks/results/agent_over_http.json (or
--output).
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
RESULTS = os.path.join(ROOT, "benchmarks", "results", "agent_over_http.json")
AGENT = os.path.join(ROOT, "src", "maxtext", "agents", "calculator.py")

CONFIGS = {  # name in the table -> the arguments that give the model its calculator
  "in process": ["rl.tools=[calculator]", "rl.max_turns=2"],
  "over HTTP": [f"rl.agent={AGENT}:run"],
}


def common(steps: int) -> list[str]:
  """The work both runs share (the slow suite's calculator learning runs)."""
  return [
    "rl.yml",
    "dataset_name=calculator_products",
    "train_fraction=0.9",
    "reward_exact_answer=1.0",
    "rl.use_agentic_rollout=true",
    "rl.off_policy_steps=1",
    "rl.max_concurrency=16",
    "max_prompt_length=440",
    "max_response_length=80",
    "batch_size=2",
    "rl.num_generations=8",
    f"num_batches={steps}",
    "learning_rate=5e-5",
    "warmup_steps_fraction=0",
    "rl.grpo_beta=0",
    "adam_weight_decay=0",
    "num_test_batches=0",
    "checkpoint_period=1000",
    "remat_policy=full",
    "train_micro_batch_size=1",
    "jax_cache_dir=",
  ]


def run_one(name: str, work: list[str], out_dir: str) -> dict:
  run = name.replace(" ", "_")
  cmd = [sys.executable, "-m", "maxtext.trainers.post_train.rl.train_rl", *work, *CONFIGS[name]]
  cmd += [f"base_output_directory={out_dir}", f"run_name={run}"]
  started = time.time()
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
  if proc.returncode != 0:
    raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  steps, wall, compiling = run_log.trained(proc.stderr)
  with open(os.path.join(out_dir, run, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  later = sorted(r["step_time_s"] for r in rows[1:])
  calls = [r.get("agent/calls_per_episode") for r in rows]
  return {
    "config": name,
    "steps": steps,
    "wall_s": wall,
    "compile_s": compiling,
    "process_s": time.time() - started,
    "step_s": [r["step_time_s"] for r in rows],
    "later_step_s": later[len(later) // 2] if later else None,
    "rewarded_share": [r["rewards/mean"] for r in rows],
    "tool_call_share": [r.get("tools/call_frequency") for r in rows],
    "calls_per_episode": calls if any(c is not None for c in calls) else None,
    "failed_episodes": sum(r.get("agent/failed_episodes", 0) for r in rows),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=6)
  parser.add_argument("--output", default=RESULTS)
  parser.add_argument("overrides", nargs="*", help="key=value arguments for both runs")
  args = parser.parse_args()
  work = common(args.steps) + args.overrides
  with tempfile.TemporaryDirectory() as out_dir:
    results = [run_one(name, work, out_dir) for name in CONFIGS]
  local, http = results
  report = {
    "date": datetime.date.today().isoformat(),
    "cpu_count": os.cpu_count(),
    "python": platform.python_version(),
    "arguments": work,
    "results": results,
    "http_over_in_process": http["wall_s"] / local["wall_s"],
    "http_over_in_process_without_compiling": (http["wall_s"] - http["compile_s"])
    / (local["wall_s"] - local["compile_s"]),
  }
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)
  print("| run | wall s | compiling s | step s | later steps s/step | rewarded share per step | calls per episode |")
  print("| --- " * 7 + "|")
  for r in results:
    calls = r["calls_per_episode"] or [None]
    print(
      f"| {r['config']} | {r['wall_s']:.1f} | {r['compile_s']:.1f} | {', '.join(f'{s:.0f}' for s in r['step_s'])} | "
      f"{fmt(r['later_step_s'], '.1f')} | {', '.join(f'{x:.2f}' for x in r['rewarded_share'])} | "
      f"{', '.join(fmt(c, '.2f') for c in calls)} |"
    )
  print(
    f"over HTTP / in process: {report['http_over_in_process']:.2f} "
    f"({report['http_over_in_process_without_compiling']:.2f} without compiling)"
  )
  print(f"wrote {args.output}")


if __name__ == "__main__":
  main()
