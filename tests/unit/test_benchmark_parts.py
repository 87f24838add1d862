"""agentic_vs_standard.py measured in parts (--engines/--configs, --append): merging and ratios."""

import copy
import importlib.util
import json
import os
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks")


@pytest.fixture(name="bench")
def _bench(monkeypatch):
  monkeypatch.syspath_prepend(BENCHMARKS)  # the script imports model_benchmark beside it
  path = os.path.join(BENCHMARKS, "agentic_vs_standard.py")
  spec = importlib.util.spec_from_file_location("agentic_vs_standard", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  yield module
  sys.modules.pop("model_benchmark", None)


def _stored() -> dict:
  with open(os.path.join(BENCHMARKS, "results", "agentic_vs_standard.json"), encoding="utf-8") as f:
    return json.load(f)


def test_two_parts_merge_into_the_table_one_run_gives(bench):
  whole = _stored()  # the --quick table, measured in one run with both engines
  assert len(whole["results"]) == 6
  parts = {}
  for engine in ("batched", "vanilla"):
    part = copy.deepcopy(whole)
    part["results"] = [r for r in part["results"] if r["engine"] == engine]
    bench.add_ratios(part["results"], None)  # as written by a run of that engine alone
    parts[engine] = part
  assert all(r["ratio_to_standard_vanilla"] is None for r in parts["batched"]["results"])
  merged = bench.merge(parts["batched"], parts["vanilla"], "batched.json")
  bench.add_ratios(merged["results"], None)

  def rows(report):
    return [(r["config"], r["engine"]) for r in report["results"]]

  assert rows(merged) == rows(whole)
  for got, want in zip(merged["results"], whole["results"]):
    for key in (
      "ratio_to_standard_same_engine",
      "ratio_to_standard_same_engine_without_compiling",
      "ratio_to_standard_vanilla",
      "ratio_to_standard_vanilla_without_compiling",
      "wall_s",
      "decode_tokens_per_s",
    ):
      assert got[key] == pytest.approx(want[key]), (got["config"], got["engine"], key)
  rerun = copy.deepcopy(parts["vanilla"])  # a part run again replaces its earlier rows
  rerun["results"] = [dict(r, wall_s=r["wall_s"] * 2) for r in rerun["results"] if r["config"] == "standard"]
  again = bench.merge(merged, rerun, "m.json")
  assert len(again["results"]) == 6
  assert [r["wall_s"] for r in again["results"] if r["engine"] == "vanilla"][0] == 2 * whole["results"][0]["wall_s"]


def test_ratios_with_compiling_left_out_match_the_table_worked_by_hand(bench):
  results = copy.deepcopy(_stored()["results"])
  bench.add_ratios(results, None)
  row = {(r["config"], r["engine"]): r for r in results}
  # (41.1 - 12.4) / (33.3 - 9.2) and (43.6 - 19.7) / (33.3 - 9.2): agentic over standard, both batched
  assert row["agentic off_policy=0", "batched"]["ratio_to_standard_same_engine_without_compiling"] == pytest.approx(
    1.191, abs=0.005
  )
  assert row["agentic off_policy=1", "batched"]["ratio_to_standard_same_engine_without_compiling"] == pytest.approx(
    0.992, abs=0.005
  )
  # (41.1 - 12.4) / (32.9 - 7.9): against standard GRPO on the vanilla engine
  assert row["agentic off_policy=0", "batched"]["ratio_to_standard_vanilla_without_compiling"] == pytest.approx(
    1.148, abs=0.005
  )


def test_parts_of_different_work_or_devices_do_not_merge(bench):
  whole = _stored()
  other = dict(whole, arguments=whole["arguments"] + ["num_batches=9"])
  with pytest.raises(SystemExit, match=r"--append: old.json has arguments .*num_batches=9.*: expected the same"):
    bench.merge(whole, other, "old.json")
  with pytest.raises(SystemExit, match="has device 'cpu', this run 'NVIDIA H100 80GB HBM3'"):
    bench.merge(whole, dict(whole, device="NVIDIA H100 80GB HBM3"), "old.json")


def test_decode_is_put_against_the_hbm_roofline_where_the_bandwidth_is_known(bench):
  results = copy.deepcopy(_stored()["results"])
  bench.add_ratios(results, 3.35e12)
  batched = [r for r in results if r["engine"] == "batched"][0]
  assert batched["decode_fraction_of_hbm_roofline"] == pytest.approx(batched["decode_gb_per_s"] * 1e9 / 3.35e12)
  tokens_per_byte = batched["decode_tokens_per_s"] / (batched["decode_gb_per_s"] * 1e9)
  assert batched["decode_roofline_tokens_per_s"] == pytest.approx(3.35e12 * tokens_per_byte)
  assert all(r["decode_roofline_tokens_per_s"] is None for r in results if r["engine"] == "vanilla")


def test_only_the_split_configuration_runs_on_two_host_devices_keeping_other_xla_flags(bench):
  env = {"XLA_FLAGS": "--xla_cpu_enable_fast_math=false", "PATH": "/bin"}
  split = bench.run_environment("agentic1split", env)
  assert split["XLA_FLAGS"].split() == ["--xla_cpu_enable_fast_math=false", "--xla_force_host_platform_device_count=2"]
  assert split["PATH"] == "/bin" and env["XLA_FLAGS"] == "--xla_cpu_enable_fast_math=false"
  assert bench.run_environment("agentic1split", {})["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"
  assert bench.run_environment("agentic1", env) == env
  assert "agentic1split" not in bench.DEFAULT_CONFIGS


@pytest.mark.parametrize("mode", [["--quick"], [], ["--quick", "--model", "qwen3-0.6b"]])
def test_every_configuration_and_engine_passes_the_config_checks(bench, mode, tmp_path):
  """The train_rl arguments the script builds for every configuration (agentic1split included) and
  engine pass pyconfig's checks, each mode's keys included: only the agentic runs get
  rl.max_concurrency (one step's samples), which standard GRPO refuses."""
  from maxtext.configs import pyconfig

  args = bench.parse_args([*mode, "--configs", *bench.CONFIGS])
  common = bench._common(args)
  assert bench.runs_on("agentic1http", bench.ENGINES) == ["batched"]
  for config in bench.CONFIGS:
    for engine in bench.runs_on(config, bench.ENGINES):
      values = pyconfig.initialize(["train_rl", *bench.train_rl_arguments(config, engine, common, str(tmp_path))])
      flat = values.flat()
      assert (flat["rl.use_agentic_rollout"], flat["rollout_engine"]) == (config != "standard", engine)
      if config != "standard":
        assert flat["rl.max_concurrency"] == args.batch_size * args.generations
