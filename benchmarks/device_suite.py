"""One command for a machine with an accelerator: the measurements a GPU or TPU session owes the
project, within a time budget, into one JSON file.

    python benchmarks/device_suite.py [--budget-s 420] [--quick] [--stages S ...] [--out F]

Stages, what matters most first, each in its own process under its own time limit:

1. cudnn: through pytest, test_model.py's GPU test of cuDNN's flash attention (finite gradients equal
   to the einsums' on left-padded rows; skipped off NVIDIA GPUs): `cudnn_flash_test`. Whether it
   passed decides the attention the train stage measures.
2. grpo: standard GRPO through benchmarks/agentic_vs_standard.py on qwen3-0.6b's shape (random
   weights, bfloat16, the batched engine), 4 steps of 8 prompts x 8 samples with 256-token replies:
   a run that ends trained 4 steps with finite parameters (train_rl's run guard stops one whose
   updated parameters are not), `grpo`.
3. decode: the continuous batcher (decode_chunks.batcher_decode) at 64, 8 and 256 `rows` (the goals'
   row counts first), each with decode_steps_per_dispatch 16, then 1, from the same prompts and keys,
   with the default scanned layers, sampled unrolled (decoder.DecodeCopy: rollout_layers=unrolled, what
   auto takes on a GPU or TPU), and at 64 rows with chunk 16 from the stacked layers too: busy-row
   tokens/s, `fraction_of_roofline` (the tokens/s of reading every weight and the whole KV cache once
   per step at the device's HBM bandwidth, model_benchmark.decode_roofline), a digest of the sampled
   tokens (`decode_tokens_identical_across_chunks` compares them per row count), and at 64 rows with
   chunk 16 `layer_copies` (the decode program's copies of a layer's weights or cache, program_census;
   {} where there are none), each layout; the compile seconds of its prefill
   (`_extend`) and decode chunk (`_decode`) programs, from JAX's compile events.
4. train: a training step of qwen3-0.6b's shape (random weights, bfloat16, 8 x 1024 tokens) through
   model_benchmark's train worker, with the attention the cudnn stage allows (cudnn_flash where its
   test passed on a GPU, else dot_product): unrolled (scan_layers=false), then scanned; tokens/s,
   `mfu` against the device's bf16 peak, the step program's lowering and compile seconds, and each
   phase's progress in the stage's log. The variants run one after another in one process, so a
   variant's peak_memory_bytes is that process's peak so far.
5. agentic: agentic GRPO (rl.off_policy_steps=1) on the grpo stage's work, added to its table:
   `agentic_vs_standard`, each run's wall and compile seconds and `ratio_to_standard_same_engine`,
   with and without compiling.
6. parity: tests/unit/test_hf_parity.py through pytest (our decoder against transformers on
   checkpoints that transformers writes): passed, failed, skipped and errors, each test's seconds in
   the stage's log.

Every stage gets at most its own cap and the budget left after the estimates of the stages after
it (and at least its own estimate); a stage whose estimate exceeds the budget left is skipped. A
stage that fails or runs out of time is recorded with its error and the measurements it finished
(each is written as it ends), and the suite goes on; the JSON is written again after every stage,
so a suite stopped from outside keeps the stages it finished. `compile` in the JSON lists the
compile seconds per program that the decode and train stages measured.

With --artifacts DIR, each stage's log is kept in DIR, and DIR/profiles.tar.gz holds JAX profiler
traces of one more training step of the unrolled variant and one more decode round at the first row
count with chunk 16, outside the measurements (benchmarks/profile_summary.py says where their time
goes).

Writes benchmarks/results/device_<device>_<date>.json (or --out): the device, platform, driver and
versions, each stage's status, seconds, limit and error, and the measurements. `mfu` and
`fraction_of_roofline` are null on a device without a known peak (model_benchmark.PEAKS: a CPU).

--quick: qwen3-tiny, small shapes, every stage tiny, a larger default budget (minutes on 2 CPU cores):
the suite end to end.

On a machine without a package registry, such as a GPU image that has Python, jax, flax, optax,
orbax, torch, transformers and pytest but not our other dependencies:

    scripts/device_wheels.sh .whl   # beforehand, where pip reaches PyPI: the wheels the image lacks
    scripts/device_run.sh .whl      # on the machine, from the repository root

device_run.sh installs the wheels of distributions the image lacks into /tmp/site and runs
`PYTHONPATH=/tmp/site:src python3 benchmarks/device_suite.py --budget-s 420` on the image's jax.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

STAGES = ("cudnn", "grpo", "decode", "train", "agentic", "parity")
VERSIONED = (
  "jax",
  "jaxlib",
  "flax",
  "optax",
  "orbax-checkpoint",
  "google-tunix",
  "transformers",
  "torch",
  "numpy",
  "pytest",
)


@dataclasses.dataclass(frozen=True)
class Work:
  """The shapes of one mode (full or --quick) and each stage's (estimate, cap) in seconds: the
  estimate is the least time in which the stage gives a result, the cap the most it may take."""

  model: str
  dtype: str
  train_batch: int
  train_seq: int
  train_iters: int
  decode_rows: tuple[int, ...]
  decode_chunks: tuple[int, ...]
  prompt: int
  reply: int
  decode_rounds: int
  agentic: tuple[str, ...]  # agentic_vs_standard.py's options
  agentic_overrides: tuple[str, ...]  # and its key=value arguments for every run
  times: dict[str, tuple[float, float]]


FULL = Work(
  model="qwen3-0.6b",
  dtype="bfloat16",
  train_batch=8,
  train_seq=1024,
  train_iters=5,
  decode_rows=(64, 8, 256),  # the goals' row counts first
  decode_chunks=(16, 1),
  prompt=256,
  reply=256,
  decode_rounds=2,
  agentic=(
    "--model",
    "qwen3-0.6b",
    "--steps",
    "4",
    "--batch-size",
    "8",
    "--generations",
    "8",
    "--engines",
    "batched",
  ),
  agentic_overrides=("max_response_length=256", "dtype=bfloat16", "weight_dtype=bfloat16"),
  # Guesses for one H100-class GPU (compiling dominates); the skip rule and the limits use them. The
  # estimates add up to 320 s of the default 420 s budget. On an H200 (2026-11-28) the scanned train
  # variant did not finish in 95 s and the unrolled decode programs took over a minute to build and
  # compile.
  times={
    "cudnn": (20, 60),
    "grpo": (90, 150),
    "decode": (60, 120),
    "train": (40, 100),
    "agentic": (80, 150),
    "parity": (30, 90),
  },
)
QUICK = Work(
  model="qwen3-tiny",
  dtype="float32",
  train_batch=2,
  train_seq=128,
  train_iters=2,
  decode_rows=(16, 8),
  decode_chunks=(16, 1),
  prompt=16,
  reply=32,
  decode_rounds=1,
  agentic=("--quick", "--steps", "2", "--batch-size", "2", "--generations", "2", "--engines", "batched"),
  agentic_overrides=(),
  times={
    "cudnn": (10, 60),
    "grpo": (30, 150),
    "decode": (20, 150),
    "train": (15, 90),
    "agentic": (30, 150),
    "parity": (30, 300),
  },
)


# ---------------------------------------------------------------------------------------------- plan


def stage_limit(stage: str, remaining: float, later: list[str], work: Work) -> float | None:
  """Seconds `stage` may run with `remaining` seconds of the budget left and the stages `later`
  still to run after it: its cap, less what the later stages' estimates need, but never less than
  its own estimate; None (skip it) when its estimate exceeds what is left."""
  estimate, cap = work.times[stage]
  if estimate > remaining:
    return None
  reserve = sum(work.times[s][0] for s in later)
  return min(cap, remaining, max(estimate, remaining - reserve))


# ------------------------------------------------------------------------------------------ workers


def _emit(partial: str, record: dict) -> None:
  """Appends one finished measurement to the stage's partial file (kept if the stage is killed)."""
  with open(partial, "a", encoding="utf-8") as f:
    f.write(json.dumps(record) + "\n")


def read_records(partial: str) -> list[dict]:
  """The measurements _emit wrote to a stage's partial file; [] where it wrote none."""
  if not os.path.exists(partial):
    return []
  with open(partial, encoding="utf-8") as f:
    return [json.loads(line) for line in f if line.strip()]


class ProgramClock:
  """Seconds JAX spent tracing and lowering (`lower_s`) and compiling (`compile_s`) each jitted
  function since it was made, by function name, from JAX's compile events (any thread)."""

  _EVENTS = {
    "/jax/core/compile/jaxpr_trace_duration": "lower_s",
    "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower_s",
    "/jax/core/compile/backend_compile_duration": "compile_s",
  }

  def __init__(self):
    import jax

    self.seconds: dict[str, dict[str, float]] = {}
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)

  def _on_duration(self, event: str, duration_secs: float, **kwargs) -> None:
    part = self._EVENTS.get(event)
    if part is None:
      return
    name = re.sub(r"^jit\((.*)\)$", r"\1", str(kwargs.get("fun_name", "?")))
    entry = self.seconds.setdefault(name, {"lower_s": 0.0, "compile_s": 0.0})
    entry[part] += duration_secs

  def snapshot(self) -> dict[str, dict[str, float]]:
    return {name: dict(entry) for name, entry in self.seconds.items()}

  def since(self, before: dict[str, dict[str, float]], name: str) -> dict[str, float]:
    """`name`'s seconds since `before` (a snapshot)."""
    now = self.seconds.get(name, {"lower_s": 0.0, "compile_s": 0.0})
    then = before.get(name, {"lower_s": 0.0, "compile_s": 0.0})
    return {part: now[part] - then[part] for part in ("lower_s", "compile_s")}


def _config_keys() -> set[str]:
  from maxtext.configs import pyconfig

  return {key for key, _, _ in pyconfig.reference()}


def train_variants(
  keys: set[str], platform_name: str, cudnn_passed: bool
) -> list[tuple[str, list[str] | None, str | None]]:
  """(variant, config overrides, reason) of each training measurement in order: overrides None means
  not measured, for `reason`. The attention is the one the cudnn stage allows: cudnn_flash on a GPU
  whose run of its test passed (cudnn_passed), else dot_product (where the config has attention).
  Unrolled layers (scan_layers=false where the config has the key) first, then scanned layers (on an
  H200 they did not finish in 95 s)."""
  attention: list[str] = []
  reason = None
  if "attention" in keys:
    allowed = platform_name == "gpu" and cudnn_passed
    attention = [f"attention={'cudnn_flash' if allowed else 'dot_product'}"]
    if not allowed:
      reason = "cudnn_flash needs a GPU" if platform_name != "gpu" else "cudnn_flash: its GPU test did not pass"
  scan = "scan_layers" in keys
  out: list[tuple[str, list[str] | None, str | None]] = [
    ("unrolled", [*(["scan_layers=false"] if scan else []), *attention], None),
    ("scan", [*attention, "scan_layers=true"], None) if scan else ("scan", None, "scan_layers not available"),
  ]
  if reason:
    out.insert(1, ("attention=cudnn_flash", None, reason))
  return out


def cudnn_passed(scratch: str) -> bool:
  """Whether the cudnn stage's run (its record in `scratch`) passed its test: not skipped, failed or
  missing."""
  records = read_records(os.path.join(scratch, "cudnn.jsonl"))
  return bool(records) and records[0]["passed"] > 0 and not (records[0]["failed"] or records[0]["errors"])


def worker_train(work: Work, partial: str, artifacts: str | None) -> None:
  import gc

  import jax
  import model_benchmark

  platform_name = jax.devices()[0].platform
  for variant, overrides, reason in train_variants(
    _config_keys(), platform_name, cudnn_passed(os.path.dirname(partial))
  ):
    record = {"variant": variant, "overrides": overrides, "batch": work.train_batch, "seq": work.train_seq, "mfu": None}
    if overrides is None:
      _emit(partial, {**record, "reason": reason})
      continue
    args = argparse.Namespace(
      model=work.model,
      dtype=work.dtype,
      remat="none",
      batch=work.train_batch,
      seq=work.train_seq,
      iters=work.train_iters,
      overrides=overrides,
      # the first program (the default attention) traced once more
      profile_dir=os.path.join(artifacts, "profile_train") if artifacts and variant == "unrolled" else None,
    )
    try:
      record.update(model_benchmark.worker_train(args))
    except Exception as e:  # one variant failing (out of memory, an unsupported kernel) leaves the others
      record["error"] = f"{type(e).__name__}: {e}"[-2000:]
    record["variant"] = variant
    _emit(partial, record)
    gc.collect()
    jax.clear_caches()


def decode_plan(work: Work) -> list[tuple[int, int, bool]]:
  """(rows, chunk, unrolled_layers) of each decode measurement in order: every chunk size at the goals'
  row counts (work.decode_rows' first two) from the layers unrolled (rollout_layers=unrolled, what a GPU
  or TPU samples from), then the first of them with the first chunk size from the stacked layers (the
  same device's comparison), then the remaining row counts unrolled."""
  goals, rest = work.decode_rows[:2], work.decode_rows[2:]
  plan = [(rows, chunk, True) for rows in goals for chunk in work.decode_chunks]
  plan.append((goals[0], work.decode_chunks[0], False))
  return plan + [(rows, chunk, True) for rows in rest for chunk in work.decode_chunks]


def worker_decode(work: Work, partial: str, artifacts: str | None) -> None:
  import decode_chunks
  import jax
  import jax.numpy as jnp
  import model_benchmark
  import numpy as np

  from maxtext.inference.continuous_batching import ContinuousBatcher

  clock = ProgramClock()
  size = work.prompt + work.reply
  cfg, mesh, model, n_params = model_benchmark._build(work.model, work.dtype)  # scanned layers, the default
  for rows, chunk, unrolled in decode_plan(work):
    rng = np.random.default_rng(rows)  # every chunk size and layout samples from the same prompts and keys
    before = clock.snapshot()
    record: dict = {
      "rows": rows,
      "decode_steps_per_dispatch": chunk,
      "scan_layers": cfg.model.scan_layers,
      "rollout_layers": "unrolled" if unrolled else "stacked",
      "prompt": work.prompt,
      "reply": work.reply,
    }
    profile = artifacts and rows == work.decode_rows[0] and chunk == work.decode_chunks[0]
    name = f"profile_decode_{rows}" + ("" if unrolled else "_stacked")
    try:
      with jax.set_mesh(mesh):
        measured = decode_chunks.batcher_decode(
          model,
          rows,
          work.prompt,
          work.reply,
          chunk,
          work.decode_rounds,
          rng,
          profile_dir=os.path.join(artifacts, name) if profile else None,
          unrolled_layers=unrolled,
        )
      record.update(measured)
      roofline = model_benchmark.decode_roofline(cfg, rows, size, jnp.dtype(work.dtype).itemsize, n_params)
      record["roofline_tokens_per_s"] = roofline
      record["fraction_of_roofline"] = record["tokens_per_s"] / roofline if roofline else None
    except Exception as e:
      record.update(error=f"{type(e).__name__}: {e}"[-2000:], fraction_of_roofline=None)
    record["compile"] = {
      "prefill": clock.since(before, "_extend"),
      "decode_chunk": clock.since(before, "_decode"),
    }
    # The census compiles the decode program once more (after its compile seconds are read): at the
    # first row count only, each layout once.
    if rows == work.decode_rows[0] and chunk == work.decode_chunks[0]:
      try:
        with jax.set_mesh(mesh):
          batcher = ContinuousBatcher(model, size, rows, steps_per_dispatch=chunk, unrolled_layers=unrolled)
          record["layer_copies"] = batcher.decode_layer_copies(rows)
          batcher.close()
      except Exception as e:
        record["layer_copies_error"] = f"{type(e).__name__}: {e}"[-2000:]
    print(f"decode {record}", file=sys.stderr, flush=True)
    _emit(partial, record)


def agentic_command(work: Work, config: str, output: str, append: bool) -> list[str]:
  """agentic_vs_standard.py's command line for `config` alone, writing (or, with append, adding to)
  `output`."""
  script = os.path.join(HERE, "agentic_vs_standard.py")
  options = [*work.agentic, "--configs", config, "--output", output, *(["--append"] if append else [])]
  return [sys.executable, script, *options, *work.agentic_overrides]


def _agentic_table(partial: str) -> str:
  """The agentic_vs_standard.py table the grpo and agentic stages share (beside their records)."""
  return os.path.join(os.path.dirname(partial), "agentic_vs_standard.json")


def _run_agentic_config(work: Work, partial: str, config: str, append: bool) -> None:
  out = _agentic_table(partial)
  cmd = agentic_command(work, config, out, append=append)
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
  with open(out, encoding="utf-8") as f:
    _emit(partial, {"report": json.load(f)})


def worker_grpo(work: Work, partial: str, artifacts: str | None) -> None:
  """Standard GRPO (a new table)."""
  del artifacts
  _run_agentic_config(work, partial, "standard", append=False)


def worker_agentic(work: Work, partial: str, artifacts: str | None) -> None:
  """Agentic GRPO, added to the grpo stage's table where it wrote one."""
  del artifacts
  _run_agentic_config(work, partial, "agentic1", append=os.path.exists(_agentic_table(partial)))


# cuDNN's flash attention against the einsums on a GPU (short; the cudnn stage), then the decoder
# against transformers (the parity stage).
CUDNN_TESTS = (
  "tests/unit/test_model.py::test_cudnn_flash_on_a_gpu_equals_dot_product_on_left_padded_rows_with_finite_gradients",
)
PARITY_TESTS = ("tests/unit/test_hf_parity.py",)


def _pytest(tests: tuple[str, ...], partial: str) -> None:
  """Runs `tests` through pytest and records their junit_counts and pytest's exit code."""
  report = partial + ".junit.xml"
  cmd = [
    sys.executable,
    "-m",
    "pytest",
    "-q",
    "-p",
    "no:cacheprovider",
    "-p",
    "no:xdist",
    "-v",
    "--durations=0",
    f"--junitxml={report}",
    *tests,
  ]
  # pytest's lines go to the stage's log as they come, so a stage out of time shows how far it got
  proc = subprocess.run(cmd, cwd=ROOT, check=False)
  if not os.path.exists(report):
    raise RuntimeError(f"pytest wrote no report (exit {proc.returncode}); its output is the stage's log")
  _emit(partial, {**junit_counts(report), "exit_code": proc.returncode})


def worker_cudnn(work: Work, partial: str, artifacts: str | None) -> None:
  del work, artifacts
  _pytest(CUDNN_TESTS, partial)


def worker_parity(work: Work, partial: str, artifacts: str | None) -> None:
  del work, artifacts
  _pytest(PARITY_TESTS, partial)


def junit_counts(path: str) -> dict:
  """passed, failed, errors and skipped test counts of a pytest JUnit XML report, and the failed
  tests' names."""
  root = ET.parse(path).getroot()
  cases = root.iter("testcase")
  counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
  for case in cases:
    outcome = next((c.tag for c in case if c.tag in ("failure", "error", "skipped")), None)
    key = {"failure": "failed", "error": "errors", "skipped": "skipped", None: "passed"}[outcome]
    counts[key] += 1
    if outcome in ("failure", "error"):
      counts["failures"].append(f"{case.get('classname')}::{case.get('name')}")
  return counts


def worker_env(work: Work, partial: str, artifacts: str | None) -> None:
  del work, artifacts
  import jax

  dev = jax.devices()[0]
  _emit(
    partial,
    {
      "device": str(dev.device_kind),
      "platform": dev.platform,
      "device_count": jax.device_count(),
      "platform_version": str(getattr(dev.client, "platform_version", "")),
    },
  )


WORKERS = {
  "env": worker_env,
  "cudnn": worker_cudnn,
  "grpo": worker_grpo,
  "decode": worker_decode,
  "train": worker_train,
  "agentic": worker_agentic,
  "parity": worker_parity,
}

# ------------------------------------------------------------------------------------------- runner


def run_stage(stage: str, limit: float, quick: bool, scratch: str, artifacts: str | None = None) -> dict:
  """Runs `stage`'s worker for at most `limit` seconds (see run_limited); with artifacts, the
  worker writes its profiles there."""
  cmd = [sys.executable, os.path.abspath(__file__), "--worker", stage]
  if quick:
    cmd.append("--quick")
  if artifacts:
    cmd += ["--artifacts", artifacts]
  return run_limited(stage, cmd, limit, scratch)


def run_limited(stage: str, cmd: list[str], limit: float, scratch: str) -> dict:
  """Runs `cmd` --partial FILE in a process group of its own for at most `limit` seconds (then the
  whole group is killed); its status (ok, failed, timed_out), seconds, limit, error (the end of its
  output, when not ok) and the records it wrote to FILE, finished or not."""
  partial = os.path.join(scratch, f"{stage}.jsonl")
  log = os.path.join(scratch, f"{stage}.log")
  started = time.monotonic()
  with open(log, "w", encoding="utf-8") as out:
    proc = subprocess.Popen(
      [*cmd, "--partial", partial], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
      code = proc.wait(timeout=limit)
      status = "ok" if code == 0 else "failed"
    except subprocess.TimeoutExpired:
      _kill_group(proc)
      code, status = None, "timed_out"
  seconds = time.monotonic() - started
  records = read_records(partial)
  error = None
  if status != "ok":
    with open(log, encoding="utf-8", errors="replace") as f:
      tail = f.read()[-3000:]
    error = (f"exit {code}" if status == "failed" else f"timed out after {limit:.0f} s") + f":\n{tail}"
  return {"stage": stage, "status": status, "seconds": seconds, "limit_s": limit, "error": error, "records": records}


def _kill_group(proc: subprocess.Popen) -> None:
  """SIGTERM to the stage's process group (its worker and every process it started), SIGKILL
  to what is left after a few seconds."""
  for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
    try:
      os.killpg(proc.pid, sig)
    except ProcessLookupError:
      return
    try:
      proc.wait(timeout=wait)
      return
    except subprocess.TimeoutExpired:
      continue


def keep_artifacts(scratch: str, artifacts: str) -> None:
  """Copies each stage's log from `scratch` into `artifacts` and packs the profile folders the
  workers wrote there into one profiles.tar.gz (the folders removed)."""
  import tarfile

  for name in sorted(os.listdir(scratch)):
    if name.endswith(".log"):
      shutil.copy(os.path.join(scratch, name), os.path.join(artifacts, name))
  profiles = sorted(p for p in os.listdir(artifacts) if p.startswith("profile_"))
  if profiles:
    with tarfile.open(os.path.join(artifacts, "profiles.tar.gz"), "w:gz") as tar:
      for p in profiles:
        tar.add(os.path.join(artifacts, p), arcname=p)
    for p in profiles:
      shutil.rmtree(os.path.join(artifacts, p))


def driver_version() -> str | None:
  """The NVIDIA driver's version from nvidia-smi, None where there is none."""
  if not shutil.which("nvidia-smi"):
    return None
  try:
    out = subprocess.run(
      ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
      capture_output=True,
      text=True,
      timeout=30,
      check=True,
    ).stdout
  except (OSError, subprocess.SubprocessError):
    return None
  return out.strip().splitlines()[0] if out.strip() else None


def versions() -> dict[str, str | None]:
  """Installed versions of the packages the measurements depend on (None: not installed), JAX's
  accelerator plugins and libtpu included."""
  from importlib import metadata

  names = list(VERSIONED)
  for dist in metadata.distributions():
    name = (dist.metadata["Name"] or "").lower()
    if name.startswith(("jax-cuda", "jax_cuda", "jax-rocm", "libtpu")) and name not in names:
      names.append(name)
  out: dict[str, str | None] = {}
  for name in names:
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      out[name] = None
  return out


def _first(records: list[dict]) -> dict:
  return records[0] if records else {}


def assemble(meta: dict, stages: list[dict]) -> dict:
  """The suite's JSON from its metadata (mode, budget, wall time, device, driver, versions) and the
  stage results run_stage returned (a stage not run: absent): each stage's status, and the
  measurements under cudnn_flash_test, grpo, train, decode, compile, agentic_vs_standard and parity."""
  by_name = {s["stage"]: s for s in stages}
  records = {name: by_name[name]["records"] if name in by_name else [] for name in STAGES}
  train = records["train"]
  decode = [{k: v for k, v in r.items() if k != "compile"} for r in records["decode"]]
  compile_s = [
    {"program": "train_step", "variant": r["variant"], "lower_s": r["lower_s"], "compile_s": r["compile_s"]}
    for r in train
    if "compile_s" in r
  ]
  for r in records["decode"]:
    for program, seconds in r.get("compile", {}).items():
      if seconds["lower_s"] or seconds["compile_s"]:
        shape = {"rows": r["rows"], "decode_steps_per_dispatch": r["decode_steps_per_dispatch"]}
        compile_s.append({"program": program, **shape, **seconds})
  tables = [r["report"] for name in ("grpo", "agentic") for r in records[name]]
  agentic = None
  grpo = None
  if tables:
    report = tables[-1]  # the agentic stage's adds to the grpo stage's
    results = report["results"]
    standard = next((r for r in results if r["config"] == "standard"), None)
    if standard is not None:
      grpo = {**standard, "finite_parameters": True}  # train_rl's run guard stops a run whose are not
    agentic_row = next((r for r in results if r["config"] != "standard"), None)
    if agentic_row is not None:
      agentic = {
        "arguments": report["arguments"],
        "results": results,
        **{
          key: agentic_row.get(key)
          for key in ("ratio_to_standard_same_engine", "ratio_to_standard_same_engine_without_compiling")
        },
      }
  parity = _first(records["parity"]) or None
  return {
    "decode_tokens_identical_across_chunks": tokens_identical(decode),
    **meta,
    "stages": [{k: v for k, v in s.items() if k != "records"} for s in stages],
    "cudnn_flash_test": _first(records["cudnn"]) or None,
    "grpo": grpo,
    "train": train,
    "decode": decode,
    "compile": compile_s,
    "agentic_vs_standard": agentic,
    "parity": parity,
  }


def tokens_identical(decode: list[dict]) -> dict[str, bool | None]:
  """For each `rows` measured more than once (chunk sizes, layers unrolled or stacked): whether every
  measurement sampled the same tokens (their tokens_sha256 equal); None where one has no digest."""
  digests: dict[str, list] = {}
  for r in decode:
    digests.setdefault(str(r["rows"]), []).append(r.get("tokens_sha256"))
  return {key: (None if None in found else len(set(found)) == 1) for key, found in digests.items() if len(found) > 1}


def default_output(device: str, date: str, quick: bool) -> str:
  """benchmarks/results/device_<device>[_quick]_<date>.json, the device kind in lower case with
  other characters than letters and digits as underscores."""
  slug = re.sub(r"[^a-z0-9]+", "_", device.lower()).strip("_") or "unknown"
  return os.path.join(HERE, "results", f"device_{slug}{'_quick' if quick else ''}_{date}.json")


def _print_summary(report: dict) -> None:
  from model_benchmark import fmt

  print(f"{report['device']} ({report['platform']}), driver {report['driver']}, jax {report['versions'].get('jax')}")
  for s in report["stages"]:
    print(f"  stage {s['stage']:<8} {s['status']:<9} {fmt(s['seconds'], '.0f'):>5} s of {fmt(s['limit_s'], '.0f')}")
  if report["cudnn_flash_test"]:
    c = report["cudnn_flash_test"]
    print(f"  cudnn_flash test: {c['passed']} passed, {c['failed']} failed, {c['skipped']} skipped")
  if report["grpo"]:
    g = report["grpo"]
    print(f"  standard GRPO: {g.get('steps')} steps with finite parameters in {fmt(g.get('wall_s'), '.0f')} s")
  for r in report["train"]:
    print(f"  train {r['variant']:<22} mfu {fmt(r.get('mfu'), '.1%'):>6}  tokens/s {fmt(r.get('tokens_per_s'), '.0f')}")
  for r in report["decode"]:
    print(
      f"  decode rows {r['rows']:>3} chunk {r['decode_steps_per_dispatch']:>2} {r.get('rollout_layers', ''):<8}"
      f" tokens/s "
      f"{fmt(r.get('tokens_per_s'), '.0f'):>8}  of roofline {fmt(r.get('fraction_of_roofline'), '.1%')}"
      + (f"  layer copies {r['layer_copies']}" if "layer_copies" in r else "")
    )
  for rows, same in report["decode_tokens_identical_across_chunks"].items():
    print(f"  decode rows {rows:>3}: tokens identical across chunk sizes: {same}")
  agentic = report["agentic_vs_standard"]
  if agentic:
    print(
      f"  agentic / standard: {fmt(agentic['ratio_to_standard_same_engine'])} "
      f"({fmt(agentic['ratio_to_standard_same_engine_without_compiling'])} without compiling)"
    )
  if report["parity"]:
    p = report["parity"]
    print(f"  parity: {p['passed']} passed, {p['failed']} failed, {p['errors']} errors, {p['skipped']} skipped")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument(
    "--budget-s", type=float, help="wall-clock seconds for the whole suite (default 420, --quick 900)"
  )
  parser.add_argument("--quick", action="store_true", help="qwen3-tiny and tiny shapes (the suite end to end on a CPU)")
  parser.add_argument("--stages", nargs="+", choices=STAGES, default=list(STAGES), help="only these (in suite order)")
  parser.add_argument("--out", help="where the JSON goes (default benchmarks/results/device_<device>_<date>.json)")
  parser.add_argument(
    "--artifacts",
    help="a folder for each stage's log and profiles.tar.gz (JAX profiler traces of one training step and one "
    "decode round; benchmarks/profile_summary.py reads them)",
  )
  parser.add_argument("--worker", choices=list(WORKERS), help=argparse.SUPPRESS)
  parser.add_argument("--partial", help=argparse.SUPPRESS)
  args = parser.parse_args()
  work = QUICK if args.quick else FULL
  if args.budget_s is None:
    args.budget_s = 900.0 if args.quick else 420.0

  from maxtext.utils import xla_flags

  xla_flags.use_sequential_cpu_scheduler()  # as train_rl does, before JAX starts; the stages inherit it
  if args.worker:
    WORKERS[args.worker](work, args.partial, args.artifacts)
    return
  if args.artifacts:
    args.artifacts = os.path.abspath(args.artifacts)
    os.makedirs(args.artifacts, exist_ok=True)

  started = time.monotonic()
  stages = [s for s in STAGES if s in args.stages]
  date = datetime.date.today().isoformat()
  results: list[dict] = []
  with tempfile.TemporaryDirectory(prefix="device_suite_") as scratch:
    # The device, from a process of its own: this one never holds the accelerator the stages need.
    env = run_stage("env", min(120.0, args.budget_s), args.quick, scratch, args.artifacts)
    device = _first(env["records"])
    meta = {
      "suite": "benchmarks/device_suite.py",
      "quick": args.quick,
      "budget_s": args.budget_s,
      "wall_s": None,
      "date": date,
      "device": device.get("device"),
      "platform": device.get("platform"),
      "device_count": device.get("device_count"),
      "platform_version": device.get("platform_version"),
      "driver": driver_version(),
      "env_error": env["error"],
      "python": platform.python_version(),
      "cpu_count": os.cpu_count(),
      "versions": versions(),
      "model": work.model,
      "dtype": work.dtype,
    }
    out = args.out or default_output(meta["device"] or "unknown", date, args.quick)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    for i, stage in enumerate(stages):
      remaining = args.budget_s - (time.monotonic() - started)
      limit = stage_limit(stage, remaining, stages[i + 1 :], work)
      if limit is None:
        skipped = f"skipped: its estimate {work.times[stage][0]:.0f} s exceeds the {max(remaining, 0):.0f} s left"
        results.append(
          {"stage": stage, "status": "skipped", "seconds": 0.0, "limit_s": None, "error": skipped, "records": []}
        )
      else:
        results.append(run_stage(stage, limit, args.quick, scratch, args.artifacts))
      print(f"  {stage}: {results[-1]['status']} in {results[-1]['seconds']:.0f} s", file=sys.stderr, flush=True)
      meta["wall_s"] = time.monotonic() - started
      report = assemble(meta, results)
      with open(out, "w", encoding="utf-8") as f:  # after every stage: a suite stopped from outside keeps these
        json.dump(report, f, indent=1)
    if args.artifacts:
      keep_artifacts(scratch, args.artifacts)
  _print_summary(report)
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
