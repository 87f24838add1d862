"""Our GRPO trainer against TRL's GRPOTrainer on identical work, in one invocation.

    python benchmarks/vs_trl.py [--shape demo|gsm8k] [--steps 6] [--rounds 1] [--output F] [--work-dir D]
        [--ours-without-torch] [--ours-also key=value ...] [key=value ...]

Needs TRL (an optional benchmark extra, not a runtime dependency): pip install trl==1.16.0 (and
peft==0.21.2 for lora_rank > 0).

Identical work: the same weights (SmolLM2-135M-Instruct from the embedded GGUF, written once as an
HF checkpoint by our to_huggingface, float32), the same prompts in the same order (our data pipeline
renders them; TRL gets the rendered text), the same group size, batch, micro-batch, prompt and
response lengths, sampling (temperature, top-k, top-p), optimizer (AdamW betas, weight decay,
global-norm clipping, learning rate with linear warmup and cosine decay to 0), KL coefficient,
clipping epsilon and loss aggregation (sequence-mean-token-mean: TRL's loss_type="grpo"), the same reward
(the reply's last number equals the answer, one Python function both call), and with lora_rank > 0
the same LoRA adapters (rank, alpha, on every attention and MLP projection; TRL through PEFT). --shape names
the work (SHAPES): demo (the default) is the default demo's (rl_times_table.yml: 8 prompts x 8 samples, 12-token
replies, micro-batches of 16, no KL reference); gsm8k is a typical GRPO shape (rl.yml's GSM8K prompts with its
system prompt, 2 prompts x 4 samples, 128-token replies, temperature 0.9, top-k 50, a KL reference at
rl.grpo_beta=0.08, learning rate 3e-6). key=value arguments change either for both trainers (a yml first
replaces the demo's recipe).

Each trainer runs in its own process, alternating (ours, TRL, ours, ...) for --rounds rounds; no JAX
compilation cache, so our first step includes compiling. TRL keeps its defaults where they are not
the work (e.g. gradient checkpointing, which it turns on by default). Per run: total training time,
median step time after the first step, compile time (ours), peak RSS of the process, and each
step's mean reward and gradient norm (before clipping). Prints a table with the ratios (ours / TRL) and writes
benchmarks/results/vs_trl.json (or --output). The work (HF export, prompts, both trainers' run folders) goes to
a temporary folder, deleted at the end, or to --work-dir, kept (a later invocation reuses its HF export).
With --ours-without-torch our process runs as where PyTorch is not installed (train_rl needs none, but
transformers imports it with any tokenizer where it is: about 0.28 GB of our peak RSS here). With
--ours-also key=value ..., each round also runs ours with those settings added (e.g.
rollout_dtype=bfloat16), after the plain run, with its own ratios against TRL.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results", "vs_trl.json")

REWARD = '''import re


def last_number_correct(prompts, completions, tmvp_config=None, *, answer, **kwargs):
  """1.0 where the completion's last number equals the answer."""
  out = []
  for completion, truth in zip(completions, answer):
    numbers = re.findall(r"-?\\d+(?:\\.\\d+)?", str(completion).replace(",", ""))
    out.append(float(bool(numbers) and float(numbers[-1]) == float(truth)))
  return out
'''

# Prepended to a `python -c` program: reports the process's peak RSS on exit (read back by peak_gb). Linux's
# VmHWM, not getrusage's ru_maxrss, which keeps the parent's peak across exec.
PEAK_PRELUDE = (
  "import atexit, sys; atexit.register(lambda: print('peak_rss_kb=' + next(line.split()[1] for line "
  "in open('/proc/self/status') if line.startswith('VmHWM:')), file=sys.stderr)); "
)


# --shape: the work's settings (before the command line's key=value arguments).
SHAPES = {
  "demo": [],
  "gsm8k": [
    "rl.yml",
    "model_name=smollm2-135m",
    "dataset_name=gsm8k",
    "max_prompt_length=192",
    "max_response_length=128",
    "batch_size=2",
    "rl.num_generations=4",
    "decode_sampling_temperature=0.9",
    "decode_sampling_top_k=50",
    "rl.grpo_beta=0.08",
    "learning_rate=3e-6",
  ],
}


def _config_args(args, work: str) -> list[str]:
  """train_rl's arguments for the benchmark's work (the TRL run reads the same resolved config). No
  evaluation (eval_batch_size back at base.yml's value, which num_test_batches=0 accepts)."""
  overrides = list(args.overrides)
  yml = overrides.pop(0) if overrides and overrides[0].endswith(".yml") else "rl_times_table.yml"
  return [
    yml,
    f"load_parameters_path={os.path.join(work, 'hf')}",
    "dtype=float32",
    "weight_dtype=float32",
    f"num_batches={args.steps}",
    "num_test_batches=0",
    "eval_batch_size=8",
    "checkpoint_period=100000",
    "jax_cache_dir=",
    f"reward_functions_path={os.path.join(work, 'reward.py')}",
    "reward_functions=[last_number_correct]",
    f"base_output_directory={work}",
    *overrides,
  ]


def _prepare(args, work: str) -> dict:
  """Writes the HF checkpoint, the reward file and the rendered prompts; returns the work's shape."""
  hf = os.path.join(work, "hf")
  if not os.path.isfile(os.path.join(hf, "config.json")):
    model_args = [a for a in _config_args(args, work) if a.split("=")[0] in ("model_name",) or a.endswith(".yml")]
    subprocess.run(
      [
        sys.executable,
        "-m",
        "maxtext.checkpoint_conversion.to_huggingface",
        *model_args,
        f"hf_output_path={hf}",
        "dtype=float32",
        "weight_dtype=float32",
      ],
      check=True,
      cwd=ROOT,
    )
  with open(os.path.join(work, "reward.py"), "w", encoding="utf-8") as f:
    f.write(REWARD)
  from maxtext import tasks
  from maxtext.configs import pyconfig
  from maxtext.input_pipeline import datasets, templates
  from maxtext.input_pipeline import tokenizer as tokenizer_lib

  cfg = pyconfig.initialize(["vs_trl", *_config_args(args, work), "run_name=prepare"])
  tokenizer = tokenizer_lib.tokenizer_for(cfg.model)
  template = templates.PromptTemplate(cfg.task, tokenizer, tasks.select(cfg.data.dataset_name).template)
  source = datasets.Examples(cfg.data, template, cfg.sampling.max_prompt_length, cfg.maxtext_view())
  batches = list(
    datasets.train_batches(
      source.training(), cfg.train, cfg.data.data_shuffle_seed, f"dataset_name={cfg.data.dataset_name}"
    )
  )
  rows = [{"prompt": str(p), "answer": str(a)} for b in batches for p, a in zip(b["prompts"], b["answer"])]
  with open(os.path.join(work, "prompts.jsonl"), "w", encoding="utf-8") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  rl = cfg.algorithm
  if rl.loss_agg_mode != "sequence-mean-token-mean" or rl.num_iterations != 1 or rl.loss_algo != "grpo":
    raise SystemExit("vs_trl maps only loss_agg_mode=sequence-mean-token-mean, rl.num_iterations=1, rl.loss_algo=grpo")
  default_targets = pyconfig.initialize(["vs_trl", "base.yml"]).model.lora_module_path
  if cfg.model.lora_rank and cfg.model.lora_module_path != default_targets:
    raise SystemExit("vs_trl maps only the default lora_module_path (every attention and MLP projection)")
  return {
    "steps": args.steps,
    "prompts_per_step": cfg.train.batch_size,
    "num_generations": rl.num_generations,
    "micro_batch_sequences": (cfg.train.train_micro_batch_size or cfg.train.batch_size) * rl.num_generations,
    "max_prompt_length": cfg.sampling.max_prompt_length,
    "max_response_length": cfg.sampling.max_response_length,
    "temperature": cfg.sampling.decode_sampling_temperature,
    "top_k": cfg.sampling.decode_sampling_top_k,
    "top_p": cfg.sampling.decode_sampling_top_p,
    "learning_rate": cfg.train.learning_rate,
    "beta": rl.grpo_beta,
    "epsilon": rl.grpo_epsilon,
    "kl_loss_mode": rl.kl_loss_mode,
    "adam_weight_decay": cfg.train.adam_weight_decay,
    "gradient_clipping_threshold": cfg.train.gradient_clipping_threshold,
    "adam_b1": cfg.train.adam_b1,
    "adam_b2": cfg.train.adam_b2,
    "warmup_steps": int(cfg.train.warmup_steps_fraction * args.steps),
    "model": cfg.model.model_name,
    "rollout_engine": cfg.sampling.rollout_engine,
    "remat_policy": cfg.model.remat_policy,
    "lora_rank": cfg.model.lora_rank,
    "lora_alpha": cfg.model.lora_alpha,
  }


def peak_gb(stderr: str) -> float:
  """The peak RSS (GB, 1e9 bytes) a PEAK_PRELUDE program reported on stderr."""
  return int([line for line in stderr.splitlines() if line.startswith("peak_rss_kb=")][-1].split("=")[1]) * 1024 / 1e9


# Makes `import torch` fail in our process, as where PyTorch is not installed: train_rl needs none (requirements.txt
# has none; this environment has it for the tests and TRL), but transformers 5 imports it with any tokenizer.
WITHOUT_TORCH = "sys.modules['torch'] = None; "


def _run_ours(args, work: str, name: str, extra: tuple[str, ...] = ()) -> dict:
  code = (
    PEAK_PRELUDE
    + (WITHOUT_TORCH if args.ours_without_torch else "")
    + (
      "import runpy; sys.argv = ['train_rl', *sys.argv[1:]]; "
      "runpy.run_module('maxtext.trainers.post_train.rl.train_rl', run_name='__main__')"
    )
  )
  start = time.perf_counter()
  proc = subprocess.run(
    [sys.executable, "-c", code, *_config_args(args, work), *extra, f"run_name={name}"],
    capture_output=True,
    text=True,
    check=False,
    cwd=ROOT,
  )
  wall = time.perf_counter() - start
  if proc.returncode != 0:
    raise RuntimeError(f"ours failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  with open(os.path.join(work, name, "metrics.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  return {
    "trainer": " ".join(["ours", *extra]),
    "process_s": wall,
    "step_s": [r["step_time_s"] for r in rows],
    "compile_s": sum(r.get("compile_s", 0.0) for r in rows),
    "rewards": [r["rewards/mean"] for r in rows],
    "grad_norms": [r.get("grad_norm") for r in rows],
    "peak_rss_gb": peak_gb(proc.stderr),
  }


def _run_trl(work: str, shape: dict, name: str) -> dict:
  out = os.path.join(work, name + ".json")
  start = time.perf_counter()
  proc = subprocess.run(
    [
      sys.executable,
      "-c",
      PEAK_PRELUDE + "import runpy; sys.argv = sys.argv[1:]; "
      f"runpy.run_path({os.path.abspath(__file__)!r}, run_name='__main__')",
      os.path.abspath(__file__),
      "--trl-worker",
      json.dumps({**shape, "work": work, "out": out}),
    ],
    capture_output=True,
    text=True,
    check=False,
    cwd=ROOT,
  )
  wall = time.perf_counter() - start
  if proc.returncode != 0:
    raise RuntimeError(f"TRL failed (exit {proc.returncode}):\n{proc.stderr[-4000:]}")
  with open(out, encoding="utf-8") as f:
    result = json.load(f)
  return {"trainer": "trl", "process_s": wall, **result, "compile_s": 0.0, "peak_rss_gb": peak_gb(proc.stderr)}


def _trl_worker(spec: dict) -> None:
  """One TRL GRPOTrainer run of the prepared work; writes step times and rewards to spec["out"]."""
  import datasets
  import torch
  import transformers
  import trl

  sys.path.insert(0, spec["work"])
  from reward import last_number_correct  # the file both trainers call

  torch.manual_seed(0)
  with open(os.path.join(spec["work"], "prompts.jsonl"), encoding="utf-8") as f:
    rows = [json.loads(line) for line in f]
  per_micro = spec["micro_batch_sequences"]
  accumulation = spec["prompts_per_step"] * spec["num_generations"] // per_micro
  config = trl.GRPOConfig(
    output_dir=os.path.join(spec["work"], "trl_out"),
    use_cpu=True,
    bf16=False,
    report_to="none",
    save_strategy="no",
    logging_steps=1,
    seed=0,
    shuffle_dataset=False,
    max_steps=spec["steps"],
    per_device_train_batch_size=per_micro,
    gradient_accumulation_steps=accumulation,
    steps_per_generation=accumulation,
    num_generations=spec["num_generations"],
    max_completion_length=spec["max_response_length"],
    temperature=spec["temperature"],
    top_k=spec["top_k"],
    top_p=spec["top_p"],
    learning_rate=spec["learning_rate"],
    beta=spec["beta"],
    epsilon=spec["epsilon"],
    loss_type="grpo",
    weight_decay=spec["adam_weight_decay"],
    max_grad_norm=spec["gradient_clipping_threshold"],
    adam_beta1=spec["adam_b1"],
    adam_beta2=spec["adam_b2"],
    lr_scheduler_type="cosine",
    warmup_steps=spec["warmup_steps"],  # optax's warmup-cosine to 0, as ours
  )
  model = transformers.AutoModelForCausalLM.from_pretrained(os.path.join(spec["work"], "hf"), dtype=torch.float32)
  tokenizer = transformers.AutoTokenizer.from_pretrained(os.path.join(spec["work"], "hf"))
  tokenizer.padding_side = "left"
  step_ends = [time.perf_counter()]

  class StepClock(transformers.TrainerCallback):
    def on_train_begin(self, *_, **__):
      step_ends[0] = time.perf_counter()

    def on_step_end(self, *_, **__):
      step_ends.append(time.perf_counter())

  peft_config = None
  if spec["lora_rank"]:
    import peft

    peft_config = peft.LoraConfig(
      r=spec["lora_rank"],
      lora_alpha=spec["lora_alpha"],
      lora_dropout=0.0,
      target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    )
  trainer = trl.GRPOTrainer(
    model=model,
    reward_funcs=last_number_correct,
    args=config,
    train_dataset=datasets.Dataset.from_list(rows),
    processing_class=tokenizer,
    callbacks=[StepClock()],
    peft_config=peft_config,
  )
  trainer.train()
  history = trainer.state.log_history
  with open(spec["out"], "w", encoding="utf-8") as f:
    json.dump(
      {
        "step_s": [b - a for a, b in zip(step_ends, step_ends[1:])],
        "rewards": [h["reward"] for h in history if "reward" in h],
        "grad_norms": [h["grad_norm"] for h in history if "grad_norm" in h],
        "versions": {
          "trl": trl.__version__,
          "torch": torch.__version__,
          "transformers": transformers.__version__,
          **({"peft": peft.__version__} if peft_config else {}),
        },
      },
      f,
    )


def _summary(run: dict) -> dict:
  later = run["step_s"][1:] or run["step_s"]
  return {**run, "train_s": sum(run["step_s"]), "warm_step_s": statistics.median(later)}


def main() -> None:
  if len(sys.argv) > 2 and sys.argv[1] == "--trl-worker":
    _trl_worker(json.loads(sys.argv[2]))
    return
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--shape", choices=list(SHAPES), default="demo", help="the work (see SHAPES)")
  parser.add_argument("--steps", type=int, default=6)
  parser.add_argument("--rounds", type=int, default=1)
  parser.add_argument("--work-dir", default="")
  parser.add_argument("--output", default=RESULTS)
  parser.add_argument(
    "--ours-without-torch", action="store_true", help="run ours as where PyTorch is not installed (train_rl needs none)"
  )
  parser.add_argument("--ours-also", nargs="+", default=[], help="key=value: a second run of ours per round")
  parser.add_argument("overrides", nargs="*", help="key=value for both trainers (a .yml first replaces the base)")
  args = parser.parse_args()
  if args.shape != "demo" and args.overrides and args.overrides[0].endswith(".yml"):
    raise SystemExit(f"--shape {args.shape} names its recipe; pass key=value arguments only")
  args.overrides = SHAPES[args.shape] + list(args.overrides)
  work = args.work_dir or tempfile.mkdtemp(prefix="vs_trl_")
  try:
    shape = _prepare(args, work)
    runs = []
    for r in range(args.rounds):
      for trainer in ("ours", "ours_also", "trl") if args.ours_also else ("ours", "trl"):
        name = f"{trainer}_{r}"
        print(f"round {r}: {trainer} ...", file=sys.stderr, flush=True)
        if trainer == "trl":
          runs.append(_summary(_run_trl(work, shape, name)))
        else:
          runs.append(_summary(_run_ours(args, work, name, tuple(args.ours_also) if trainer == "ours_also" else ())))
  finally:
    if not args.work_dir:  # (an HF export and every run's checkpoints: gigabytes per invocation)
      shutil.rmtree(work, ignore_errors=True)
  trl_runs = [x for x in runs if x["trainer"] == "trl"]
  med = lambda rs, k: statistics.median(x[k] for x in rs)
  variants = list(dict.fromkeys(x["trainer"] for x in runs if x["trainer"] != "trl"))
  ratios_of = {
    v: {
      k: med([x for x in runs if x["trainer"] == v], k) / med(trl_runs, k)
      for k in ("train_s", "warm_step_s", "peak_rss_gb")
    }
    for v in variants
  }
  ratios = ratios_of["ours"]
  width = max(len(v) for v in variants)
  print(
    f"\n{'trainer':{width}} {'train s':>9} {'warm step s':>12} {'compile s':>10} {'peak RSS GB':>12}  rewards per step"
  )
  for x in runs:
    print(
      f"{x['trainer']:{width}} {x['train_s']:9.1f} {x['warm_step_s']:12.2f} {x['compile_s']:10.1f} "
      f"{x['peak_rss_gb']:12.2f}  {[round(v, 2) for v in x['rewards']]}"
    )
  for v, r in ratios_of.items():
    print(f"{v} / TRL: " + ", ".join(f"{k} {value:.2f}x" for k, value in r.items()))
  versions = trl_runs[0].get("versions", {})
  result = {
    "date": datetime.date.today().isoformat(),
    "machine": platform.platform(),
    "cpus": os.cpu_count(),
    "python": platform.python_version(),
    "versions": versions,
    "shape_name": args.shape,
    "shape": shape,
    "ours_without_torch": args.ours_without_torch,
    "runs": runs,
    "ratios_ours_over_trl": ratios,
    **({"ratios_over_trl": ratios_of} if args.ours_also else {}),
  }
  os.makedirs(os.path.dirname(args.output), exist_ok=True)
  with open(args.output, "w", encoding="utf-8") as f:
    json.dump(result, f, indent=1)
  print(f"wrote {args.output}")


if __name__ == "__main__":
  main()
