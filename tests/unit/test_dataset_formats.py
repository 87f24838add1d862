"""Datasets as TRL, Tunix and MaxText users bring them: every file format and saved dataset loads
the same rows; a TRL-style `prompt` (text or a conversation) with a `solution`, or Tunix's and
MaxText's `question` and `answer`, is read by column (prompt_column / answer_column); every column
travels with the example into the training batches; what cannot be read is refused in one line
naming the way forward."""

import json

import numpy as np
import pytest

from maxtext.input_pipeline import datasets
from maxtext.input_pipeline.text_as_data import Rendered
from maxtext.rl.prompt_feed import single_prompts
from maxtext.utils import errors
from tests.conftest import make_config, template_for

SYSTEM = "Answer with a number."


def _conversation(i: int) -> list[dict]:
  """A system turn, an earlier exchange and the question."""
  return [
    {"role": "system", "content": "You are a careful calculator."},
    {"role": "user", "content": "What is 1 + 1?"},
    {"role": "assistant", "content": "2"},
    {"role": "user", "content": f"What is {i} + {i}?"},
  ]


PLAIN = [{"prompt": f"What is {i} + {i}?", "solution": f"{2 * i}", "source": f"gen-{i}"} for i in range(4)]
CONVERSATIONAL = [{"prompt": _conversation(i), "solution": f"{2 * i}", "source": f"gen-{i}"} for i in range(4)]


def _template_file(tmp_path) -> str:
  path = tmp_path / "template.json"
  path.write_text(json.dumps({"SYSTEM_PROMPT": SYSTEM, "TEMPLATE": "{question}"}))
  return str(path)


def _config(name, tmp_path, *overrides):
  return make_config(
    f"dataset_name={name}", "train_fraction=1.0", f"data_template_path={_template_file(tmp_path)}", *overrides
  )


def _training(cfg, tokenizer, render=None):
  source = datasets.Examples(cfg.data, template_for(cfg, tokenizer), cfg.sampling.max_prompt_length, cfg.maxtext_view())
  return source.training(render)


def _write(rows, tmp_path, fmt) -> str:
  """rows written as the format `fmt`: the dataset_name that reads them."""
  import datasets as hf_datasets
  import pyarrow as pa
  import pyarrow.parquet as pq

  if fmt == "jsonl":
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  elif fmt == "json array":
    path = tmp_path / "data.json"
    path.write_text(json.dumps(rows, indent=2))
  elif fmt == "json lines in .json":
    path = tmp_path / "data.json"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  elif fmt == "csv":
    path = tmp_path / "data.csv"
    path.write_text(
      "prompt,solution,source\n" + "".join(f"{r['prompt']},{r['solution']},{r['source']}\n" for r in rows)
    )
  elif fmt == "parquet":
    path = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
  elif fmt == "save_to_disk Dataset":
    path = tmp_path / "saved"
    hf_datasets.Dataset.from_list(rows).save_to_disk(str(path))
  elif fmt == "save_to_disk DatasetDict":
    path = tmp_path / "saved_splits"
    splits = {"train": hf_datasets.Dataset.from_list(rows), "test": hf_datasets.Dataset.from_list(rows[:1])}
    hf_datasets.DatasetDict(splits).save_to_disk(str(path))
  else:  # an HF dataset folder, loaded by datasets.load_dataset as a hub name is
    (tmp_path / "hf" / "data").mkdir(parents=True)
    (tmp_path / "hf" / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "hf"
  return str(path)


FORMATS = [
  "jsonl",
  "json array",
  "json lines in .json",
  "parquet",
  "save_to_disk Dataset",
  "save_to_disk DatasetDict",
  "hf folder",
]


@pytest.mark.parametrize("fmt", [*FORMATS, "csv"])
def test_every_format_gives_the_same_plain_examples(tmp_path, qwen3_tokenizer, fmt):
  """A TRL-style text prompt is the question, rendered through the data template; the solution is
  the answer; every column stays under its own name."""
  name = _write(PLAIN, tmp_path, fmt)
  cfg = _config(name, tmp_path)
  examples = _training(cfg, qwen3_tokenizer)
  assert sorted((e["question"], e["answer"], e["prompt"], e["solution"], e["source"]) for e in examples) == sorted(
    (r["prompt"], r["solution"], r["prompt"], r["solution"], r["source"]) for r in PLAIN
  )
  for e in examples:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": e["prompt"]}]
    assert e["prompts"] == qwen3_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_gives_the_same_conversational_examples(tmp_path, qwen3_tokenizer, fmt):
  """A conversation (system turn, earlier turns) is rendered through the chat template as given: the
  data template's system prompt is not added; the example keeps it as its `prompt`."""
  name = _write(CONVERSATIONAL, tmp_path, fmt)
  examples = _training(_config(name, tmp_path), qwen3_tokenizer)
  assert len(examples) == len(CONVERSATIONAL)
  for e in sorted(examples, key=lambda e: e["source"]):
    i = int(e["source"].split("-")[1])
    assert e["prompt"] == _conversation(i) and e["solution"] == str(2 * i)
    assert (e["question"], e["user_content"], e["answer"]) == (f"What is {i} + {i}?", f"What is {i} + {i}?", str(2 * i))
    expected = qwen3_tokenizer.apply_chat_template(_conversation(i), add_generation_prompt=True, tokenize=False)
    assert e["prompts"] == expected and SYSTEM not in expected


def test_a_conversation_without_a_system_turn_is_rendered_as_given(tmp_path, smollm2_tokenizer):
  """No data-template system prompt is added: the chat template's own default applies (SmolLM2's)."""
  messages = [{"role": "user", "content": "What is 2 + 2?"}]
  path = tmp_path / "data.jsonl"
  path.write_text(json.dumps({"prompt": messages, "solution": "4"}) + "\n")
  [example] = _training(_config(path, tmp_path, "reasoning_start_token_in_prompt=true"), smollm2_tokenizer)
  rendered = smollm2_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
  assert example["prompts"] == rendered + "<reasoning>" and SYSTEM not in rendered


def test_every_column_travels_in_the_training_batches(tmp_path, qwen3_tokenizer):
  """Columns of any kind (a conversation, numbers, lists, dicts, one some rows lack) reach every batch
  whole, and the agentic feed's one-prompt batches too."""
  rows = [
    {
      "prompt": _conversation(i)[i % 2 * 2 :],  # conversations of different lengths
      "solution": str(2 * i),
      "id": i,
      "tags": ["sum"] * (i + 1),
      "meta": {"level": i},
      **({"hint": "double it"} if i % 2 else {}),
    }
    for i in range(4)
  ]
  path = tmp_path / "data.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  cfg = _config(path, tmp_path, "batch_size=2", "num_batches=2")
  examples = _training(cfg, qwen3_tokenizer)
  assert [e["hint"] for e in examples] == [None, "double it", None, "double it"]
  batches = list(datasets.train_batches(examples, cfg.train, cfg.data.data_shuffle_seed, "dataset_name=x"))
  reserve = datasets.reserve_batches(examples, cfg.train, cfg.data.data_shuffle_seed)
  by_id = {r["id"]: r for r in rows}
  for batch in [*batches, reserve[0], reserve[5]]:
    assert set(batch) == {"prompt", "solution", "id", "tags", "meta", "hint", *datasets.INTERNAL}
    assert batch["id"].dtype.kind == "i" and all(isinstance(p, Rendered) for p in batch["prompts"])  # with its ids
    for j, i in enumerate(batch["id"]):
      row = by_id[int(i)]
      assert batch["prompt"][j] == row["prompt"] and batch["tags"][j] == row["tags"]
      assert batch["meta"][j] == row["meta"] and batch["hint"][j] == row.get("hint")
      assert batch["solution"][j] == row["solution"]
    assert sorted(int(i) for p in single_prompts(batch) for i in p["id"]) == sorted(int(i) for i in batch["id"])
    for p in single_prompts(batch):
      assert p["prompt"].shape == (1,) and p["prompt"][0] == by_id[int(p["id"][0])]["prompt"]
  # As Tunix repeats a batch for its generations: each value stays whole.
  repeated = np.repeat(batches[0]["prompt"], 2, axis=0)
  assert list(repeated) == [v for v in batches[0]["prompt"] for _ in range(2)]


def test_the_column_mapping_keys_choose_the_prompt_and_the_answer(tmp_path, qwen3_tokenizer):
  path = tmp_path / "data.jsonl"
  rows = [{"problem": f"What is {i} * 3?", "reference": f"so #### {3 * i}", "answer": f"{3 * i}"} for i in range(2)]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  examples = _training(_config(path, tmp_path, "prompt_column=problem", "answer_column=reference"), qwen3_tokenizer)
  assert [(e["question"], e["answer"], e["reference"]) for e in examples] == [
    (r["problem"], r["answer"], r["reference"]) for r in rows
  ]
  with pytest.raises(errors.InputError) as raised:
    _training(_config(path, tmp_path, "prompt_column=text"), qwen3_tokenizer)
  assert str(raised.value) == (
    f"dataset_name={path}: line 1 has no column 'text' (prompt_column=text); its columns are "
    "['problem', 'reference', 'answer']"
  )
  # Without the keys: `prompt` before `question`, `answer` before `solution`.
  both = tmp_path / "both.jsonl"
  row = {"question": "What is 2 + 2?", "prompt": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"}
  both.write_text(json.dumps({**row, "solution": "four"}) + "\n")
  [example] = _training(_config(both, tmp_path), qwen3_tokenizer)
  assert example["prompt"] == row["prompt"] and example["answer"] == "4" and example["solution"] == "four"
  assert example["prompts"] == qwen3_tokenizer.apply_chat_template(
    row["prompt"], add_generation_prompt=True, tokenize=False
  )


def test_tunix_and_maxtext_question_answer_rows_keep_working(tmp_path, qwen3_tokenizer):
  path = tmp_path / "data.jsonl"
  path.write_text(json.dumps({"question": "What is 6 * 7?", "answer": "work #### 4,2", "level": 1}) + "\n")
  [example] = _training(_config(path, tmp_path), qwen3_tokenizer)
  assert (example["question"], example["answer"], example["level"]) == ("What is 6 * 7?", "42", 1)


@pytest.mark.parametrize(
  "row, overrides, message",
  [
    (
      {"question": "What is 2 + 2?", "prompt": "Compute 2 + 2.", "answer": "4"},
      (),
      "line 1 has column 'question' 'What is 2 + 2?', which the example's own 'question' (the question, from "
      "column 'prompt': 'Compute 2 + 2.') would replace; rename that column, or set prompt_column=question",
    ),
    (
      {"question": "What is 2 + 2?", "solution": "4", "answer": "5"},
      ("answer_column=solution",),
      "line 1 has column 'answer' '5', which the example's own 'answer' (the reference answer, from column "
      "'solution': '4') would replace; rename that column, or set answer_column=answer",
    ),
    (
      {"question": "What is 2 + 2?", "answer": "4", "prompts": "my own"},
      (),
      "line 1 has column 'prompts' 'my own', which the example's own 'prompts' (the rendered prompt: "
      "'<|im_start|>system\\nAnswer with a number.<|im_end|>\\n<|i...) would replace; rename that column",
    ),
    (
      {"prompt": [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4"}], "answer": "4"},
      (),
      "line 1 has prompt that ends in a 'assistant' turn; expected a conversation whose last turn is the user's",
    ),
    (
      {"prompt": [{"role": "user", "text": "2 + 2?"}], "answer": "4"},
      (),
      "line 1 has prompt message 0 {'role': 'user', 'text': '2 + 2?'}; expected "
      '{"role": a string, "content": a string}',
    ),
    (
      {"prompt": [{"role": "user", "content": "2 + 2?"}], "answer": "4"},
      ("rl.use_agentic_rollout=true",),
      "line 1 has a conversation in column 'prompt', and agentic runs (rl.use_agentic_rollout=true) build each "
      "conversation from the data template and a text prompt; expected prompt_column to name a text column, or "
      "rl.use_agentic_rollout=false",
    ),
  ],
)
def test_a_row_that_cannot_be_read_is_refused_in_one_line_naming_the_way_forward(
  tmp_path, qwen3_tokenizer, row, overrides, message
):
  path = tmp_path / "data.jsonl"
  path.write_text(json.dumps(row) + "\n")
  cfg = _config(path, tmp_path, *overrides)
  render = (lambda user: user) if cfg.agentic.use_agentic_rollout else None
  with pytest.raises(errors.InputError) as raised:
    _training(cfg, qwen3_tokenizer, render)
  assert str(raised.value) == f"dataset_name={path}: {message}"


def test_a_plain_prompt_trains_agentic_runs_as_its_user_turn(tmp_path, qwen3_tokenizer):
  path = tmp_path / "data.jsonl"
  path.write_text(json.dumps({"prompt": "What is 2 + 2?", "solution": "4"}) + "\n")
  cfg = _config(path, tmp_path, "rl.use_agentic_rollout=true")
  [example] = _training(cfg, qwen3_tokenizer, lambda user: f"<rendered>{user}")
  assert (example["prompts"], example["user_content"], example["prompt"]) == (
    "<rendered>What is 2 + 2?",
    "What is 2 + 2?",
    "What is 2 + 2?",
  )


def test_a_json_file_or_saved_folder_that_cannot_be_read_is_refused_in_one_line(tmp_path):
  path = tmp_path / "data.json"
  path.write_text(json.dumps([{"prompt": "a", "solution": "1"}, "b"]))
  cfg = make_config(f"dataset_name={path}")
  with pytest.raises(errors.InputError) as raised:
    datasets.load_rows(cfg.data, str(path), "train", training=True)
  assert str(raised.value) == f"{path}: item 1 of its array is 'b'; expected a JSON object"
  path.write_text('{"prompt": "a", "solution": "1"}\n{"prompt": \n')
  with pytest.raises(errors.InputError, match=f"^{path}:2: not valid JSON"):
    datasets.load_rows(cfg.data, str(path), "train", training=True)
  saved = _write(PLAIN, tmp_path, "save_to_disk Dataset")
  for arrow in (tmp_path / "saved").glob("*.arrow"):
    arrow.write_bytes(arrow.read_bytes()[:100])  # truncated
  with pytest.raises(errors.InputError) as raised:
    datasets.load_rows(make_config(f"dataset_name={saved}").data, saved, "train", training=True)
  assert str(raised.value).startswith(f"dataset_name={saved}: cannot load its save_to_disk dataset (")
  assert "\n" not in str(raised.value)
