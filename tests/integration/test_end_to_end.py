"""The end_to_end/ scripts (all slow: faster tests cover what they check)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.mark.parametrize(
  "script, args",
  [
    # test_shutdown covers a rerun resuming from a checkpoint, test_metrics the rows of a killed run
    pytest.param("resume_after_kill.sh", [], marks=pytest.mark.slow),
    pytest.param("standard_grpo_smoke.sh", [], marks=pytest.mark.slow),  # test_train_rl covers the same run
    # test_scripted_policy and test_train_rl cover the agentic tool run; test_checkpoint_conversion
    # the round trip
    pytest.param("agentic_grpo_smoke.sh", [], marks=pytest.mark.slow),
    pytest.param("hf_export_round_trip.sh", ["model_name=qwen3-tiny"], marks=pytest.mark.slow),
  ],
)
def test_end_to_end_script(script, args):
  env = dict(os.environ, PYTHON=sys.executable, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
    ["bash", os.path.join(ROOT, "end_to_end", script), *args],
    env=env,
    capture_output=True,
    text=True,
    timeout=900,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  assert proc.stdout.rstrip().endswith(": OK")


@pytest.mark.slow
def test_hf_export_round_trip_of_the_embedded_model():
  env = dict(os.environ, PYTHON=sys.executable, JAX_PLATFORMS="cpu")
  proc = subprocess.run(
    ["bash", os.path.join(ROOT, "end_to_end", "hf_export_round_trip.sh")],
    env=env,
    capture_output=True,
    text=True,
    timeout=1800,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
