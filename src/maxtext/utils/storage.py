"""Paths that name a local file or folder, or an object prefix in a Google Cloud Storage bucket
(`gs://bucket/path`).

Orbax reads and writes gs:// itself (TensorStore for arrays, etils.epath for the rest). Every other
reader and writer works on local files: inputs on a bucket are copied to a local folder once
(`local_copy`), and a run folder on a bucket is written locally and uploaded (`upload`). An
emulator is used by setting the standard STORAGE_EMULATOR_HOST=http://host:port; `use_emulator`
passes it on to the clients that read their own variable. A bucket that cannot be read or written
is an InputError of one line naming the config key (gcsfs's retries summarised in it; the tracebacks
gcsfs logs are kept for log_level=debug).

A storage server that stops answering fails each request within a bound: gcsfs gives a request
REQUEST_TIMEOUT_S seconds and tries it RETRIES times, backing off 1, 2, 4, 8, 16 s (+ up to 1 s)
in between; TensorStore (Orbax's arrays) likewise (`bound_requests`, and Orbax's retry settings
in checkpoint_conversion/orbax_checkpoint.py). `unreachable` tells such a failure.
"""

from __future__ import annotations

import atexit
import errno
import logging
import os
import re
import shutil
import tempfile
import uuid

from maxtext.utils import errors

log = logging.getLogger(__name__)

SCHEMES = ("gs",)


def scheme(path: str) -> str | None:
  match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", str(path or ""))
  return match.group(1) if match else None


def is_url(path: str) -> bool:
  return scheme(path) is not None


def unsupported(key: str, path: str) -> str | None:
  """Why `path`, the value of `key`, cannot be stored to: a URL of a scheme other than gs:// (None:
  it can)."""
  found = scheme(path)
  if found and found not in SCHEMES:
    return f"{key}={path!r}: {found}:// is not supported; expected a local path or " + " or ".join(
      f"{s}://bucket/path" for s in SCHEMES
    )
  return None


REQUEST_TIMEOUT_S = 30  # a request with no answer (connecting, or no byte for this long) fails
RETRIES = 6  # attempts per request: gcsfs's default, and TensorStore's 5 retries
BACKOFF_S = 1 + 2 + 4 + 8 + 16 + 5  # the most time spent between the attempts of one request


def bound_requests() -> None:
  """Bounds the requests of gcsfs file systems made from now on (Orbax's metadata files go through
  one too) and of TensorStore (read from the environment when it starts): connecting, and any
  stretch without a byte transferred, give up after REQUEST_TIMEOUT_S."""
  import fsspec

  fsspec.config.conf.setdefault("gs", {}).setdefault("requests_timeout", REQUEST_TIMEOUT_S)
  os.environ.setdefault("TENSORSTORE_CURL_CONNECT_TIMEOUT_SECONDS", str(REQUEST_TIMEOUT_S))
  os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_TIME_SECONDS", str(REQUEST_TIMEOUT_S))
  os.environ.setdefault("TENSORSTORE_CURL_LOW_SPEED_LIMIT_BYTES", "1")


def use_emulator() -> None:
  """With STORAGE_EMULATOR_HOST set, TensorStore (Orbax's array store) writes to the same server,
  and gcsfs does not ask the emulator for bucket layouts it cannot serve (it retries for minutes)."""
  host = os.environ.get("STORAGE_EMULATOR_HOST")
  if host:
    os.environ.setdefault("TENSORSTORE_GCS_HTTP_URL", host if is_url(host) else f"http://{host}")
    os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


def join(base: str, *parts: str) -> str:
  """os.path.join that keeps a URL's `//`; a local path is made absolute (Orbax needs it)."""
  if is_url(base):
    return "/".join([base.rstrip("/"), *(p.strip("/") for p in parts)])
  return os.path.abspath(os.path.join(base, *parts))


def _fs(url: str):
  use_emulator()
  bound_requests()
  import fsspec

  gcsfs_log = logging.getLogger("gcsfs")
  if not any(isinstance(f, _RetryTracebacks) for f in gcsfs_log.filters):
    gcsfs_log.addFilter(_RetryTracebacks())
  return fsspec.core.url_to_fs(url)


class _RetryTracebacks(logging.Filter):
  """gcsfs logs a request that ran out of retries (or failed in a way it does not retry) as an ERROR
  with its traceback, some 100 lines, before raising it; the raised error is what callers report
  (`_failed`: one line). Those records are kept for log_level=debug and dropped otherwise."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.exc_info is None:
      return True
    record.levelno, record.levelname = logging.DEBUG, "DEBUG"
    return logging.getLogger("gcsfs").isEnabledFor(logging.DEBUG)


def fault_tracebacks(record: logging.LogRecord) -> bool:
  """A logging filter for a library that logs the storage faults it raises with their tracebacks
  (Orbax's background saves, through absl): such a record, a write that found no space left or a
  request that got no answer (`no_space`, `unreachable`), is kept for log_level=debug and dropped
  otherwise; the run reports the fault in one line."""
  exc = record.exc_info[1] if record.exc_info else None
  if exc is None or not (no_space(exc) or unreachable(exc)):
    return True
  record.levelno, record.levelname = logging.DEBUG, "DEBUG"
  return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _failed(key: str, url: str, e: Exception) -> errors.InputError:
  """The one-line error for a failed bucket operation on config key `key`'s url."""
  if isinstance(e, FileNotFoundError):
    return errors.MissingInputError(f"{key}={url}: no such object or folder in the bucket")
  return errors.InputError(f"{key}={url}: the bucket cannot be reached ({reason(e)})")


def reason(e: BaseException) -> str:
  """A bucket operation's error on one line; where gcsfs retried it, how often."""
  from gcsfs import GCSFileSystem, retry

  text = f"{type(e).__name__}: {' '.join(str(e).split())}"
  return f"gave up after {GCSFileSystem.retries} attempts: {text}" if retry.is_retriable(e) else text


def check_writable(key: str, value: str, path: str) -> None:
  """Refuses a folder `path` (under `value`, config key `key`'s) that this process cannot write: the
  folder is made if missing and a probe file written in it and removed; on a bucket, a probe object."""
  probe = f".maxtext-write-check-{os.getpid()}-{uuid.uuid4().hex}"
  what = f"{key}={value}: cannot write {path}"
  if not is_url(path):
    try:
      os.makedirs(path, exist_ok=True)
      with open(os.path.join(path, probe), "wb"):
        pass
      os.remove(os.path.join(path, probe))
    except OSError as e:
      raise errors.InputError(f"{what} ({e.strerror or e})") from e
    return
  try:
    fs, root = _fs(path)
    fs.pipe_file(f"{root}/{probe}", b"")
    fs.rm_file(f"{root}/{probe}")
  except FileNotFoundError as e:
    raise errors.MissingInputError(f"{what} (no such bucket)") from e
  except Exception as e:  # gcsfs's and aiohttp's errors
    raise errors.InputError(f"{what} ({reason(e)})") from e


def exists(key: str, url: str) -> bool:
  try:
    fs, path = _fs(url)
    return fs.exists(path)
  except Exception as e:
    raise _failed(key, url, e) from e


def download(key: str, url: str, local: str, skip: tuple[str, ...] = ()) -> None:
  """Copies the object or folder `url` to the local path `local` (replacing what is there), leaving
  out the folder's subfolders named in `skip`."""
  try:
    fs, path = _fs(url)
    if not fs.exists(path):
      raise FileNotFoundError(url)
    shutil.rmtree(local, ignore_errors=True)
    os.makedirs(os.path.dirname(local), exist_ok=True)
    if fs.isdir(path):
      os.makedirs(local, exist_ok=True)
      for remote in fs.find(path):
        rel = os.path.relpath(remote, path)
        if rel.split("/")[0] in skip:
          continue
        target = os.path.join(local, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fs.get_file(remote, target)
    else:
      fs.get_file(path, local)
  except errors.InputError:
    raise
  except Exception as e:
    raise _failed(key, url, e) from e


def upload(local: str, url: str) -> None:
  """Copies the local file, or every file under the local folder, to `url`."""
  fs, path = _fs(url)
  if os.path.isfile(local):
    fs.put_file(local, path)
    return
  for root, _, names in os.walk(local):
    for name in names:
      fs.put_file(os.path.join(root, name), f"{path}/{os.path.relpath(os.path.join(root, name), local)}")


def move(source: str, target: str) -> None:
  """Renames a file or folder (on a bucket: copies every object, then deletes the originals)."""
  if not is_url(source):
    os.makedirs(os.path.dirname(target), exist_ok=True)
    os.replace(source, target)
    return
  fs, path = _fs(source)
  fs.mv(path, _fs(target)[1], recursive=True)
  fs.invalidate_cache()  # the instance is shared (Orbax's epath uses it): no stale listings of `source`


def remove(url: str) -> None:
  fs, path = _fs(url)
  fs.rm_file(path)


def unreachable(e: BaseException | None) -> bool:
  """Whether the exception, or one it was raised from or during, is a storage request that got no
  answer after its retries: gcsfs's retriable errors (connection refused or reset, timeouts, 5xx)
  and TensorStore's HTTP failures (their text names the CURL error)."""
  from gcsfs import retry

  seen = set()
  while e is not None and id(e) not in seen:
    if (isinstance(e, Exception) and retry.is_retriable(e)) or "CURL error" in str(e):
      return True
    seen.add(id(e))
    e = e.__cause__ or e.__context__
  return False


def free_bytes(path: str) -> int:
  """Bytes free to this user on the filesystem of the local path (of its nearest existing folder)."""
  path = os.path.abspath(path)
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return shutil.disk_usage(path).free


def no_space(e: BaseException | None) -> bool:
  """Whether the exception, or one it was raised from or during, is a write that found no space left
  on its device: an OSError with ENOSPC, or TensorStore's error for one (Orbax's array writes)."""
  seen = set()
  while e is not None and id(e) not in seen:
    if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e):
      return True
    seen.add(id(e))
    e = e.__cause__ or e.__context__
  return False


def local_copy(key: str, url: str) -> str:
  """A local copy of the input `url` (a file or folder), fresh for this process and removed at its
  exit; a local path is returned as it is."""
  if not is_url(url):
    return url
  global _inputs
  if _inputs is None:
    _inputs = tempfile.mkdtemp(prefix="maxtext-inputs-")
    atexit.register(shutil.rmtree, _inputs, ignore_errors=True)
  local = os.path.join(_inputs, url.replace("://", "/", 1).rstrip("/"))
  if not os.path.exists(local):
    download(key, url, local)
    log.info("%s: copied %s to %s", key, url, local)
  return local


_inputs: str | None = None
