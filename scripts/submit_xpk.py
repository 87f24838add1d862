#!/usr/bin/env python3
"""Submits train_rl to a GKE cluster with XPK (`xpk workload create`).

    scripts/submit_xpk.py --cluster C --docker-image IMG (--tpu-type v5p-16 | --device-type h100-80gb-8)
        [--num-slices N | --num-nodes N] [--project P] [--zone Z] [--workload NAME] [--dry-run]
        -- rl.yml model_name=qwen3-0.6b base_output_directory=gs://BUCKET/runs [key=value ...]

The train_rl arguments after `--` are checked here first (an unknown key or a bad value fails before
anything is submitted). Every host of the workload runs the same command; jax.distributed starts
from what XPK sets up (TPU slices and GPU nodes are detected by JAX; elsewhere set
JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID). base_output_directory must be a
place every host reaches: a gs:// bucket path, or a folder every host shares; every process writes
its part of each checkpoint there. --dry-run prints the xpk command line and exits.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys

TRAIN_RL = ["python3", "-m", "maxtext.trainers.post_train.rl.train_rl"]


def _parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
    description=__doc__.split("\n\n")[0], usage="submit_xpk.py [options] -- rl.yml [key=value ...]"
  )
  p.add_argument("--cluster", required=True, help="XPK/GKE cluster name")
  p.add_argument("--docker-image", required=True, help="image with this program installed")
  accel = p.add_mutually_exclusive_group(required=True)
  accel.add_argument("--tpu-type", help="TPU slice type, e.g. v5p-16 or v6e-8")
  accel.add_argument("--device-type", help="GPU node type, e.g. h100-80gb-8")
  p.add_argument("--num-slices", type=int, default=1, help="TPU slices (with --tpu-type)")
  p.add_argument("--num-nodes", type=int, default=1, help="GPU nodes (with --device-type)")
  p.add_argument("--project", help="Google Cloud project")
  p.add_argument("--zone", help="Google Cloud zone")
  p.add_argument("--workload", help="workload name (default: the config's run_name)")
  p.add_argument("--dry-run", action="store_true", help="print the xpk command line instead of running it")
  return p


def workload_name(name: str) -> str:
  """A valid workload name: lowercase letters, digits and '-', starting with a letter, <= 40 chars."""
  clean = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
  if not clean or not clean[0].isalpha():
    clean = "rl-" + clean
  return clean[:40].rstrip("-")


def xpk_command(opts: argparse.Namespace, train_args: list[str], run_name: str) -> list[str]:
  """The `xpk workload create` argv that runs train_rl with train_args on every host."""
  cmd = [
    "xpk",
    "workload",
    "create",
    "--cluster",
    opts.cluster,
    "--workload",
    workload_name(opts.workload or run_name),
    "--docker-image",
    opts.docker_image,
  ]
  if opts.tpu_type:
    cmd += ["--tpu-type", opts.tpu_type, "--num-slices", str(opts.num_slices)]
  else:
    cmd += ["--device-type", opts.device_type, "--num-nodes", str(opts.num_nodes)]
  for flag, value in (("--project", opts.project), ("--zone", opts.zone)):
    if value:
      cmd += [flag, value]
  return cmd + ["--command", shlex.join(TRAIN_RL + train_args)]


def main(argv: list[str]) -> int:
  if "--" in argv:
    split = argv.index("--")
    own, train_args = argv[:split], argv[split + 1 :]
  else:
    own, train_args = argv, []
  opts = _parser().parse_args(own)
  if not train_args:
    print("error: give the train_rl arguments after --, e.g. -- rl.yml model_name=qwen3-0.6b", file=sys.stderr)
    return 2
  from maxtext.configs import pyconfig
  from maxtext.utils import storage

  try:
    cfg = pyconfig.initialize(["train_rl", *train_args])
  except pyconfig.ConfigError as e:
    print(f"config error: {e}", file=sys.stderr)
    return 2
  if not os.path.isabs(cfg.run.base_output_directory) and not storage.is_url(cfg.run.base_output_directory):
    print(
      f"warning: base_output_directory={cfg.run.base_output_directory!r} is relative: the run folder lands in each "
      "host's working directory and is lost with the pod; give gs://BUCKET/PATH (or a folder every host shares)",
      file=sys.stderr,
    )
  cmd = xpk_command(opts, train_args, cfg.run.run_name)
  if opts.dry_run:
    print(shlex.join(cmd))
    return 0
  if shutil.which("xpk") is None:
    print("error: xpk is not on PATH (pip install xpk), or use --dry-run to print the command", file=sys.stderr)
    return 2
  return subprocess.call(cmd)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
