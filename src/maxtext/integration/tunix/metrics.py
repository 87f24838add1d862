"""Metric sinks for Tunix's MetricsLogger: TensorBoard, one JSON object per step in metrics.jsonl,
and each row to W&B.

The sinks write what Tunix logs, once each, in step order; they judge nothing: every training
scalar is also handed to `on_scalar` (the run guard, trainers/post_train/rl/run_guard.py, decides
what stops a run). Their writes land whole or not at all (utils/safe_files.py) and a failed one
(a full disk) is raised in the thread that logged the scalar, so the run stops with its files as
they were before it. Reading metrics.jsonl back and cutting it to a checkpoint on resume is
utils/metrics_file.py."""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import socket
import struct
import threading
import time
from collections.abc import Callable

import jax
import numpy as np
from tensorboardX import summary as tb_summary
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.record_writer import masked_crc32c

from maxtext.utils import metrics_file, safe_files
from maxtext.utils.steps import Steps

log = logging.getLogger(__name__)

# The default of a run whose steps make one optimizer update each (its step count is not read here).
ONE_UPDATE_PER_STEP = Steps(0)
# The share of a step's groups whose rewards are all equal (zero advantage: no learning signal).
ZERO_SIGNAL = "frac_reward_zero_std"
# Called with each training scalar as it arrives: (metric name, training step, its values).
OnScalar = Callable[[str, int, np.ndarray], None]


def parse_event(event: str, step: int, steps: Steps = ONE_UPDATE_PER_STEP) -> tuple[str, str, int] | None:
  """Tunix event `{prefix}/{mode}/{name}` -> (metric name, mode, training step), None for others.

  The actor trainer logs at its 1-based optimizer update, which belongs to step steps.of_update(update);
  RLCluster logs rollout metrics (rewards, completion lengths) at the 0-based step that consumes
  them, so those move one step on.
  """
  parts = event.split("/")
  if len(parts) < 3 or not parts[0] or parts[1] not in ("train", "eval"):
    return None  # JAX's and Orbax's own monitoring events
  prefix, mode, name = parts[0], parts[1], "/".join(parts[2:])
  if prefix == "actor":
    return name, mode, steps.of_update(step)
  return (name if prefix == "global" else f"{prefix}/{name}"), mode, step + 1


_COMPILE_EVENTS = (
  "/jax/core/compile/jaxpr_trace_duration",
  "/jax/core/compile/jaxpr_to_mlir_module_duration",
  "/jax/core/compile/backend_compile_duration",
)


class CompileClock:
  """Wall-clock seconds in which JAX was tracing, lowering or compiling a program since it was made
  (on any thread: time in which several threads compile counts once; a persistent compilation
  cache hit counts only its tracing and lowering)."""

  def __init__(self):
    self._seconds = 0.0
    self._spans: list[tuple[float, float]] = []  # disjoint (start, end), in order of end
    self._lock = threading.Lock()
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)

  def _on_duration(self, event: str, duration_secs: float, **kwargs) -> None:
    del kwargs
    if event not in _COMPILE_EVENTS:
      return
    with self._lock:  # an event arrives as it ends: its span ends now, after every span before it
      end = time.monotonic()
      start = end - duration_secs
      while self._spans and self._spans[-1][1] >= start:
        s, e = self._spans.pop()
        self._seconds -= e - s
        start = min(start, s)
      self._spans.append((start, end))
      self._seconds += end - start

  def __call__(self) -> float:
    with self._lock:
      return self._seconds

  def close(self) -> None:
    try:
      jax.monitoring.unregister_event_duration_listener(self._on_duration)
    except AssertionError:  # already gone: closed before, or Tunix's MetricsLogger.close cleared JAX's listeners
      pass


class JsonlBackend:
  """Collects training scalars per step; writes one line per step, in step order.

  Asynchronous (agentic) runs log some scalars of a step after later steps have begun, so a row is
  held until a step `lag` steps later appears (and the rest at close). Held rows are mirrored to
  `<path>.pending` as each scalar arrives (fsynced whenever a step begins and at each checkpoint
  request, MetricSinks.save_held), so a killed run loses none of the rows of the steps its
  checkpoints hold:
  metrics_file.truncate_after merges them back on resume. A step's scalars arrive when it ends, so
  step_time_s is the wall time from the first scalar of the previous step (for the first step: from
  `restart_clock`, called when training starts) to the first scalar of this one, and compile_s the
  seconds of compiling (`compile_clock`) in that time.
  """

  def __init__(
    self,
    path: str,
    lag: int = 2,
    on_row: Callable[[dict], None] | None = None,
    compile_clock: Callable[[], float] = lambda: 0.0,
    steps: Steps = ONE_UPDATE_PER_STEP,
    on_scalar: OnScalar = lambda name, step, values: None,
  ):
    """on_row: also called with each row as it is written; steps: see parse_event (a step's row
    holds its last update's trainer metrics); on_scalar(name, step, values): called with each
    training scalar of a step not yet written, as it arrives (the run guard's feed)."""
    self._on_scalar = on_scalar
    self._steps = steps
    os.makedirs(os.path.dirname(path), exist_ok=True)
    self._on_row = on_row
    self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    self._pending = metrics_file.pending(path)
    self._lag = lag
    self._rows: dict[int, dict[str, float]] = {}
    self._started: dict[int, tuple[float, float]] = {}  # step -> (wall time, compile clock) of its first scalar
    self._written = 0
    self._compile_clock = compile_clock
    self._origin = (time.time(), compile_clock())
    self.last_step: int | None = None  # set when training stopped early: later rows are dropped at close
    # Agentic runs log from the producer's threads while the training thread saves the pending rows.
    self._lock = threading.RLock()

  def restart_clock(self):
    self._origin = (time.time(), self._compile_clock())

  def log_scalar(self, event: str, value, **kwargs):
    parsed = parse_event(event, int(kwargs.get("step", 0)), self._steps)
    if parsed is None or parsed[1] != "train":
      return
    name, _, step = parsed
    with self._lock:
      self._add(name, step, value)

  def _add(self, name: str, step: int, value) -> None:
    """Adds a training scalar to its step's row; writes the rows `lag` steps behind the newest."""
    if step <= self._written:
      return  # its row is already written
    if step not in self._rows:
      self._started[step] = (time.time(), self._compile_clock())
      self.save_pending()
    arr = np.asarray(value, dtype=np.float64)
    self._rows.setdefault(step, {})[name] = float(arr.mean()) if arr.size else math.nan
    self._on_scalar(name, step, arr)
    for s in sorted(self._rows):
      if s <= max(self._rows) - self._lag:
        self._write(s)
    if self._rows:
      # A step's trainer scalars arrive once its checkpoint has been asked for, and that checkpoint may
      # land before the next step begins: each scalar reaches the pending file at once (a kill keeps the
      # page cache, so without an fsync; the step boundaries' mirrors are fsynced).
      self.save_pending(durable=False)

  def _row(self, step: int) -> dict:
    earlier = [t for s, t in self._started.items() if s < step]
    begin = max(earlier) if earlier else self._origin
    end = self._started[step]
    return {"step": step, **self._rows.get(step, {}), "step_time_s": end[0] - begin[0], "compile_s": end[1] - begin[1]}

  def save_pending(self, durable: bool = True):
    """Mirrors the held rows to the pending file (atomically: a kill or a full disk leaves the
    previous mirror; `durable`: fsynced, so that a power loss does too)."""
    with self._lock, safe_files.replaced(self._pending, durable) as f:
      json.dump([self._row(s) for s in sorted(self._rows)], f)

  def _write(self, step: int):
    row = self._row(step)
    if row.get(ZERO_SIGNAL, 0.0) > 0.5:
      log.warning(
        "step %d: %.0f%% of the groups had equal rewards, so they carry no learning signal (make the task "
        "easier or harder for the model, or raise rl.num_generations)",
        step,
        100 * row[ZERO_SIGNAL],
      )
    safe_files.append(self._fd, (json.dumps(row) + "\n").encode("utf-8"))  # a failure: the row stays held
    if self._on_row is not None:
      self._on_row(row)
    del self._rows[step]
    self._written = step

  def flush_through(self, step: int) -> None:
    """Writes the held rows up to `step` now: their steps have logged all their scalars (see
    MetricSinks.step_logged); the later held rows are mirrored to the pending file."""
    with self._lock:
      for s in sorted(self._rows):
        if s <= step:
          self._write(s)
      self.save_pending()

  def close(self):
    """Writes the held rows (those up to last_step when set: later ones belong to steps that were
    not trained) and closes the file; the pending file goes once they are written (where one
    cannot be, it is kept and the failure raised)."""
    with self._lock:
      try:
        for s in sorted(self._rows):
          if self.last_step is None or s <= self.last_step:
            self._write(s)
      finally:
        os.close(self._fd)
    if os.path.exists(self._pending):
      os.remove(self._pending)


class TensorboardBackend:
  """TensorBoard scalar events of process 0, written to one events file in the logging thread (so
  a failed write is raised there: tensorboardX's writer thread would die on it, and its bounded
  queue then block the training loop)."""

  def __init__(self, log_dir: str):
    self._fd = None
    if jax.process_index() == 0:
      os.makedirs(log_dir, exist_ok=True)
      name = f"events.out.tfevents.{time.time():.0f}.{socket.gethostname()}.{os.getpid()}"
      self._fd = os.open(os.path.join(log_dir, name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
      self._append(Event(wall_time=time.time(), file_version="brain.Event:2"))

  def _append(self, event: Event) -> None:
    """One TFRecord: length, its masked CRC-32C, the event, its masked CRC-32C."""
    data = event.SerializeToString()
    header = struct.pack("Q", len(data))
    record = header + struct.pack("I", masked_crc32c(header)) + data + struct.pack("I", masked_crc32c(data))
    assert self._fd is not None  # process 0's
    safe_files.append(self._fd, record)

  def log_scalar(self, event: str, value, **kwargs):
    if self._fd is not None:
      scalar = tb_summary.scalar(event.lstrip("/"), value)
      self._append(Event(wall_time=time.time(), step=int(kwargs.get("step") or 0), summary=scalar))

  def close(self):
    fd, self._fd = self._fd, None
    if fd is not None:
      os.close(fd)


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


class WandbRun:
  """A Weights & Biases run (wandb_project) that gets each metrics.jsonl row as it is written, so its
  steps arrive in order (late agentic scalars included)."""

  def __init__(self, project: str, name: str, folder: str, config: dict | None = None):
    import wandb

    self._run = wandb.init(project=project, name=name, dir=folder, config=config, anonymous="allow")

  def log(self, row: dict) -> None:
    self._run.log({k: v for k, v in row.items() if k != "step"}, step=row["step"])

  def close(self) -> None:
    self._run.finish()


class MetricSinks:
  """The run's metric sinks: TensorBoard events and metrics.jsonl (and its rows to a WandbRun).

  Tunix builds a MetricsLogger more than once per run, and each registers the backends it gets as
  global JAX scalar listeners; only the first request of each kind gets the real sink, so each
  scalar is written once. `close` flushes the sinks and unregisters every listener handed out
  (jax's clear_event_listeners leaves scalar listeners in place), so a later run in the same
  process never writes into this run's closed files.
  """

  def __init__(
    self,
    run_dir: str,
    lag: int = 2,
    wandb: WandbRun | None = None,
    steps: Steps = ONE_UPDATE_PER_STEP,
    on_scalar: OnScalar = lambda name, step, values: None,
    on_row: Callable[[dict], None] | None = None,
  ):
    """lag: how many steps later a metrics.jsonl row is final (an agentic producer runs up to
    off_policy_steps + 1 steps ahead of the trainer, so its rows need off_policy_steps + 2);
    steps: the run's steps and their optimizer updates; on_scalar: see JsonlBackend (the run
    guard's feed, on the process that writes metrics.jsonl); on_row: called with each row written
    (after the W&B run's log)."""
    self._wandb = wandb
    self.compile_clock = CompileClock()
    self.log_dir = os.path.join(run_dir, "tensorboard")
    consumers = [f for f in (wandb.log if wandb is not None else None, on_row) if f is not None]

    def each_row(row: dict) -> None:
      for consume in consumers:
        consume(row)

    self._makers = {
      "tensorboard": lambda: TensorboardBackend(self.log_dir),
      "jsonl": lambda: JsonlBackend(
        os.path.join(run_dir, "metrics.jsonl"), lag, each_row, self.compile_clock, steps, on_scalar
      ),
    }
    self._real: dict[str, _Sink] = {}
    self._handed_out: list[_Sink] = []

  def _make(self, kind: str) -> _Sink:
    sink = _Sink() if kind in self._real else _Sink(self._makers[kind]())
    self._real.setdefault(kind, sink)
    self._handed_out.append(sink)
    return sink

  def _jsonl(self) -> JsonlBackend | None:
    """The open metrics.jsonl backend (None before Tunix asked for it and after close)."""
    sink = self._real.get("jsonl")
    return sink._backend if sink is not None else None

  def restart_clock(self) -> None:
    """Marks the start of training (the first step's step_time_s counts from here)."""
    jsonl = self._jsonl()
    if jsonl is not None:
      jsonl.restart_clock()

  def __deepcopy__(self, memo):  # Tunix deep-copies its logger options; the sinks stay shared
    return self

  def factories(self) -> list:
    """Factories for Tunix's MetricsLoggerOptions(custom_backend=...)."""
    return [functools.partial(self._make, kind) for kind in self._makers]

  def step_logged(self, step: int) -> None:
    """Every scalar of training step `step` and earlier has been logged (the metrics.jsonl rows
    through it are final): standard GRPO calls it when the actor asks to checkpoint the next step,
    right after Tunix logs this step's trainer scalars, so a kill loses at most the step in flight.
    Agentic runs log late scalars of earlier steps and rely on the lag instead."""
    jsonl = self._jsonl()
    if jsonl is not None:
      jsonl.flush_through(step)

  def save_held(self) -> None:
    """Mirrors the rows not yet final to the pending file now: agentic runs call it when the actor
    asks to checkpoint a step, so the rows of every step before it (whose scalars have arrived but
    for late ones) are on disk before that checkpoint is."""
    jsonl = self._jsonl()
    if jsonl is not None:
      jsonl.save_pending()

  def stopped_after(self, step: int) -> None:
    """Training stopped early after `step`: rows of later steps (whose rollouts ran but were never
    trained on) are dropped when the sinks close (Tunix closes them too)."""
    jsonl = self._jsonl()
    if jsonl is not None:
      jsonl.last_step = step

  def close(self) -> None:
    """Closes every sink and unregisters it; the first sink's failure to write is raised after."""
    failure = None
    for sink in self._handed_out:
      try:
        sink.close()
      except Exception as e:  # noqa: BLE001 (raised below, once every sink is closed)
        failure = failure or e
      try:
        jax.monitoring.unregister_scalar_listener(sink.log_scalar)
      except AssertionError:  # not registered (Tunix registers on process 0 only)
        pass
    self._handed_out.clear()
    self.compile_clock.close()
    wandb, self._wandb = self._wandb, None
    if wandb is not None:
      wandb.close()
    if failure is not None:
      raise failure
