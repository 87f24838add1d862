"""The start-of-run memory estimate of agent runs against the memory they hold, their agent workers
included.

    python benchmarks/agent_memory.py [--output F] [key=value ...]

Each run trains qwen3-tiny with agentic GRPO through rl.agent=FILE:run, rl.max_concurrency=32 and a
step of 32 episodes (4 prompts x 8 samples), two steps, once per agent: src/maxtext/agents/calculator.py
(the `openai` client) and benchmarks/agents/smolagents_calculator.py (smolagents' ToolCallingAgent).
While a run lives, its process tree (the trainer and every process under it: the agent workers and
their fork server, tool workers) is sampled every 0.2 s: the sum of the processes' proportional set
sizes (PSS: shared pages split among their sharers, so the sum is the memory the tree holds) and of
their resident sizes (RSS: shared pages counted in each). Per run: the estimate train_rl logs at start
(its "estimated at start" line), the trainer's own peak RSS, the tree's peak PSS and RSS sums, and the
estimate over the peak PSS. Prints a table and writes benchmarks/results/agent_memory.json (or --output).
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
import threading
import time

import run_log

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "agent_memory.json")
AGENTS = {
  "openai client (calculator)": os.path.join(ROOT, "src", "maxtext", "agents", "calculator.py"),
  "smolagents ToolCallingAgent": os.path.join(ROOT, "benchmarks", "agents", "smolagents_calculator.py"),
}
WORK = [
  "rl.yml",
  "model_name=qwen3-tiny",
  "dataset_name=calculator_products",
  "rl.use_agentic_rollout=true",
  "rl.max_concurrency=32",
  "batch_size=4",
  "rl.num_generations=8",
  "num_batches=2",
  "max_prompt_length=1536",
  "max_response_length=48",
  "rl.agent_max_failures=1000",
  "num_test_batches=0",
  "checkpoint_period=1000",
  "jax_cache_dir=",
]


def _children() -> dict[int, list[int]]:
  """Each live process's children, from /proc."""
  out: dict[int, list[int]] = {}
  for name in os.listdir("/proc"):
    if not name.isdigit():
      continue
    try:
      with open(f"/proc/{name}/stat", encoding="ascii") as f:
        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
      continue
    out.setdefault(ppid, []).append(int(name))
  return out


def _tree(root: int) -> list[int]:
  children, found, todo = _children(), [], [root]
  while todo:
    pid = todo.pop()
    found.append(pid)
    todo += children.get(pid, [])
  return found


def _memory(pid: int) -> tuple[int, int]:
  """(PSS, RSS) of a process in bytes; (0, 0) for one that is gone."""
  pss = rss = 0
  try:
    with open(f"/proc/{pid}/smaps_rollup", encoding="ascii") as f:
      for line in f:
        if line.startswith("Pss:"):
          pss = int(line.split()[1]) * 1024
        elif line.startswith("Rss:"):
          rss = int(line.split()[1]) * 1024
  except OSError:
    pass
  return pss, rss


def run_one(name: str, path: str, work: list[str], out_dir: str) -> dict:
  cmd = [sys.executable, "-m", "maxtext.trainers.post_train.rl.train_rl", *work, f"rl.agent={path}:run"]
  cmd += [f"base_output_directory={out_dir}", f"run_name=r{len(os.listdir(out_dir))}"]
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
  peak = {"pss": 0, "rss": 0, "processes": 0}

  def sample():
    while proc.poll() is None:
      pids = _tree(proc.pid)
      sizes = [_memory(p) for p in pids]
      peak["pss"] = max(peak["pss"], sum(s[0] for s in sizes))
      peak["rss"] = max(peak["rss"], sum(s[1] for s in sizes))
      peak["processes"] = max(peak["processes"], len(pids))
      time.sleep(0.2)

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  _, stderr = proc.communicate()
  sampler.join()
  if proc.returncode != 0:
    raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{stderr[-4000:]}")
  estimate = run_log.estimated_gb(stderr)
  workers = next((line for line in stderr.splitlines() if "rl.agent's workers" in line), "").strip()
  return {
    "agent": name,
    "estimated_gb": estimate,
    "estimated_workers": workers,
    "trainer_peak_rss_gb": run_log.peak_gb(stderr),
    "tree_peak_pss_gb": peak["pss"] / 1e9,
    "tree_peak_rss_gb": peak["rss"] / 1e9,
    "most_processes": peak["processes"],
    "estimate_over_peak_pss": estimate / (peak["pss"] / 1e9),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--output", default=RESULTS)
  parser.add_argument("overrides", nargs="*", help="key=value arguments for every run")
  args = parser.parse_args()
  work = WORK + args.overrides
  with tempfile.TemporaryDirectory() as out_dir:
    results = [run_one(name, path, work, out_dir) for name, path in AGENTS.items()]
  report = {
    "date": datetime.date.today().isoformat(),
    "cpu_count": os.cpu_count(),
    "python": platform.python_version(),
    "arguments": work,
    "results": results,
  }
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)
  print(
    "| agent | estimated GB | trainer peak RSS GB | tree peak PSS GB | tree peak RSS GB | processes | estimate / PSS |"
  )
  print("| --- " * 7 + "|")
  for r in results:
    print(
      f"| {r['agent']} | {r['estimated_gb']:.2f} | {r['trainer_peak_rss_gb']:.2f} | {r['tree_peak_pss_gb']:.2f} | "
      f"{r['tree_peak_rss_gb']:.2f} | {r['most_processes']} | {r['estimate_over_peak_pss']:.2f} |"
    )
  print(f"wrote {args.output}")


if __name__ == "__main__":
  main()
