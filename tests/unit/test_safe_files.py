"""Writes on a real full disk (a tmpfs filled by another process) land whole or not at all: the
file keeps its earlier content, and once space is freed the next write lands."""

import errno
import os

import pytest

from maxtext.utils import safe_files, storage
from tests import small_disk


def test_replace_and_append_on_a_full_disk_leave_the_file_as_it_was(tmp_path):
  disk = tmp_path / "disk"
  with small_disk.mounted(disk, "1m"):
    path = str(disk / "eval.json")
    with safe_files.replaced(path) as f:
      f.write("old")
    fd = os.open(str(disk / "rows"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    try:
      safe_files.append(fd, b"row 1\n")
      filler = small_disk.fill(disk)
      big = b"x" * 200_000  # more than a page: a tmpfs file's last page cannot take it
      with pytest.raises(OSError) as replaced, safe_files.replaced(path) as f:
        f.write(big.decode())
      assert storage.no_space(replaced.value)
      with pytest.raises(OSError) as appended:
        safe_files.append(fd, big)
      assert appended.value.errno == errno.ENOSPC
      assert (disk / "eval.json").read_text() == "old" and (disk / "rows").read_bytes() == b"row 1\n"
      assert sorted(os.listdir(disk)) == ["eval.json", "filler", "rows"]  # no temporary file left
      os.remove(filler)
      safe_files.append(fd, b"row 2\n")
    finally:
      os.close(fd)
    assert (disk / "rows").read_bytes() == b"row 1\nrow 2\n"
