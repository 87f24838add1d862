"""Agentic GRPO against standard GRPO on the same work, per rollout engine.

    python benchmarks/agentic_vs_standard.py [--quick] [--model NAME] [--steps N] [--engines E ...]
        [--configs C ...] [--output F [--append]] [key=value ...]

Every configuration trains the same prompts (same data order and seed), samples, steps and
sampling parameters through train_rl, each in its own process with no compilation cache: standard
GRPO and agentic GRPO with rl.off_policy_steps 0 and 1, each with rollout_engine vanilla and batched
(and, when --configs names agentic1split, off_policy_steps 1 with trainer and sampler on separate
halves of the devices: two host devices on a CPU; agentic1http, off_policy_steps 1 with the run's
single turn made by benchmarks/agents/chat_agent.py, an `openai`-client agent trained through
rl.agent: the policy served over HTTP, the agent in worker processes). An agentic run keeps one step's samples in flight
(rl.max_concurrency); each run gets only the keys its mode reads.
Per configuration it reports the training wall time (train_rl's "Trained steps A to B in X s", model
loading and evaluation excluded) and the part of it spent compiling, rollout tokens/s (completion
tokens generated for training / that wall time), the median step time after the first step (which
carries most of the compiling), the mean trainer/idle_fraction, the mean share of prompt tokens
read from a reused KV prefix and the decode steps' tokens/s and GB/s read (batched engine; against the
HBM roofline on a GPU the script knows), the final mean reward (rewards/sum of the last step)
and the wall-time ratio to standard GRPO with the same engine and to standard GRPO with the vanilla
engine (when that was run), each also with compiling left out of both (what longer runs approach).
Prints a table and writes benchmarks/results/agentic_vs_standard.json (or --output).

--quick: a tiny random model (qwen3-tiny), so rewards do not move; the full run is the default demo
(SmolLM2-135M-Instruct on GSM8K, 6 steps of 2 prompts x 4 samples). --model NAME trains that model's
shape from seeded random weights instead (random_weights=true), e.g. --model qwen3-0.6b on a GPU.
Extra key=value arguments reach every run. --engines and --configs run a part of the table;
--append adds it to the JSON already at --output (same arguments, device and versions), so a
table too long for one session or one command's time limit is measured in parts.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import run_log
from model_benchmark import PEAKS, fmt

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "agentic_vs_standard.json")

_AGENTIC1 = ["rl.use_agentic_rollout=true", "rl.off_policy_steps=1"]
CONFIGS = {  # --configs choice: (name in the table, extra arguments)
  "standard": ("standard", []),
  "agentic0": ("agentic off_policy=0", ["rl.use_agentic_rollout=true", "rl.off_policy_steps=0"]),
  "agentic1": ("agentic off_policy=1", _AGENTIC1),
  "agentic1split": (
    "agentic off_policy=1, split devices",
    _AGENTIC1 + ["trainer_devices_fraction=0.5", "sampler_devices_fraction=0.5"],
  ),
  # the same single turn by an OpenAI-SDK agent in a worker process, through the served policy
  "agentic1http": (
    "agentic off_policy=1, rl.agent over HTTP",
    _AGENTIC1 + [f"rl.agent={os.path.join(os.path.dirname(os.path.abspath(__file__)), 'agents', 'chat_agent.py')}:run"],
  ),
}
DEFAULT_CONFIGS = ("standard", "agentic0", "agentic1")
# On a CPU the split's two halves are two host devices; an accelerator needs two devices of its own.
SPLIT_XLA_FLAG = "--xla_force_host_platform_device_count=2"
ENGINES = ("vanilla", "batched")


def _common(args) -> list[str]:
  work = [
    f"num_batches={args.steps}",
    "num_test_batches=1",
    "eval_batch_size=2",
    "checkpoint_period=1000",
    "decode_seed=0",
    "data_shuffle_seed=0",
    "jax_cache_dir=",
  ]  # every run compiles for itself
  work += [f"batch_size={args.batch_size}", f"rl.num_generations={args.generations}"]
  if args.quick:
    work += ["model_name=qwen3-tiny", "max_response_length=32", "learning_rate=1e-3", "warmup_steps_fraction=0"]
  if args.model:
    work += [f"model_name={args.model}", "random_weights=true"]
  return work + args.overrides


def runs_on(config: str, engines) -> list[str]:
  """The engines of `engines` that `config` runs on: rl.agent (agentic1http) is served from the
  batched engine only."""
  return [e for e in engines if config != "agentic1http" or e == "batched"]


def run_environment(config: str, environ) -> dict:
  """The environment of `config`'s run: `environ`, plus two host devices for the split."""
  env = dict(environ)
  if config == "agentic1split":
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {SPLIT_XLA_FLAG}".strip()
  return env


def run_name(config: str, engine: str) -> str:
  return re.sub(r"[^a-z0-9]+", "_", f"{CONFIGS[config][0]}_{engine}")


def train_rl_arguments(config: str, engine: str, common: list[str], out_dir: str) -> list[str]:
  """train_rl's arguments for `config` on `engine`: rl.yml, the work every configuration shares,
  the engine, where it writes, and the keys of that configuration only (an agentic one's rollouts in
  flight: one step's samples, all at once), so that no run gets a key its mode refuses."""
  _, extra = CONFIGS[config]
  if "rl.use_agentic_rollout=true" in extra:
    extra = [*extra, f"rl.max_concurrency={_arg(common, 'batch_size') * _arg(common, 'rl.num_generations')}"]
  placement = [f"base_output_directory={out_dir}", f"run_name={run_name(config, engine)}"]
  return ["rl.yml", *common, f"rollout_engine={engine}", *placement, *extra]


def _run_one(config: str, engine: str, common: list[str], out_dir: str) -> dict:
  name = CONFIGS[config][0]
  cmd = [
    sys.executable,
    "-m",
    "maxtext.trainers.post_train.rl.train_rl",
    *train_rl_arguments(config, engine, common, out_dir),
  ]
  started = time.time()
  proc = subprocess.run(
    cmd, capture_output=True, text=True, check=False, cwd=ROOT, env=run_environment(config, os.environ)
  )
  if proc.returncode != 0:
    raise RuntimeError(f"{name} / {engine} failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  steps, train_s, compile_s = run_log.trained(proc.stderr)
  with open(os.path.join(out_dir, run_name(config, engine), "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]

  per_sample = [r.get("completions/mean_length", r.get("generation/completions/mean_length")) for r in rows]
  samples = _arg(common, "batch_size") * _arg(common, "rl.num_generations")
  idle = [r["trainer/idle_fraction"] for r in rows if "trainer/idle_fraction" in r]
  reuse = [r["rollout/prefix_reuse_fraction"] for r in rows if "rollout/prefix_reuse_fraction" in r]
  later = sorted(r["step_time_s"] for r in rows[1:])
  decode = rows[-1].get("rollout/decode_tokens_per_s"), rows[-1].get("rollout/decode_gb_per_s")  # whole run
  return {
    "config": name,
    "engine": engine,
    "steps": steps,
    "wall_s": train_s,
    "compile_s": compile_s,
    "process_s": time.time() - started,
    "rollout_tokens_per_s": sum(per_sample) * samples / train_s,
    "trainer_idle_fraction": sum(idle) / len(idle) if idle else None,
    "later_step_s": later[len(later) // 2] if later else None,
    "prefix_reuse_fraction": sum(reuse) / len(reuse) if reuse else None,
    "decode_tokens_per_s": decode[0],
    "decode_gb_per_s": decode[1],
    "final_mean_reward": rows[-1]["rewards/sum"],
  }


def _arg(common: list[str], key: str) -> int:
  return int([a.split("=", 1)[1] for a in common if a.startswith(key + "=")][-1])


def merge(previous: dict, report: dict, path: str) -> dict:
  """`report` with the results of `previous` (the JSON at `path`) for the configurations and engines
  it did not run; both must have measured the same work with the same device and versions."""
  for key in ("arguments", "device", "versions"):
    check_same(previous, key, report[key], path)
  ran = {(r["config"], r["engine"]) for r in report["results"]}
  order = [(name, engine) for name, _ in CONFIGS.values() for engine in ENGINES]
  results = report["results"] + [r for r in previous["results"] if (r["config"], r["engine"]) not in ran]
  return {**report, "results": sorted(results, key=lambda r: order.index((r["config"], r["engine"])))}


def check_same(previous: dict, key: str, value, path: str) -> None:
  if previous.get(key) != value:
    raise SystemExit(
      f"--append: {path} has {key} {previous.get(key)!r}, this run {value!r}: expected the "
      "same (or leave --append out to start a new file)"
    )


def add_ratios(results: list[dict], bandwidth: float | None) -> None:
  """Wall-time ratios to standard GRPO (same engine and vanilla, each also without compiling) where that
  ran, and decode against the HBM roofline where the device's bandwidth is known."""
  base = {r["engine"]: r for r in results if r["config"] == "standard"}
  for r in results:
    for name, standard in (("same_engine", base.get(r["engine"])), ("vanilla", base.get("vanilla"))):
      r[f"ratio_to_standard_{name}"] = r["wall_s"] / standard["wall_s"] if standard else None
      r[f"ratio_to_standard_{name}_without_compiling"] = (
        (r["wall_s"] - r["compile_s"]) / (standard["wall_s"] - standard["compile_s"]) if standard else None
      )
    # decode at the HBM bandwidth reads what it read at that many tokens/s
    fraction = r["decode_gb_per_s"] * 1e9 / bandwidth if bandwidth and r["decode_gb_per_s"] else None
    r["decode_fraction_of_hbm_roofline"] = fraction
    r["decode_roofline_tokens_per_s"] = r["decode_tokens_per_s"] / fraction if fraction else None


def _versions() -> dict:
  from importlib import metadata

  return {p: metadata.version(p) for p in ("jax", "jaxlib", "flax", "google-tunix")}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
  """The command line (sys.argv when argv is None), with the defaults --quick changes filled in."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--quick", action="store_true", help="tiny random model (minutes on 2 CPU cores)")
  parser.add_argument("--model", help="model_name to train from seeded random weights (default: the demo's)")
  parser.add_argument("--steps", type=int, default=None, help="training steps (default 6, --quick 4)")
  parser.add_argument("--batch-size", type=int, default=None, help="prompts per step (default the demo's 2, --quick 4)")
  parser.add_argument("--generations", type=int, default=4)
  parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
  parser.add_argument(
    "--configs",
    nargs="+",
    choices=list(CONFIGS),
    default=list(DEFAULT_CONFIGS),
    help="agentic1split (trainer and sampler on halves of the devices) runs only when named",
  )
  parser.add_argument("--output", default=RESULTS, help="where the JSON goes")
  parser.add_argument(
    "--append", action="store_true", help="keep --output's results for the configurations and engines not run now"
  )
  parser.add_argument("overrides", nargs="*", help="key=value arguments for every run")
  args = parser.parse_args(argv)
  args.steps = args.steps or (4 if args.quick else 6)
  args.batch_size = args.batch_size or (4 if args.quick else 2)
  return args


def main() -> None:
  from maxtext.utils import xla_flags

  xla_flags.use_sequential_cpu_scheduler()  # as train_rl does, before JAX starts
  args = parse_args()
  common = _common(args)
  previous = None
  if args.append and os.path.exists(args.output):
    with open(args.output, encoding="utf-8") as f:
      previous = json.load(f)
    check_same(previous, "arguments", common, args.output)  # before hours of runs; device and versions after
  results = []
  with tempfile.TemporaryDirectory() as out_dir:
    for config in args.configs:
      for engine in runs_on(config, args.engines):
        results.append(_run_one(config, engine, common, out_dir))
        print(f"  done: {results[-1]['config']} / {engine}: {results[-1]['wall_s']:.1f} s", file=sys.stderr, flush=True)
  # jax only now: importing it before the runs would hold the GPU they need
  import jax

  device = str(jax.devices()[0].device_kind)
  report = {
    "date": datetime.date.today().isoformat(),
    "device": device,
    "cpu_count": os.cpu_count(),
    "python": platform.python_version(),
    "versions": _versions(),
    "arguments": common,
    "results": results,
  }
  if previous is not None:
    report = merge(previous, report, args.output)
  results = report["results"]
  add_ratios(results, PEAKS.get(device, (None, None))[1])
  os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    json.dump(report, f, indent=2)
  print(
    "| configuration | engine | wall s | compiling s | later steps s/step | rollout tok/s | trainer idle "
    "| prefix reuse | decode tok/s | decode GB/s | HBM roofline tok/s | final reward | / standard (same engine) "
    "| without compiling | / standard vanilla | without compiling |"
  )
  print("| --- " * 16 + "|")
  for r in results:
    print(
      f"| {r['config']} | {r['engine']} | {r['wall_s']:.1f} | {r['compile_s']:.1f} | "
      f"{fmt(r['later_step_s'], '.1f')} | {r['rollout_tokens_per_s']:.1f} | {fmt(r['trainer_idle_fraction'])} | "
      f"{fmt(r['prefix_reuse_fraction'])} | {fmt(r['decode_tokens_per_s'], '.1f')} | "
      f"{fmt(r['decode_gb_per_s'], '.2f')} | {fmt(r['decode_roofline_tokens_per_s'], '.0f')} | "
      f"{r['final_mean_reward']:.3f} | "
      f"{fmt(r['ratio_to_standard_same_engine'])} | {fmt(r['ratio_to_standard_same_engine_without_compiling'])} | "
      f"{fmt(r['ratio_to_standard_vanilla'])} | "
      f"{fmt(r['ratio_to_standard_vanilla_without_compiling'])} |"
    )
  print(f"wrote {args.output}")


if __name__ == "__main__":
  main()
