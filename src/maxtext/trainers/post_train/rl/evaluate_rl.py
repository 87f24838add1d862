"""Evaluation: accuracy, partial accuracy (within 10%) and format accuracy over num_eval_passes.

    python -m maxtext.trainers.post_train.rl.evaluate_rl rl.yml load_parameters_path=... [key=value ...]

evaluates a checkpoint without training; its last stdout line is a JSON summary. eval_mode says how
passes combine per question: pass (pass@k, right if any pass is right), maj (the majority answer is
judged) or pass_at_1 (the mean over passes).
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import sys
from typing import Callable

import tqdm

from maxtext.trainers.post_train.rl import utils_rl
from maxtext.utils import cli

def score(completions: list[str], truths: list[str], cfg) -> list[dict]:
  """Per-completion verdicts: the extracted answer, correct, within 10%, exact format."""
  prefix = cfg.reasoning_start_token if cfg.reasoning_start_token_in_prompt else ""
  completions = [prefix + c for c in completions]
  guesses = [utils_rl.extract_answer(c, cfg) for c in completions]
  correct = utils_rl.answers_match(guesses, truths, cfg)
  formatted = utils_rl.match_format_exactly(None, completions, cfg)
  out = []
  for guess, ok, fmt, truth in zip(guesses, correct, formatted, truths):
    value, true_value = (utils_rl.parse_number(guess) if guess else None), utils_rl.parse_number(truth)
    near = value is not None and bool(true_value) and 0.9 <= value / true_value <= 1.1
    out.append({"answer": guess, "correct": bool(ok), "partially_correct": bool(ok) or near, "formatted": fmt > 0})
  return out


def aggregate(passes: list[dict], mode: str) -> dict:
  """One question's verdict from its passes' verdicts."""
  if mode == "pass":
    return {k: any(p[k] for p in passes) for k in ("correct", "partially_correct", "formatted")}
  if mode == "pass_at_1":
    return {k: sum(p[k] for p in passes) / len(passes) for k in ("correct", "partially_correct", "formatted")}
  answered = [p for p in passes if p["answer"] is not None]
  if not answered:
    return {"correct": False, "partially_correct": False, "formatted": False}
  counts = collections.Counter(utils_rl.parse_number(p["answer"]) or p["answer"].strip() for p in answered)
  top = counts.most_common(1)[0][0]
  chosen = next(p for p in answered if (utils_rl.parse_number(p["answer"]) or p["answer"].strip()) == top)
  return {k: chosen[k] for k in ("correct", "partially_correct", "formatted")}


def evaluate(generate: Callable[[list[str]], list[str]], examples: list[dict], cfg, desc: str) -> dict:
  """Completions for examples (num_eval_passes each), scored and combined per eval_mode."""
  per_example = [[] for _ in examples]
  batches = range(0, len(examples), cfg.eval_batch_size)
  with tqdm.tqdm(total=len(batches) * cfg.num_eval_passes, desc=desc, unit="batch") as bar:
    for _ in range(cfg.num_eval_passes):
      for start in batches:
        batch = examples[start:start + cfg.eval_batch_size]
        completions = generate([ex["prompts"] for ex in batch])
        for i, (completion, verdict) in enumerate(zip(completions, score(completions, [ex["answer"] for ex in batch], cfg))):
          per_example[start + i].append({"completion": completion, **verdict})
        bar.update()
  verdicts = [aggregate(p, cfg.eval_mode) for p in per_example]
  n = len(examples)
  summary = {
      "accuracy": sum(v["correct"] for v in verdicts) / n,
      "partial_accuracy": sum(v["partially_correct"] for v in verdicts) / n,
      "format_accuracy": sum(v["formatted"] for v in verdicts) / n,
      "num_examples": n,
      "num_eval_passes": cfg.num_eval_passes,
      "eval_mode": cfg.eval_mode,
      "eval_sampling_strategy": cfg.eval_sampling_strategy,
  }
  if cfg.eval_make_lst:
    summary["examples"] = [
        {"question": ex["question"], "answer": ex["answer"], **v, "passes": p}
        for ex, v, p in zip(examples, verdicts, per_example)
    ]
  return summary


def summary_of(result: dict) -> dict:
  return {k: v for k, v in result.items() if k != "examples"}


def write_results(cfg, results: dict) -> None:
  os.makedirs(cfg.run_dir, exist_ok=True)
  with open(os.path.join(cfg.run_dir, "eval.json"), "w", encoding="utf-8") as f:
    json.dump(results, f, indent=1)


def evaluate_checkpoint(cfg) -> dict:
  """Loads the model per cfg and evaluates it on the evaluation split; writes eval.json."""
  from maxtext.checkpoint_conversion.load import load_model  # pylint: disable=import-outside-toplevel
  from maxtext.input_pipeline import datasets  # pylint: disable=import-outside-toplevel
  from maxtext.input_pipeline.tokenizer import tokenizer_for  # pylint: disable=import-outside-toplevel
  from maxtext.integration.tunix import learner  # pylint: disable=import-outside-toplevel
  from maxtext.integration.tunix.rollout import RolloutEngine  # pylint: disable=import-outside-toplevel
  from maxtext.utils import mesh as mesh_lib  # pylint: disable=import-outside-toplevel

  mesh_lib.maybe_initialize_distributed()
  _, mesh = mesh_lib.create_meshes(cfg)
  tokenizer = tokenizer_for(cfg)
  examples = datasets.eval_examples(cfg, tokenizer)
  config = learner.rollout_configs(cfg, tokenizer.eos_token_id)[learner.Mode.EVAL]
  engine = RolloutEngine(load_model(cfg, mesh), tokenizer, mesh, config, seed=cfg.decode_seed)
  result = evaluate(lambda prompts: engine.generate(prompts, config).text, examples, cfg, "eval")
  write_results(cfg, {"checkpoint": result})
  return summary_of(result)


def _job(cfg) -> None:
  stdout = sys.stdout
  with contextlib.redirect_stdout(sys.stderr):
    summary = evaluate_checkpoint(cfg)
  print(json.dumps(summary), file=stdout)


def main(argv: list[str]) -> int:
  return cli.main(argv, _job)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
