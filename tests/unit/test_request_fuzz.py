"""A property-based fuzzer of the server's request schemas (hypothesis): bodies built from each route's
fields with values of every JSON kind (wrong types, huge and non-finite numbers, text spelling control
tokens, nested structures) and unknown fields, sent to the running server. No response is a 5xx; every
4xx carries an OpenAI error body; the server answers a plain request after them."""

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from maxtext.integration.tunix.tool_format import QwenToolFormat
from maxtext.rl.episode_handouts import EpisodeHandouts
from tests.unit.test_openai_server import scripted_server

SCALARS = st.one_of(
  st.none(),
  st.booleans(),
  st.integers(min_value=-(2**70), max_value=2**70),
  st.floats(allow_nan=True, allow_infinity=True),
  st.text(max_size=12),
  st.sampled_from(["<|im_end|>\n<|im_start|>system\n", "<tool_call>", "auto", "required", "none", "function"]),
)
JSON = st.recursive(
  SCALARS,
  lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
  max_leaves=12,
)
MESSAGE = st.fixed_dictionaries(
  {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer"]) | JSON},
  optional={"content": JSON | st.text(max_size=20), "tool_calls": JSON, "tool_call_id": JSON, "name": JSON},
)
TOOL = st.fixed_dictionaries({"type": st.just("function") | JSON, "function": JSON}) | JSON
EDGES = [-1, 0, 1, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, 2**70, -(2**63) - 1]
INTEGER = st.integers(-(2**70), 2**70) | st.sampled_from(EDGES)
NUMBER = st.one_of(INTEGER, INTEGER, st.floats(allow_nan=True, allow_infinity=True), JSON)
SAMPLING = {
  "temperature": NUMBER,
  "top_p": NUMBER,
  "top_k": NUMBER,
  "max_tokens": NUMBER,
  "seed": NUMBER,
  "n": NUMBER,
  "stream": JSON,
  "stop": st.lists(st.text(max_size=4), max_size=3) | JSON,
  "logprobs": NUMBER,
  "return_token_ids": JSON,
  "logit_bias": JSON,
  "frequency_penalty": NUMBER,
}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "2+3?"}], "max_tokens": 2}
ROUTES = {  # a valid body, and each field's values
  "/v1/chat/completions": (
    CHAT,
    {
      "messages": st.lists(MESSAGE, min_size=1, max_size=3) | JSON,
      "tools": st.lists(TOOL, max_size=2) | JSON,
      "tool_choice": JSON,
      "parallel_tool_calls": JSON,
      "response_format": JSON,
      "top_logprobs": NUMBER,
      "max_completion_tokens": NUMBER,
      **SAMPLING,
    },
  ),
  "/v1/completions": (
    {"model": "m", "prompt": [1, 2, 3], "max_tokens": 2},
    {"prompt": st.lists(st.integers(-3, 2**40), max_size=4) | JSON, "echo": JSON, **SAMPLING},
  ),
  "/v1/responses": (
    {"model": "m", "input": "2+3?", "max_output_tokens": 2},
    {
      "input": st.lists(JSON | MESSAGE, max_size=3) | JSON,
      "instructions": JSON,
      "tools": st.lists(TOOL, max_size=2) | JSON,
      "tool_choice": JSON,
      "previous_response_id": JSON,
      "max_output_tokens": NUMBER,
      "include": JSON,
      "text": JSON,
      "temperature": NUMBER,
      "store": JSON,
    },
  ),
  "/tokenize": (
    {"model": "m", "prompt": "2+3?"},
    {"prompt": JSON, "messages": st.lists(MESSAGE, max_size=2) | JSON, "add_generation_prompt": JSON},
  ),
  "/detokenize": (
    {"model": "m", "tokens": [1, 2]},
    {"tokens": st.lists(st.integers(-(2**40), 2**40), max_size=4) | JSON},
  ),
}


def _fields(route: str) -> dict:
  return {**ROUTES[route][1], "model": JSON, "unknown_field": JSON}


def _body(route: str, field: str | None):
  """The route's valid body with `field` set to values of any kind (None: one or two of its fields,
  the model or a field it does not know; now and then a body that is no object)."""
  valid, fields = ROUTES[route][0], _fields(route)
  if field is not None:
    return fields[field].map(lambda value: {**valid, field: value})
  keys = st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=2, unique=True)
  mutated = keys.flatmap(lambda ks: st.fixed_dictionaries({k: fields[k] for k in ks}))
  return mutated.map(lambda m: {**valid, **m}) | JSON


@pytest.fixture(scope="module")
def server(qwen3_tokenizer):
  server = scripted_server(qwen3_tokenizer, "5", tool_format=QwenToolFormat(), max_n=4)
  handouts = EpisodeHandouts(server, "m")
  url = server.start("127.0.0.1", 0).removesuffix("/v1")
  with httpx.Client(base_url=url, timeout=30) as client:
    yield client, server
  handouts.close()
  server.stop()


def _check(client: httpx.Client, route: str, body) -> None:
  content = json.dumps(body, allow_nan=True)  # NaN and Infinity as Python's json writes them
  r = client.post(route, content=content, headers={"content-type": "application/json"})
  assert r.status_code < 500, (route, content[:500], r.text[:500])
  if r.status_code >= 400:
    error = r.json()["error"]
    assert isinstance(error["message"], str) and error["code"] == r.status_code, r.text


@pytest.mark.parametrize(
  "route, field", [(r, f) for r in sorted(ROUTES) for f in [None, *sorted(_fields(r))]], ids=lambda x: str(x)
)
def test_no_request_body_gets_a_5xx(server, route, field):
  client, _ = server

  @settings(
    max_examples=50 if field is None else 15, deadline=None, database=None, suppress_health_check=list(HealthCheck)
  )
  @given(_body(route, field))
  def fuzz(body):
    _check(client, route, body)

  fuzz()
  assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_no_reward_body_gets_a_5xx(server):
  client, srv = server
  session = srv.open_session()

  @settings(max_examples=80, deadline=None, database=None, suppress_health_check=list(HealthCheck))
  @given(st.fixed_dictionaries({}, optional={"reward": JSON, "error": JSON, "unknown": JSON}) | JSON)
  def fuzz(body):
    _check(client, f"/sessions/{session}/reward", body)

  fuzz()
