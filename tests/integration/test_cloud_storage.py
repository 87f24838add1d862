"""Cloud storage: train_rl against a real GCS server on localhost (fake-gcs-server), reached through
the standard STORAGE_EMULATOR_HOST alone. A run folder on a bucket holds what a local one holds; a
dataset, a reward file and weights on the bucket are read from it; a killed run resumes from it."""

import json
import os
import re
import subprocess
import time

import numpy as np
import pytest
import yaml

from tests import gcs_server
from tests.integration.test_multiprocess import _ENV, TINY, TRAIN_RL, _launch, _rows, assert_same_training

_DATA = b"".join(
  b'{"question": "What is %d plus %d?", "answer": "%d"}\n' % (a, b, a + b) for a in range(6) for b in range(6)
)
_REWARD = (
  b"def variety(prompts, completions, tmvp_config, **kwargs):\n  return [len(set(c)) / 10 for c in completions]\n"
)


@pytest.fixture(name="gcs")
def _gcs(tmp_path):
  with gcs_server.running(str(tmp_path / "fake-gcs-server.log")) as url:
    gcs_server.write(url, "data/train.jsonl", _DATA)
    gcs_server.write(url, "code/rewards.py", _REWARD)
    yield url


def _train(args: list[str], url: str, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
  env = dict(env or _ENV, **({"STORAGE_EMULATOR_HOST": url} if url else {}))
  proc = subprocess.run([*TRAIN_RL, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return proc


def _bucket_rows(url: str, prefix: str) -> list[dict]:
  return [json.loads(line) for line in gcs_server.read(url, f"{prefix}/metrics.jsonl").decode().splitlines()]


def _layout(names) -> list[str]:
  """A run folder's files, with the names Orbax and TensorBoard make unique (content hashes, times)
  reduced to their folder."""
  out = set()
  for name in names:
    parts = name.split("/")
    if parts[0] == "checkpoints":
      out.add("/".join(parts[:4]))  # checkpoints/actor/<update>/<item>
    elif parts[0] == "tensorboard":
      out.add("tensorboard/events")
    else:
      out.add(name)
  return sorted(out)


def test_a_run_folder_on_a_missing_bucket_is_one_line_and_exit_2(gcs):
  """Refused at start, before the model loads, naming base_output_directory."""
  proc = subprocess.run(
    [*TRAIN_RL, *TINY, "base_output_directory=gs://nobkt/runs", "run_name=r"],
    env=dict(_ENV, STORAGE_EMULATOR_HOST=gcs),
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 2, proc.stderr[-4000:]
  last = proc.stderr.strip().splitlines()[-1]
  assert last == "error: base_output_directory=gs://nobkt/runs: cannot write gs://nobkt/runs/r (no such bucket)"
  assert "Traceback" not in proc.stderr and "Initialising" not in proc.stderr


def test_a_run_on_a_bucket_holds_what_a_local_run_holds(gcs, tmp_path):
  """The same run twice, once with everything local and once with the dataset, the reward file, the
  run folder and the HF export on the bucket: the bucket's run folder has the local one's files, the
  same metrics and evaluations, config.yml names the URLs, and the exported weights are equal."""
  (tmp_path / "train.jsonl").write_bytes(_DATA)
  (tmp_path / "rewards.py").write_bytes(_REWARD)
  common = [*TINY, "num_batches=2", "reward_functions=[variety]", "export_hf=true", "run_name=r"]
  _train(
    [
      *common,
      f"dataset_name={tmp_path / 'train.jsonl'}",
      f"reward_functions_path={tmp_path / 'rewards.py'}",
      f"base_output_directory={tmp_path / 'runs'}",
      f"hf_output_path={tmp_path / 'export'}",
    ],
    None,
  )
  _train(
    [
      *common,
      "dataset_name=gs://bkt/data/train.jsonl",
      "reward_functions_path=gs://bkt/code/rewards.py",
      "base_output_directory=gs://bkt/runs",
      "hf_output_path=gs://bkt/export",
    ],
    gcs,
  )

  local = tmp_path / "runs" / "r"
  local_names = [os.path.relpath(os.path.join(root, n), local) for root, _, names in os.walk(local) for n in names]
  bucket_names = [name.removeprefix("runs/r/") for name in gcs_server.objects(gcs, prefix="runs/r/")]
  assert _layout(bucket_names) == _layout(local_names)
  assert "checkpoints/actor/2/model_params" in _layout(bucket_names) and "report.md" in bucket_names

  here, there = _rows(local), _bucket_rows(gcs, "runs/r")
  assert [r["step"] for r in there] == [1, 2]
  assert_same_training(here, there)
  assert here[0]["rewards/variety"] > 0
  local_eval = json.loads((local / "eval.json").read_text())
  bucket_eval = json.loads(gcs_server.read(gcs, "runs/r/eval.json"))
  assert bucket_eval["before"] == local_eval["before"] and bucket_eval["after"] == local_eval["after"]

  config = yaml.safe_load(gcs_server.read(gcs, "runs/r/config.yml"))
  assert config["dataset_name"] == "gs://bkt/data/train.jsonl"
  assert config["reward_functions_path"] == "gs://bkt/code/rewards.py"
  assert config["base_output_directory"] == "gs://bkt/runs"

  from safetensors.numpy import load

  exported = load(gcs_server.read(gcs, "export/model.safetensors"))
  expected = load((tmp_path / "export" / "model.safetensors").read_bytes())
  assert sorted(exported) == sorted(expected) and {"config.json", "tokenizer.json"} <= {
    n.removeprefix("export/") for n in gcs_server.objects(gcs, prefix="export/")
  }
  for name, value in expected.items():
    np.testing.assert_allclose(exported[name], value, rtol=1e-6, atol=1e-7, err_msg=name)


@pytest.mark.slow  # make test: a whole run on the bucket
def test_an_hf_export_on_the_bucket_loads_back_as_training_weights(gcs, tmp_path):
  """A run exports to the bucket; a second run loads its weights and tokenizer from there and
  evaluates them exactly as the first run's final evaluation did."""
  args = [*TINY, "num_batches=1", "dataset_name=gs://bkt/data/train.jsonl", "base_output_directory=gs://bkt/runs"]
  _train([*args, "run_name=first", "export_hf=true", "hf_output_path=gs://bkt/export"], gcs)
  second = _train(
    [
      *args,
      "run_name=second",
      "load_parameters_path=gs://bkt/export",
      "tokenizer_path=gs://bkt/export",
    ],
    gcs,
  )
  assert "load_parameters_path: copied gs://bkt/export" in second.stderr
  first = json.loads(gcs_server.read(gcs, "runs/first/eval.json"))
  loaded = json.loads(gcs_server.read(gcs, "runs/second/eval.json"))
  assert loaded["before"] == first["after"]
  assert yaml.safe_load(gcs_server.read(gcs, "runs/second/config.yml"))["load_parameters_path"] == "gs://bkt/export"


@pytest.mark.slow
def test_a_killed_run_on_a_bucket_resumes_from_the_bucket(gcs, tmp_path):
  """SIGKILL after the second checkpoint reached the bucket; the same command, rerun in a fresh
  working directory, resumes from the bucket's checkpoint and logs every step once."""
  args = [*TINY, "num_batches=4", "base_output_directory=gs://bkt/runs", "run_name=killed"]
  proc = subprocess.Popen(
    [*TRAIN_RL, *args],
    env=dict(_ENV, STORAGE_EMULATOR_HOST=gcs),
    cwd=tmp_path,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  try:
    deadline = time.monotonic() + 600
    while (
      proc.poll() is None
      and time.monotonic() < deadline
      and not any(
        n.startswith("runs/killed/checkpoints/actor/2/model_params/") for n in gcs_server.objects(gcs, prefix="runs/")
      )
    ):
      time.sleep(0.3)
    assert proc.poll() is None, "the run ended before it could be killed"
  finally:
    proc.kill()
    proc.wait()
  rerun = _train(args, gcs)
  assert "Resuming from the checkpoint of step" in rerun.stderr
  assert [r["step"] for r in _bucket_rows(gcs, "runs/killed")] == [1, 2, 3, 4]


@pytest.mark.slow
def test_checkpoints_and_adapters_on_the_bucket_load_in_place(gcs, tmp_path):
  """A LoRA run's checkpoints on the bucket: Orbax reads them in place as lora_input_adapters_path,
  and a full run's checkpoints as load_parameters_path; each evaluates as the run that wrote them."""
  args = [*TINY, "num_batches=1", "base_output_directory=gs://bkt/runs"]
  _train([*args, "run_name=full"], gcs)
  _train([*args, "run_name=lora", "lora_rank=4", "lora_alpha=8"], gcs)
  full = _train([*args, "run_name=full_again", "load_parameters_path=gs://bkt/runs/full/checkpoints"], gcs)
  lora = _train(
    [
      *args,
      "run_name=lora_again",
      "lora_rank=4",
      "lora_alpha=8",
      "lora_input_adapters_path=gs://bkt/runs/lora/checkpoints",
    ],
    gcs,
  )
  assert "copied" not in full.stderr + lora.stderr  # read where they are
  for name in ("full", "lora"):
    trained = json.loads(gcs_server.read(gcs, f"runs/{name}/eval.json"))
    reloaded = json.loads(gcs_server.read(gcs, f"runs/{name}_again/eval.json"))
    assert reloaded["before"] == trained["after"], name


@pytest.mark.slow
def test_two_processes_write_one_run_folder_on_the_bucket(gcs, tmp_path):
  """2 processes x 2 devices with the run folder on the bucket: the same metrics as one process with
  a local folder, and every process's part of the checkpoints in the bucket."""
  args = [
    *TINY,
    "num_batches=2",
    "reward_functions_path=gs://bkt/code/rewards.py",
    "reward_functions=[variety]",
    "dataset_name=gs://bkt/data/train.jsonl",
    "run_name=multi",
  ]
  multi = _launch(2, 2, [*args, "base_output_directory=gs://bkt/runs"], 900, dict(_ENV, STORAGE_EMULATOR_HOST=gcs))
  assert multi.returncode == 0, multi.stdout[-4000:]
  _train(
    [*args, f"base_output_directory={tmp_path}"],
    gcs,
    env=dict(_ENV, XLA_FLAGS="--xla_force_host_platform_device_count=4"),
  )
  assert_same_training(_rows(tmp_path / "multi"), _bucket_rows(gcs, "runs/multi"))
  names = gcs_server.objects(gcs, prefix="runs/multi/checkpoints/actor/2/model_params/")
  assert any("process_0" in n for n in names) and any("process_1" in n for n in names)


def _bucket_steps(url: str, prefix: str) -> set[int]:
  """The steps with a metrics row on the bucket, in metrics.jsonl or its pending rows."""
  names = gcs_server.objects(url, prefix=prefix)
  steps = set()
  if f"{prefix}/metrics.jsonl" in names:
    steps |= {r["step"] for r in _bucket_rows(url, prefix)}
  if f"{prefix}/metrics.jsonl.pending" in names:
    steps |= {r["step"] for r in json.loads(gcs_server.read(url, f"{prefix}/metrics.jsonl.pending"))}
  return steps


@pytest.mark.slow
def test_a_run_whose_storage_server_dies_ends_in_one_line_within_three_minutes(gcs, tmp_path):
  """The server is SIGKILLed once step 1's checkpoint and metrics row are on the bucket. The run used
  to go on for minutes (TensorStore retries for some 15) and end in a thousand lines of tracebacks;
  now every client gives up within storage.py's bounds and the run ends with exit 1 and one line
  naming the checkpoint it saved there."""
  args = [*TINY, "num_batches=6", "base_output_directory=gs://bkt/runs", "run_name=lost"]
  proc = subprocess.Popen(
    [*TRAIN_RL, *args],
    env=dict(_ENV, STORAGE_EMULATOR_HOST=gcs),
    cwd=tmp_path,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    deadline = time.monotonic() + 600
    while not (
      "runs/lost/checkpoints/actor/1/commit_success.txt" in gcs_server.objects(gcs, prefix="runs/lost/checkpoints/")
      and 1 in _bucket_steps(gcs, "runs/lost")
    ):
      assert proc.poll() is None and time.monotonic() < deadline, "the run ended before the server was killed"
      time.sleep(0.3)
    gcs_server.kill(gcs)
    killed = time.monotonic()
    _, err = proc.communicate(timeout=600)
    took = time.monotonic() - killed
  finally:
    proc.kill()
    proc.wait()
  assert proc.returncode == 1, err[-4000:]
  # The only tracebacks left: TensorStore's, printed from its threads, of writes cut short whose
  # callbacks found Orbax's event loop closed (printed by TensorStore, not through Python's logging).
  assert err.count("Traceback") == err.count("RuntimeError: Event loop is closed"), err[-4000:]
  last = err.splitlines()[-1]
  assert re.fullmatch(
    r"stopped: the storage of gs://bkt/runs/lost stopped answering \(.+\); the checkpoint of step [1-5] is kept "
    r"there with its metrics: rerun the same command once it answers to resume",
    last,
  ), last
  assert took < 180, f"{took:.0f} s"
