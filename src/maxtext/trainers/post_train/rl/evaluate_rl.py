"""Greedy evaluation: accuracy, partial accuracy (within 10%) and format accuracy on test examples."""

from __future__ import annotations

import tqdm
from tunix.rl import rl_cluster as rl_cluster_lib

from maxtext.trainers.post_train.rl import utils_rl


def score(completion: str, truth: str, cfg) -> dict[str, bool]:
  """Per-example verdicts: correct number, number within 10%, exact format."""
  guess = utils_rl.extract_answer(completion, cfg)
  value = utils_rl.parse_number(guess) if guess is not None else None
  true_value = utils_rl.parse_number(truth)
  correct = value is not None and value == true_value
  partial = value is not None and bool(true_value) and 0.9 <= value / true_value <= 1.1
  formatted = utils_rl.match_format_exactly(None, [completion], cfg)[0] > 0
  return {"correct": correct, "partially_correct": correct or partial, "formatted": formatted}


def evaluate(cluster: rl_cluster_lib.RLCluster, examples: list[dict], cfg, desc: str) -> dict:
  """Greedy completions for examples, scored; returns the summary and per-example records."""
  records = []
  for start in tqdm.trange(0, len(examples), cfg.eval_batch_size, desc=desc, unit="batch"):
    batch = examples[start:start + cfg.eval_batch_size]
    out = cluster.generate([ex["prompts"] for ex in batch], mode=rl_cluster_lib.Mode.EVAL)
    for ex, completion in zip(batch, out.text):
      records.append({"question": ex["question"], "answer": ex["answer"], "completion": completion,
                      **score(completion, ex["answer"], cfg)})
  n = len(records)
  return {
      "accuracy": sum(r["correct"] for r in records) / n,
      "partial_accuracy": sum(r["partially_correct"] for r in records) / n,
      "format_accuracy": sum(r["formatted"] for r in records) / n,
      "num_examples": n,
      "examples": records,
  }
