"""The console's view of training: one line per trained step, from the step's metrics.jsonl row.

    step 3/6: reward 1.250, kl 0.0012, loss 0.01, 4.0 s, ETA 12 s

The first step's line says how much of it was compiling; the ETA is the mean time of the steps seen
so far, less their compiling, times the steps left. Rows arrive in step order (metrics.py writes
them so), each once.
"""

from __future__ import annotations

import logging
import math

log = logging.getLogger(__name__)

# The row's total reward per sample, by preference: the weighted sum TRL users read as `reward`, then
# Tunix's sum over reward functions.
_REWARD_KEYS = ("reward", "rewards/sum")


def duration(seconds: float) -> str:
  """'4.2 s', '42 s', '3 min 05 s' or '2 h 03 min'."""
  if seconds < 10:
    return f"{max(seconds, 0.0):.1f} s"
  seconds = round(seconds)
  if seconds < 60:
    return f"{seconds} s"
  if seconds < 3600:
    return f"{seconds // 60} min {seconds % 60:02d} s"
  return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class StepLines:
  """Called with each metrics row as it is written; logs its step's line. total: the run's steps;
  first: the step training starts at (a resumed run's first step is first + 1)."""

  def __init__(self, total: int, first: int = 0):
    self.total = total
    self._first = first
    self._seconds = 0.0  # wall time of the steps seen, less their compiling
    self._seen = 0

  def __call__(self, row: dict) -> None:
    log.info("%s", self.line(row))

  def line(self, row: dict) -> str:
    step = int(row["step"])
    parts = []
    reward = next((row[k] for k in _REWARD_KEYS if k in row), None)
    if reward is not None:
      parts.append(f"reward {reward:.3f}")
    for key, fmt in (("kl", ".4g"), ("loss", ".4g")):
      if key in row and math.isfinite(row[key]):
        parts.append(f"{key} {row[key]:{fmt}}")
    took, compiling = row.get("step_time_s", 0.0), row.get("compile_s", 0.0)
    self._seconds += max(took - compiling, 0.0)
    self._seen += 1
    timing = duration(took)
    if compiling >= 1.0:
      timing += f" ({duration(compiling)} of it compiling)"
    left = self.total - step
    if left > 0:
      timing += f", ETA {duration(self._seconds / self._seen * left)}"
    return f"step {step}/{self.total}: " + ", ".join([*parts, timing])
