"""Data templates in MaxText's and Tunix's form: {system_prompt} and the tag fields, and a TEMPLATE that
already holds the chat's turn markers used as the whole prompt, never wrapped a second time (checked
on Gemma 3's and Qwen3's token streams against their own chat templates)."""

import functools
import json
import re

import pytest

from maxtext import assets
from maxtext.input_pipeline.templates import PromptTemplate
from maxtext.input_pipeline.tokenizer import load_tokenizer
from maxtext.utils import errors
from tests.conftest import make_config

# MaxText's src/maxtext/examples/chat_templates/gsm8k_rl.json, as MaxText ships it (Tunix's Gemma demo
# writes the same TEMPLATE).
MAXTEXT_GSM8K = {
  "SYSTEM_PROMPT": "You are given a problem. Think about the problem and provide your reasoning. Place it between "
  "{reasoning_start_token} and {reasoning_end_token}. Then, provide the final answer (i.e., just one numerical "
  "value) between {solution_start_token} and {solution_end_token}.",
  "TEMPLATE": "<start_of_turn>user\n{system_prompt}\n\n{question}<end_of_turn>\n<start_of_turn>model",
}
QUESTION = "What is 12*7?"


@functools.cache
def _gemma3():
  return load_tokenizer(assets.gemma3_270m_gguf())


def _template(tmp_path, data, tokenizer, *overrides, agentic=False):
  path = tmp_path / "template.json"
  path.write_text(json.dumps(data))
  cfg = make_config(f"data_template_path={path}", *overrides)
  return PromptTemplate(cfg.task, tokenizer, "gsm8k_rl.json", agentic)


def test_maxtexts_gemma_template_is_the_whole_prompt_on_gemma3(tmp_path):
  tok = _gemma3()
  template = _template(tmp_path, MAXTEXT_GSM8K, tok)
  system = template.system_prompt
  assert "<reasoning>" in system and "{" not in system
  prompt = template.render(QUESTION)
  assert prompt == f"<bos><start_of_turn>user\n{system}\n\n{QUESTION}<end_of_turn>\n<start_of_turn>model"
  ids = tok.encode(prompt, add_special_tokens=False)
  start = tok.convert_tokens_to_ids("<start_of_turn>")
  assert ids.count(start) == 2 and ids.count(tok.bos_token_id) == 1 and ids[0] == tok.bos_token_id
  # Gemma's own chat template puts a system prompt into the user turn the same way; it only ends the
  # model turn's opening with a newline that MaxText's TEMPLATE leaves out.
  own = tok.apply_chat_template(
    [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}],
    add_generation_prompt=True,
    tokenize=False,
  )
  assert own == prompt + "\n"


def test_maxtexts_gemma_template_is_the_whole_prompt_on_qwen3_too_as_maxtext_takes_it(tmp_path, qwen3_tokenizer):
  """On a model of another family the Gemma markers are no special tokens, but the TEMPLATE is still
  the whole prompt (as MaxText writes it for any model), never wrapped in ChatML around it."""
  template = _template(tmp_path, MAXTEXT_GSM8K, qwen3_tokenizer)
  prompt = template.render(QUESTION)
  assert prompt == f"<start_of_turn>user\n{template.system_prompt}\n\n{QUESTION}<end_of_turn>\n<start_of_turn>model"
  assert "<|im_start|>" not in prompt and template.turn_markers == ["<end_of_turn>", "<start_of_turn>"]


def test_a_chatml_template_is_the_whole_prompt_on_qwen3(tmp_path, qwen3_tokenizer):
  data = {
    "SYSTEM_PROMPT": "Answer between {solution_start_token} and {solution_end_token}.",
    "TEMPLATE": "<|im_start|>system\n{system_prompt}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
    "<|im_start|>assistant\n",
  }
  template = _template(tmp_path, data, qwen3_tokenizer)
  prompt = template.render(QUESTION)
  own = qwen3_tokenizer.apply_chat_template(
    [{"role": "system", "content": template.system_prompt}, {"role": "user", "content": QUESTION}],
    add_generation_prompt=True,
    tokenize=False,
  )
  assert prompt == own
  ids = qwen3_tokenizer.encode(prompt, add_special_tokens=False)
  assert ids.count(qwen3_tokenizer.convert_tokens_to_ids("<|im_start|>")) == 3


def test_system_prompt_placed_by_the_template_gets_no_turn_of_its_own(tmp_path, qwen3_tokenizer):
  data = {"SYSTEM_PROMPT": "Be brief.", "TEMPLATE": "{system_prompt}\n\nQ: {question}"}
  prompt = _template(tmp_path, data, qwen3_tokenizer).render(QUESTION)
  own = qwen3_tokenizer.apply_chat_template(
    [{"role": "user", "content": f"Be brief.\n\nQ: {QUESTION}"}], add_generation_prompt=True, tokenize=False
  )
  assert prompt == own and prompt.count("Be brief.") == 1 and prompt.count("<|im_start|>") == 2


@pytest.mark.parametrize(
  "data, says",
  [
    ({"SYSTEM_PROMPT": "", "TEMPLATE": "{question} {answer}"}, "TEMPLATE has field(s) {answer}; expected among"),
    ({"SYSTEM_PROMPT": "{question}", "TEMPLATE": "{question}"}, "SYSTEM_PROMPT has field(s) {question}"),
    ({"SYSTEM_PROMPT": "", "TEMPLATE": "{question"}, "TEMPLATE does not format"),
  ],
)
def test_a_template_field_not_known_is_refused_naming_the_file(tmp_path, qwen3_tokenizer, data, says):
  with pytest.raises(errors.InputError, match=re.escape(f"data_template_path={tmp_path}/template.json: {says}")):
    _template(tmp_path, data, qwen3_tokenizer)


def test_agentic_runs_refuse_a_template_with_turn_markers(tmp_path):
  with pytest.raises(errors.InputError, match=r"holds the chat's turn markers \['<end_of_turn>', '<start_of_turn>'\]"):
    _template(tmp_path, MAXTEXT_GSM8K, _gemma3(), agentic=True)
