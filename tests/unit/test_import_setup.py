"""What importing maxtext sets up for the process: XLA's sequential CPU scheduler and an allocator
that returns freed buffers to the system. Each case runs in a fresh interpreter."""

import os
import subprocess
import sys

import pytest

# Interleaves 300 buffers of 2 MiB with small live blocks, frees the buffers and prints the RSS in MB.
# glibc's dynamic threshold has climbed past 2 MiB after the first large free (as after any training
# step), so by default the buffers come from the heap and their holes between the live blocks stay.
_FRAGMENT = """
import ctypes, sys
if sys.argv[1] == "import":
  import maxtext
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
libc.free(libc.malloc(4 << 20))
big, small = [], []
for _ in range(300):
  big.append(libc.malloc(2 << 20))
  ctypes.memset(big[-1], 1, 2 << 20)
  small.append(libc.malloc(64))
for p in big:
  libc.free(p)
print(next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:")) // 1000)
"""


def _rss_mb_after_freeing(mode: str, **env) -> int:
  env = {**{k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}, **env}
  return int(subprocess.run([sys.executable, "-c", _FRAGMENT, mode], capture_output=True, text=True, check=True,
                            env=env).stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc")
def test_freed_buffers_go_back_to_the_system_unless_the_environment_says_otherwise():
  held = _rss_mb_after_freeing("plain")
  assert held > 500  # the 600 MB the control keeps although all of it was freed
  assert _rss_mb_after_freeing("import") < held - 500
  assert _rss_mb_after_freeing("import", MALLOC_MMAP_THRESHOLD_="33554432") > 500  # the user's setting wins


def _xla_flags_after_import(flags: str) -> list[str]:
  return subprocess.run([sys.executable, "-c", "import os, maxtext; print(os.environ['XLA_FLAGS'])"],
                        capture_output=True, text=True, check=True, env={**os.environ, "XLA_FLAGS": flags}).stdout.split()


def test_xla_gets_the_sequential_cpu_scheduler_unless_xla_flags_set_it():
  assert _xla_flags_after_import("--xla_cpu_enable_fast_math=false") == [
      "--xla_cpu_enable_fast_math=false", "--xla_cpu_enable_concurrency_optimized_scheduler=false"]
  assert _xla_flags_after_import("--xla_cpu_enable_concurrency_optimized_scheduler=true") == [
      "--xla_cpu_enable_concurrency_optimized_scheduler=true"]
