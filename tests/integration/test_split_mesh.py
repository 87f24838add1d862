"""Trainer and sampler on separate devices (2 host CPU devices): a GRPO step runs and syncs weights."""

import json
import os
import subprocess
import sys


def test_grpo_on_split_trainer_and_sampler_devices(tmp_path):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
  args = ["model_name=qwen3-tiny", "num_batches=2", "batch_size=2", "rl.num_generations=2",
          "max_response_length=8", "num_test_batches=1", "eval_batch_size=2",
          "trainer_devices_fraction=0.5", "sampler_devices_fraction=0.5",
          f"base_output_directory={tmp_path}", "run_name=split"]
  proc = subprocess.run(
      [sys.executable, "-m", "maxtext.trainers.post_train.rl.train_rl", "rl.yml", *args],
      env=env, capture_output=True, text=True, timeout=600, check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "trainer mesh {'data': 1, 'fsdp': 1, 'tensor': 1}" in proc.stderr
  assert "Devices: [CpuDevice(id=0), CpuDevice(id=1)]" in proc.stderr
  with open(tmp_path / "split" / "metrics.jsonl", encoding="utf-8") as f:
    assert [json.loads(line)["step"] for line in f] == [1, 2]
