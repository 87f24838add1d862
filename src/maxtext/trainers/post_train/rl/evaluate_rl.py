"""Evaluation: accuracy, partial accuracy (within 10%) and format accuracy over num_eval_passes.

    python -m maxtext.trainers.post_train.rl.evaluate_rl rl.yml load_parameters_path=... [key=value ...]

evaluates a checkpoint without training; its last stdout line is a JSON summary. eval_mode says how
passes combine per question: pass (pass@k, right if any pass is right), maj (the majority answer is
judged) or pass_at_1 (the mean over passes).
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Callable

import numpy as np
import tqdm

from maxtext.configs import cli
from maxtext.input_pipeline import templates
from maxtext.trainers.post_train.rl import utils_rl
from maxtext.utils import numbers
from maxtext.utils.errors import ConfigError


def score(completions: list[str], truths: list[str], cfg) -> list[dict]:
  """Per-completion verdicts: the extracted answer, correct, within 10%, formatted (the exact tag format, or
  with answer_format=last_number a number present)."""
  completions = [templates.answer_prefix(cfg) + c for c in completions]
  guesses = [utils_rl.extract_answer(c, cfg) for c in completions]
  correct = utils_rl.answers_match(guesses, truths, cfg)
  formatted: list[bool] | list[float]
  if cfg.answer_format == "last_number":
    formatted = [guess is not None for guess in guesses]
  else:
    formatted = utils_rl.match_format_exactly(None, completions, cfg)
  out = []
  for guess, ok, fmt, truth in zip(guesses, correct, formatted, truths):
    value = numbers.parse_number(guess) if guess else None
    near = numbers.within(value, numbers.parse_number(truth), 0.1)
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
  counts = collections.Counter(numbers.parse_number(p["answer"]) or p["answer"].strip() for p in answered)
  top = counts.most_common(1)[0][0]
  chosen = next(p for p in answered if (numbers.parse_number(p["answer"]) or p["answer"].strip()) == top)
  return {k: chosen[k] for k in ("correct", "partially_correct", "formatted")}


def evaluate(generate: Callable[[list[str]], list[str]], examples: list[dict], cfg, desc: str) -> dict:
  """Completions for examples (num_eval_passes each), scored and combined per eval_mode."""
  per_example: list[list[dict]] = [[] for _ in examples]
  batches = range(0, len(examples), cfg.eval_batch_size)
  with tqdm.tqdm(total=len(batches) * cfg.num_eval_passes, desc=desc, unit="batch") as bar:
    for _ in range(cfg.num_eval_passes):
      for start in batches:
        batch = examples[start : start + cfg.eval_batch_size]
        completions = generate([ex["prompts"] for ex in batch])
        for i, (completion, verdict) in enumerate(
          zip(completions, score(completions, [ex["answer"] for ex in batch], cfg))
        ):
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


def paired_gain(before: dict, after: dict, resamples: int = 10000, seed: int = 0) -> dict | None:
  """Accuracy after minus before on the same questions, with a paired bootstrap 95% interval
  (questions resampled with replacement, both evaluations kept together); None without per-question
  records (eval_make_lst=false) or when the two evaluations asked different questions."""
  rows = [(before or {}).get("examples"), (after or {}).get("examples")]
  if not rows[0] or not rows[1] or [e["question"] for e in rows[0]] != [e["question"] for e in rows[1]]:
    return None
  diff = np.array([float(a["correct"]) - float(b["correct"]) for b, a in zip(*rows)])
  picks = np.random.default_rng(seed).integers(0, len(diff), (resamples, len(diff)))
  low, high = np.percentile(diff[picks].mean(axis=1), [2.5, 97.5])
  return {
    "gain": float(diff.mean()),
    "ci95_low": float(low),
    "ci95_high": float(high),
    "num_examples": len(diff),
    "improved": int((diff > 0).sum()),
    "worsened": int((diff < 0).sum()),
  }


def summary_of(result: dict | None) -> dict | None:
  return None if result is None else {k: v for k, v in result.items() if k != "examples"}


def evaluate_checkpoint(cfg) -> list[dict]:
  """Loads the model per cfg and evaluates it on the evaluation split; writes eval.json and
  returns the summary (the command's stdout line)."""
  from maxtext.input_pipeline import datasets
  from maxtext.integration.tunix import rollout
  from maxtext.trainers.post_train.rl.run_folder import RunFolder

  if cfg.num_test_batches == 0:
    raise ConfigError("num_test_batches=0: evaluate_rl has nothing to evaluate; expected a positive integer")
  generate, tokenizer = rollout.load_sampler(cfg, rollout.Mode.EVAL)
  examples = datasets.eval_examples(cfg, tokenizer)
  result = evaluate(lambda prompts: generate(prompts).text, examples, cfg, "eval")
  RunFolder(cfg).write_results({"checkpoint": result})
  summary = summary_of(result)
  assert summary is not None  # result is a dict
  return [summary]


def main(argv: list[str]) -> int:
  return cli.main(argv, evaluate_checkpoint)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
