"""The python tool's sandbox: what a call costs with bubblewrap + seccomp against the same call unsandboxed.

    python benchmarks/tool_sandbox.py [--calls 40] [--concurrent 64] [--output F]

Per call: median and p90 wall seconds of `--calls` sequential calls of sandbox.run (the tool's own
path: limits, bounded output reading, cleanup) with rl.tool_sandbox=bwrap and =none, alternating, and
of a bare `python -I -c pass` subprocess; the overhead is the sandboxed median minus the unsandboxed
one. Concurrency: `--concurrent` calls at once from as many threads (the agentic learner's pattern),
total wall seconds per mode. Prints a table and writes benchmarks/results/tool_sandbox.json.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from maxtext.utils import sandbox

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "tool_sandbox.json")
CODE = "print(sum(i * i for i in range(10000)))"


def _call(sandboxed: bool) -> float:
  start = time.perf_counter()
  output, error = sandbox.run(CODE, sandboxed, 30, 30, 512, 2000)
  assert error is None and output.strip() == str(sum(i * i for i in range(10000))), (output, error)
  return time.perf_counter() - start


def _bare() -> float:
  start = time.perf_counter()
  subprocess.run([sys.executable, "-I", "-c", "pass"], check=True)
  return time.perf_counter() - start


def _stats(times: list[float]) -> dict:
  ordered = sorted(times)
  return {"median_s": statistics.median(ordered), "p90_s": ordered[int(0.9 * (len(ordered) - 1))], "n": len(ordered)}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--calls", type=int, default=40)
  parser.add_argument("--concurrent", type=int, default=64)
  parser.add_argument("--output", default=RESULTS)
  args = parser.parse_args()
  sandbox.check()
  _call(True), _call(False), _bare()  # warm the page cache
  times = {"bwrap": [], "none": [], "bare python -I -c pass": []}
  for _ in range(args.calls):
    times["bwrap"].append(_call(True))
    times["none"].append(_call(False))
    times["bare python -I -c pass"].append(_bare())
  per_call = {name: _stats(t) for name, t in times.items()}
  concurrent_s = {}
  for mode, sandboxed in (("bwrap", True), ("none", False), ("bwrap ", True), ("none ", False)):
    with concurrent.futures.ThreadPoolExecutor(args.concurrent) as pool:
      start = time.perf_counter()
      list(pool.map(lambda _, sandboxed=sandboxed: _call(sandboxed), range(args.concurrent)))
      concurrent_s.setdefault(mode.strip(), []).append(time.perf_counter() - start)
  report = {
    "date": datetime.date.today().isoformat(),
    "device": f"CPU, {os.cpu_count()} cores",
    "python": platform.python_version(),
    "code": CODE,
    "per_call": per_call,
    "overhead_median_s": per_call["bwrap"]["median_s"] - per_call["none"]["median_s"],
    "concurrent_calls": args.concurrent,
    "concurrent_total_s": {k: min(v) for k, v in concurrent_s.items()},
  }
  report["concurrent_ratio"] = report["concurrent_total_s"]["bwrap"] / report["concurrent_total_s"]["none"]
  print("| mode | median ms per call | p90 ms |\n| --- | --- | --- |")
  for name, s in per_call.items():
    print(f"| {name} | {s['median_s'] * 1e3:.1f} | {s['p90_s'] * 1e3:.1f} |")
  print(f"sandbox overhead (median): {report['overhead_median_s'] * 1e3:.1f} ms per call")
  print(
    f"{args.concurrent} concurrent calls: bwrap {report['concurrent_total_s']['bwrap']:.2f} s, "
    f"none {report['concurrent_total_s']['none']:.2f} s (ratio {report['concurrent_ratio']:.2f})"
  )
  os.makedirs(os.path.dirname(args.output), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)


if __name__ == "__main__":
  main()
