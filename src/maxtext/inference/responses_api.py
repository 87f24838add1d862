"""The Responses API (POST /v1/responses, OpenAI's shape) as chat completions: a request's `input`
(a text, or a list of items: messages, `function_call`s and their `function_call_output`s), its
`instructions` and the conversation named by `previous_response_id` become chat messages; the chat
route samples them (so a session records the call, with its token ids and log-probs, exactly as a
chat call's) and its reply comes back as a Response: a `message` item with the text, a
`function_call` item per tool call.

Taken as OpenAI documents them: function tools (`{"type": "function", "name", "description",
"parameters"}`), `tool_choice` (as the chat route takes it: auto, none, required or a named
function), `parallel_tool_calls`, `max_output_tokens` (a reply cut by it is `incomplete` with reason
`max_output_tokens`), `temperature`, `top_p`, `store` (default true: the response's conversation is
kept for a later `previous_response_id`, the newest MAX_STORED per server; a session's responses are
found only in that session), `include: ["message.output_text.logprobs"]` (each sampled token's
log-prob), `text.format` `text`, `stream` (the events OpenAI sends, in order, sent once the reply is
complete: `events`). `return_token_ids: true` (vLLM's extension) adds the prompt's and the reply's
token ids. Fields that change what would be sampled and that this server does not do (other tool
types, images and files in the input, reasoning items, `reasoning`, `background`, `conversation`,
stored `prompt`s, a `text.format` other than text) are 400s naming them;
fields that do not (`metadata`, `user`, `truncation`, `service_tier`, `prompt_cache_key`,
`safety_identifier`) are taken and echoed.
"""

from __future__ import annotations

import collections
import json
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pydantic

MAX_STORED = 4096  # responses kept for previous_response_id (the oldest go first)
LOGPROBS = "message.output_text.logprobs"


class ResponsesError(ValueError):
  """A request this module refuses: the message of a 400 and the field it names."""

  def __init__(self, message: str, param: str):
    super().__init__(message)
    self.message, self.param = message, param


class ResponsesRequest(pydantic.BaseModel):
  model: str
  input: str | list[dict[str, Any]]
  instructions: str | None = None
  tools: list[dict[str, Any]] | None = None
  tool_choice: Any = None
  parallel_tool_calls: bool | None = None
  previous_response_id: str | None = None
  max_output_tokens: int | None = pydantic.Field(None, ge=1)
  temperature: float = pydantic.Field(1.0, ge=0.0, allow_inf_nan=False)
  top_p: float = pydantic.Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
  store: bool = True
  include: list[str] | None = None
  text: dict[str, Any] | None = None
  return_token_ids: bool = False
  stream: bool = False
  top_logprobs: int | None = None
  reasoning: dict[str, Any] | None = None
  background: bool | None = None
  conversation: Any = None
  prompt: Any = None
  max_tool_calls: int | None = None
  metadata: dict[str, Any] | None = None
  user: str | None = None
  truncation: str | None = None
  service_tier: str | None = None
  prompt_cache_key: str | None = None
  safety_identifier: str | None = None


def _refuse_unhonoured(body: ResponsesRequest) -> None:
  refused = {
    "background": body.background or None,
    "conversation": body.conversation,
    "prompt": body.prompt,
    "max_tool_calls": body.max_tool_calls,
    "top_logprobs": body.top_logprobs or None,
    "reasoning": {k: v for k, v in (body.reasoning or {}).items() if v is not None} or None,
  }
  for field, value in refused.items():
    if value is not None:
      raise ResponsesError(f"{field}={value!r} is not supported by this server's /v1/responses", field)
  text = dict(body.text or {})
  if text.pop("format", {"type": "text"}) != {"type": "text"} or any(v is not None for v in text.values()):
    raise ResponsesError("text: only {'format': {'type': 'text'}} is supported (no structured output)", "text")
  unknown = sorted(set(body.include or []) - {LOGPROBS})
  if unknown:
    raise ResponsesError(f"include: {unknown} not supported (only {LOGPROBS!r})", "include")


def _text(content: Any, where: str) -> str:
  """A message's or output's content as text: a string, or text parts (input_text, output_text)."""
  if isinstance(content, str):
    return content
  if not isinstance(content, list):
    raise ResponsesError(f"{where}: expected a string or a list of text parts", where)
  texts = []
  for k, part in enumerate(content):
    kind = part.get("type") if isinstance(part, dict) else None
    if kind not in ("input_text", "output_text", "text") or not isinstance(part.get("text"), str):
      raise ResponsesError(f"{where}[{k}]: only text parts are supported, got type {kind!r}", f"{where}[{k}]")
    texts.append(part["text"])
  return "".join(texts)


def _messages(items: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
  """The input as chat messages: a function_call joins the assistant message before it (the
  Responses API gives a reply's text and its calls as separate items; chat, as one message)."""
  if isinstance(items, str):
    return [{"role": "user", "content": items}]
  messages: list[dict[str, Any]] = []
  for i, item in enumerate(items):
    where = f"input[{i}]"
    kind = item.get("type", "message")
    if kind == "message":
      role = item.get("role")
      if role not in ("user", "system", "developer", "assistant"):
        raise ResponsesError(f"{where}.role: expected user, system, developer or assistant, got {role!r}", where)
      messages.append(
        {"role": "system" if role == "developer" else role, "content": _text(item.get("content"), f"{where}.content")}
      )
    elif kind == "function_call":
      name, arguments, call_id = item.get("name"), item.get("arguments"), item.get("call_id")
      if not (isinstance(name, str) and isinstance(arguments, str) and isinstance(call_id, str)):
        raise ResponsesError(f"{where}: a function_call needs string name, arguments and call_id", where)
      call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
      if not (messages and messages[-1]["role"] == "assistant"):
        messages.append({"role": "assistant", "content": ""})
      messages[-1].setdefault("tool_calls", []).append(call)
    elif kind == "function_call_output":
      if not isinstance(item.get("call_id"), str):
        raise ResponsesError(f"{where}.call_id: expected a string", where)
      output = _text(item.get("output"), f"{where}.output")
      messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": output})
    else:
      raise ResponsesError(f"{where}.type {kind!r} is not supported (messages and function calls only)", where)
  return messages


def _tools(body: ResponsesRequest) -> tuple[list[dict] | None, Any]:
  """The function tools and the tool choice in chat's shapes."""
  tools = []
  for i, tool in enumerate(body.tools or []):
    if tool.get("type") != "function" or not isinstance(tool.get("name"), str):
      raise ResponsesError(f"tools[{i}]: only function tools are supported, got type {tool.get('type')!r}", "tools")
    function = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    tools.append({"type": "function", "function": function})
  choice = body.tool_choice
  if isinstance(choice, dict) and choice.get("type") == "function":
    choice = {"type": "function", "function": {"name": choice.get("name")}}
  return tools or None, choice


class Responses:
  """Turns Responses requests into chat requests and chat replies into Responses, and keeps the
  conversations stored responses continue (thread-safe)."""

  def __init__(self, max_stored: int = MAX_STORED):
    self._stored: collections.OrderedDict[tuple[str | None, str], list[dict]] = collections.OrderedDict()
    self._max = max_stored
    self._lock = threading.Lock()

  def chat_body(self, body: ResponsesRequest, session: str | None) -> tuple[dict[str, Any], list[dict]]:
    """(the chat request's body, the conversation without the instructions) for `body`, asked in
    `session` (None: none); ResponsesError for what is refused."""
    _refuse_unhonoured(body)
    history: list[dict] = []
    if body.previous_response_id is not None:
      with self._lock:
        stored = self._stored.get((session, body.previous_response_id))
      if stored is None:
        raise ResponsesError(
          f"previous_response_id {body.previous_response_id!r} is not stored here", "previous_response_id"
        )
      history = list(stored)
    history += _messages(body.input)
    tools, choice = _tools(body)
    instructions = [{"role": "system", "content": body.instructions}] if body.instructions else []
    chat: dict[str, Any] = {
      "model": body.model,
      "messages": instructions + history,
      "temperature": body.temperature,
      "top_p": body.top_p,
      "logprobs": LOGPROBS in (body.include or []),
      "return_token_ids": body.return_token_ids,
    }
    for field, value in (
      ("tools", tools),
      ("tool_choice", choice),
      ("parallel_tool_calls", body.parallel_tool_calls),
      ("max_tokens", body.max_output_tokens),
    ):
      if value is not None:
        chat[field] = value
    return chat, history

  def response(self, body: ResponsesRequest, chat: dict[str, Any], history: list[dict], session: str | None) -> dict:
    """The Response for a chat reply `chat` to `body` (stored under its id when body.store)."""
    (choice,) = chat["choices"]
    message, reason = choice["message"], choice["finish_reason"]
    output: list[dict[str, Any]] = []
    if message.get("content"):
      part: dict[str, Any] = {"type": "output_text", "text": message["content"], "annotations": []}
      if body.include and LOGPROBS in body.include:
        part["logprobs"] = (choice.get("logprobs") or {}).get("content", [])
      item = {"type": "message", "id": f"msg_{uuid.uuid4().hex}", "status": "completed", "role": "assistant"}
      output.append({**item, "content": [part]})
    for call in message.get("tool_calls") or []:
      function = call["function"]
      output.append(
        {
          "type": "function_call",
          "id": f"fc_{uuid.uuid4().hex}",
          "call_id": call["id"],
          "name": function["name"],
          "arguments": function["arguments"],
          "status": "completed",
        }
      )
    usage = chat["usage"]
    response_id = f"resp_{uuid.uuid4().hex}"
    out: dict[str, Any] = {
      "id": response_id,
      "object": "response",
      "created_at": time.time(),
      "model": chat["model"],
      "status": "incomplete" if reason == "length" else "completed",
      "incomplete_details": {"reason": "max_output_tokens"} if reason == "length" else None,
      "error": None,
      "instructions": body.instructions,
      "output": output,
      "parallel_tool_calls": body.parallel_tool_calls is not False,
      "previous_response_id": body.previous_response_id,
      "tool_choice": body.tool_choice or "auto",
      "tools": body.tools or [],
      "temperature": body.temperature,
      "top_p": body.top_p,
      "max_output_tokens": body.max_output_tokens,
      "store": body.store,
      "text": {"format": {"type": "text"}},
      "truncation": body.truncation or "disabled",
      "metadata": body.metadata or {},
      "user": body.user,
      "usage": {
        "input_tokens": usage["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": usage["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage["total_tokens"],
      },
    }
    if body.return_token_ids:
      out["prompt_token_ids"] = chat["prompt_token_ids"]
      out["token_ids"] = choice["token_ids"]
    if body.store:
      reply: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
      if message.get("tool_calls"):
        reply["tool_calls"] = message["tool_calls"]
      with self._lock:
        self._stored[(session, response_id)] = history + [reply]
        while len(self._stored) > self._max:
          self._stored.popitem(last=False)
    return out


def events(response: dict[str, Any]) -> Iterator[str]:
  """The server-sent events of a streamed Response, as OpenAI sends them: created, in progress, each
  output item added, its text or arguments (one delta each) and done, then completed (or incomplete)
  with the whole Response."""
  number = iter(range(1 << 30))

  def sse(kind: str, **fields) -> str:
    return f"event: {kind}\ndata: {json.dumps({'type': kind, 'sequence_number': next(number), **fields})}\n\n"

  opening = {**response, "status": "in_progress", "output": [], "incomplete_details": None}
  yield sse("response.created", response=opening)
  yield sse("response.in_progress", response=opening)
  for k, item in enumerate(response["output"]):
    where = {"item_id": item["id"], "output_index": k}
    if item["type"] == "message":
      yield sse("response.output_item.added", output_index=k, item={**item, "status": "in_progress", "content": []})
      part = item["content"][0]
      logprobs = part.get("logprobs", [])
      empty = {"type": "output_text", "text": "", "annotations": []}
      yield sse("response.content_part.added", **where, content_index=0, part=empty)
      yield sse("response.output_text.delta", **where, content_index=0, delta=part["text"], logprobs=logprobs)
      yield sse("response.output_text.done", **where, content_index=0, text=part["text"], logprobs=logprobs)
      yield sse("response.content_part.done", **where, content_index=0, part=part)
    else:
      yield sse("response.output_item.added", output_index=k, item={**item, "status": "in_progress", "arguments": ""})
      yield sse("response.function_call_arguments.delta", **where, delta=item["arguments"])
      yield sse("response.function_call_arguments.done", **where, name=item["name"], arguments=item["arguments"])
    yield sse("response.output_item.done", output_index=k, item=item)
  yield sse("response.completed" if response["status"] == "completed" else "response.incomplete", response=response)
