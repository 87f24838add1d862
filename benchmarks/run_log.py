"""What the benchmarks read off a train_rl run's console: the lines training_run.TrainingRun logs
when training ends."""

from __future__ import annotations

import re

_TRAINED = re.compile(r"Trained steps (\d+) to (\d+) in ([\d.]+) s \(([\d.]+) s of it compiling\)")
_PEAK = re.compile(r"Peak memory \(RSS\) ([\d.]+) GB")
_ESTIMATED = re.compile(r"Peak memory \(RSS\) [\d.]+ GB; estimated at start ([\d.]+) GB")


def trained(stderr: str) -> tuple[int, float, float]:
  """(steps trained, wall seconds, seconds of it compiling) from train_rl's `Trained steps A to B in
  W s (C s of it compiling)` line; ValueError naming the line when the output has none."""
  found = _TRAINED.search(stderr)
  if found is None:
    raise ValueError(
      f"train_rl's output has no 'Trained steps A to B in W s (C s of it compiling)' line:\n{stderr[-2000:]}"
    )
  first, last, wall, compiling = found.groups()
  return int(last) - int(first) + 1, float(wall), float(compiling)


def peak_gb(stderr: str) -> float:
  """The run's peak resident memory in GB from train_rl's `Peak memory (RSS) X GB` line; ValueError
  when the output has none."""
  found = _PEAK.search(stderr)
  if found is None:
    raise ValueError(f"train_rl's output has no 'Peak memory (RSS) X GB' line:\n{stderr[-2000:]}")
  return float(found.group(1))


def estimated_gb(stderr: str) -> float:
  """The run's start-of-run memory estimate in GB from the same line; ValueError when there is none."""
  found = _ESTIMATED.search(stderr)
  if found is None:
    raise ValueError(f"train_rl's output has no 'estimated at start X GB' line:\n{stderr[-2000:]}")
  return float(found.group(1))
