"""A small real filesystem for tests: a tmpfs mounted at a test's folder (root only; the test is
skipped where mounting is not allowed), and another process filling it up."""

from __future__ import annotations

import contextlib
import os
import subprocess

import pytest


@contextlib.contextmanager
def mounted(path, size: str):
  """A tmpfs of `size` (mount's notation: 300m, 64k) mounted at `path` while the block runs."""
  os.makedirs(path)
  done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
  if done.returncode:
    pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
  try:
    yield
  finally:
    subprocess.run(["umount", "-l", str(path)], check=True)


def fill(path) -> str:
  """Fills the filesystem of folder `path` from another process (dd, until no space is left);
  returns the filler file, whose removal frees the space again."""
  filler = os.path.join(path, "filler")
  done = subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True, timeout=120)
  assert b"No space left on device" in done.stderr, done.stderr
  return filler
