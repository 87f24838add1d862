"""The fast end_to_end/ scripts, run as CI runs them."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize("script", ["resume_after_kill.sh"])
def test_end_to_end_script(script):
  env = dict(os.environ, PYTHON=sys.executable, JAX_PLATFORMS="cpu")
  proc = subprocess.run(["bash", os.path.join(ROOT, "end_to_end", script)], env=env, capture_output=True,
                        text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
