"""Command-line programs: a config or input error is one line and exit 2; anything else keeps its
traceback."""

import pytest

from maxtext.configs import cli
from maxtext.utils import errors


def test_input_error_is_one_line_and_exit_2(capsys):
  def job(cfg):
    raise errors.MissingInputError(f"dataset_name=/data/{cfg.run.run_name}.jsonl: dataset file not found")

  assert cli.main(["prog", "rl.yml", "run_name=gone"], job) == 2
  assert (
    capsys.readouterr().err.strip().splitlines()[-1] == "error: dataset_name=/data/gone.jsonl: dataset file not found"
  )


def test_internal_error_keeps_its_traceback():
  """A ValueError from inside JAX or Tunix (here a shape bug) is not dressed as a user error."""

  def job(cfg):
    raise ValueError("dot_general requires contracting dimensions to have the same shape, got (3,) and (4,)")

  with pytest.raises(ValueError, match="dot_general"):
    cli.main(["prog", "rl.yml"], job)


def test_missing_data_file_is_one_line_and_exit_2(tmp_path, capsys):
  """train_rl with a missing data file (read before any model loads): one line naming it, exit 2."""
  from maxtext.trainers.post_train.rl import train_rl

  assert train_rl.main(["train_rl", "rl.yml", "model_name=qwen3-tiny", f"dataset_name={tmp_path / 'nope.jsonl'}"]) == 2
  err = capsys.readouterr().err
  assert err.strip().splitlines()[-1] == f"error: {tmp_path / 'nope.jsonl'}: dataset file not found"
  assert "Traceback" not in err


def _train_rl(tmp_path, *args):
  """train_rl as a user runs it, in its own process (bounded in time); its exit code and stderr."""
  import os
  import subprocess
  import sys

  env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
  command = [sys.executable, "-m", "maxtext.trainers.post_train.rl.train_rl", "rl.yml", "model_name=qwen3-tiny"]
  proc = subprocess.run(
    [*command, *args, f"base_output_directory={tmp_path / 'runs'}"],
    capture_output=True,
    text=True,
    timeout=300,
    env=env,
  )
  return proc.returncode, proc.stderr


def test_start_checks_through_the_entrypoint_are_one_line_and_exit_2(tmp_path):
  """A count key out of range and a start beyond the host's memory, each refused before any model
  loads or anything is saved (data faults: test_datasets.py, in process)."""
  code, err = _train_rl(tmp_path, "rl.num_iterations=0")
  assert (code, err.strip().splitlines()) == (2, ["config error: rl.num_iterations=0: expected a positive integer"])
  huge = ["batch_size=4096", "rl.num_generations=64", "max_response_length=512"]
  code, err = _train_rl(tmp_path, *huge)
  last = err.strip().splitlines()[-1]
  assert code == 2 and last.startswith("error: expected peak memory ") and "Traceback" not in err
  assert "the biggest item is activations" in last and last.endswith("set ignore_memory_estimate=true to start anyway")
  assert not (tmp_path / "runs" / "default_run" / "checkpoints").exists()
