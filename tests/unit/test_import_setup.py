"""Importing maxtext changes nothing in the process; the command-line programs give XLA the
sequential CPU scheduler before JAX starts. Each case runs in a fresh interpreter."""

import os
import subprocess
import sys


def _xla_flags_after(code: str, flags: str) -> list[str]:
  code = f"import os\n{code}\nprint(os.environ['XLA_FLAGS'])"
  return subprocess.run(
    [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={**os.environ, "XLA_FLAGS": flags}
  ).stdout.split()


def test_importing_the_package_leaves_xla_flags_alone():
  code = "import maxtext, maxtext.configs.cli, maxtext.models.decoder, maxtext.trainers.post_train.rl.train_rl"
  assert _xla_flags_after(code, "--xla_cpu_enable_fast_math=false") == ["--xla_cpu_enable_fast_math=false"]


def test_programs_give_xla_the_sequential_cpu_scheduler_unless_xla_flags_set_it():
  """What cli.main, the start of every program, applies first (here through `--help`, which returns
  before reading a config)."""
  code = "from maxtext.configs import cli\ncli.main(['prog', '--help'], lambda cfg: None)"
  assert _xla_flags_after(code, "--xla_cpu_enable_fast_math=false")[-2:] == [
    "--xla_cpu_enable_fast_math=false",
    "--xla_cpu_enable_concurrency_optimized_scheduler=false",
  ]
  assert _xla_flags_after(code, "--xla_cpu_enable_concurrency_optimized_scheduler=true")[-1:] == [
    "--xla_cpu_enable_concurrency_optimized_scheduler=true"
  ]
