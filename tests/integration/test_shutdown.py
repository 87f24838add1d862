"""Stopping on purpose: SIGTERM finishes the current step, checkpoints, flushes metrics and exits; a
rerun resumes and draws what an uninterrupted run draws; a NaN reward stops the run and keeps the
last good checkpoint."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from maxtext.checkpoint_conversion import orbax_checkpoint
from maxtext.trainers.post_train.rl import train_rl

TINY = [
  "rl.yml",
  "model_name=qwen3-tiny",
  "batch_size=2",
  "rl.num_generations=2",
  "max_response_length=16",
  "num_test_batches=1",
  "eval_batch_size=2",
  "checkpoint_period=100",
  "learning_rate=1e-3",
  "warmup_steps_fraction=0",
]


# Timings, and the prefix reuse so far in the process (a resumed one began at the resume): what a resumed
# run's metrics rows may differ from an uninterrupted run's in.
TIMING = (
  "step_time_s",
  "compile_s",
  "trainer/idle_fraction",
  "rollout/prefix_reuse_fraction",
  "rollout/decode_tokens_per_s",
  "rollout/decode_gb_per_s",
)


def untimed(row: dict) -> dict:
  """A metrics row without its TIMING keys."""
  return {k: v for k, v in row.items() if k not in TIMING}


def _rows(run):
  with open(os.path.join(run, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _start(args):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  return subprocess.Popen(
    [sys.executable, "-m", "maxtext.trainers.post_train.rl.train_rl", *args],
    env=env,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def _wait_for(proc, path) -> None:
  """Returns once `path` exists, failing (with the run's stderr) if the run ends or 300 s pass first."""
  deadline = time.time() + 300
  while not os.path.exists(path):
    assert proc.poll() is None and time.time() < deadline, proc.communicate()[1][-3000:]
    time.sleep(0.2)


def _terminate_after_first_step(proc, run):
  """SIGTERM once the first training step's scalars arrived; returns (exit code, stderr, seconds to exit)."""
  _wait_for(proc, os.path.join(run, "metrics.jsonl.pending"))
  proc.send_signal(signal.SIGTERM)
  sent = time.time()
  _, err = proc.communicate(timeout=180)
  return proc.returncode, err, time.time() - sent


@pytest.mark.parametrize("agentic", [False, pytest.param(True, marks=pytest.mark.slow)])  # agentic: ~2 min
def test_sigterm_checkpoints_the_finished_steps_and_a_rerun_completes_them(tmp_path, agentic):
  steps = 3
  extra = ["rl.use_agentic_rollout=true", "rl.off_policy_steps=1", "rl.max_concurrency=8"] if agentic else []
  args = [*TINY, f"num_batches={steps}", *extra, f"base_output_directory={tmp_path}"]
  run = str(tmp_path / "stopped")
  code, err, took = _terminate_after_first_step(_start([*args, "run_name=stopped"]), run)
  assert code == 128 + signal.SIGTERM, err[-3000:]
  assert "stopped: stopped by SIGTERM after step" in err and took < 120
  stopped_at = int(err.split("stopped by SIGTERM after step ")[1].split(";")[0])
  assert 1 <= stopped_at < steps
  assert orbax_checkpoint.steps(os.path.join(run, "checkpoints", "actor"))[-1] == stopped_at
  assert [r["step"] for r in _rows(run)] == list(range(1, stopped_at + 1))
  assert os.path.isfile(os.path.join(run, "report.md"))

  assert train_rl.main(["train_rl", *args, "run_name=stopped"]) == 0  # the same command resumes
  resumed = _rows(run)
  assert [r["step"] for r in resumed] == list(range(1, steps + 1))
  evals = json.load(open(os.path.join(run, "eval.json"), encoding="utf-8"))
  assert evals["before"] and evals["after"]  # before training: from the first launch
  if not agentic:  # synchronous sampling is reproducible: the rerun draws what one run would have,
    # and decoding a token per dispatch draws what decoding chunks of 16 (the default) draws.
    assert train_rl.main(["train_rl", *args, "run_name=straight", "decode_steps_per_dispatch=1"]) == 0
    straight = _rows(str(tmp_path / "straight"))
    straight_evals = json.load(open(tmp_path / "straight" / "eval.json", encoding="utf-8"))
    completions = lambda results: [p["completion"] for e in results["after"]["examples"] for p in e["passes"]]
    assert completions(evals) == completions(straight_evals)
    for a, b in zip(resumed, straight):
      assert untimed(a) == untimed(b)


def test_nan_reward_stops_and_keeps_the_last_good_checkpoint(tmp_path, capsys):
  rewards = tmp_path / "rewards.py"
  rewards.write_text(
    "calls = 0\n"
    "def flaky(prompts, completions, tmvp_config, **kwargs):\n"
    "  global calls\n"
    "  calls += 1\n"
    "  return [float('nan') if calls == 2 else 1.0 for _ in completions]\n"
  )
  args = [
    *TINY,
    "num_batches=4",
    "checkpoint_period=1",
    f"reward_functions_path={rewards}",
    "reward_functions=[flaky]",
    f"base_output_directory={tmp_path}",
    "run_name=nan",
  ]
  assert train_rl.main(["train_rl", *args]) == 1
  err = capsys.readouterr().err
  # The reward is named, not the parameters: the run stops on it before step 2's update.
  assert re.search(
    r"rewards/flaky: not finite at step 2; stopped without saving it: a rerun resumes from the checkpoint of step 1",
    err,
  )
  run = tmp_path / "nan"
  assert orbax_checkpoint.steps(str(run / "checkpoints" / "actor")) == [1]
  rows = _rows(str(run))
  assert [r["step"] for r in rows] == [1] and rows[0]["rewards/flaky"] == 1.0


def test_a_diverging_last_step_is_not_saved_and_exits_1(tmp_path, capsys):
  """learning_rate=1e30 keeps step 1's values finite and makes step 2's (the last) update NaN: the
  run stops with exit 1 before saving it, so a rerun resumes from step 1's checkpoint. The reward
  differs within every group, so each step has a gradient (a random model's replies to the default
  task may all score alike)."""
  rewards = tmp_path / "rewards.py"
  rewards.write_text("def varied(completions, **kwargs):\n  return [float(i % 2) for i in range(len(completions))]\n")
  args = [
    *TINY,
    "num_batches=2",
    "checkpoint_period=1",
    "learning_rate=1e30",
    f"reward_functions_path={rewards}",
    "reward_functions=[varied]",
    f"base_output_directory={tmp_path}",
  ]
  assert train_rl.main(["train_rl", *args, "run_name=diverged"]) == 1
  err = capsys.readouterr().err
  assert "not finite at step 2; stopped without saving it: a rerun resumes from the checkpoint of step 1" in err
  run = tmp_path / "diverged"
  assert orbax_checkpoint.steps(str(run / "checkpoints" / "actor")) == [1]
  params = orbax_checkpoint.restore_arrays(str(run / "checkpoints" / "actor" / "1"))
  assert all(np.isfinite(a).all() for a in params.values())
  assert [r["step"] for r in _rows(str(run))] == [1]


def test_a_rerun_sets_a_truncated_newest_checkpoint_aside_and_resumes_from_the_one_before(tmp_path):
  args = [*TINY, "num_batches=2", "checkpoint_period=1", f"base_output_directory={tmp_path}", "run_name=cut"]
  assert train_rl.main(["train_rl", *args]) == 0
  actor = tmp_path / "cut" / "checkpoints" / "actor"
  assert orbax_checkpoint.steps(str(actor)) == [1, 2]
  data = max((actor / "2").rglob("d/*"), key=lambda p: p.stat().st_size)
  with open(data, "r+b") as f:
    f.truncate(100)
  proc = _start(args)  # the same command, as a scheduler's restart runs it
  _, err = proc.communicate(timeout=300)
  assert proc.returncode == 0, err[-3000:]
  assert "The checkpoint of step 2 is set aside (checkpoints/set_aside/): " in err and "does not read back" in err
  assert "Resuming from the checkpoint of step 1" in err
  assert orbax_checkpoint.steps(str(actor)) == [1, 2]  # step 2 trained again
  assert [r["step"] for r in _rows(str(tmp_path / "cut"))] == [1, 2]


def test_two_quick_sigints_end_in_a_few_lines_with_exit_130_keeping_the_finished_steps(tmp_path):
  """The second SIGINT abandons the step in flight (or, once the stop has begun, is logged). It used
  to print some 150 lines of tracebacks; now the run says what happened and what it kept, and exits
  130."""
  tiny = [a for a in TINY if not a.startswith(("num_test_batches=", "eval_batch_size="))]
  args = [*tiny, "num_batches=3", "num_test_batches=0", "checkpoint_period=1", f"base_output_directory={tmp_path}"]
  run = str(tmp_path / "r")
  proc = _start([*args, "run_name=r"])
  try:
    _wait_for(proc, os.path.join(run, "metrics.jsonl.pending"))
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=180)
  finally:
    proc.kill()
    proc.wait()
  assert proc.returncode == 128 + signal.SIGINT, err[-3000:]
  assert "Traceback" not in err, err[-3000:]
  after = err[err.index("SIGINT received: stopping after the current step") :].splitlines()
  assert len(after) <= 6, after
  kept = orbax_checkpoint.steps(os.path.join(run, "checkpoints", "actor"))[-1]
  assert re.fullmatch(  # the second abandons the step in flight, or the stop once that step has ended (its
    # checkpoint kept or not), or is logged where the stop had begun
    rf"stopped: stopped by (a second SIGINT (during step {kept + 1}, which is abandoned|after step \d, while the run "
    rf"was stopping); the checkpoint of step {kept} is kept with its metrics|SIGINT after step {kept}; the checkpoint "
    rf"of step {kept} is saved): rerun the same command to resume",
    after[-1],
  ), after[-1]
  assert [r["step"] for r in _rows(run)][:kept] == list(range(1, kept + 1))


@pytest.mark.slow  # a process of its own, a minute
def test_a_second_sigterm_ends_a_run_whose_reward_function_never_returns_within_seconds(tmp_path):
  """A preemption's SIGTERM, then another, while step 2's reward function sleeps for good (it runs in
  a worker process): the workers are killed, the run exits 143 within seconds keeping step 1's
  checkpoint. It used to stay up past the SIGKILL a cluster sends after its grace period."""
  marker = tmp_path / "hung"
  rewards = tmp_path / "rewards.py"
  rewards.write_text(
    "import time\ncalls = 0\n"
    "def slow(prompts, completions, **kwargs):\n"
    "  global calls\n  calls += 1\n"
    f"  if calls >= 2:\n    open({str(marker)!r}, 'w').close()\n    time.sleep(1000)\n"
    "  return [1.0 for _ in completions]\n"
  )
  tiny = [a for a in TINY if not a.startswith(("num_test_batches=", "eval_batch_size="))]
  args = [*tiny, "num_batches=4", "num_test_batches=0", "checkpoint_period=1", f"base_output_directory={tmp_path}"]
  args += [f"reward_functions_path={rewards}", "reward_functions=[slow]", "run_name=r"]
  proc = _start(args)
  try:
    _wait_for(proc, marker)
    proc.send_signal(signal.SIGTERM)
    time.sleep(2)
    proc.send_signal(signal.SIGTERM)
    second = time.monotonic()
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - second
  finally:
    proc.kill()
    proc.wait()
  assert proc.returncode == 128 + signal.SIGTERM and took < 20, (took, err[-3000:])
  assert "stopped: stopped by a second SIGTERM during step 2, which is abandoned; the checkpoint of step 1" in err
  assert orbax_checkpoint.steps(str(tmp_path / "r" / "checkpoints" / "actor")) == [1]
