"""Agentic GRPO with trainer and sampler on separate devices (2 host devices): off_policy_steps and
max_concurrency combinations finish without deadlock (bounded by the subprocess timeout) and the
observed staleness never exceeds rl.off_policy_steps."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

_RUNS = textwrap.dedent("""
    import json, sys
    from maxtext.trainers.post_train.rl import train_rl
    out, combos, steps = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
    for off_policy, concurrency in combos:
      run = f"o{off_policy}_c{concurrency}"
      args = ["train_rl", "rl.yml", "model_name=qwen3-tiny", f"num_batches={steps}", "batch_size=2",
              "rl.num_generations=2", "max_response_length=8", "num_test_batches=1", "eval_batch_size=2",
              "rl.use_agentic_rollout=true", f"rl.off_policy_steps={off_policy}",
              f"rl.max_concurrency={concurrency}", "trainer_devices_fraction=0.5",
              "sampler_devices_fraction=0.5", f"base_output_directory={out}", f"run_name={run}"]
      assert train_rl.main(args) == 0, run
""")


def _run(tmp_path, combos, steps, timeout):
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
  proc = subprocess.run(
    [sys.executable, "-c", _RUNS, str(tmp_path), json.dumps(combos), str(steps)],
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  for off_policy, concurrency in combos:
    with open(tmp_path / f"o{off_policy}_c{concurrency}" / "metrics.jsonl", encoding="utf-8") as f:
      rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    assert max(r["staleness/max"] for r in rows) <= off_policy
    assert all(0 <= r["staleness/mean"] <= r["staleness/max"] for r in rows)


def test_split_mesh_off_policy_runs_finish_within_the_staleness_bound(tmp_path):
  _run(tmp_path, [[2, 64]], steps=3, timeout=600)  # the deadlock-prone case; the slow matrix has all nine


@pytest.mark.slow
def test_split_mesh_off_policy_matrix(tmp_path):
  _run(tmp_path, [[o, c] for o in (0, 1, 2) for c in (1, 8, 64)], steps=4, timeout=1800)
