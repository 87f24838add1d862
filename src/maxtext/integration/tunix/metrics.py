"""Metric sinks for Tunix's MetricsLogger: TensorBoard plus one JSON object per step in metrics.jsonl."""

from __future__ import annotations

import functools
import json
import math
import os
import time

import jax
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


class _Sink:
  """A backend whose close is idempotent and which ignores scalars once closed."""

  def __init__(self, backend=None):
    self._backend = backend

  def log_scalar(self, event, value, **kwargs):
    if self._backend is not None:
      self._backend.log_scalar(event, value, **kwargs)

  def close(self):
    backend, self._backend = self._backend, None
    if backend is not None:
      backend.close()


class MetricSinks:
  """The run's metric sinks: TensorBoard events and metrics.jsonl.

  Tunix builds a MetricsLogger more than once per run, and each registers the backends it gets as
  global JAX scalar listeners; only the first request of each kind gets the real sink, so each
  scalar is written once. `close` flushes the sinks and unregisters every listener handed out
  (jax's clear_event_listeners leaves scalar listeners in place), so a later run in the same
  process never writes into this run's closed files.
  """

  def __init__(self, run_dir: str):
    self._makers = {
        "tensorboard": lambda: TensorboardBackend(log_dir=os.path.join(run_dir, "tensorboard"), flush_every_n_steps=1),
        "jsonl": lambda: JsonlBackend(os.path.join(run_dir, "metrics.jsonl")),
    }
    self._real: dict[str, _Sink] = {}
    self._handed_out: list[_Sink] = []

  def _make(self, kind: str) -> _Sink:
    sink = _Sink() if kind in self._real else _Sink(self._makers[kind]())
    self._real.setdefault(kind, sink)
    self._handed_out.append(sink)
    return sink

  def __deepcopy__(self, memo):  # Tunix deep-copies its logger options; the sinks stay shared
    return self

  def factories(self) -> list:
    """Factories for Tunix's MetricsLoggerOptions(custom_backend=...)."""
    return [functools.partial(self._make, kind) for kind in self._makers]

  def close(self) -> None:
    for sink in self._handed_out:
      sink.close()
      try:
        jax.monitoring.unregister_scalar_listener(sink.log_scalar)
      except AssertionError:  # not registered (Tunix registers on process 0 only)
        pass
    self._handed_out.clear()
