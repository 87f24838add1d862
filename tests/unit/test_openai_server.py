"""The OpenAI-compatible server, through the real `openai` client, on qwen3-tiny's continuous batcher."""

import concurrent.futures
import json
import time

import httpx
import jax
import jax.numpy as jnp
import numpy as np
import openai
import pytest
from flax import nnx

from maxtext.inference.continuous_batching import Completion, ContinuousBatcher, SamplingParams
from maxtext.inference.openai_server import OpenAIServer
from maxtext.inference.sessions import SessionSampling
from maxtext.inference.step_keys import StepKeys
from maxtext.input_pipeline.chat_parser import ConfigChatParser
from maxtext.input_pipeline.tokenizer import tokenizer_for
from maxtext.integration.tunix.rollout import per_token_logps
from maxtext.integration.tunix.tool_format import QwenToolFormat
from maxtext.models import load
from maxtext.rl.session_stitching import stitch
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config

CONTEXT = 160  # max_prompt_length + max_response_length
MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]


@pytest.fixture(scope="module")
def served():
  cfg = make_config("model_name=qwen3-tiny", "max_prompt_length=96", "max_response_length=64")
  model = load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])
  tokenizer = tokenizer_for(cfg.model)
  batcher = ContinuousBatcher(model, cfg.sampling.kv_cache_size, 4, steps_per_dispatch=4)
  server = OpenAIServer(
    batcher, tokenizer, ConfigChatParser(tokenizer, ""), "qwen3-tiny", StepKeys(0), QwenToolFormat()
  )
  url = server.start("127.0.0.1", 0)
  yield server, url
  server.stop()
  batcher.close()


@pytest.fixture
def client(served):
  return openai.OpenAI(base_url=served[1], api_key="unused", max_retries=0, timeout=120)


def test_models_names_the_model_and_its_context(client):
  (model,) = client.models.list().data
  assert model.id == "qwen3-tiny" and model.max_model_len == CONTEXT


def test_chat_logprobs_and_token_ids_are_what_the_batcher_samples(served, client):
  server, _ = served
  out = client.chat.completions.create(
    model="qwen3-tiny",
    messages=MESSAGES,
    temperature=0.8,
    top_p=0.9,
    seed=7,
    max_tokens=12,
    logprobs=True,
    extra_body={"return_token_ids": True},
  )
  prompt_ids = out.model_extra["prompt_token_ids"]
  assert server.tokenizer.decode(prompt_ids) == "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
  (choice,) = out.choices
  params = SamplingParams(12, temperature=0.8, top_p=0.9, eos_ids=server.eos_ids)
  done = server.batcher.submit(prompt_ids, params, jax.random.fold_in(jax.random.PRNGKey(7), 0)).result(timeout=120)
  assert choice.model_extra["token_ids"] == done.tokens.tolist()
  np.testing.assert_allclose([t.logprob for t in choice.logprobs.content], done.logprobs, rtol=1e-6)
  assert choice.message.content == server.tokenizer.decode(done.tokens[:-1] if done.stopped else done.tokens)
  assert choice.finish_reason == ("stop" if done.stopped else "length")
  assert out.usage.prompt_tokens == len(prompt_ids) and out.usage.completion_tokens == len(done.tokens)


def test_streamed_chat_equals_the_unstreamed_one(client):
  kwargs = dict(model="qwen3-tiny", messages=MESSAGES, temperature=0, seed=3, max_tokens=20)
  whole = client.chat.completions.create(**kwargs).choices[0]
  chunks = list(client.chat.completions.create(stream=True, **kwargs))
  text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
  assert text == whole.message.content and len(chunks) > 3  # one chunk per decode chunk of 4 tokens
  assert chunks[-1].choices[0].finish_reason == whole.finish_reason == "length"


def test_a_streamed_stop_string_ends_the_stream_as_the_unstreamed_one_and_the_record_is_the_same(served):
  """A stop string that completes mid-stream: the streamed text is the unstreamed text before it (none
  of the stop string is sent, though it spans chunks), the finish reason is stop, and the session's
  record is the unstreamed one's: the tokens through the one that completed it."""
  server, url = served
  plain = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
  kwargs = dict(model="qwen3-tiny", messages=MESSAGES, temperature=0, max_tokens=24)
  text = plain.chat.completions.create(**kwargs).choices[0].message.content
  stop = text[9:14]  # past the first 4-token chunk: the stop string completes mid-stream
  assert len(stop) == 5 and text.find(stop) == 9, text
  records = []
  for stream in (False, True):
    session = server.open_session()
    agent = openai.OpenAI(base_url=f"{url.removesuffix('/v1')}/sessions/{session}/v1", api_key="unused", max_retries=0)
    if stream:
      chunks = list(agent.chat.completions.create(stream=True, stop=[stop], **kwargs))
      content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
      reason = chunks[-1].choices[0].finish_reason
    else:
      choice = agent.chat.completions.create(stop=[stop], **kwargs).choices[0]
      content, reason = choice.message.content, choice.finish_reason
    assert content == text[:9] and reason == "stop"
    (call,) = server.close_session(session).calls
    records.append(call.token_ids.tolist())
  assert records[0] == records[1] and stop in server.tokenizer.decode(records[0])
  assert stop not in server.tokenizer.decode(records[0][:-1])


def test_completions_take_a_token_id_prompt_and_sample_at_the_seed(served, client):
  server, _ = served
  prompt = server.tokenizer.encode("The capital of France is")
  kwargs = dict(model="qwen3-tiny", prompt=prompt, max_tokens=8, temperature=1.0, seed=11, logprobs=0)
  first = client.completions.create(**kwargs, extra_body={"return_token_ids": True}).choices[0]
  again = client.completions.create(**kwargs, extra_body={"return_token_ids": True}).choices[0]
  other = client.completions.create(**{**kwargs, "seed": 12}, extra_body={"return_token_ids": True}).choices[0]
  assert first.model_extra["prompt_token_ids"] == prompt
  assert first.model_extra["token_ids"] == again.model_extra["token_ids"] != other.model_extra["token_ids"]
  assert len(first.logprobs.token_logprobs) == len(first.model_extra["token_ids"]) == 8
  text = client.completions.create(**{**kwargs, "prompt": "The capital of France is"}).choices[0].text
  assert text == first.text  # the text prompt tokenizes to the same ids


def test_tokenize_and_detokenize_round_trip(served):
  _, url = served
  base = url.removesuffix("/v1")
  ids = httpx.post(f"{base}/tokenize", json={"model": "qwen3-tiny", "prompt": "Hello, world!"}).json()
  assert ids["count"] == len(ids["tokens"]) and ids["max_model_len"] == CONTEXT
  assert httpx.post(f"{base}/detokenize", json={"tokens": ids["tokens"]}).json() == {"prompt": "Hello, world!"}
  chat = httpx.post(f"{base}/tokenize", json={"messages": MESSAGES}).json()["tokens"]
  assert httpx.post(f"{base}/detokenize", json={"tokens": chat}).json()["prompt"].endswith("<|im_start|>assistant\n")


def test_sessions_record_each_call_and_stay_apart(served):
  server, url = served
  base = url.removesuffix("/v1")
  a, b = server.open_session(), server.open_session()
  client_a = openai.OpenAI(base_url=f"{base}/sessions/{a}/v1", api_key="unused", max_retries=0)
  client_b = openai.OpenAI(base_url=f"{base}/sessions/{b}/v1", api_key="unused", max_retries=0)
  out = client_a.chat.completions.create(
    model="qwen3-tiny", messages=MESSAGES, max_tokens=6, seed=1, extra_body={"return_token_ids": True}
  )
  client_a.completions.create(model="qwen3-tiny", prompt=[1, 2, 3], max_tokens=5, temperature=0)
  client_b.completions.create(model="qwen3-tiny", prompt=[4, 5], max_tokens=3, temperature=0)
  first, second = server.session(a).calls
  assert first.prompt_ids.tolist() == out.model_extra["prompt_token_ids"]
  assert first.token_ids.tolist() == out.choices[0].model_extra["token_ids"] and first.temperature == 1.0
  assert len(first.logprobs) == len(first.versions) == len(first.token_ids) and (first.versions == 0).all()
  assert second.prompt_ids.tolist() == [1, 2, 3] and len(second.token_ids) == 5 and second.finish_reason == "length"
  (only,) = server.session(b).calls
  assert only.prompt_ids.tolist() == [4, 5]
  server.close_session(a)
  with pytest.raises(openai.NotFoundError, match="unknown session"):
    client_a.completions.create(model="qwen3-tiny", prompt=[1, 2], max_tokens=2)


def test_a_training_session_continues_the_conversation_with_its_exact_tokens(served, client, monkeypatch):
  """A session opened with SessionSampling samples as it says (here greedy, whatever the request
  asks); a chat call that sends back the conversation with the reply as it came continues the
  previous call's exact tokens (the reply's own turn-end token, where re-rendering would write the
  template's) with the added messages rendered after the turn-end suffix; a call that edits the
  history is rendered whole; the session's budget of tokens after its first prompt is enforced, and a
  max_tokens past it clamped."""
  server, url = served
  greedy = dict(
    model="qwen3-tiny", messages=MESSAGES, temperature=0, max_tokens=1, extra_body={"return_token_ids": True}
  )
  (first_token,) = client.chat.completions.create(**greedy).choices[0].model_extra["token_ids"]
  monkeypatch.setattr(server, "eos_ids", (*server.eos_ids, first_token))  # the greedy reply ends at once
  session = server.open_session(SessionSampling(0.0, 1.0, None, key=jax.random.PRNGKey, budget=40))
  agent = openai.OpenAI(base_url=f"{url.removesuffix('/v1')}/sessions/{session}/v1", api_key="unused", max_retries=0)
  reply = agent.chat.completions.create(model="qwen3-tiny", messages=MESSAGES, temperature=1.5, max_tokens=5)
  assert reply.choices[0].finish_reason == "stop" and reply.choices[0].message.content == ""
  added = {"role": "user", "content": "And 4 + 4?"}
  messages = [*MESSAGES, reply.choices[0].message, added]
  agent.chat.completions.create(model="qwen3-tiny", messages=messages, max_tokens=3)
  edited = [{"role": "user", "content": "What is 2 + 4?"}, reply.choices[0].message, added]
  agent.chat.completions.create(model="qwen3-tiny", messages=edited, max_tokens=3)
  first, second, third = server.session(session).calls
  assert first.temperature == 0.0 and first.token_ids.tolist() == [first_token]
  before = first.prompt_ids.tolist() + [first_token]
  rendered = server.chat.turn_end_suffix + server.chat.parse([added], add_generation_prompt=True)
  assert second.prompt_ids.tolist() == before + server.tokenizer(rendered, add_special_tokens=False).input_ids
  whole = server.tokenizer.decode(third.prompt_ids)
  assert whole == server.chat.render(
    [edited[0], {"role": "assistant", "content": ""}, added], add_generation_prompt=True
  )
  stitched = stitch([first, second], budget=40)
  assert (stitched.counts.calls, stitched.counts.mismatched) == (2, 0) and stitched.masks.tolist()[0] == 1
  assert stitch([first, second, third], budget=40).counts.mismatched == 1
  cut = agent.chat.completions.create(model="qwen3-tiny", messages=edited, max_tokens=2)  # greedy: no turn end
  assert cut.choices[0].finish_reason == "length"
  agent.chat.completions.create(model="qwen3-tiny", messages=[*edited, cut.choices[0].message, added], max_tokens=1)
  fourth, fifth = server.session(session).calls[3:]
  turn_end = [server.tokenizer.eos_token_id]  # written after the cut reply, as the template would
  assert (
    fifth.prompt_ids.tolist()[: len(fourth.prompt_ids) + 3]
    == fourth.prompt_ids.tolist() + fourth.token_ids.tolist() + turn_end
  )
  assert stitch([fourth, fifth], budget=40).counts.mismatched == 0
  long = [*messages, {"role": "user", "content": "count " * 60}]  # past the 40 tokens after the first prompt
  with pytest.raises(openai.BadRequestError, match="budget of 40 tokens"):
    agent.chat.completions.create(model="qwen3-tiny", messages=long, max_tokens=3)
  # max_tokens past what the context and the budget leave is clamped to what the budget leaves (the
  # agent cannot know it); without a session it is a 400 (test_errors_are_openai_error_bodies)
  clamped = agent.chat.completions.create(model="qwen3-tiny", messages=edited, max_tokens=4096)
  left = 40 - (len(third.prompt_ids) - len(first.prompt_ids))
  assert clamped.choices[0].finish_reason == "length" and clamped.usage.completion_tokens == left
  server.close_session(session)


def test_errors_are_openai_error_bodies(served, client):
  _, url = served
  with pytest.raises(openai.NotFoundError, match="The model `gpt-4` does not exist"):
    client.chat.completions.create(model="gpt-4", messages=MESSAGES)
  with pytest.raises(openai.BadRequestError, match="maximum context length is 160 tokens") as e:
    client.completions.create(model="qwen3-tiny", prompt=list(range(1, 151)), max_tokens=11)
  assert e.value.status_code == 400 and e.value.body["code"] == 400
  with pytest.raises(openai.NotFoundError, match="unknown session 'nope'"):
    openai.OpenAI(base_url=url.replace("/v1", "/sessions/nope/v1"), api_key="x", max_retries=0).models.list()
  bad = httpx.post(
    f"{url}/chat/completions",
    content=b'{"model": "qwen3-tiny", "messages": [',
    headers={"content-type": "application/json"},
    timeout=30,
  )
  assert bad.status_code == 400 and "JSON" in bad.json()["error"]["message"]
  assert bad.json()["error"]["type"] == "BadRequestError"


def test_a_client_that_leaves_a_stream_frees_its_slot(served):
  server, url = served
  before = server.batcher.decode_steps
  body = {"model": "qwen3-tiny", "prompt": [1, 2, 3], "max_tokens": 150, "temperature": 0, "stream": True}
  with httpx.stream("POST", f"{url}/completions", json=body, timeout=60) as response:
    assert next(response.iter_lines()).startswith("data: ")  # sampling has begun
  deadline = time.monotonic() + 60
  while server.batcher.active() and time.monotonic() < deadline:
    time.sleep(0.05)
  assert server.batcher.active() == 0
  assert server.batcher.decode_steps - before < 150  # it stopped before its budget


def test_a_client_that_gives_up_on_a_reply_gives_up_its_request(served):
  """Not streamed: the client's read times out and it closes the connection while its request waits
  (the batcher paused); the request is dropped, so nothing is sampled for it after the pause."""
  server, url = served
  body = {"model": "qwen3-tiny", "prompt": [1, 2, 3], "max_tokens": 150, "temperature": 0}
  whole = httpx.post(f"{url}/completions", json=body, timeout=120).json()
  assert whole["usage"]["completion_tokens"] == 150  # left alone, it samples its whole budget
  before = server.batcher.decode_steps
  with server.batcher.paused():
    with pytest.raises(httpx.ReadTimeout):
      httpx.post(f"{url}/completions", json=body, timeout=httpx.Timeout(60, read=0.5))
    time.sleep(0.5)  # the server sees the disconnect
  time.sleep(1.0)
  deadline = time.monotonic() + 60
  while server.batcher.active() and time.monotonic() < deadline:
    time.sleep(0.05)
  assert server.batcher.decode_steps == before


def test_weights_replaced_mid_request_pause_it_and_it_goes_on_with_them():
  """A session's streamed request is in flight when the sampler's weights are replaced (the batcher
  paused between chunks, as a weight sync does): it loses no token, its tokens before the pause are
  stamped version 0 and sampled from the old weights (their log-probs are the old model's for them),
  those after it version 1 and sampled by the new weights over the keys and values computed before
  (their log-probs are a reference's: the old model's cache of the tokens fed before the pause, the new
  model's forward pass over the rest)."""
  cfg = make_config("model_name=qwen3-tiny", "max_prompt_length=64", "max_response_length=960")
  model = load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])
  old = jax.tree.map(lambda x: x, nnx.state(model))
  new = jax.tree.map(lambda x: x * 1.5 if x.dtype.kind == "f" else x, old)
  version = [0]
  batcher = ContinuousBatcher(model, 1024, 2, steps_per_dispatch=4, version=lambda: version[0])
  tokenizer = tokenizer_for(cfg.model)
  server = OpenAIServer(batcher, tokenizer, ConfigChatParser(tokenizer, ""), "qwen3-tiny", StepKeys(0), None)
  url = server.start("127.0.0.1", 0)
  try:
    session = server.open_session()
    client = openai.OpenAI(base_url=f"{url.removesuffix('/v1')}/sessions/{session}/v1", api_key="x", max_retries=0)
    stream = client.completions.create(model="qwen3-tiny", prompt=[1, 2, 3], max_tokens=900, seed=5, stream=True)
    text = next(iter(stream)).choices[0].text  # sampling has begun
    with batcher.paused():
      sampled = batcher.decode_steps
      nnx.update(model, new)
      version[0] = 1
      batcher.weights_changed()
      time.sleep(0.3)
      assert batcher.decode_steps == sampled  # no chunk runs while paused
    text += "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    (call,) = server.session(session).calls
  finally:
    server.stop()
    batcher.close()
  n = len(call.token_ids)  # 900, or fewer where EOS ends it (570 at seed 5)
  assert text == tokenizer.decode(call.token_ids[: n - (call.finish_reason == "stop")].tolist())
  switch = int(np.argmax(call.versions == 1))
  assert 0 < switch < n and (call.versions[:switch] == 0).all() and (call.versions[switch:] == 1).all()
  nnx.update(model, old)
  prompt, completion = jnp.asarray([[1, 2, 3]]), jnp.asarray(call.token_ids[None])
  np.testing.assert_allclose(
    call.logprobs[:switch], per_token_logps(model, prompt, completion, 0, -1, 1.0)[0, :switch], atol=2e-4
  )
  ids = np.concatenate([[1, 2, 3], call.token_ids])
  fed_before = 3 + switch - 1  # the prompt and the tokens before the last one sampled before the pause
  after = _logps_over_a_cache_of(model, old, new, ids, fed_before)
  np.testing.assert_allclose(call.logprobs[switch:], after, atol=2e-4)
  nnx.update(model, new)
  whole_new = np.asarray(per_token_logps(model, prompt, completion, 0, -1, 1.0))[0]
  assert np.abs(call.logprobs[switch:] - whole_new[switch:]).max() > 1e-3  # not the new model's alone


def _logps_over_a_cache_of(model, old, new, ids, fed_before: int) -> np.ndarray:
  """Log-probs (temperature 1) of ids[fed_before + 1:], the keys and values of positions before
  fed_before computed by the `old` weights and those from it on by the `new` ones, through the
  model's own forward pass with a cache."""
  size = len(ids)
  cache = model.init_cache(1, size, jnp.float32)

  def forward(weights, start, stop, cache):
    nnx.update(model, weights)
    for layer in cache.values():
      layer["end_index"] = jnp.asarray([start], jnp.int32)
    positions = jnp.arange(start, stop)[None]
    mask = jnp.arange(size)[None, None, :] <= positions[:, :, None]
    return model(jnp.asarray(ids[None, start:stop]), positions, cache, mask)

  _, cache = forward(old, 0, fed_before, cache)
  logits, _ = forward(new, fed_before, size - 1, cache)
  logps = jax.nn.log_softmax(np.asarray(logits[0], np.float32), axis=-1)
  return np.asarray(logps[np.arange(size - 1 - fed_before), ids[fed_before + 1 :]])


def scripted_server(tokenizer, reply: str | list[str] = "5", **kwargs) -> OpenAIServer:
  """A server (model id "m") on a _ScriptedBatcher answering `reply` (a list: one after another, the
  last from then on); kwargs: OpenAIServer's options."""
  return OpenAIServer(
    _ScriptedBatcher(tokenizer, reply), tokenizer, ConfigChatParser(tokenizer, ""), "m", StepKeys(0), **kwargs
  )


class _ScriptedBatcher:
  """Answers every prompt with one scripted reply (and EOS), keeping the prompts it got: the tool-call
  path needs a reply that calls a tool, which random weights do not write."""

  def __init__(self, tokenizer, reply: str | list[str]):
    self.cache_size = 4096  # room for the tool prompt and a framework's (smolagents: 1,100 tokens)
    self.max_batch_size = 4
    self.waiting = 0  # what queued() reports
    replies = [reply] if isinstance(reply, str) else reply
    encode = lambda r: tokenizer.encode(r, add_special_tokens=False) + [tokenizer.eos_token_id]  # noqa: E731 (as sampled: no BOS)
    self.replies = [np.asarray(encode(r), np.int32) for r in replies]
    self.tokens = self.replies[0]
    self.prompts = []
    self.owners = []

  def queued(self) -> int:
    return self.waiting

  def submit_many(self, prompts, params, keys=None, on_tokens=None, owner=None):
    self.prompts += [list(p) for p in prompts]
    self.owners.append(owner)
    self.tokens = self.replies[min(len(self.owners), len(self.replies)) - 1]
    done = concurrent.futures.Future()
    done.set_result(Completion(self.tokens, np.zeros(len(self.tokens), np.float32), np.zeros(len(self.tokens)), True))
    return [done] * len(prompts)


def test_a_tool_call_comes_back_as_tool_calls(served):
  tokenizer = served[0].tokenizer
  reply = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>'
  batcher = _ScriptedBatcher(tokenizer, reply)
  server = OpenAIServer(
    batcher, tokenizer, ConfigChatParser(tokenizer, ""), "qwen3-tiny", StepKeys(0), QwenToolFormat()
  )
  url = server.start("127.0.0.1", 0)
  try:
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0)
    tool = {
      "type": "function",
      "function": {"name": "calculator", "parameters": {"type": "object", "properties": {"expression": {}}}},
    }
    out = client.chat.completions.create(model="qwen3-tiny", messages=MESSAGES, tools=[tool], max_tokens=40)
    (choice,) = out.choices
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me compute."
    (call,) = choice.message.tool_calls
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "2+3"}
    assert '"name": "calculator"' in tokenizer.decode(batcher.prompts[0])  # the tool was offered in the prompt
    streamed = list(
      client.chat.completions.create(model="qwen3-tiny", messages=MESSAGES, tools=[tool], max_tokens=40, stream=True)
    )
    assert streamed[-1].choices[0].finish_reason == "tool_calls"
    assert streamed[-1].choices[0].delta.tool_calls[0].function.name == "calculator"
    # The call goes back into the next turn as the model wrote it, and the tool's answer after it.
    follow = MESSAGES + [choice.message.model_dump(exclude_none=True), {"role": "tool", "content": "5"}]
    client.chat.completions.create(model="qwen3-tiny", messages=follow, tools=[tool], max_tokens=40)
    rendered = tokenizer.decode(batcher.prompts[-1])
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call>' in rendered
    assert "<tool_response>\n5\n</tool_response>" in rendered
  finally:
    server.stop()


def _serve(*args):
  """python -m maxtext.inference.serve as a user runs it, in its own process."""
  import os
  import subprocess
  import sys

  env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
  command = [sys.executable, "-m", "maxtext.inference.serve", "rl.yml", "model_name=qwen3-tiny", *args]
  return subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow  # two processes that load the model (about 90 s)
def test_the_command_serves_until_sigterm_and_a_busy_port_is_refused():
  import signal
  import socket

  proc = _serve("serve_port=0", "rollout_max_batch_size=2")
  try:
    url = None
    deadline = time.monotonic() + 240
    while url is None and time.monotonic() < deadline:  # the log line names the bound port
      line = proc.stderr.readline()
      assert line or proc.poll() is None, "the server exited before serving"
      if " at http://127.0.0.1:" in line:
        url = line.strip().rsplit(" at ", 1)[1]
    client = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)
    assert client.models.list().data[0].id == "qwen3-tiny"
    assert (
      client.completions.create(model="qwen3-tiny", prompt=[1, 2], max_tokens=3, temperature=0).usage.completion_tokens
      == 3
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
  finally:
    proc.kill()
    proc.wait()
  with socket.socket() as taken:
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    port = taken.getsockname()[1]
    busy = _serve(f"serve_port={port}")
    try:
      _, err = busy.communicate(timeout=240)
    finally:
      busy.kill()
  assert busy.returncode == 2
  assert err.strip().splitlines()[-1].startswith(f"error: serve_host=127.0.0.1 serve_port={port}: cannot listen there")
