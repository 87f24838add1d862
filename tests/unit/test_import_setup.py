"""What importing maxtext sets up for the process: XLA's sequential CPU scheduler. Each case runs in a
fresh interpreter."""

import os
import subprocess
import sys


def _xla_flags_after_import(flags: str) -> list[str]:
  code = "import os, maxtext; print(os.environ['XLA_FLAGS'])"
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                        env={**os.environ, "XLA_FLAGS": flags}).stdout.split()


def test_xla_gets_the_sequential_cpu_scheduler_unless_xla_flags_set_it():
  assert _xla_flags_after_import("--xla_cpu_enable_fast_math=false") == [
      "--xla_cpu_enable_fast_math=false", "--xla_cpu_enable_concurrency_optimized_scheduler=false"]
  assert _xla_flags_after_import("--xla_cpu_enable_concurrency_optimized_scheduler=true") == [
      "--xla_cpu_enable_concurrency_optimized_scheduler=true"]
