"""Past one process: train_rl as several JAX processes on this machine (the multi-controller runtime a
TPU/GPU slice runs, CPU collectives over gloo), started by maxtext.utils.launch_local with only the
variables a cluster sets. A 2 processes x 2 devices job gives what 1 process x 4 devices gives."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from maxtext.utils import launch_local

TINY = [
  "rl.yml",
  "model_name=qwen3-tiny",
  "batch_size=2",
  "rl.num_generations=2",
  "max_response_length=8",
  "num_test_batches=1",
  "eval_batch_size=4",
  "learning_rate=1e-3",
  "warmup_steps_fraction=0",
  "adam_weight_decay=0",
  "checkpoint_period=1",
]
# Agentic GRPO, each step sampled from the weights the previous one left (so runs compare step by step).
AGENTIC = ["rl.use_agentic_rollout=true", "rl.off_policy_steps=0", "batch_size=4"]
# PPO, one sample per prompt, two critic updates a step.
PPO = ["rl.algorithm=ppo", "rl.num_generations=1", "batch_size=4", "critic.mini_batch_size=2"]
TRAIN_RL = [sys.executable, "-m", "maxtext.trainers.post_train.rl.train_rl"]
_ENV = dict(os.environ, JAX_PLATFORMS="cpu")
_ENV.pop("XLA_FLAGS", None)


def launcher(processes: int, devices: int, command: list[str]) -> list[str]:
  """The command line that runs `command` as `processes` processes of `devices` CPU devices each."""
  return [
    sys.executable,
    "-m",
    "maxtext.utils.launch_local",
    "--processes",
    str(processes),
    "--devices-per-process",
    str(devices),
    "--",
    *command,
  ]


def _launch(
  processes: int, devices: int, args: list[str], timeout: int = 600, env: dict | None = None
) -> subprocess.CompletedProcess:
  command = launcher(processes, devices, [*TRAIN_RL, *args])
  return subprocess.run(command, env=env or _ENV, capture_output=True, text=True, timeout=timeout, check=False)


def assert_same_training(one: list[dict], other: list[dict], rewards_rtol: float = 1e-12) -> None:
  """metrics.jsonl rows of two runs of the same job: equal rewards, advantages and lengths (up to the
  order in which a step's groups are averaged: agentic groups arrive as they finish; rewards within
  rewards_rtol, where a model computes them), the loss and gradient norm within float tolerance."""
  exact = ("completions/", "generation/completions/")
  for a, b in zip(one, other, strict=True):
    mine = {k: v for k, v in a.items() if k.startswith(exact)}
    assert mine == pytest.approx({k: v for k, v in b.items() if k.startswith(exact)}, rel=1e-12, abs=1e-15)
    mine = {k: v for k, v in a.items() if k.startswith("rewards/")}
    theirs = {k: v for k, v in b.items() if k.startswith("rewards/")}
    assert mine == pytest.approx(theirs, rel=rewards_rtol, abs=max(1e-15, rewards_rtol * 1e-3))
    assert np.isclose(a["loss"], b["loss"], rtol=1e-4, atol=1e-6)
    assert np.isclose(a["grad_norm"], b["grad_norm"], rtol=1e-3)


def _multi_and_single(tmp_path, args: list[str], processes: int = 2, devices: int = 2, timeout: int = 600):
  """Runs `args` as `processes` x `devices` (run_name=multi) and as 1 process x 4 devices
  (run_name=single); returns the multi-process run and the two runs' metrics.jsonl rows."""
  multi = _launch(processes, devices, [*args, "run_name=multi"], timeout=timeout)
  assert multi.returncode == 0, multi.stdout[-4000:]
  env = dict(_ENV, XLA_FLAGS="--xla_force_host_platform_device_count=4")
  single = subprocess.run(
    [*TRAIN_RL, *args, "run_name=single"], env=env, capture_output=True, text=True, timeout=600, check=False
  )
  assert single.returncode == 0, single.stderr[-4000:]
  return multi, _rows(tmp_path / "single"), _rows(tmp_path / "multi")


def _rows(run_dir) -> list[dict]:
  with open(os.path.join(run_dir, "metrics.jsonl"), encoding="utf-8") as f:
    return [json.loads(line) for line in f]


def _reward_file(tmp_path) -> str:
  """A reward with spread inside groups (the random model's completions differ), so training moves."""
  path = tmp_path / "rewards.py"
  path.write_text(
    "def variety(prompts, completions, tmvp_config, **kwargs):\n  return [len(set(c)) / 10 for c in completions]\n"
  )
  return str(path)


_PLACEMENT = textwrap.dedent("""
    import json, jax, numpy as np
    from maxtext.utils import distributed, mesh as mesh_lib
    distributed.initialize()
    mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(1, 4, 1), mesh_lib.MESH_AXES)
    batch = {"ids": np.arange(8 * 3).reshape(8, 3), "odd": np.arange(6)}  # 6 rows do not split over 4 devices
    placed = mesh_lib.global_batch(batch, mesh)
    rows = sorted({int(s.data[r, 0]) // 3 for s in placed["ids"].addressable_shards for r in range(s.data.shape[0])})
    total = int(jax.jit(lambda x: x.sum())(placed["ids"]))
    print(json.dumps({"process": jax.process_index(), "rows": rows, "shape": list(placed["ids"].shape),
                      "total": total, "odd_replicated": placed["odd"].sharding.is_fully_replicated}))
""")


def test_each_process_places_its_own_rows_of_the_global_batch():
  """Every process holds the whole batch; the global array takes each row from the process whose
  devices hold it: the processes' rows are disjoint and cover the batch, and a global sum counts
  every row once."""
  proc = subprocess.run(
    launcher(2, 2, [sys.executable, "-c", _PLACEMENT]),
    env=_ENV,
    capture_output=True,
    text=True,
    timeout=300,
    check=False,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  reports = {}
  for line in proc.stdout.splitlines():
    prefix, _, text = line.partition(" ")
    if text.startswith("{"):
      reports[prefix] = json.loads(text)
  assert sorted(reports) == ["[p0]", "[p1]"]  # the launcher prefixes each process's output
  p0, p1 = reports["[p0]"], reports["[p1]"]
  assert p0["rows"] == [0, 1, 2, 3] and p1["rows"] == [4, 5, 6, 7]
  assert p0["shape"] == p1["shape"] == [8, 3]
  assert p0["total"] == p1["total"] == sum(range(24))
  assert p0["odd_replicated"] and p1["odd_replicated"]


def test_launcher_ends_every_process_when_one_fails():
  """One process exits 3 while the other would run for a minute: the launcher ends it and exits 3,
  each process's output behind its prefix."""
  code = (
    "import os, sys, time\nrank = int(os.environ['JAX_PROCESS_ID'])\n"
    "print('rank', rank, 'of', os.environ['JAX_NUM_PROCESSES'], os.environ['JAX_COORDINATOR_ADDRESS'])\n"
    "sys.stdout.flush()\ntime.sleep(0.5)\nsys.exit(3) if rank == 1 else time.sleep(60)"
  )
  start = time.monotonic()
  proc = subprocess.run(
    [
      sys.executable,
      "-m",
      "maxtext.utils.launch_local",
      "--processes",
      "2",
      "--port",
      "1234",
      "--",
      sys.executable,
      "-c",
      code,
    ],
    capture_output=True,
    text=True,
    timeout=60,
    check=False,
  )
  assert proc.returncode == 3 and time.monotonic() - start < 30, proc.stderr
  assert "[p0] rank 0 of 2 127.0.0.1:1234" in proc.stdout and "[p1] rank 1 of 2 127.0.0.1:1234" in proc.stdout
  assert "process 1 ended with exit code 3" in proc.stderr


@pytest.mark.slow  # 100-220 s; the fast suite keeps the multi-process batch placement and launcher tests
def test_two_processes_train_as_one_process_does(tmp_path):
  """Standard GRPO, 2 processes x 2 devices against 1 process x 4 devices, same seeds: the same
  rewards and completion lengths at every step (the second step samples from trained weights), the
  same loss within float tolerance, the same evaluation of every question once; process 0 alone
  writes the text files, every process writes its part of the checkpoints."""
  args = [
    *TINY,
    "num_batches=2",
    f"reward_functions_path={_reward_file(tmp_path)}",
    "reward_functions=[variety]",
    f"base_output_directory={tmp_path}",
  ]
  multi, one, two = _multi_and_single(tmp_path, args)
  assert "Process 0 of 2" in multi.stdout and "Process 1 of 2" in multi.stdout
  assert [r["step"] for r in two] == [1, 2] and all(r["rewards/variety"] > 0 for r in one)
  assert_same_training(one, two)
  with open(tmp_path / "single" / "eval.json", encoding="utf-8") as f:
    single_eval = json.load(f)
  with open(tmp_path / "multi" / "eval.json", encoding="utf-8") as f:
    multi_eval = json.load(f)
  assert multi_eval["before"]["num_examples"] == 4 and multi_eval["after"] == single_eval["after"]
  # Only process 0 wrote the report (each process logs what it writes).
  assert "[p0]" in multi.stdout and "report.md" in multi.stdout
  assert not [line for line in multi.stdout.splitlines() if line.startswith("[p1]") and "Wrote " in line]
  assert sorted(os.listdir(tmp_path / "multi" / "checkpoints" / "actor")) == ["1", "2"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["standard", "agentic"])
def test_killed_process_ends_its_peers_and_a_rerun_resumes(tmp_path, mode):
  """SIGKILL of one process (no launcher to end the others: as on separate hosts) ends its peer
  within a bounded time through the coordination service's heartbeat; the same command, rerun,
  resumes from the last checkpoint and logs every step once."""
  extra = AGENTIC if mode == "agentic" else []
  args = [*TINY, *extra, "num_batches=4", f"base_output_directory={tmp_path}", "run_name=killed"]
  port = launch_local.free_port()
  procs = [
    subprocess.Popen(
      [*TRAIN_RL, *args],
      env=launch_local.environment(_ENV, k, 2, port, 2),
      stdout=subprocess.DEVNULL,
      stderr=subprocess.PIPE,
      text=True,
    )
    for k in range(2)
  ]
  actor = tmp_path / "killed" / "checkpoints" / "actor"
  deadline = time.monotonic() + 600
  while not (actor / "2").is_dir() and time.monotonic() < deadline and procs[0].poll() is None:
    time.sleep(0.5)
  assert (actor / "2").is_dir()
  procs[1].kill()
  killed_at = time.monotonic()
  try:
    _, err = procs[0].communicate(timeout=120)
  finally:
    for p in procs:
      p.kill()
  assert procs[0].returncode != 0 and time.monotonic() - killed_at < 90
  assert any(w in err for w in ("heartbeat", "Heartbeat", "unavailable", "UNAVAILABLE", "terminat")), err[-3000:]
  rerun = _launch(2, 2, args)
  assert rerun.returncode == 0, rerun.stdout[-4000:]
  assert "Resuming from the checkpoint of step" in rerun.stdout
  assert [r["step"] for r in _rows(tmp_path / "killed")] == [1, 2, 3, 4]


@pytest.mark.slow
def test_sigterm_to_the_launcher_checkpoints_and_exits_143(tmp_path):
  """A preemption (SIGTERM to every process, here through the launcher) checkpoints the finished steps
  and exits 143; a rerun resumes."""
  args = [*TINY, "num_batches=4", "checkpoint_period=100", f"base_output_directory={tmp_path}", "run_name=term"]
  launched = subprocess.Popen(
    launcher(2, 2, [*TRAIN_RL, *args]), env=_ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
  )
  metrics = tmp_path / "term" / "metrics.jsonl"
  deadline = time.monotonic() + 600
  while (
    time.monotonic() < deadline
    and launched.poll() is None
    and not (metrics.exists() and metrics.read_text().count("\n") >= 1)
  ):
    time.sleep(0.5)
  launched.send_signal(signal.SIGTERM)
  out, _ = launched.communicate(timeout=300)
  assert launched.returncode == 143, out[-4000:]
  assert "stopped by SIGTERM" in out
  rerun = _launch(2, 2, args)
  assert rerun.returncode == 0, rerun.stdout[-4000:]
  assert [r["step"] for r in _rows(tmp_path / "term")] == [1, 2, 3, 4]


@pytest.mark.slow
def _reward_model_dir(tmp_path) -> str:
  """A random Qwen3ForSequenceClassification of qwen3-tiny's shape, with the Qwen3 tokenizer beside it."""
  import torch
  import transformers

  from maxtext import assets

  path = tmp_path / "reward_model"
  torch.manual_seed(0)
  tokenizer = transformers.AutoTokenizer.from_pretrained(assets.qwen3_tokenizer_dir())
  config = transformers.Qwen3Config(
    vocab_size=151936,
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=128,
    num_labels=1,
    pad_token_id=tokenizer.pad_token_id,
    initializer_range=0.2,
  )
  transformers.AutoModelForSequenceClassification.from_config(config).save_pretrained(path)
  tokenizer.save_pretrained(path)
  return str(path)


@pytest.mark.parametrize(
  "layout",
  [  # make test-slow; make test has test_two_processes_train_as_one_process_does
    pytest.param(layout, marks=pytest.mark.slow)
    for layout in ("lora_2x2", "full_4x1", "agentic_lora_2x2", "agentic_full_4x1", "ppo_2x2", "reward_model_2x2")
  ],
)
def test_multiprocess_layouts_match_one_process(tmp_path, layout):
  """LoRA across 2 processes x 2 devices, and full fine-tuning across 4 processes x 1 device, in
  standard and agentic GRPO, PPO (its critic sharded like the actor) across 2 x 2, and GRPO paying a
  reward model's score beside the rule across 2 x 2, against 1 process x 4 devices: the same rewards
  and lengths, the loss (and the critic's) within float tolerance."""
  extra = ["lora_rank=4", "lora_alpha=8"] if "lora" in layout else []
  extra += AGENTIC if layout.startswith("agentic") else []
  extra += PPO if layout.startswith("ppo") else []
  extra += [f"reward_model.load_parameters_path={_reward_model_dir(tmp_path)}"] if layout.startswith("reward") else []
  processes, devices = (2, 2) if layout.endswith("2x2") else (4, 1)
  args = [
    *TINY,
    *extra,
    "num_batches=2",
    f"reward_functions_path={_reward_file(tmp_path)}",
    "reward_functions=[variety]",
    f"base_output_directory={tmp_path}",
  ]
  _, one, other = _multi_and_single(tmp_path, args, processes, devices, timeout=900)
  assert_same_training(one, other, 1e-5 if layout.startswith("reward") else 1e-12)
  for a, b in zip(one, other, strict=True):
    for key in ("critic/value_loss", "critic/values_mean", "critic/returns_mean") if layout.startswith("ppo") else ():
      assert np.isclose(a[key], b[key], rtol=1e-3, atol=1e-6), key


def test_split_meshes_and_unequal_agentic_shares_are_refused_across_processes(tmp_path):
  """What does not run across processes is a config error at start that says why (exit 2)."""
  for extra, key in (
    (["trainer_devices_fraction=0.5", "sampler_devices_fraction=0.5"], "trainer_devices_fraction"),
    (["rl.use_agentic_rollout=true", "batch_size=3"], "batch_size=3"),
  ):
    proc = _launch(2, 1, [*TINY, "num_batches=1", *extra, f"base_output_directory={tmp_path}"], timeout=300)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert key in proc.stdout and "processes" in proc.stdout


def _recording_reward_file(tmp_path) -> str:
  """The variety reward, also appending every prompt it scores to scored_<process>.txt."""
  path = tmp_path / "recording_rewards.py"
  path.write_text(
    textwrap.dedent(f"""
      import os
      def variety(prompts, completions, tmvp_config, **kwargs):
        with open(os.path.join({str(tmp_path)!r}, "scored_" + os.environ.get("JAX_PROCESS_ID", "single")), "a") as f:
          f.writelines(repr(str(p)) + "\\n" for p in prompts)
        return [len(set(c)) / 10 for c in completions]
    """)
  )
  return str(path)


@pytest.mark.slow
def test_agentic_two_processes_train_as_one_process_does(tmp_path):
  """Agentic GRPO, 2 processes x 2 devices (each sampling its half of every batch on its own
  devices) against 1 process x 4 devices, same seeds: every prompt scored once per sample (none
  dropped or duplicated), the same rewards, lengths and advantages at every step, the loss within
  float tolerance, the same evaluation."""
  args = [
    *TINY,
    "rl.use_agentic_rollout=true",
    "rl.off_policy_steps=0",  # each step samples from the weights the previous one left
    "num_batches=2",
    f"reward_functions_path={_recording_reward_file(tmp_path)}",
    "reward_functions=[variety]",
    f"base_output_directory={tmp_path}",
  ]
  multi, one, two = _multi_and_single(tmp_path, args)
  scored = {name: sorted((tmp_path / f"scored_{name}").read_text().splitlines()) for name in ("single", "0", "1")}
  assert scored["0"] == scored["1"] == scored["single"]  # every process scores the whole batch
  assert len(scored["single"]) == 2 * 2 * 2 and all(scored["single"].count(p) == 2 for p in scored["single"])
  assert [r["step"] for r in two] == [1, 2] and all(r["rewards/variety"] > 0 for r in one)
  assert_same_training(one, two)
  assert json.loads((tmp_path / "multi" / "eval.json").read_text()) == json.loads(
    (tmp_path / "single" / "eval.json").read_text()
  )
  assert not [line for line in multi.stdout.splitlines() if line.startswith("[p1]") and "Wrote " in line]
