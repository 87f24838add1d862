"""Metric sinks for Tunix's MetricsLogger: TensorBoard plus one JSON object per step in metrics.jsonl."""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np
from metrax.logging import TensorboardBackend


def parse_event(event: str, step: int) -> tuple[str, str, int] | None:
  """Tunix event `{prefix}/{mode}/{name}` -> (metric name, mode, training step), None for others.

  The actor trainer logs at its 1-based update step; RLCluster logs rollout metrics (rewards,
  completion lengths) at the 0-based step that consumes them, so those move one step on.
  """
  parts = event.split("/")
  if len(parts) < 3 or not parts[0] or parts[1] not in ("train", "eval"):
    return None  # JAX's and Orbax's own monitoring events
  prefix, mode, name = parts[0], parts[1], "/".join(parts[2:])
  if prefix == "actor":
    return name, mode, step
  return (name if prefix == "global" else f"{prefix}/{name}"), mode, step + 1


class JsonlBackend:
  """Collects training scalars per step; writes one line per finished step with its wall time."""

  def __init__(self, path: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    self._file = open(path, "a", encoding="utf-8")
    self._step: int | None = None
    self._row: dict[str, float] = {}
    self._last_time = time.time()

  def log_scalar(self, event: str, value, **kwargs):
    parsed = parse_event(event, int(kwargs.get("step", 0)))
    if parsed is None or parsed[1] != "train":
      return
    name, _, step = parsed
    if self._step is not None and step > self._step:
      self._flush()
    self._step = max(step, self._step or 0)
    arr = np.asarray(value, dtype=np.float64)
    self._row[name] = float(arr.mean()) if arr.size else math.nan

  def _flush(self):
    if self._step is None or not self._row:
      return
    now = time.time()
    row = {"step": self._step, **self._row, "step_time_s": now - self._last_time}
    self._last_time = now
    self._file.write(json.dumps(row) + "\n")
    self._file.flush()
    self._row = {}

  def close(self):
    self._flush()
    self._file.close()


class _NullBackend:

  def log_scalar(self, event, value, **kwargs):
    pass

  def close(self):
    pass


def backend_factories(run_dir: str) -> list:
  """Factories for Tunix's MetricsLoggerOptions(custom_backend=...).

  Tunix builds a MetricsLogger more than once per run, and each registers its backends as global
  JAX monitoring listeners; only the first gets real sinks, so each scalar is written once.
  """
  made = []

  def once(make):
    def factory():
      if make in made:
        return _NullBackend()
      made.append(make)
      return make()
    return factory

  return [
      once(lambda: TensorboardBackend(log_dir=os.path.join(run_dir, "tensorboard"), flush_every_n_steps=1)),
      once(lambda: JsonlBackend(os.path.join(run_dir, "metrics.jsonl"))),
  ]
