"""A run folder's own files after a kill or a crash: a torn or zero-filled metrics.jsonl, a cut
metrics.jsonl.pending or eval.json are set aside into side files named in one warning and the rerun
resumes; rewrites are atomic, so a resume killed while it rewrites metrics.jsonl loses nothing."""

import glob
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap

import jax.numpy as jnp
import pytest
from flax import nnx

from maxtext.checkpoint_conversion import orbax_checkpoint
from maxtext.trainers.post_train.rl.run_folder import RunFolder
from maxtext.utils import metrics_file, safe_files
from maxtext.utils.steps import Steps
from tests.conftest import make_config

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _folder(tmp_path) -> RunFolder:
  cfg = make_config(f"base_output_directory={tmp_path}", "run_name=run")
  return RunFolder(cfg.run, Steps.of(cfg.train, cfg.algorithm))


def _checkpoints(folder: RunFolder, *updates: int) -> None:
  """Real Orbax checkpoints of a small module."""
  model = nnx.Linear(4, 4, rngs=nnx.Rngs(0))
  model.kernel[...] = jnp.ones((4, 4))
  for update in updates:
    orbax_checkpoint.save_params(os.path.join(folder.path, "checkpoints", "actor"), model, update)


def _lines(*steps: int) -> str:
  return "".join(json.dumps({"step": s, "loss": 0.1 * s}) + "\n" for s in steps)


def _steps_in(path) -> list[int]:
  with open(path, encoding="utf-8") as f:
    return [json.loads(line)["step"] for line in f]


def _side_files(path) -> list[str]:
  return glob.glob(f"{path}{safe_files.DAMAGED}*")


def _warnings(caplog) -> list[str]:
  return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and r.name.startswith("maxtext")]


@pytest.mark.parametrize(
  "tail",
  [
    '{"step": 3, "lo',  # a kill cut the last row short
    "\0" * 4096,  # a crash left the tail of the file zero-filled
    '{"step": 3, "loss": 0.3}\n' + "\0" * 100,
  ],
  ids=["torn line", "zero-filled tail", "zeros after the last row"],
)
def test_a_damaged_metrics_file_is_set_aside_and_the_rerun_resumes_from_the_rows_that_read_back(tmp_path, caplog, tail):
  folder = _folder(tmp_path)
  _checkpoints(folder, 1, 2, 3)
  damaged = _lines(1, 2) + tail
  with open(folder.metrics, "w", encoding="utf-8") as f:
    f.write(damaged)
  resumes = 3 if tail.startswith('{"step": 3, "loss"') else 2  # step 3's row read back, or it was lost
  with caplog.at_level(logging.WARNING):
    assert folder.resume() == resumes
  assert folder.saved_steps() == list(range(1, resumes + 1))  # the checkpoint without its row is set aside
  assert _steps_in(folder.metrics) == list(range(1, resumes + 1))
  [side] = _side_files(folder.metrics)
  with open(side, encoding="utf-8") as f:
    assert f.read() == damaged  # kept as it was
  [warning] = _warnings(caplog)
  assert "\n" not in warning and os.path.basename(side) in warning and f"the first line {resumes + 1}," in warning


def test_a_broken_pending_file_is_set_aside_and_its_steps_count_as_not_logged(tmp_path, caplog):
  folder = _folder(tmp_path)
  _checkpoints(folder, 1, 2)
  with open(folder.metrics, "w", encoding="utf-8") as f:
    f.write(_lines(1))
  pending = metrics_file.pending(folder.metrics)
  with open(pending, "w", encoding="utf-8") as f:
    f.write('[{"step": 2, "loss": 0.2}, {"st')  # cut short (written by an earlier version in place)
  with caplog.at_level(logging.WARNING):
    assert folder.resume() == 1
  assert not os.path.exists(pending) and len(_side_files(pending)) == 1
  assert _steps_in(folder.metrics) == [1]
  assert any(os.path.basename(_side_files(pending)[0]) in w for w in _warnings(caplog))


def test_a_cut_eval_json_is_set_aside_and_the_evaluations_start_afresh(tmp_path, caplog):
  folder = _folder(tmp_path)
  folder.write_results({"before": {"accuracy": 0.5}, "during": [{"step": 1, "accuracy": 0.6}], "after": None})
  with open(folder.evaluations, "r+b") as f:
    f.truncate(30)
  with caplog.at_level(logging.WARNING):
    assert folder.previous_results(2) == {"before": None, "during": [], "after": None, "gain": None}
  [side] = _side_files(folder.evaluations)
  assert not os.path.exists(folder.evaluations) and os.path.getsize(side) == 30
  [warning] = _warnings(caplog)
  assert "eval.json" in warning and os.path.basename(side) in warning and "\n" not in warning


def test_rows_of_a_run_killed_before_its_first_checkpoint_are_not_logged_twice(tmp_path):
  """With checkpoint_period above the steps a run reached, its rerun starts at step 0: the rows the
  killed run wrote go, or every step would get a second row."""
  folder = _folder(tmp_path)
  os.makedirs(folder.path)
  with open(folder.metrics, "w", encoding="utf-8") as f:
    f.write(_lines(1, 2))
  assert folder.resume() == 0
  assert _steps_in(folder.metrics) == []


def test_a_rewrite_that_fails_leaves_the_file_as_it_was(tmp_path):
  path = str(tmp_path / "eval.json")
  with open(path, "w", encoding="utf-8") as f:
    f.write("old")
  with pytest.raises(RuntimeError), safe_files.replaced(path) as f:
    f.write("new, in part")
    raise RuntimeError("stop")
  assert os.listdir(tmp_path) == ["eval.json"]
  with open(path, encoding="utf-8") as f:
    assert f.read() == "old"


# The resume's rewrite of metrics.jsonl, in a process of its own that stops once it has written part
# of the new file: the test kills it there with SIGKILL.
_RESUME_THEN_STALL = textwrap.dedent(
  """
  import json, sys, time
  from maxtext.trainers.post_train.rl.run_folder import RunFolder
  from maxtext.utils import metrics_file
  from maxtext.utils.steps import Steps
  from tests.conftest import make_config

  dumps = json.dumps

  def stalling_dumps(value, *args, **kwargs):
    if isinstance(value, dict) and value.get("step") == 2:  # the rewrite wrote row 1 and comes to row 2
      print("rewriting", flush=True)
      time.sleep(600)
    return dumps(value, *args, **kwargs)

  metrics_file.json.dumps = stalling_dumps
  cfg = make_config(f"base_output_directory={sys.argv[1]}", "run_name=run")
  RunFolder(cfg.run, Steps.of(cfg.train, cfg.algorithm)).resume()
  """
)


def test_a_resume_killed_while_it_rewrites_metrics_jsonl_loses_nothing(tmp_path):
  """Checkpoints of steps 1 and 2, rows 1 and 2 in metrics.jsonl and row 3 pending: a resume killed
  while it rewrites metrics.jsonl leaves it whole, so the next resume still resumes from step 2."""
  folder = _folder(tmp_path)
  _checkpoints(folder, 1, 2)
  with open(folder.metrics, "w", encoding="utf-8") as f:
    f.write(_lines(1, 2))
  with open(metrics_file.pending(folder.metrics), "w", encoding="utf-8") as f:
    json.dump([{"step": 3, "loss": 0.3}], f)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.path.join(SRC, "..")]), JAX_PLATFORMS="cpu")
  proc = subprocess.Popen(
    [sys.executable, "-c", _RESUME_THEN_STALL, str(tmp_path)], env=env, stdout=subprocess.PIPE, text=True
  )
  try:
    assert proc.stdout.readline() == "rewriting\n"  # ends when the child prints it or exits
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
  assert _steps_in(folder.metrics) == [1, 2]
  assert folder.resume() == 2
  assert folder.saved_steps() == [1, 2]
  assert _steps_in(folder.metrics) == [1, 2]
