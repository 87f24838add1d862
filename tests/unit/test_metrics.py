"""Metric sinks: one line per step in metrics.jsonl, each scalar written once, nothing after close."""

import errno
import json
import os
import time

import jax
import pytest

from maxtext.integration.tunix import metrics
from maxtext.utils import metrics_file


def test_sinks_write_each_step_once_and_unregister_on_close(tmp_path):
  sinks = metrics.MetricSinks(str(tmp_path))
  # Tunix builds two MetricsLoggers, each registering the backends it makes as JAX listeners.
  backends = [make() for _ in range(2) for make in sinks.factories()]
  for b in backends:
    jax.monitoring.register_scalar_listener(b.log_scalar)
  jax.monitoring.record_scalar("actor/train/loss", 0.5, step=1)
  jax.monitoring.record_scalar("global/train/rewards/mean", 1.0, step=0)  # rollout metrics are 0-based
  jax.monitoring.record_scalar("actor/train/loss", 0.25, step=2)
  sinks.close()
  jax.monitoring.record_scalar("actor/train/loss", 9.0, step=3)  # a later run in the same process
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 0.5), (2, 0.25)]
  assert rows[0]["rewards/mean"] == 1.0 and "step_time_s" in rows[0]
  assert list((tmp_path / "tensorboard").iterdir())


def test_parse_event_ignores_foreign_events():
  assert metrics.parse_event("/jax/compile", 3) is None
  assert metrics.parse_event("actor/eval/loss", 3) == ("loss", "eval", 3)
  assert metrics.parse_event("global/train/kl", 0) == ("kl", "train", 1)


def test_killed_run_keeps_pending_rows_and_resume_cuts_later_ones(tmp_path):
  path = tmp_path / "metrics.jsonl"
  backend = metrics.JsonlBackend(str(path))  # never closed: the process is killed
  for step in (1, 2, 3):
    backend.log_scalar("actor/train/loss", float(step), step=step)
  assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1]  # 2 and 3 are held
  assert set(metrics_file.logged_steps(str(path))) == {1, 2, 3}  # each scalar reaches the pending rows
  assert metrics_file.truncate_after(str(path), 1) == 2  # resuming from step 1: rows 2 and 3 go
  assert [json.loads(line)["loss"] for line in path.read_text().splitlines()] == [1.0]
  assert not (tmp_path / "metrics.jsonl.pending").exists()


def test_step_time_is_the_time_between_step_ends(tmp_path):
  import time

  backend = metrics.JsonlBackend(str(tmp_path / "m.jsonl"))
  backend.restart_clock()
  time.sleep(0.3)
  backend.log_scalar("actor/train/loss", 1.0, step=1)  # a step's scalars arrive when it ends
  time.sleep(0.1)
  backend.log_scalar("actor/train/loss", 1.0, step=2)
  backend.close()
  times = [json.loads(line)["step_time_s"] for line in (tmp_path / "m.jsonl").read_text().splitlines()]
  assert 0.3 <= times[0] < 0.6 and 0.1 <= times[1] < 0.3


def test_compile_seconds_are_counted_in_the_step_that_compiled(tmp_path):
  import jax.numpy as jnp

  clock = metrics.CompileClock()
  backend = metrics.JsonlBackend(str(tmp_path / "m.jsonl"), compile_clock=clock)
  backend.restart_clock()
  jax.jit(lambda x: jnp.sin(x) * 3.0)(jnp.ones(7)).block_until_ready()  # a new program: traced and compiled
  backend.log_scalar("actor/train/loss", 1.0, step=1)
  backend.log_scalar("actor/train/loss", 1.0, step=2)
  backend.close()
  jax.monitoring.clear_event_listeners()  # as Tunix's MetricsLogger.close does
  clock.close()  # its listener is gone already: no error
  total = clock()
  jax.jit(lambda x: jnp.cos(x) - 1.0)(jnp.ones(5)).block_until_ready()
  rows = [json.loads(line) for line in (tmp_path / "m.jsonl").read_text().splitlines()]
  assert rows[0]["compile_s"] > 0 and rows[1]["compile_s"] == 0
  assert rows[0]["compile_s"] == pytest.approx(total)
  assert clock() == total  # closed: no longer counting


def test_compile_clock_counts_compiling_on_several_threads_at_once_once():
  clock = metrics.CompileClock()
  try:
    record = jax.monitoring.record_event_duration_secs
    record("/jax/core/compile/backend_compile_duration", 2.0)  # one thread compiled for 2 s until now
    record("/jax/core/compile/jaxpr_trace_duration", 1.5)  # another traced within those 2 s
    assert 2.0 <= clock() < 2.1
    record("/jax/core/compile/backend_compile_duration", 30.0)  # a long compile spanning both
    assert 30.0 <= clock() < 30.1
    time.sleep(0.2)
    record("/jax/core/compile/jaxpr_to_mlir_module_duration", 0.1)  # after they all ended: adds
    record("/jax/pjit/some_other_duration", 50.0)  # not compiling
    assert 30.1 - 1e-6 <= clock() < 30.2
  finally:
    clock.close()


def test_groups_with_equal_rewards_are_counted_and_warned_about(tmp_path, caplog):
  """GRPO advantages of 3 groups of 2: the first and last groups' rewards were equal (zero
  advantage), the middle one's were not; a row where most groups carry no signal is warned about."""
  from maxtext.integration.tunix import step_metrics

  assert step_metrics.zero_signal_groups([0.0, 0.0, 0.7, -0.7, 0.0, 0.0], 2) == (2, 3)
  assert step_metrics.zero_signal_groups([1e-9, -1e-9, 0.7, -0.7], 2) == (1, 2)
  backend = metrics.JsonlBackend(str(tmp_path / "metrics.jsonl"), lag=0)
  backend.log_scalar("global/train/frac_reward_zero_std", 2 / 3, step=0)
  backend.log_scalar("global/train/frac_reward_zero_std", 0.25, step=1)
  backend.close()
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl", encoding="utf-8")]
  assert [r["frac_reward_zero_std"] for r in rows] == [pytest.approx(2 / 3), 0.25]
  warnings = [r.message for r in caplog.records if "equal rewards" in r.message]
  assert len(warnings) == 1 and warnings[0].startswith("step 1: 67% of the groups")


def test_a_logged_step_is_written_at_once_and_a_kill_keeps_the_next_ones_pending(tmp_path):
  """Standard GRPO: Tunix logs step 1's trainer scalars while step 2 trains; once they are in, row 1
  is final and written, not held for the lag; step 2's rollout scalars are mirrored to the pending file."""
  sinks = metrics.MetricSinks(str(tmp_path))
  for make in sinks.factories():
    jax.monitoring.register_scalar_listener(make().log_scalar)
  jax.monitoring.record_scalar("global/train/rewards/mean", 1.0, step=0)  # step 1's rollout
  jax.monitoring.record_scalar("global/train/rewards/mean", 2.0, step=1)  # step 2's rollout
  jax.monitoring.record_scalar("actor/train/loss", 0.5, step=1)  # step 1's trainer scalars, one step late
  sinks.step_logged(1)
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  assert [(r["step"], r["loss"], r["rewards/mean"]) for r in rows] == [(1, 0.5, 1.0)]
  assert metrics_file.logged_steps(str(tmp_path / "metrics.jsonl"))[2]["rewards/mean"] == 2.0  # never closed: a kill
  sinks.close()


def _records(path) -> list:
  """The events of a TensorBoard events file, every TFRecord's checksums verified."""
  import struct

  from tensorboardX.proto.event_pb2 import Event
  from tensorboardX.record_writer import masked_crc32c

  data, events = path.read_bytes(), []
  while data:
    header, (header_crc,) = data[:8], struct.unpack("I", data[8:12])
    (length,) = struct.unpack("Q", header)
    body, (body_crc,) = data[12 : 12 + length], struct.unpack("I", data[12 + length : 16 + length])
    assert header_crc == masked_crc32c(header) and body_crc == masked_crc32c(body)
    events.append(Event.FromString(body))
    data = data[16 + length :]
  return events


def test_tensorboard_events_read_back(tmp_path):
  backend = metrics.TensorboardBackend(str(tmp_path))
  backend.log_scalar("actor/train/loss", 0.5, step=1)
  backend.log_scalar("/global/train/kl", 0.25, step=2)
  backend.close()
  (events,) = list(tmp_path.iterdir())
  records = _records(events)
  assert records[0].file_version == "brain.Event:2"
  assert [(e.step, e.summary.value[0].tag, e.summary.value[0].simple_value) for e in records[1:]] == [
    (1, "actor/train/loss", 0.5),
    (2, "global/train/kl", 0.25),
  ]


def test_a_full_disk_loses_no_row_and_writes_none_twice(tmp_path):
  """metrics.jsonl on a tmpfs that another process fills: the write of a row fails (raised to the
  logging thread), the file and the pending rows stay as they were, and once space is freed every
  row is written exactly once. A failed row used to stay half-buffered and be written again."""
  from tests import small_disk

  disk = tmp_path / "disk"
  with small_disk.mounted(disk, "2m"):
    path = disk / "metrics.jsonl"
    backend = metrics.JsonlBackend(str(path), lag=1)
    names = [f"rewards/a_long_reward_function_name_{i:04d}" for i in range(400)]  # rows of ~20 KB

    def log(step):
      for name in names:
        backend.log_scalar(f"global/train/{name}", float(step), step=step - 1)

    log(1)
    log(2)  # step 1's row is written
    written = path.read_bytes()
    filler = small_disk.fill(disk)
    with pytest.raises(OSError) as failed:
      backend.flush_through(2)  # step 2's row cannot be written
    assert failed.value.errno == errno.ENOSPC and path.read_bytes() == written
    os.remove(filler)
    backend.close()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
  assert [r["step"] for r in rows] == [1, 2] and rows[1][names[0]] == 2.0
