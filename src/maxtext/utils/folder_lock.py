"""One writer per run folder: the file (or object) `run.lock` in the folder, naming its holder.

`acquire(folder)` takes the lock or raises an InputError naming the folder and the holder (pid,
host, since when); `release()` gives it back and removes the lock file.

A local folder: the file is locked with flock, which the OS releases when the holding process ends
however it ends (SIGKILL included), so a lock a killed run left is taken over at once (logged with
the holder it names). On a bucket (gs://): the object is created only where none exists
(if_generation_match=0); the holder rewrites it every lease_s / 5 seconds, each time on the
condition that it is still the version it wrote last, and a run that finds it unrenewed for lease_s
seconds (its update time on the bucket against this host's clock), or held by a process of its own
host that no longer runs, takes it over on the condition that it is still the version it read, so
of two runs taking over at once one wins. A holder whose lock was taken over (it did not renew it
for lease_s) logs an error.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import logging
import os
import socket
import threading
import time

from maxtext.utils import errors, storage

log = logging.getLogger(__name__)

NAME = "run.lock"
# A lock on a bucket not renewed for this long is taken over (renewed every LEASE_S / 5 seconds).
LEASE_S = 300.0


def _holder() -> dict:
  return {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _describe(holder: dict) -> str:
  return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')} (since {holder.get('since', '?')})"


def _in_use(folder: str, holder: dict, detail: str = "") -> errors.InputError:
  return errors.InputError(
    f"run folder {folder} is in use by {_describe(holder)}{detail}: one run writes to a run folder at a time; "
    "wait for that run to end, or choose another run_name"
  )


def _parse(data: bytes) -> dict:
  try:
    holder = json.loads(data)
  except ValueError:
    return {}
  return holder if isinstance(holder, dict) else {}


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


class LocalLock:
  """The flock of `folder`/run.lock, held through an open file descriptor."""

  def __init__(self, folder: str):
    self.folder, self.path = folder, os.path.join(folder, NAME)
    while True:
      os.makedirs(folder, exist_ok=True)
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:
        holder = _parse(os.pread(fd, 4096, 0))
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
          raise _in_use(folder, holder) from None
        raise errors.InputError(
          f"run folder {folder}: cannot lock {NAME} ({e.strerror}); expected a filesystem with file locks (flock)"
        ) from None
      if self._is_the_file(fd):
        break
      os.close(fd)  # its holder removed the file while releasing it: lock the file now there
    self._fd = fd
    left = _parse(os.pread(fd, 4096, 0))
    if left:
      log.warning(
        "run folder %s: taking over the lock of %s, which ended without releasing it", folder, _describe(left)
      )
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(_holder()).encode(), 0)
    os.fsync(fd)

  def _is_the_file(self, fd: int) -> bool:
    try:
      named = os.stat(self.path)
    except FileNotFoundError:
      return False
    held = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (held.st_dev, held.st_ino)

  def release(self) -> None:
    """Removes the lock file (if still there), then unlocks it; removes the folder too if nothing
    else is in it."""
    try:
      os.unlink(self.path)
    except FileNotFoundError:
      pass  # removed by hand: the flock is released all the same
    finally:
      os.close(self._fd)
    try:
      os.rmdir(self.folder)
    except OSError:
      pass  # the run wrote files there (or another run is taking the lock)


class BucketLock:
  """The object `url`/run.lock, renewed by a thread while held."""

  def __init__(self, url: str, lease_s: float = LEASE_S):
    from google.api_core import exceptions
    from google.cloud import storage as gcs

    storage.use_emulator()
    self.url, self._lease_s, self._record = url, lease_s, json.dumps(_holder())
    bucket_name, _, prefix = url.removeprefix("gs://").partition("/")
    name = "/".join(p for p in (prefix.strip("/"), NAME) if p)
    try:
      bucket = gcs.Client().bucket(bucket_name)
      self._blob = bucket.blob(name)
      try:
        self._blob.upload_from_string(self._record, if_generation_match=0)
      except exceptions.PreconditionFailed:
        self._take_over(bucket.get_blob(name), exceptions)
    except errors.InputError:
      raise
    except Exception as e:
      raise errors.InputError(f"run folder {url}: cannot lock {NAME} ({type(e).__name__}: {e})") from e
    self.generation = self._blob.generation
    self._stop = threading.Event()
    self._renewer = threading.Thread(target=self._renew, name="run folder lock", daemon=True)
    self._renewer.start()

  def _take_over(self, found, exceptions) -> None:
    """Takes over the lock object `found` (read just now) if it is stale; else raises naming its holder."""
    if found is None:  # released since: take it as new
      self._blob.upload_from_string(self._record, if_generation_match=0)
      return
    holder = _parse(found.download_as_bytes(if_generation_match=found.generation))
    age = (datetime.datetime.now(datetime.UTC) - found.updated).total_seconds()
    dead = holder.get("host") == socket.gethostname() and not _alive(int(holder.get("pid", 0)))
    if age <= self._lease_s and not dead:
      raise _in_use(self.url, holder, f", renewed {age:.0f} s ago; a lock unrenewed for {self._lease_s:.0f} s is stale")
    try:
      self._blob.upload_from_string(self._record, if_generation_match=found.generation)
    except exceptions.PreconditionFailed:
      raise _in_use(self.url, holder, ", just taken over by another run") from None
    reason = "which no longer runs" if dead else f"unrenewed for {age:.0f} s"
    log.warning("run folder %s: took over the lock of %s, %s", self.url, _describe(holder), reason)

  def _renew(self) -> None:
    from google.api_core import exceptions

    while not self._stop.wait(self._lease_s / 5):
      try:
        self._blob.upload_from_string(
          self._record, if_generation_match=self.generation, timeout=storage.REQUEST_TIMEOUT_S, retry=_retry()
        )
        self.generation = self._blob.generation
      except (exceptions.PreconditionFailed, exceptions.NotFound):
        log.error(
          "run folder %s: another run took over this run's lock (it was not renewed for %.0f s); both now write "
          "to the folder",
          self.url,
          self._lease_s,
        )
        return
      except Exception as e:  # the bucket is unreachable for now: try again at the next renewal
        log.warning("run folder %s: lock not renewed (%s: %s)", self.url, type(e).__name__, e)

  def release(self) -> None:
    """Stops renewing and deletes the object, unless another run took it over; where the bucket
    does not answer (within storage's bounds), a warning says so (the lock goes stale)."""
    from google.api_core import exceptions

    self._stop.set()
    self._renewer.join()
    try:
      self._blob.delete(if_generation_match=self.generation, timeout=storage.REQUEST_TIMEOUT_S, retry=_retry())
    except (exceptions.PreconditionFailed, exceptions.NotFound):
      pass
    except Exception as e:  # noqa: BLE001 (the run is ending; a rerun takes a stale lock over)
      log.warning("run folder %s: %s not released (%s)", self.url, NAME, " ".join(str(e).split())[:200])


def _retry():
  """google-cloud-storage's retry of the lock's requests, giving up as storage.py's clients do."""
  from google.cloud.storage import retry

  return retry.DEFAULT_RETRY.with_timeout(storage.BACKOFF_S)


def acquire(folder: str, lease_s: float = LEASE_S) -> LocalLock | BucketLock:
  """The lock of the run folder `folder` (a local path or gs:// URL); an InputError naming the folder
  and the holder when another run holds it. lease_s: how long a lock on a bucket may go unrenewed."""
  return BucketLock(folder, lease_s) if storage.is_url(folder) else LocalLock(folder)
