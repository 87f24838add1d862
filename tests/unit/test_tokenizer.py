"""Tokenizer loading: GGUF-embedded, tokenizer.json / HF directory, sentencepiece model."""

import json
import os

import pytest
import sentencepiece as spm

from maxtext import assets
from maxtext.input_pipeline.tokenizer import _use_plain_template, load_tokenizer, tokenizer_for
from maxtext.utils import errors
from tests.conftest import make_config

_TEMPLATE = (
  "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}</s>{% endfor %}"
  "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


@pytest.fixture(scope="module")
def sp_dir(tmp_path_factory):
  folder = tmp_path_factory.mktemp("sp")
  corpus = folder / "corpus.txt"
  corpus.write_text("\n".join(f"Natalia sold {i} clips to {i + 3} friends in April and May." for i in range(300)))
  spm.SentencePieceTrainer.train(
    input=str(corpus),
    model_prefix=str(folder / "tokenizer"),
    vocab_size=300,
    model_type="bpe",
    pad_id=0,
    bos_id=1,
    eos_id=2,
    unk_id=3,
    byte_fallback=True,
    minloglevel=2,
  )
  os.remove(corpus)
  os.remove(folder / "tokenizer.vocab")
  return folder


def test_sentencepiece_model_matches_sentencepiece(sp_dir):
  (sp_dir / "chat_template.jinja").write_text(_TEMPLATE)
  tok = load_tokenizer(str(sp_dir / "tokenizer.model"))
  reference = spm.SentencePieceProcessor(model_file=str(sp_dir / "tokenizer.model"))
  text = "Natalia sold 48 clips to her friends in April, and then she sold half as many clips in May."
  assert tok(text, add_special_tokens=False).input_ids == reference.encode(text)
  assert tok.decode(reference.encode(text)) == text
  assert tok.eos_token == "</s>" and tok.pad_token_id != tok.eos_token_id
  rendered = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
  assert rendered == "<|user|>hi</s><|assistant|>"
  assert load_tokenizer(str(sp_dir)).get_vocab() == tok.get_vocab()


def test_sentencepiece_without_chat_template_is_an_error(tmp_path, sp_dir):
  model = tmp_path / "tokenizer.model"
  model.write_bytes((sp_dir / "tokenizer.model").read_bytes())
  with pytest.raises(ValueError, match="no chat template"):
    load_tokenizer(str(model))


def test_hf_directory_and_tokenizer_json_agree():
  folder = assets.qwen3_tokenizer_dir()
  a = load_tokenizer(folder)
  b = load_tokenizer(os.path.join(folder, "tokenizer.json"))
  text = "Janet's ducks lay 16 eggs per day."
  assert a(text).input_ids == b(text).input_ids
  assert a.eos_token == "<|im_end|>" and a.pad_token == "<|endoftext|>"


def test_gguf_tokenizer_has_chatml_template(smollm2_tokenizer):
  rendered = smollm2_tokenizer.apply_chat_template(
    [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
  )
  assert "<|im_start|>user\nhi<|im_end|>" in rendered and rendered.endswith("<|im_start|>assistant\n")
  assert smollm2_tokenizer.pad_token_id != smollm2_tokenizer.eos_token_id


@pytest.mark.parametrize("name, error", [("missing.model", FileNotFoundError), ("vocab.txt", ValueError)])
def test_bad_tokenizer_paths(tmp_path, name, error):
  path = tmp_path / name
  if error is ValueError:
    path.write_text("x")
  with pytest.raises(error, match="tokenizer_path="):
    load_tokenizer(str(path))


def test_directory_without_tokenizer_files(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps({}))
  with pytest.raises(FileNotFoundError, match="tokenizer.json or tokenizer.model"):
    load_tokenizer(str(tmp_path))


def test_tokenizer_larger_than_the_embedding_is_an_input_error():
  from maxtext.input_pipeline.tokenizer import tokenizer_for
  from tests.conftest import make_config

  with pytest.raises(errors.InputError, match=r"tokenizer_path=.*: 151669 tokens exceed the model's vocab_size=1000"):
    tokenizer_for(make_config("model_name=qwen3-tiny", "vocab_size=1000").model)


@pytest.mark.parametrize("model_name", ["qwen3-0.6b", "qwen3-8b"])
def test_every_qwen3_size_defaults_to_the_qwen3_tokenizer(model_name):
  from maxtext.input_pipeline.tokenizer import tokenizer_for
  from tests.conftest import make_config

  tok = tokenizer_for(make_config(f"model_name={model_name}").model)
  assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<tool_call>"]) == [151644, 151645, 151657]
  text = tok.apply_chat_template([{"role": "user", "content": "2+2?"}], tokenize=False, add_generation_prompt=True)
  assert text.endswith("<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n")


def test_plain_chat_template_writes_question_answer_text_ending_turns_at_a_blank_line():
  """chat_template=plain (base models): plain "Question:/Answer:" turns; a turn ends with a blank line,
  whose token becomes the EOS, so an answer's sampling stops there."""
  tok = tokenizer_for(make_config("model_name=qwen3-tiny", "chat_template=plain").model)
  messages = [
    {"role": "system", "content": "Add."},
    {"role": "user", "content": "What is 3 + 4?"},
    {"role": "assistant", "content": "7"},
    {"role": "user", "content": "What is 1 + 1?"},
  ]
  text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
  assert text == "Add.\n\nQuestion: What is 3 + 4?\nAnswer: 7\n\nQuestion: What is 1 + 1?\nAnswer:"
  assert tok.encode("\n\n", add_special_tokens=False) == [tok.eos_token_id]
  assert tok.encode(" 7\n\n", add_special_tokens=False)[-1] == tok.eos_token_id
  default = tokenizer_for(make_config("model_name=qwen3-tiny").model)
  assert default.eos_token == "<|im_end|>" and "<|im_start|>" in default.chat_template


def test_plain_chat_template_needs_a_blank_line_token(sp_dir):
  """A tokenizer that writes a blank line as two tokens cannot end plain turns with one: refused,
  naming the key."""
  (sp_dir / "chat_template.jinja").write_text(_TEMPLATE)
  tok = load_tokenizer(str(sp_dir / "tokenizer.model"))
  assert len(tok.encode("\n\n", add_special_tokens=False)) == 3  # byte fallback, after a "▁" piece
  with pytest.raises(errors.InputError, match=r"chat_template=plain: .* 3 tokens"):
    _use_plain_template(tok, str(sp_dir))
