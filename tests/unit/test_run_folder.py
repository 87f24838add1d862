"""The run folder on real files: what a rerun resumes from, what it sets aside and what it keeps; the
settings a rerun must keep, the room a run needs and what a save that found the disk full leaves."""

import errno
import glob
import json
import logging
import os
import shutil

import jax.numpy as jnp
import pytest
import yaml
from flax import nnx

from maxtext.checkpoint_conversion import orbax_checkpoint
from maxtext.trainers.post_train.rl.run_folder import RunFolder
from maxtext.utils import errors, storage
from maxtext.utils.steps import Steps
from tests.conftest import make_config


def _folder(tmp_path, *overrides) -> RunFolder:
  cfg = make_config(f"base_output_directory={tmp_path}", "run_name=run", *overrides)
  return RunFolder(cfg.run, Steps.of(cfg.train, cfg.algorithm))


def _checkpoint(folder: RunFolder, update: int, value: float = 1.0) -> None:
  """A real Orbax checkpoint of a small module, every parameter `value`."""
  model = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
  model.kernel[...] = jnp.full((4, 4), value)
  orbax_checkpoint.save_params(os.path.join(folder.path, "checkpoints", "actor"), model, update)


def _rows(folder: RunFolder, steps) -> None:
  with open(folder.metrics, "w", encoding="utf-8") as f:
    f.writelines(json.dumps({"step": s, "loss": 0.1 * s}) + "\n" for s in steps)


def test_a_fresh_folder_resumes_from_nothing(tmp_path):
  folder = _folder(tmp_path)
  assert folder.resume() == 0
  assert folder.previous_results(0) == {"before": None, "during": [], "after": None, "gain": None}


def test_resume_takes_the_latest_checkpoint_whose_steps_are_all_logged(tmp_path):
  """Checkpoints of steps 2 and 4, metrics rows of steps 1-3: step 4's checkpoint landed but its row
  did not, so the rerun resumes at 2, sets 4 aside and drops row 3."""
  folder = _folder(tmp_path)
  for update in (2, 4):
    _checkpoint(folder, update)
  _rows(folder, [1, 2, 3])
  assert folder.resume() == 2
  assert folder.saved_steps() == [2]
  set_aside = os.listdir(os.path.join(folder.path, "checkpoints", "set_aside"))
  assert [name.split("_")[0] for name in set_aside] == ["4"]
  with open(folder.metrics, encoding="utf-8") as f:
    assert [json.loads(line)["step"] for line in f] == [1, 2]


def test_steps_count_batches_when_each_is_trained_twice(tmp_path):
  """rl.num_iterations=2: checkpoints are named by optimizer update (2 per step)."""
  folder = _folder(tmp_path, "rl.num_iterations=2")
  for update in (2, 4, 6):
    _checkpoint(folder, update)
  _rows(folder, [1, 2, 3])
  assert folder.saved_steps() == [1, 2, 3]
  assert folder.keep_checkpoints_through(1) == [4, 6]
  assert folder.saved_steps() == [1]


def test_previous_results_keep_evaluations_up_to_the_resumed_step(tmp_path):
  folder = _folder(tmp_path)
  folder.write_results(
    {
      "before": {"accuracy": 0.1},
      "during": [{"step": 2, "accuracy": 0.2}, {"step": 4, "accuracy": 0.3}],
      "after": {"accuracy": 0.4},
      "gain": {"gain": 0.3},
    }
  )
  kept = folder.previous_results(3)
  assert kept == {"before": {"accuracy": 0.1}, "during": [{"step": 2, "accuracy": 0.2}], "after": None, "gain": None}
  kept["during"].append({"step": 5})  # a fresh dict each time
  assert folder.previous_results(3)["during"] == [{"step": 2, "accuracy": 0.2}]


def test_resume_sets_aside_checkpoints_that_do_not_read_back_or_hold_nan(tmp_path, caplog):
  """Step 3's checkpoint has a truncated data file and step 2's holds a NaN: the rerun resumes from
  step 1 and names both, with the reason, in a warning."""
  folder = _folder(tmp_path)
  for update, value in ((1, 1.0), (2, float("nan")), (3, 1.0)):
    _checkpoint(folder, update, value)
  data = max(
    glob.glob(os.path.join(folder.path, "checkpoints", "actor", "3", "**", "d", "*"), recursive=True),
    key=os.path.getsize,
  )
  with open(data, "r+b") as f:
    f.truncate(10)
  _rows(folder, [1, 2, 3])
  with caplog.at_level(logging.WARNING):
    assert folder.resume() == 1
  assert folder.saved_steps() == [1]
  warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert any(w.startswith("The checkpoint of step 3 is set aside") and "does not read back" in w for w in warnings)
  assert any(w.startswith("The checkpoint of step 2 is set aside") and "kernel" in w and "NaN" in w for w in warnings)
  set_aside = os.listdir(os.path.join(folder.path, "checkpoints", "set_aside"))
  assert sorted(name.split("_")[0] for name in set_aside) == ["2", "3"]


def _run(tmp_path, *overrides) -> RunFolder:
  """A run's folder after it checked its config against the folder's config.yml and wrote its own."""
  cfg = make_config(f"base_output_directory={tmp_path}", "run_name=run", *overrides)
  folder = RunFolder(cfg.run, Steps.of(cfg.train, cfg.algorithm))
  folder.check_config(cfg)
  folder.write_config(cfg)
  return folder


def test_a_rerun_that_changes_what_shapes_training_is_refused_naming_old_and_new_values(tmp_path):
  """A rerun with another learning rate and dataset used to resume silently."""
  _run(tmp_path, "learning_rate=0.001")
  with pytest.raises(
    errors.ConfigError,
    match=r"run folder .*run holds a run whose config.yml sets keys that shape training otherwise \(dataset_name: "
    r"'gsm8k' -> 'svamp'; learning_rate: 0.001 -> 0.5\); .* resume_with_changes=true",
  ):
    _run(tmp_path, "learning_rate=0.5", "dataset_name=svamp")
  config = yaml.safe_load((tmp_path / "run" / "config.yml").read_text())
  assert config["learning_rate"] == 0.001 and config["dataset_name"] == "gsm8k"  # the run's own, kept


def test_a_rerun_may_change_where_it_writes_how_it_evaluates_and_its_device_layout(tmp_path):
  _run(tmp_path, "eval_batch_size=8")
  _run(
    tmp_path,
    "eval_batch_size=4",
    "log_level=debug",
    "checkpoint_period=2",
    "ici_fsdp_parallelism=2",
    "remat_policy=full",
  )
  assert yaml.safe_load((tmp_path / "run" / "config.yml").read_text())["eval_batch_size"] == 4


def test_resume_with_changes_accepts_them_and_config_yml_records_them(tmp_path):
  _run(tmp_path, "learning_rate=0.001")
  _run(tmp_path, "learning_rate=0.5", "resume_with_changes=true")
  _run(tmp_path, "learning_rate=0.5", "num_batches=9", "resume_with_changes=true")
  text = (tmp_path / "run" / "config.yml").read_text()
  first, second = text.splitlines()[:2]
  assert first.endswith("resumed with changes: learning_rate: 0.001 -> 0.5")
  assert second.endswith("resumed with changes: num_batches: 6 -> 9")
  config = yaml.safe_load(text)
  assert config["learning_rate"] == 0.5 and config["num_batches"] == 9 and config["resume_with_changes"] is True


def test_a_folder_needs_room_for_two_checkpoints(tmp_path, monkeypatch):
  folder = _folder(tmp_path)
  usage = shutil.disk_usage(tmp_path)
  monkeypatch.setattr(shutil, "disk_usage", lambda path: usage._replace(free=1_000_000))
  folder.check_space(500_000)
  with pytest.raises(
    errors.ConfigError,
    match=rf"base_output_directory={tmp_path}: 1,000,000 bytes \(0.00 GB\) free on its filesystem, but two "
    r"checkpoints of this run \(parameters and optimizer state\) need 1,000,002 bytes",
  ):
    folder.check_space(500_001)


def test_a_failed_save_leaves_only_complete_checkpoints(tmp_path):
  """After a save that found the disk full, what Orbax left of it is deleted and the last complete
  checkpoint whose steps' metrics rows are on disk (the one a rerun resumes from) is reported."""
  folder = _folder(tmp_path)
  for update in (1, 2):
    _checkpoint(folder, update)
    (tmp_path / "run" / "checkpoints" / "actor" / str(update) / "commit_success.txt").write_text("ok")
  os.makedirs(tmp_path / "run" / "checkpoints" / "actor" / "3.orbax-checkpoint-tmp-7" / "model_params")
  (tmp_path / "run" / "metrics.jsonl").write_text('{"step": 1}\n')
  assert folder.drop_unfinished_checkpoints() == 1  # step 2's row never reached the disk
  assert sorted(os.listdir(tmp_path / "run" / "checkpoints" / "actor")) == ["1", "2"]
  (tmp_path / "run" / "metrics.jsonl.pending").write_text('[{"step": 2}]')
  assert folder.drop_unfinished_checkpoints() == 2


def test_a_full_disk_is_recognised_in_orbax_s_errors():
  """Orbax's array writes fail as ValueErrors carrying TensorStore's message; ours as OSError."""
  tensorstore = ValueError("RESOURCE_EXHAUSTED: Error writing \"x\": No space left on device [os_error_code='28']")
  try:
    try:
      raise tensorstore
    except ValueError as e:
      raise RuntimeError("Save Finalize thread failed") from e
  except RuntimeError as e:
    assert storage.no_space(e)
  assert storage.no_space(OSError(errno.ENOSPC, "full"))
  assert not storage.no_space(OSError(errno.EACCES, "denied")) and not storage.no_space(ValueError("other"))


def test_a_storage_server_that_does_not_answer_is_recognised():
  """gcsfs's errors for a refused connection (aiohttp's, from a real request to a closed port) and
  TensorStore's text for one (as Orbax raises it, wrapped) are storage.unreachable; others are not."""
  import asyncio
  import socket

  import aiohttp

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]  # closed once the block ends: connections are refused

  async def request():
    async with aiohttp.ClientSession() as session:
      await session.get(f"http://127.0.0.1:{port}/")

  with pytest.raises(aiohttp.ClientError) as refused:
    asyncio.run(request())
  assert storage.unreachable(refused.value)
  tensorstore = ValueError(
    'ABORTED: Error writing "embed.value/0.0" in OCDBT database at gs://bkt/r/: All 5 retry attempts failed: CURL '
    "error Could not connect to server: Failed to connect to 127.0.0.1 port 9 [curl_code='7']"
  )
  try:
    try:
      raise tensorstore
    except ValueError as e:
      raise RuntimeError("Save Finalize thread failed") from e
  except RuntimeError as e:
    assert storage.unreachable(e)
  assert not storage.unreachable(FileNotFoundError("gs://bkt/x")) and not storage.unreachable(ValueError("other"))


def test_orbax_s_tensorstore_requests_to_gcs_give_up_within_the_stated_retries():
  from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

  from maxtext.checkpoint_conversion import orbax_checkpoint  # noqa: F401 (sets the bound)

  for use_ocdbt in (True, False):
    spec = ts_utils.get_ts_context(use_ocdbt=use_ocdbt).spec.to_json()
    assert spec["gcs_request_retries"] == {"max_retries": 5, "max_delay": "16s"}  # initial_delay: 1s, the default


def test_orbax_s_logged_storage_faults_lose_their_tracebacks_unless_debugging():
  import logging

  def record(exc):
    return logging.LogRecord("absl", logging.ERROR, "f", 1, "save failed", None, (type(exc), exc, None))

  full = record(OSError(errno.ENOSPC, "No space left on device"))
  assert not storage.fault_tracebacks(full) and full.levelname == "DEBUG"
  assert storage.fault_tracebacks(record(ValueError("a bug")))
