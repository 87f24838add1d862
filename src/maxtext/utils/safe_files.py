"""A run's small local files (metrics.jsonl, its pending rows, eval.json, config.yml) written so that a
kill at any moment leaves each one whole, and read back so that one found damaged stops nothing.

`replaced(path)` rewrites a file atomically: the new text goes to a temporary file in the same
folder, is flushed and fsynced, and is renamed over `path` (os.replace), so a reader finds the old
file or the new one, never a part, and a write that fails midway (a full disk) leaves the old one.
`append(fd, data)` adds bytes at the end of an open file and cuts them back when they do not all
fit. `set_aside(path, reason)` keeps a damaged file as a side file, `<path>.damaged-<YYYYmmdd-HHMMSS>`,
named in one warning line, for the caller to go on without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import time
from collections.abc import Iterator
from typing import TextIO

log = logging.getLogger(__name__)

DAMAGED = ".damaged-"  # what a side file's name adds to the damaged file's


@contextlib.contextmanager
def replaced(path: str, durable: bool = True) -> Iterator[TextIO]:
  """A text file (UTF-8) that replaces the local file `path` as a whole when the block ends: until
  then `path` is left as it was, and an error in the block leaves it so (the temporary file is
  removed). `durable`: the file and the rename are fsynced (a kill of the process cannot tear the
  file either way; a power loss can without)."""
  folder = os.path.dirname(path) or "."
  os.makedirs(folder, exist_ok=True)
  tmp = os.path.join(folder, f".{os.path.basename(path)}.{os.getpid()}.tmp")  # one writer per file in a process
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      yield f
      f.flush()
      if durable:
        os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    with contextlib.suppress(FileNotFoundError):
      os.remove(tmp)
    raise
  if not durable:
    return
  with contextlib.suppress(OSError):  # the rename itself reaches the disk (not possible everywhere)
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
      os.fsync(dir_fd)
    finally:
      os.close(dir_fd)


def set_aside(path: str, reason: str, keep: bool = False) -> str:
  """Moves the damaged file `path` to a side file next to it (copies it where `keep`, for a caller
  that rewrites `path` at once) and logs one warning line naming both and `reason`, what is wrong
  with it and what the run does instead; returns the side file's path."""
  stamp = time.strftime("%Y%m%d-%H%M%S")
  side, n = f"{path}{DAMAGED}{stamp}", 1
  while os.path.exists(side):
    n += 1
    side = f"{path}{DAMAGED}{stamp}-{n}"
  if keep:
    shutil.copyfile(path, side)
  else:
    os.replace(path, side)
  log.warning("%s is damaged (%s); it is kept as %s", path, reason, os.path.basename(side))
  return side


def append(fd: int, data: bytes) -> None:
  """Appends `data` to the file open (for writing, unbuffered) as descriptor `fd`, whole or not at all:
  a write that fails midway (a full disk: storage.no_space tells it) cuts the file back and raises."""
  size = os.lseek(fd, 0, os.SEEK_END)
  view = memoryview(data)
  try:
    while view:  # a short write (the disk filled midway) is followed by one that raises
      view = view[os.write(fd, view) :]
  except BaseException:
    os.ftruncate(fd, size)
    os.lseek(fd, size, os.SEEK_SET)
    raise
