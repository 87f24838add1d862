"""The run folder on real files: what a rerun resumes from, what it sets aside and what it keeps."""

import glob
import json
import logging
import os

import jax.numpy as jnp
from flax import nnx

from maxtext.checkpoint_conversion import orbax_checkpoint
from maxtext.trainers.post_train.rl.run_folder import RunFolder
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
