"""No request holds the others or gets a 500: `n` is capped (400 above the server's bound), a queue past
its bound is a 429 with Retry-After, a body over
the limit is a 413 (declared or chunked), and the probe's wrongly typed or out-of-range fields are 400s
naming the field (a content part's text, tool_calls, seeds past 64 bits, infinite temperatures,
out-of-vocabulary ids, completions log-prob alternatives, rewards that are booleans or beyond
float32), the server serving on after them."""

import json

import httpx
import openai
import pytest

from maxtext.integration.tunix.tool_format import QwenToolFormat
from maxtext.rl.episode_handouts import EpisodeHandouts
from tests.unit.test_openai_server import scripted_server

ASK = {"model": "m", "messages": [{"role": "user", "content": "2+3?"}], "max_tokens": 2}
TOOL = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture
def base(qwen3_tokenizer):
  server = scripted_server(qwen3_tokenizer, max_n=4, max_body_bytes=64 << 10)
  handouts = EpisodeHandouts(server, "m")
  url = server.start("127.0.0.1", 0).removesuffix("/v1")
  yield url, server, handouts
  handouts.close()
  server.stop()


def _post(url, body, **kwargs):
  return httpx.post(url, json=body, timeout=30, **kwargs)


def test_n_over_the_bound_is_a_400_naming_it(base):
  url, _, _ = base
  assert _post(f"{url}/v1/chat/completions", {**ASK, "n": 4}).status_code == 200
  r = _post(f"{url}/v1/chat/completions", {**ASK, "n": 5})
  assert r.status_code == 400 and r.json()["error"]["param"] == "n" and "at most 4" in r.json()["error"]["message"]


def test_a_request_that_would_pass_the_queue_bound_is_a_429_with_retry_after_and_sessions_own_their_calls(
  qwen3_tokenizer,
):
  server = scripted_server(qwen3_tokenizer, max_n=4, max_queued=8)
  url = server.start("127.0.0.1", 0).removesuffix("/v1")
  try:
    server.batcher.waiting = 6  # six choices wait for the scripted batcher's 4 slots
    assert _post(f"{url}/v1/chat/completions", {**ASK, "n": 2}).status_code == 200
    r = _post(f"{url}/v1/chat/completions", {**ASK, "n": 3})
    assert r.status_code == 429 and r.headers["retry-after"] == "2"  # a second per full batch waiting
    assert r.json()["error"]["type"] == "RateLimitError" and "at most 8" in r.json()["error"]["message"]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.RateLimitError):
      client.chat.completions.create(model="m", messages=ASK["messages"], n=3)
    # A session's calls have one owner, the session; a request without one owns itself.
    session = server.open_session()
    for _ in range(2):
      assert _post(f"{url}/sessions/{session}/v1/chat/completions", ASK).status_code == 200
    assert server.batcher.owners[0] is None and server.batcher.owners[-2:] == [session, session]
  finally:
    server.stop()


def test_a_body_over_the_limit_is_a_413_declared_or_chunked(base):
  url, _, _ = base
  big = {**ASK, "messages": [{"role": "user", "content": "x" * (100 << 10)}]}
  r = _post(f"{url}/tokenize", {"prompt": "x" * (100 << 10)})
  assert r.status_code == 413 and r.json()["error"]["type"] == "RequestTooLargeError"

  def chunks():
    data = json.dumps(big).encode()
    for i in range(0, len(data), 8192):
      yield data[i : i + 8192]

  r = httpx.post(f"{url}/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
  assert r.status_code == 413 and "limit of 65536 bytes" in r.json()["error"]["message"]
  assert _post(f"{url}/v1/chat/completions", ASK).status_code == 200  # and it serves on


@pytest.mark.parametrize(
  "route, body, field",
  [
    ("/v1/chat/completions", {**ASK, "seed": 2**70}, "seed"),
    (
      "/v1/chat/completions",
      {**ASK, "messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
      "content[0].text",
    ),
    (
      "/v1/chat/completions",
      {**ASK, "messages": [{"role": "assistant", "content": "", "tool_calls": "abc"}]},
      "tool_calls",
    ),
    (
      "/v1/chat/completions",
      {**ASK, "messages": [{"role": "assistant", "tool_calls": [{"function": "f"}]}]},
      "tool_calls[0].function",
    ),
    ("/v1/chat/completions", {**ASK, "messages": [{"role": "user", "content": 5}]}, "content"),
    ("/detokenize", {"tokens": [-1]}, "tokens"),
    ("/detokenize", {"tokens": [10**12]}, "tokens"),
    ("/v1/completions", {"model": "m", "prompt": "2+3=", "logprobs": 5}, "logprobs"),
    ("/v1/completions", {"model": "m", "prompt": "2+3=", "logprobs": -2}, "logprobs"),
  ],
)
def test_a_wrongly_typed_or_out_of_range_field_is_a_400_naming_it(base, route, body, field):
  url, _, _ = base
  r = _post(f"{url}{route}", body)
  assert r.status_code == 400, r.text
  assert field.split("[")[0].split(".")[0] in r.json()["error"]["message"] + str(r.json()["error"]["param"])


def test_an_infinite_temperature_is_a_400(base):
  url, _, _ = base
  r = httpx.post(
    f"{url}/v1/chat/completions",
    content=json.dumps({**ASK, "temperature": float("inf")}),  # Python writes Infinity
    headers={"content-type": "application/json"},
    timeout=30,
  )
  assert r.status_code == 400 and "temperature" in r.json()["error"]["message"]


@pytest.mark.parametrize("reward", [True, 1e39, -1e39])
def test_a_reward_that_is_a_boolean_or_beyond_float32_is_a_400(base, reward):
  url, server, handouts = base
  session = server.open_session()
  future = handouts.hand_out(session, {}, 30.0, "limit")
  assert _post(f"{url}/episodes/next", {"wait_s": 1}).json()["session"] == session
  r = _post(f"{url}/sessions/{session}/reward", {"reward": reward})
  assert r.status_code == 400 and "reward" in r.json()["error"]["message"]
  assert not future.done()  # the episode waits on for a reward that is one
  assert _post(f"{url}/sessions/{session}/reward", {"reward": 1.0}).status_code == 200


@pytest.mark.parametrize(
  "extra, field",
  [
    ({"tool_choice": "required"}, "tool_choice"),  # without tools
    ({"tool_choice": {"type": "function", "function": {"name": "calculator"}}}, "tool_choice"),
    ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"frequency_penalty": 0.5}, "frequency_penalty"),
    ({"presence_penalty": -0.5}, "presence_penalty"),
    ({"logit_bias": {"17": 5.0}}, "logit_bias"),
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"modalities": ["audio"]}, "modalities"),
    ({"prediction": {"type": "content", "content": "x"}}, "prediction"),
    ({"web_search_options": {}}, "web_search_options"),
    ({"reasoning_effort": "high"}, "reasoning_effort"),
  ],
)
def test_a_field_set_to_what_the_server_does_not_do_is_a_400_naming_it_not_ignored(base, extra, field):
  url, _, _ = base
  r = _post(f"{url}/v1/chat/completions", {**ASK, **extra})
  assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "calculator"}}])
def test_a_forced_tool_choice_opens_the_reply_with_the_call_as_context_and_the_policy_writes_the_rest(
  qwen3_tokenizer, choice
):
  opening = QwenToolFormat().call_opening(None if choice == "required" else "calculator")
  call = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
  server = scripted_server(qwen3_tokenizer, call.removeprefix(opening), tool_format=QwenToolFormat())
  url = server.start("127.0.0.1", 0).removesuffix("/v1")
  try:
    session = server.open_session()
    body = {**ASK, "tools": [TOOL], "tool_choice": choice, "return_token_ids": True}
    out = _post(f"{url}/sessions/{session}/v1/chat/completions", body).json()
    (calls,) = [c["message"]["tool_calls"] for c in out["choices"]]
    assert [c["function"]["name"] for c in calls] == ["calculator"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "2+3"}
    # The opening ends the prompt (context, not trained); what was sampled is the rest of the call.
    assert qwen3_tokenizer.decode(out["prompt_token_ids"]).endswith("<|im_start|>assistant\n" + opening)
    (record,) = server.session(session).calls
    assert qwen3_tokenizer.decode(record.token_ids.tolist()) == call.removeprefix(opening) + "<|im_end|>"
    other = {**body, "tool_choice": {"type": "function", "function": {"name": "mul"}}}  # not among the tools
    r = _post(f"{url}/v1/chat/completions", other)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
  finally:
    server.stop()


def test_the_defaults_of_those_fields_are_served(base):
  url, _, _ = base
  defaults = {
    "tool_choice": "auto",
    "parallel_tool_calls": True,
    "response_format": {"type": "text"},
    "modalities": ["text"],
  }
  assert _post(f"{url}/v1/chat/completions", {**ASK, **defaults, "frequency_penalty": 0}).status_code == 200


def test_a_stop_string_ends_the_reply_as_vllm_ends_it_and_the_record_keeps_what_completed_it(qwen3_tokenizer):
  """smolagents' ReAct loop sends stop=["Observation:"]: the content is the text before it, the finish
  reason "stop"; the session records the tokens through the one that completed the stop string, and
  the next call continues them, followed by the template's turn end."""
  reply = "Thought: add them.\nAction: calculator 2+3\nObservation: 5, and more"
  server = scripted_server(qwen3_tokenizer, reply)
  base = server.start("127.0.0.1", 0).removesuffix("/v1")
  session = server.open_session()
  url = f"{base}/sessions/{session}/v1/chat/completions"
  try:
    r = _post(url, {**ASK, "max_tokens": 64, "stop": ["Observation:", "never"]}).json()
    choice = r["choices"][0]
    assert choice["message"]["content"] == "Thought: add them.\nAction: calculator 2+3\n"
    assert choice["finish_reason"] == "stop"
    (call,) = server.session(session).calls
    assert qwen3_tokenizer.decode(call.token_ids.tolist()).endswith("Observation:")
    assert r["usage"]["completion_tokens"] == len(call.token_ids)
    follow = [*ASK["messages"], choice["message"], {"role": "user", "content": "Observation: 5"}]
    _post(url, {**ASK, "messages": follow, "max_tokens": 4})
    first, second = server.session(session).calls
    stream = first.prompt_ids.tolist() + first.token_ids.tolist()
    end = qwen3_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert second.prompt_ids.tolist()[: len(stream) + 1] == stream + [end]
    assert _post(url, {**ASK, "stop": [str(i) for i in range(17)]}).status_code == 400
  finally:
    server.stop()
