"""Where the time of a traced program goes: reads the JAX profiler traces that device_suite.py
--artifacts packs into profiles.tar.gz (or a folder of them) and prints, per trace, the span from
the first to the last device operation, the fraction of it some operation runs (busy), and the
operations taking the most time, by XLA operation (the `hlo_op` stat, where the trace names it: a
CUDA graph's kernels share its command buffer's) and by kernel. Writes the same as JSON.

    python benchmarks/profile_summary.py benchmarks/results/profiles_<device>_<date>.tar.gz [--top 15] [--out F]

The device's operations are the events on the planes named /device:GPU:<n> (/device:TPU:<n>); on a
CPU, where there is no such plane, those of the XLA client's threads on /host:CPU.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import tarfile
import tempfile


def _device_events(path: str) -> list[tuple[str, str, float, float]]:
  """(XLA operation, kernel, start_ns, end_ns) of every device operation in one .xplane.pb file."""
  from jax.profiler import ProfileData

  data = ProfileData.from_file(path)
  planes = [p for p in data.planes if p.name.startswith(("/device:GPU", "/device:TPU"))]
  cpu = not planes
  if cpu:
    planes = [p for p in data.planes if p.name == "/host:CPU"]
  events = []
  for plane in planes:
    for line in plane.lines:
      if cpu and not line.name.startswith("tf_XLA"):
        continue
      if not cpu and line.name in ("XLA Modules", "XLA Ops", "Steps", "Framework Ops", "Framework Name Scope"):
        continue  # derived lines repeat the streams' kernels
      for event in line.events:
        if event.duration_ns <= 0:
          continue
        stats = dict(event.stats)
        events.append((str(stats.get("hlo_op") or event.name), event.name, float(event.start_ns), float(event.end_ns)))
  return events


def summarise(path: str, top: int) -> dict:
  """One trace's span, busy fraction and top operations (see the module docstring)."""
  events = _device_events(path)
  if not events:
    return {"trace": path, "events": 0}
  span = max(e[3] for e in events) - min(e[2] for e in events)
  busy, reach = 0.0, None
  for _, _, start, end in sorted(events, key=lambda e: e[2]):  # the union of the operations' intervals
    if reach is None or start > reach:
      busy += end - start
      reach = end
    elif end > reach:
      busy += end - reach
      reach = end
  total = sum(end - start for _, _, start, end in events)

  def top_by(index: int) -> list[dict]:
    time: collections.Counter = collections.Counter()
    counts: collections.Counter = collections.Counter()
    for event in events:
      time[event[index]] += event[3] - event[2]
      counts[event[index]] += 1
    return [
      {"name": name, "ms": ns / 1e6, "fraction": ns / total, "count": counts[name]}
      for name, ns in time.most_common(top)
    ]

  return {
    "trace": path,
    "events": len(events),
    "span_ms": span / 1e6,
    "busy_fraction": busy / span if span else None,
    "operations_ms": total / 1e6,
    "operations": top_by(0),
    "kernels": top_by(1),
  }


def traces(source: str, scratch: str) -> list[str]:
  """The .xplane.pb files in `source`, a folder or a .tar.gz unpacked into `scratch`."""
  if os.path.isfile(source):
    with tarfile.open(source) as tar:
      tar.extractall(scratch, filter="data")
    source = scratch
  return sorted(glob.glob(os.path.join(source, "**", "*.xplane.pb"), recursive=True))


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("source", help="profiles.tar.gz from device_suite.py --artifacts, or a folder of traces")
  parser.add_argument("--top", type=int, default=15)
  parser.add_argument("--out", help="the JSON (default: the source's name with .summary.json)")
  args = parser.parse_args()
  with tempfile.TemporaryDirectory() as scratch:
    found = traces(args.source, scratch)
    if not found:
      raise SystemExit(f"error: {args.source}: no .xplane.pb trace in it")
    summaries = []
    for path in found:
      summary = summarise(path, args.top)
      summary["trace"] = os.path.relpath(path, scratch if os.path.isfile(args.source) else args.source)
      summaries.append(summary)
  for s in summaries:
    print(f"{s['trace']}: {s['events']} device operations")
    if not s["events"]:
      continue
    print(f"  span {s['span_ms']:.2f} ms, busy {s['busy_fraction']:.1%}, operations {s['operations_ms']:.2f} ms")
    for part in ("operations", "kernels"):
      print(f"  by {part[:-1]}:")
      for t in s[part]:
        print(f"  {t['ms']:9.3f} ms {t['fraction']:6.1%} x{t['count']:<6} {t['name'][:100]}")
  out = args.out or (args.source.removesuffix(".tar.gz").rstrip("/") + ".summary.json")
  with open(out, "w", encoding="utf-8") as f:
    json.dump(summaries, f, indent=1)
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
