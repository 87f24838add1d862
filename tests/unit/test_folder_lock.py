"""The run folder's lock: one holder, named to whoever finds it held; a lock its holder left behind
(killed, or on a bucket no longer renewed) is taken over, and of two runs taking one over one wins.
The bucket's lock runs against a real GCS server on localhost (fake-gcs-server)."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from maxtext.utils import errors, folder_lock
from tests import gcs_server

# Takes the lock of the folder in argv[1] and holds it until killed.
_HOLD = (
  "import sys; from maxtext.utils import folder_lock as f; f.acquire(sys.argv[1]); print('held', flush=True); input()"
)


def test_a_local_folder_has_one_holder_and_is_left_as_found(tmp_path):
  folder = str(tmp_path / "run")
  lock = folder_lock.acquire(folder)
  holder = json.loads((tmp_path / "run" / "run.lock").read_text())
  assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
  with pytest.raises(
    errors.InputError, match=rf"run folder {folder} is in use by pid {os.getpid()} on host {socket.gethostname()} "
  ):
    folder_lock.acquire(folder)
  lock.release()
  assert not (tmp_path / "run").exists()  # it held nothing but the lock
  folder_lock.acquire(folder).release()


def test_the_lock_of_a_killed_process_is_taken_over(tmp_path, caplog):
  folder = str(tmp_path / "run")
  holder = subprocess.Popen(
    [sys.executable, "-c", _HOLD, folder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
  )
  assert holder.stdout.readline() == "held\n"
  with pytest.raises(errors.InputError, match=f"in use by pid {holder.pid} "):
    folder_lock.acquire(folder)
  holder.send_signal(signal.SIGKILL)
  holder.wait()
  folder_lock.acquire(folder).release()
  assert f"taking over the lock of pid {holder.pid} on host" in caplog.text


@pytest.fixture(name="gcs")
def _gcs(tmp_path, monkeypatch):
  with gcs_server.running(str(tmp_path / "fake-gcs-server.log")) as url:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", url)
    yield url


def _other_holder(gcs, pid=1, host="elsewhere"):
  gcs_server.write(gcs, "runs/r/run.lock", json.dumps({"pid": pid, "host": host, "since": "then"}).encode())


def test_a_lock_on_a_bucket_has_one_holder_renewed_while_held(gcs):
  lock = folder_lock.acquire("gs://bkt/runs/r", lease_s=0.5)
  first = lock.generation
  holder = json.loads(gcs_server.read(gcs, "runs/r/run.lock"))
  assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
  with pytest.raises(errors.InputError, match=rf"run folder gs://bkt/runs/r is in use by pid {os.getpid()} on host "):
    folder_lock.acquire("gs://bkt/runs/r", lease_s=0.5)
  time.sleep(0.5)
  assert lock.generation != first  # renewed every lease_s / 5
  lock.release()
  assert gcs_server.objects(gcs, prefix="runs/r/") == {}


def test_a_lock_on_a_bucket_is_taken_over_when_its_lease_runs_out(gcs, caplog):
  _other_holder(gcs)
  with pytest.raises(errors.InputError, match=r"in use by pid 1 on host elsewhere \(since then\), renewed 0 s ago"):
    folder_lock.acquire("gs://bkt/runs/r", lease_s=1.0)
  time.sleep(1.2)
  lock = folder_lock.acquire("gs://bkt/runs/r", lease_s=1.0)
  assert "took over the lock of pid 1 on host elsewhere (since then), unrenewed for 1 s" in caplog.text
  assert json.loads(gcs_server.read(gcs, "runs/r/run.lock"))["pid"] == os.getpid()
  lock.release()


def test_a_lock_on_a_bucket_held_by_a_dead_process_of_this_host_is_taken_over_at_once(gcs, caplog):
  dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  _other_holder(gcs, pid=int(dead.stdout), host=socket.gethostname())
  folder_lock.acquire("gs://bkt/runs/r").release()
  assert f"took over the lock of pid {int(dead.stdout)} on host {socket.gethostname()}" in caplog.text


def test_of_two_runs_taking_over_a_stale_lock_on_a_bucket_one_wins(gcs, monkeypatch):
  """Another run rewrites the stale lock between this run's read and its write: the write's
  generation precondition fails and this run is refused."""
  _other_holder(gcs, pid=2, host=socket.gethostname())

  def dead_but_taken_meanwhile(pid):
    _other_holder(gcs, pid=3, host="winner")
    return False

  monkeypatch.setattr(folder_lock, "_alive", dead_but_taken_meanwhile)
  with pytest.raises(errors.InputError, match=r"in use by pid 2 on host .*, just taken over by another run"):
    folder_lock.acquire("gs://bkt/runs/r")
  assert json.loads(gcs_server.read(gcs, "runs/r/run.lock"))["host"] == "winner"
