"""scripts/submit_xpk.py in dry-run mode: the xpk command line it builds, and what it refuses."""

import os
import re
import shlex
import subprocess
import sys

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "submit_xpk.py")


def _run(*args):
  return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120, check=False)


def test_dry_run_prints_the_workload_command_with_the_train_rl_arguments():
  train = [
    "rl.yml",
    "model_name=qwen3-0.6b",
    "run_name=Qwen3_GRPO.run",
    "base_output_directory=/gcs/b/runs",
    "rl.use_agentic_rollout=true",
    "rl.system_prompt=Think, then answer.",
  ]
  proc = _run(
    "--cluster",
    "c1",
    "--docker-image",
    "gcr.io/p/maxtext-rl:1",
    "--tpu-type",
    "v5p-16",
    "--num-slices",
    "2",
    "--project",
    "p",
    "--zone",
    "us-east5-a",
    "--dry-run",
    "--",
    *train,
  )
  assert proc.returncode == 0, proc.stderr
  cmd = shlex.split(proc.stdout.strip())
  assert cmd[:3] == ["xpk", "workload", "create"]
  flags = dict(zip(cmd[3::2], cmd[4::2]))
  assert flags == {
    "--cluster": "c1",
    "--workload": "qwen3-grpo-run",
    "--docker-image": "gcr.io/p/maxtext-rl:1",
    "--tpu-type": "v5p-16",
    "--num-slices": "2",
    "--project": "p",
    "--zone": "us-east5-a",
    "--command": flags["--command"],
  }
  assert shlex.split(flags["--command"]) == ["python3", "-m", "maxtext.trainers.post_train.rl.train_rl", *train]
  assert "warning" not in proc.stderr


def test_gpu_nodes_and_a_local_output_folder_warn():
  proc = _run(
    "--cluster",
    "c",
    "--docker-image",
    "img",
    "--device-type",
    "h100-80gb-8",
    "--num-nodes",
    "4",
    "--dry-run",
    "--",
    "rl.yml",
  )
  assert proc.returncode == 0, proc.stderr
  assert "--device-type h100-80gb-8 --num-nodes 4" in proc.stdout
  assert "is relative" in proc.stderr and "gs://BUCKET/PATH" in proc.stderr
  proc = _run(
    "--cluster",
    "c",
    "--docker-image",
    "img",
    "--tpu-type",
    "v6e-8",
    "--dry-run",
    "--",
    "rl.yml",
    "base_output_directory=gs://b/runs",
  )
  assert proc.returncode == 0 and "warning" not in proc.stderr and "base_output_directory=gs://b/runs" in proc.stdout
  proc = _run(
    "--cluster",
    "c",
    "--docker-image",
    "img",
    "--tpu-type",
    "v6e-8",
    "--dry-run",
    "--",
    "rl.yml",
    "base_output_directory=s3://b/runs",
  )
  assert proc.returncode == 2 and "base_output_directory='s3://b/runs': s3:// is not supported" in proc.stderr


def test_bad_input_is_refused_before_submitting():
  common = ["--cluster", "c", "--docker-image", "img", "--tpu-type", "v6e-8", "--dry-run"]
  proc = _run(*common, "--", "rl.yml", "rl.max_concurency=64")
  assert proc.returncode == 2 and "rl.max_concurency: unknown key" in proc.stderr and not proc.stdout
  proc = _run(*common)
  assert proc.returncode == 2 and "give the train_rl arguments after --" in proc.stderr
  proc = _run(
    "--cluster", "c", "--docker-image", "img", "--tpu-type", "v6e-8", "--device-type", "h100-80gb-8", "--", "rl.yml"
  )
  assert proc.returncode == 2 and "not allowed with argument" in proc.stderr


def test_the_image_installs_the_pins_make_install_does():
  """The Dockerfile installs requirements.txt, the package and the same asset pins as the Makefile."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  with open(os.path.join(root, "Dockerfile"), encoding="utf-8") as f:
    dockerfile = f.read()
  with open(os.path.join(root, "Makefile"), encoding="utf-8") as f:
    assets = re.search(r"^ASSETS := (.*)$", f.read(), re.M).group(1).split()
  assert "pip install --no-cache-dir -r requirements.txt" in dockerfile
  assert "pip install --no-cache-dir --no-deps -e ." in dockerfile
  assert f"--no-deps {' '.join(assets)}" in dockerfile
