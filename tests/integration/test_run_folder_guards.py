"""A run folder under faults, with the real program: one run writes it at a time (a second one exits
2 naming the holder, alone or as a multi-process job; a SIGKILLed run's lock is taken over), config.yml
is written once the run's inputs have loaded, and a disk without room for the checkpoints refuses the
run at start or stops it in one line with its last checkpoint kept."""

import json
import os
import shutil
import socket
import subprocess
import time

import pytest

from maxtext.checkpoint_conversion import orbax_checkpoint
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils import folder_lock, launch_local, metrics_file
from tests import small_disk
from tests.integration.test_multiprocess import _ENV, TINY, TRAIN_RL, _rows


def _holder_pid(run) -> int | None:
  try:
    return json.loads((run / "run.lock").read_text())["pid"]
  except (OSError, ValueError, KeyError):
    return None


def test_a_second_run_on_a_folder_in_use_exits_2_naming_the_holder_and_a_killed_run_s_lock_is_taken_over(tmp_path):
  """Two runs on one folder used to both write it (one crashed at its first checkpoint, the other
  logged steps twice). Now the second exits 2 before loading anything; once the first is SIGKILLed,
  the same command takes its lock over and completes."""
  args = [*TINY, "num_batches=2", f"base_output_directory={tmp_path}", "run_name=r"]
  run = tmp_path / "r"
  with open(tmp_path / "first.log", "w", encoding="utf-8") as log:
    first = subprocess.Popen([*TRAIN_RL, *args], env=_ENV, stdout=subprocess.DEVNULL, stderr=log)
  try:
    deadline = time.monotonic() + 300
    while _holder_pid(run) != first.pid:
      assert first.poll() is None and time.monotonic() < deadline, (tmp_path / "first.log").read_text()[-3000:]
      time.sleep(0.2)
    second = subprocess.run([*TRAIN_RL, *args], env=_ENV, capture_output=True, text=True, timeout=300, check=False)
    assert first.poll() is None, "the first run ended before the second was refused"
  finally:
    first.kill()
    first.wait()
  assert second.returncode == 2, second.stderr[-3000:]
  assert second.stderr.splitlines()[-1].startswith(
    f"error: run folder {run} is in use by pid {first.pid} on host {socket.gethostname()} (since "
  )
  assert "Devices:" not in second.stderr  # refused before setting anything up

  third = subprocess.run([*TRAIN_RL, *args], env=_ENV, capture_output=True, text=True, timeout=600, check=False)
  assert third.returncode == 0, third.stderr[-3000:]
  assert f"taking over the lock of pid {first.pid} on host {socket.gethostname()}" in third.stderr
  assert [r["step"] for r in _rows(run)] == [1, 2]
  assert not (run / "run.lock").exists()  # released at the end


def test_every_process_of_a_job_on_a_folder_in_use_exits_2_naming_the_holder(tmp_path):
  """Process 0 finds the folder locked (by this test) and the other process learns it from it."""
  lock = folder_lock.acquire(str(tmp_path / "r"))
  port = launch_local.free_port()
  try:
    procs = [
      subprocess.Popen(
        [*TRAIN_RL, *TINY, "num_batches=1", f"base_output_directory={tmp_path}", "run_name=r"],
        env=launch_local.environment(_ENV, process, 2, port, 1),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
      )
      for process in range(2)
    ]
    errs = [p.communicate(timeout=300)[1] for p in procs]
  finally:
    lock.release()
  for proc, err in zip(procs, errs):
    assert proc.returncode == 2, err[-3000:]
    assert f"error: run folder {tmp_path / 'r'} is in use by pid {os.getpid()} on host " in err


def test_config_yml_is_written_once_the_inputs_have_loaded(tmp_path):
  """A run whose dataset file does not exist used to leave its config.yml (with the bad value)."""
  missing = tmp_path / "typo.jsonl"
  args = [*TINY, f"dataset_name={missing}", f"base_output_directory={tmp_path}", "run_name=r"]
  assert train_rl.main(["train_rl", *args]) == 2
  assert not (tmp_path / "r").exists()


def test_a_folder_without_room_for_two_checkpoints_is_refused_at_start(tmp_path, monkeypatch, capsys):
  usage = shutil.disk_usage(tmp_path)
  monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=100_000_000))
  args = [*TINY, "num_batches=1", f"base_output_directory={tmp_path}", "run_name=r"]
  assert train_rl.main(["train_rl", *args]) == 2
  assert capsys.readouterr().err.splitlines()[-1] == (
    f"error: base_output_directory={tmp_path}: 100,000,000 bytes (0.10 GB) free on its filesystem, but two "
    "checkpoints of this run (parameters and optimizer state) need 235,743,744 bytes (0.24 GB); free space or "
    "choose another base_output_directory"
  )


def test_a_checkpoint_the_disk_cannot_hold_stops_the_run_in_one_line_keeping_the_last_one(tmp_path):
  """300 MB hold two of qwen3-tiny's 118 MB checkpoints but not a third. The first save used to fail
  after training with hundreds of lines of tracebacks and no checkpoint."""
  disk = tmp_path / "disk"
  with small_disk.mounted(disk, "300m"):
    args = [
      *TINY,
      "num_batches=3",
      "max_num_checkpoints_to_keep=5",
      f"base_output_directory={disk}",
      "run_name=r",
    ]
    proc = subprocess.run([*TRAIN_RL, *args], env=_ENV, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines()[-1] == (
      f"stopped: no space left on the device of {disk / 'r'}; the checkpoint of step 2 is kept with its metrics, "
      "and nothing of an unfinished one: free space and rerun the same command to resume"
    )
    assert sorted(os.listdir(disk / "r" / "checkpoints" / "actor")) == ["1", "2"]
    assert [r["step"] for r in _rows(disk / "r")] == [1, 2]


@pytest.mark.slow
def test_a_disk_filled_by_another_process_mid_run_stops_in_one_line_and_a_rerun_logs_every_step_once(tmp_path):
  """Another process fills the disk once step 1's checkpoint is saved; whichever write then finds it
  full (metrics.jsonl, its pending rows, TensorBoard events, a checkpoint), the run exits 1 with one
  line naming the folder and the checkpoint kept. A metrics row used to be lost, with a traceback.
  Once the space is freed, the same command resumes and logs every step exactly once."""
  disk = tmp_path / "disk"
  with small_disk.mounted(disk, "400m"):
    args = [*TINY, "num_batches=4", f"base_output_directory={disk}", "run_name=r"]
    actor = disk / "r" / "checkpoints" / "actor"
    proc = subprocess.Popen([*TRAIN_RL, *args], env=_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
      deadline = time.monotonic() + 400
      while 1 not in orbax_checkpoint.steps(str(actor)):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.2)
      filler = small_disk.fill(disk)
      _, err = proc.communicate(timeout=300)
    finally:
      proc.kill()
      proc.wait()
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    last = err.splitlines()[-1]
    assert "the checkpoint of step " in last, err[-3000:]
    kept = int(last.split("the checkpoint of step ")[1].split(" ")[0])
    assert last == (
      f"stopped: no space left on the device of {disk / 'r'}; the checkpoint of step {kept} is kept with its "
      "metrics, and nothing of an unfinished one: free space and rerun the same command to resume"
    )
    assert 1 <= kept < 4 and orbax_checkpoint.steps(str(actor))[-1] == kept
    assert set(metrics_file.logged_steps(str(disk / "r" / "metrics.jsonl"))) >= set(range(1, kept + 1))

    os.remove(filler)
    rerun = subprocess.run([*TRAIN_RL, *args], env=_ENV, capture_output=True, text=True, timeout=600, check=False)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"Resuming from the checkpoint of step {kept}" in rerun.stderr
    assert [r["step"] for r in _rows(disk / "r")] == [1, 2, 3, 4]
