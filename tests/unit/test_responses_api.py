"""POST /v1/responses through the real `openai` client (the Agents SDK's default model: test_agent_frameworks): the
same prompt ids as the chat route for the same conversation, tool calls as function_call items, a
conversation continued by previous_response_id or by the full input list, token capture in a session,
and what it does not do refused as 400s naming the field."""

import httpx
import openai
import pytest

from maxtext.integration.tunix.tool_format import QwenToolFormat
from tests.unit.test_openai_server import scripted_server

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
TOOL = {
  "type": "function",
  "name": "add",
  "description": "Adds two integers.",
  "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
}
CHAT_TOOL = {"type": "function", "function": {k: TOOL[k] for k in ("name", "description", "parameters")}}


@pytest.fixture
def server(qwen3_tokenizer):
  server = scripted_server(qwen3_tokenizer, [CALL, "The sum is 5."], tool_format=QwenToolFormat())
  url = server.start("127.0.0.1", 0)
  yield server, url
  server.stop()


def _client(url):
  return openai.OpenAI(base_url=url, api_key="unused", max_retries=0)


def test_a_tool_call_comes_back_as_a_function_call_and_the_prompt_is_the_chat_routes(server):
  server, url = server
  client = _client(url)
  out = client.responses.create(model="m", instructions="Be brief.", input="What is 2 + 3?", tools=[TOOL])
  assert out.status == "completed" and out.usage.input_tokens == len(server.batcher.prompts[0])
  (call,) = out.output
  assert (call.type, call.name, call.arguments) == ("function_call", "add", '{"a": 2, "b": 3}')
  # The conversation as chat messages gives the same prompt ids on the chat route.
  messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2 + 3?"}]
  client.chat.completions.create(model="m", messages=messages, tools=[CHAT_TOOL])
  assert server.batcher.prompts[1] == server.batcher.prompts[0]

  # The next turn by previous_response_id, and the same turn as a full input list (what the Agents
  # SDK sends), both give the chat route's prompt for the whole conversation.
  result = {"type": "function_call_output", "call_id": call.call_id, "output": "5"}
  by_id = client.responses.create(
    model="m", instructions="Be brief.", previous_response_id=out.id, input=[result], tools=[TOOL]
  )
  assert by_id.output[0].content[0].text == "The sum is 5." and by_id.previous_response_id == out.id
  full = [{"role": "user", "content": "What is 2 + 3?"}, call.model_dump(), result]
  client.responses.create(model="m", instructions="Be brief.", input=full, tools=[TOOL])
  chat_call = {"id": call.call_id, "type": "function", "function": {"name": "add", "arguments": call.arguments}}
  messages += [
    {"role": "assistant", "content": "", "tool_calls": [chat_call]},
    {"role": "tool", "tool_call_id": call.call_id, "content": "5"},
  ]
  client.chat.completions.create(model="m", messages=messages, tools=[CHAT_TOOL])
  assert server.batcher.prompts[2] == server.batcher.prompts[3] == server.batcher.prompts[4]
  assert "<tool_response>\n5\n</tool_response>" in server.tokenizer.decode(server.batcher.prompts[2])


def test_a_session_records_each_response_as_a_call_continuing_the_last(server):
  server, url = server
  session = server.open_session()
  client = _client(f"{url.removesuffix('/v1')}/sessions/{session}/v1")
  first = client.responses.create(
    model="m", input="What is 2 + 3?", tools=[TOOL], extra_body={"return_token_ids": True}
  )
  result = {"type": "function_call_output", "call_id": first.output[0].call_id, "output": "5"}
  second = client.responses.create(
    model="m", previous_response_id=first.id, input=[result], tools=[TOOL], extra_body={"return_token_ids": True}
  )
  calls = server.session(session).calls
  assert [c.prompt_ids.tolist() for c in calls] == [first.prompt_token_ids, second.prompt_token_ids]
  assert calls[0].token_ids.tolist() == first.token_ids
  # The second call's prompt continues the first call's prompt and reply token for token.
  assert second.prompt_token_ids[: len(first.prompt_token_ids) + len(first.token_ids)] == (
    first.prompt_token_ids + first.token_ids
  )
  # A response stored in one session is not found from another, nor without one.
  other = _client(f"{url.removesuffix('/v1')}/sessions/{server.open_session()}/v1")
  for c in (other, client.with_options(base_url=url)):
    with pytest.raises(openai.BadRequestError, match="previous_response_id"):
      c.responses.create(model="m", previous_response_id=first.id, input="again")


@pytest.mark.parametrize(
  "extra, field",
  [
    ({"tools": [{"type": "web_search"}]}, "tools"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0]"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"text": {"format": {"type": "json_object"}}}, "text"),
    ({"include": ["file_search_call.results"]}, "include"),
    ({"background": True}, "background"),
    ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
    ({"tool_choice": {"type": "function", "name": "mul"}, "tools": [TOOL]}, "tool_choice"),
    ({"temperature": "hot"}, None),
  ],
)
def test_what_it_does_not_do_is_a_400_naming_the_field(server, extra, field):
  _, url = server
  r = httpx.post(f"{url}/responses", json={"model": "m", "input": "hi", **extra}, timeout=30)
  assert r.status_code == 400, r.text
  assert r.json()["error"]["param"] == field or field is None and "temperature" in r.json()["error"]["message"]


def test_a_streamed_response_sends_openais_events_ending_in_the_whole_response(server):
  _, url = server
  client = _client(url)
  events = list(client.responses.create(model="m", input="What is 2 + 3?", tools=[TOOL], stream=True))
  kinds = [e.type for e in events]
  assert kinds == [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.function_call_arguments.delta",
    "response.function_call_arguments.done",
    "response.output_item.done",
    "response.completed",
  ]
  assert [e.sequence_number for e in events] == list(range(len(events)))
  (call,) = events[-1].response.output
  assert (call.name, call.arguments) == ("add", '{"a": 2, "b": 3}') and events[3].delta == call.arguments
  text = list(client.responses.create(model="m", input="And now?", stream=True))  # the scripted answer
  assert [e.delta for e in text if e.type == "response.output_text.delta"] == ["The sum is 5."]
  assert text[-1].response.output[0].content[0].text == "The sum is 5."
