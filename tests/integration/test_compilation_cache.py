"""jax_cache_dir: compiled programs persist across runs (checked with two decode processes)."""

import json
import os
import subprocess
import sys


def test_jax_cache_dir_keeps_compiled_programs_for_the_next_run(tmp_path):
  cache = tmp_path / "cache"
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # cache every program, however fast it compiled
  cmd = [
    sys.executable,
    "-m",
    "maxtext.inference.decode",
    "rl.yml",
    "model_name=qwen3-tiny",
    "prompt=What is 2+3?",
    "max_response_length=4",
    "decode_sampling_temperature=0",
    f"jax_cache_dir={cache}",
  ]
  first = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
  assert first.returncode == 0, first.stderr[-2000:]
  entries = set(os.listdir(cache))
  assert any(e.endswith("-cache") for e in entries)
  second = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)
  assert second.returncode == 0, second.stderr[-2000:]
  assert json.loads(second.stdout)["token_ids"] == json.loads(first.stdout)["token_ids"]
  assert set(os.listdir(cache)) == entries  # the second run compiled nothing new
