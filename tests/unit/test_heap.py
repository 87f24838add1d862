"""maxtext.utils.heap.release gives freed heap pages back to the system (in a fresh interpreter)."""

import subprocess
import sys

import pytest

# Interleaves 300 blocks of 2 MiB with live ones of 4 KiB, frees the big ones and prints the RSS in MB,
# before and after heap.release(). glibc's mmap threshold has climbed past 2 MiB after the first
# large free (as after any XLA step), so the blocks come from the heap, and the holes between the
# live blocks stay in the process.
_FRAGMENT = """
import ctypes
from maxtext.utils import heap
rss = lambda: next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmRSS:")) // 1000
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
libc.free(libc.malloc(4 << 20))
big, small = [], []
for _ in range(300):
  big.append(libc.malloc(2 << 20))
  ctypes.memset(big[-1], 1, 2 << 20)
  small.append(libc.malloc(4096))
before = rss()
for p in big:
  libc.free(p)
freed = rss()
heap.release()
print(before, freed, rss())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc")
def test_release_returns_the_freed_blocks_that_free_kept():
  before, freed, released = map(
    int, subprocess.run([sys.executable, "-c", _FRAGMENT], capture_output=True, text=True, check=True).stdout.split()
  )
  assert freed > before - 100  # free() kept the 600 MB
  assert released < freed - 550


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc and /proc")
def test_release_after_compiling_returns_them_when_xla_compiles():
  """After release_after_compiling(), the next compile gives the freed blocks back (here: the 600 MB
  freed above, as a compiler's freed working memory would be)."""
  program = _FRAGMENT.replace(
    "heap.release()\n",
    "import jax\nheap.release_after_compiling()\nf = jax.jit(lambda x: x * 3)\nf(1.0).block_until_ready()\n",
  )
  before, freed, released = map(
    int, subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True).stdout.split()
  )
  assert freed > before - 100
  assert released < freed - 550
