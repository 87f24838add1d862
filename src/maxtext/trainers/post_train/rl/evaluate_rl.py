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

from maxtext import tasks
from maxtext.configs import cli
from maxtext.configs.run_config import RunConfig
from maxtext.configs.sections import EvalMode, EvalSection, TaskSection
from maxtext.input_pipeline import templates
from maxtext.tasks.task import Task
from maxtext.utils import numbers

Score = Callable[[list[str], list[str]], list[dict]]


def scorer(spec: Task, task: TaskSection) -> Score:
  """(completions, truths) -> the task's per-completion verdicts, on the completions as the model wrote
  them (after the prompt's answer prefix, reasoning_start_token_in_prompt)."""
  prefix = templates.answer_prefix(task)
  return lambda completions, truths: spec.score([prefix + c for c in completions], truths, task)


def aggregate(passes: list[dict], mode: EvalMode) -> dict:
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


def evaluate(
  generate: Callable[[list[str]], list[str]], examples: list[dict], score: Score, evaluation: EvalSection, desc: str
) -> dict:
  """Completions for examples (num_eval_passes each), scored and combined per eval_mode."""
  per_example: list[list[dict]] = [[] for _ in examples]
  batches = range(0, len(examples), evaluation.eval_batch_size)
  with tqdm.tqdm(total=len(batches) * evaluation.num_eval_passes, desc=desc, unit="batch") as bar:
    for _ in range(evaluation.num_eval_passes):
      for start in batches:
        batch = examples[start : start + evaluation.eval_batch_size]
        completions = generate([ex["prompts"] for ex in batch])
        for i, (completion, verdict) in enumerate(zip(completions, score(completions, [ex["answer"] for ex in batch]))):
          per_example[start + i].append({"completion": completion, **verdict})
        bar.update()
  verdicts = [aggregate(p, evaluation.eval_mode) for p in per_example]
  n = len(examples)
  summary = {
    "accuracy": sum(v["correct"] for v in verdicts) / n,
    "partial_accuracy": sum(v["partially_correct"] for v in verdicts) / n,
    "format_accuracy": sum(v["formatted"] for v in verdicts) / n,
    "num_examples": n,
    "num_eval_passes": evaluation.num_eval_passes,
    "eval_mode": evaluation.eval_mode,
    "eval_sampling_strategy": evaluation.eval_sampling_strategy,
  }
  if evaluation.eval_make_lst:
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


def evaluate_checkpoint(cfg: RunConfig) -> list[dict]:
  """Loads the model per cfg and evaluates it on the evaluation split; writes eval.json and
  returns the summary (the command's stdout line)."""
  from maxtext.trainers.post_train.rl import run_folder
  from maxtext.utils import distributed
  from maxtext.utils.steps import Steps

  cfg.check(distributed.initialize(), program="evaluate_rl")  # the layout fits the devices; the program's key is set
  with run_folder.locked(cfg.run):  # a writable folder no other run writes, checked before evaluating
    return _evaluate_into(cfg, run_folder.RunFolder(cfg.run, Steps.of(cfg.train, cfg.algorithm)))


def _evaluate_into(cfg: RunConfig, folder) -> list[dict]:
  """evaluate_checkpoint's evaluation, its result written to `folder`'s eval.json."""
  from maxtext.input_pipeline import datasets
  from maxtext.integration.tunix import rollout_setup

  task = tasks.select(cfg.data.dataset_name)
  generate, tokenizer = rollout_setup.load_sampler(
    cfg.model, cfg.mesh, cfg.sampling, cfg.eval.eval_sampling_strategy, rollout_setup.Mode.EVAL
  )
  template = templates.PromptTemplate(cfg.task, tokenizer, task.template)
  source = datasets.Examples(cfg.data, template, cfg.sampling.max_prompt_length, cfg.maxtext_view())
  examples = source.evaluation(cfg.eval.num_test_batches * cfg.eval.eval_batch_size)
  result = evaluate(lambda prompts: generate(prompts).text, examples, scorer(task, cfg.task), cfg.eval, "eval")
  folder.write_results({"checkpoint": result})
  summary = summary_of(result)
  assert summary is not None  # result is a dict
  return [summary]


def main(argv: list[str]) -> int:
  return cli.main(argv, evaluate_checkpoint)


if __name__ == "__main__":
  sys.exit(main(sys.argv))
