"""Runs killed with SIGKILL, and reruns refused, on real tiny runs: the rerun resumes from the newest
checkpoint that reads back with one metrics row per trained step, and a refused rerun leaves the
folder's config.yml as it was. (The resume's own rewrite of the run files, killed: see
tests/unit/test_damaged_run_files.py.)"""

import collections
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from maxtext.checkpoint_conversion import orbax_checkpoint
from maxtext.trainers.post_train.rl import train_rl
from tests.integration.test_shutdown import _rows, untimed

TINY = [
  "rl.yml",
  "model_name=qwen3-tiny",
  "batch_size=2",
  "rl.num_generations=2",
  "max_response_length=8",
  "num_test_batches=0",
  "checkpoint_period=1",
]


def _steps(run) -> list[int]:
  with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line)["step"] for line in f]


def _kill_when(args, appears: str, timeout: float = 600) -> None:
  """Starts the run and kills it with SIGKILL as soon as a path matching the glob `appears` exists."""
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.Popen(
    [sys.executable, "-m", "maxtext.trainers.post_train.rl.train_rl", *args],
    env=env,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.PIPE,
    text=True,
  )
  try:
    deadline = time.time() + timeout
    while not glob.glob(appears):
      assert proc.poll() is None, f"the run ended before {appears} appeared: {proc.communicate()[1][-3000:]}"
      assert time.time() < deadline, f"{appears} did not appear in {timeout} s"
      time.sleep(0.02)
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)


@pytest.mark.slow  # two agentic runs: ~3 min
def test_an_agentic_run_killed_as_a_checkpoint_begins_resumes_from_the_one_before(tmp_path, caplog):
  """Agentic runs hold their metrics rows (late scalars follow): the rows of the steps a checkpoint
  holds are on disk before it, so a kill as step 2's checkpoint is being written keeps step 1's."""
  args = [
    *TINY,
    "num_batches=3",
    "rl.use_agentic_rollout=true",
    "rl.off_policy_steps=1",
    "rl.max_concurrency=8",
    f"base_output_directory={tmp_path}",
    "run_name=agentic",
  ]
  run = str(tmp_path / "agentic")
  _kill_when(args, os.path.join(run, "checkpoints", "actor", "2.orbax-checkpoint-tmp*"))
  assert orbax_checkpoint.steps(os.path.join(run, "checkpoints", "actor")) == [1]
  with caplog.at_level("INFO"):
    assert train_rl.main(["train_rl", *args]) == 0
  assert "Resuming from the checkpoint of step 1 (newer checkpoints set aside: []" in caplog.text
  assert _steps(run) == [1, 2, 3]
  # the episodes of the steps after the checkpoint (scored ahead, off policy) were cut and scored again
  with open(os.path.join(run, "episodes.jsonl"), encoding="utf-8") as f:
    per_step = collections.Counter(json.loads(line)["step"] for line in f)
  assert sorted(per_step) == [1, 2, 3] and len(set(per_step.values())) == 1, per_step


@pytest.mark.slow  # two standard runs: ~1 min
def test_a_run_killed_as_soon_as_a_checkpoint_lands_resumes_from_it(tmp_path, caplog):
  """Step 2's trainer scalars arrive only once its checkpoint has been asked for, and the checkpoint
  lands while step 3 samples: step 2's row is on disk (in the pending rows) as soon as they arrive,
  so a kill the moment checkpoint 2 is complete resumes from it, not from step 1."""
  args = [*TINY, "num_batches=3", f"base_output_directory={tmp_path}", "run_name=landed"]
  run = str(tmp_path / "landed")
  _kill_when(args, os.path.join(run, "checkpoints", "actor", "2", "_CHECKPOINT_METADATA"))
  assert 2 in orbax_checkpoint.steps(os.path.join(run, "checkpoints", "actor"))
  with caplog.at_level("INFO"):
    assert train_rl.main(["train_rl", *args]) == 0
  assert "Resuming from the checkpoint of step 2 (newer checkpoints set aside: []" in caplog.text
  assert _steps(run) == [1, 2, 3]


def test_a_refused_rerun_leaves_config_yml_as_it_was(tmp_path, capsys):
  """A folder whose config.yml was removed takes any settings, until its checkpoint refuses them
  (here the decoder layout): the refused rerun writes no config.yml, so the first command resumes."""
  args = [*TINY, "num_batches=1", f"base_output_directory={tmp_path}", "run_name=refused"]
  assert train_rl.main(["train_rl", *args]) == 0
  config = tmp_path / "refused" / "config.yml"
  config.unlink()
  assert train_rl.main(["train_rl", *args, "scan_layers=false"]) == 2
  assert "scan_layers=false: the run's checkpoints hold the decoder layers stacked" in capsys.readouterr().err
  assert not config.exists()


# Fractional rewards that differ between completions, so the critic has returns to fit.
SPREAD_REWARD = (
  "def spread(prompts, completions, **kwargs):\n"
  "  return [float(sum((i + 1) * ord(ch) for i, ch in enumerate(c)) % 1000) / 1000 for c in completions]\n"
)


@pytest.mark.slow  # two PPO runs and a kill (65 s); the fast suite keeps the critic's save and restore
# (test_critic) and a killed GRPO run resuming exactly (above)
def test_a_killed_ppo_run_resumes_its_critic_to_the_metrics_of_a_run_never_stopped(tmp_path, caplog):
  """PPO (one sample per prompt, two critic updates a step, one critic-only warmup step): killed with
  SIGKILL as soon as step 2's checkpoint lands, the rerun restores the critic with the actor and
  logs what a run that never stopped logs, critic metrics included."""
  (tmp_path / "reward.py").write_text(SPREAD_REWARD)
  args = [
    *TINY,
    "num_batches=3",
    "batch_size=4",
    "rl.algorithm=ppo",
    "rl.num_generations=1",
    "critic.mini_batch_size=2",
    "critic.warmup_steps=1",
    "learning_rate=1e-3",
    "warmup_steps_fraction=0",
    f"reward_functions_path={tmp_path / 'reward.py'}",
    "reward_functions=[spread]",
    f"base_output_directory={tmp_path}",
  ]
  killed = str(tmp_path / "killed")
  _kill_when([*args, "run_name=killed"], os.path.join(killed, "checkpoints", "actor", "2", "_CHECKPOINT_METADATA"))
  assert 2 in orbax_checkpoint.steps(os.path.join(killed, "checkpoints", "actor"))
  assert os.path.isdir(os.path.join(killed, "checkpoints", "actor", "2", "critic_params"))
  with caplog.at_level("INFO"):
    assert train_rl.main(["train_rl", *args, "run_name=killed"]) == 0
  assert "Restored the critic from the checkpoint of update 2" in caplog.text
  assert train_rl.main(["train_rl", *args, "run_name=straight"]) == 0
  resumed, straight = _rows(killed), _rows(str(tmp_path / "straight"))
  assert [r["step"] for r in resumed] == [1, 2, 3]
  for a, b in zip(resumed[:2], straight[:2]):  # the killed run's rows (a late scalar may be missing)
    assert untimed(a) == {k: v for k, v in untimed(b).items() if k in a}
  assert untimed(resumed[2]) == untimed(straight[2])  # trained after the resume
  # step 1 trains the critic alone: the policy's loss has no gradient until step 2 (whose loss is about 0:
  # at ratio 1 it is the mean of whitened advantages)
  assert straight[0]["grad_norm"] == 0.0 and straight[1]["grad_norm"] > 0.1
  for row in straight:
    assert {"critic/value_loss", "critic/vf_clipfrac", "critic/explained_variance", "pg_clipfrac", "entropy"} <= set(
      row
    )
  assert straight[-1]["critic/value_loss"] < straight[0]["critic/value_loss"]
