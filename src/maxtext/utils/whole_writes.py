"""Local file writes that land whole or not at all, so that a write failing midway (a full disk, say)
leaves the file as it was: `replace` writes a new file's content beside it and renames it over the
old one; `append` adds bytes at the end of an open file and cuts it back when they do not all fit.
The failure is raised (an OSError; storage.no_space tells a full disk)."""

from __future__ import annotations

import os


def replace(path: str, data: str | bytes) -> None:
  """Makes `data` (text is written as UTF-8) the content of the file at `path`."""
  tmp = f"{path}.{os.getpid()}.tmp"
  try:
    with open(tmp, "wb") as f:
      f.write(data.encode("utf-8") if isinstance(data, str) else data)
    os.replace(tmp, path)
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


def append(fd: int, data: bytes) -> None:
  """Appends `data` to the file open (for writing, unbuffered) as descriptor `fd`."""
  size = os.lseek(fd, 0, os.SEEK_END)
  view = memoryview(data)
  try:
    while view:  # a short write (the disk filled midway) is followed by one that raises
      view = view[os.write(fd, view) :]
  except BaseException:
    os.ftruncate(fd, size)
    os.lseek(fd, size, os.SEEK_SET)
    raise
