"""An OpenAI-compatible HTTP server (vLLM's shape) on a ContinuousBatcher, with per-session records
of what was sampled, so an agent written against the OpenAI API can be served and, later, trained.

Endpoints (FastAPI, run by uvicorn):
- GET /v1/models: the one model, id = model_name, max_model_len = the context (KV cache) length;
- POST /v1/chat/completions: messages rendered with the chat parser (input_pipeline.chat_parser, the
  template the agentic learner trains with); `tools` go into the system turn as the tool format's
  prompt, and a reply's tool calls come back as `tool_calls` (finish_reason "tool_calls");
  stream=true answers with server-sent events as the tokens are sampled (with tools, the content
  and calls come in the last chunks, once the reply is complete);
- POST /v1/chat/completions/tokens: the chat route under the path verifiers' token client posts its
  continuations to (ChatTokensRequest: its `tokens` are not taken as the prompt);
- POST /v1/completions: `prompt` a text or a list of token ids (vLLM's extension);
- POST /v1/responses: the Responses API on the chat route (responses_api: function tools,
  previous_response_id or a full input list; streamed once the reply is complete);
- POST /tokenize, POST /detokenize: vLLM's shapes.
Sampling: temperature, top_p, top_k (vLLM's extension), max_tokens (default: what the context
leaves), seed (choice i draws with fold_in(PRNGKey(seed), i), as the rollout engine does; without a
seed, a fresh key from StepKeys), n. `logprobs` returns each sampled token's log-prob under the
temperature-scaled distribution (what the engine records; no alternatives: top_logprobs > 0 is
refused), `return_token_ids: true` (vLLM's extension) the prompt's and each choice's token ids.
Sampling stops at the template's turn end or the tokenizer's EOS or pad token, which the token ids
and log-probs keep and the text leaves out, and at `stop` strings (streamed too), cut as vLLM cuts
them (_cut). Fields set to what the server does not do are 400s naming them (_refuse_unhonoured);
`n` is capped (max_n), bodies too (max_body_bytes: 413). Each request, or each session for all its
calls, is an owner the batcher shares its slots fairly among (slots.Slots.admit); a request that would
pass max_queued choices waiting is a 429 with Retry-After. With an api_key every route but GET /health
needs it (_Guard).

Sessions: the same endpoints under /sessions/{id}/v1/... record each completion (a `Call`: prompt
ids, sampled ids, their log-probs and weights versions) in that session, which `open_session()`
creates with an unguessable id; `session(id).calls` reads them. A session id is the capability: an
agent given one session's base URL cannot reach another's records, and no endpoint returns records.

Errors are OpenAI-style bodies {"error": {"message", "type", "param", "code"}}: 400 for a body that
is not valid JSON or not a valid request and for a prompt that does not fit the context, 404 for
another model name or an unknown session. A client that disconnects, streaming or not, gives up its
request (the engine slot is freed before the next decode chunk).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import json
import logging
import secrets
import signal
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import fastapi
import jax
import numpy as np
import pydantic
import uvicorn
from fastapi import responses
from starlette.middleware import body_limit

from maxtext.inference import responses_api
from maxtext.inference.continuous_batching import Completion, ContinuousBatcher, SamplingParams
from maxtext.inference.responses_api import Responses, ResponsesError, ResponsesRequest
from maxtext.inference.sessions import Call, Session, Sessions, SessionSampling
from maxtext.inference.step_keys import StepKeys
from maxtext.input_pipeline.chat_parser import ConfigChatParser
from maxtext.input_pipeline.text_as_data import TextAsData
from maxtext.utils import errors

log = logging.getLogger(__name__)


class ToolFormat(Protocol):
  """How tools reach the model and its calls come back (the agentic learner's format)."""

  def prompt(self, tools: list[dict]) -> str:
    """The system-turn text that offers `tools` (OpenAI function schemas)."""

  def calls(self, text: str) -> tuple[str, list[tuple[str, Any]]]:
    """A reply's text before its tool calls, and (name, arguments) of each well-formed call in it."""

  def call_opening(self, name: str | None) -> str:
    """The text a call begins with, up to its function's name (None) or up to its arguments."""

  def call_text(self, name: str, arguments: Any) -> str:
    """A call as the model writes it (to render earlier assistant turns that made calls)."""


class ApiError(Exception):
  """A request the server refuses: the HTTP status and the message of an OpenAI error body."""

  def __init__(self, status: int, message: str, param: str | None = None, retry_after_s: int | None = None):
    super().__init__(message)
    self.status, self.message, self.param, self.retry_after_s = status, message, param, retry_after_s


_ERROR_TYPES = {
  400: "BadRequestError",
  401: "AuthenticationError",
  404: "NotFoundError",
  410: "GoneError",
  413: "RequestTooLargeError",
  429: "RateLimitError",
}
MAX_BODY_BYTES = 8 << 20  # the largest request body by default
MAX_STOPS = 16  # stop strings a request may give


def _error_response(
  status: int, message: str, param: str | None = None, retry_after_s: int | None = None
) -> responses.JSONResponse:
  kind = _ERROR_TYPES.get(status, "InternalServerError")
  headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
  return responses.JSONResponse(
    {"error": {"message": message, "type": kind, "param": param, "code": status}}, status_code=status, headers=headers
  )


class _Sampling(pydantic.BaseModel):
  """The sampling fields chat and text completions share."""

  model: str
  temperature: float = pydantic.Field(1.0, ge=0.0, allow_inf_nan=False)
  top_p: float = pydantic.Field(1.0, gt=0.0, le=1.0, allow_inf_nan=False)
  top_k: int | None = None
  max_tokens: int | None = pydantic.Field(None, ge=1)
  seed: int | None = pydantic.Field(None, ge=0, lt=2**63)
  n: int = pydantic.Field(1, ge=1)
  stream: bool = False
  stop: str | list[str] | None = None
  return_token_ids: bool = False
  frequency_penalty: float = 0.0
  presence_penalty: float = 0.0
  logit_bias: dict[str, float] | None = None


class ChatRequest(_Sampling):
  messages: list[dict[str, Any]] = pydantic.Field(min_length=1)
  tools: list[dict[str, Any]] | None = None
  tool_choice: Any = None
  parallel_tool_calls: bool | None = None
  response_format: dict[str, Any] | None = None
  max_completion_tokens: int | None = pydantic.Field(None, ge=1)
  logprobs: bool = False
  top_logprobs: int | None = None
  # OpenAI fields that would change the reply and that this server does not do (_refuse_unhonoured)
  functions: Any = None
  function_call: Any = None
  audio: Any = None
  modalities: list[str] | None = None
  prediction: Any = None
  web_search_options: Any = None
  reasoning_effort: str | None = None


class ChatTokensRequest(ChatRequest):
  """POST /v1/chat/completions/tokens (vLLM's route for verifiers' token client): a chat request with
  the ids the client expects its prompt to be. They are checked as ids and not used as the prompt: the
  prompt is what the chat route makes of the messages (in a session, the previous call's exact ids and
  the added messages as the template renders them), so ids a client writes cannot add control turns
  that its messages do not hold."""

  tokens: list[int] = pydantic.Field(default_factory=list)


class CompletionRequest(_Sampling):
  prompt: str | list[int] = pydantic.Field(min_length=1)
  logprobs: int | None = pydantic.Field(None, ge=0, le=0)  # the sampled token's only: no alternatives
  echo: bool = False


class TokenizeRequest(pydantic.BaseModel):
  model: str | None = None
  prompt: str | None = None
  messages: list[dict[str, Any]] | None = None
  tools: list[dict[str, Any]] | None = None  # with messages: rendered as a chat request's tools are
  add_special_tokens: bool | None = None
  add_generation_prompt: bool = True


class DetokenizeRequest(pydantic.BaseModel):
  model: str | None = None
  tokens: list[int]
  skip_special_tokens: bool = False  # as the tokenizer's decode takes it (an extension of vLLM's route)


@dataclasses.dataclass
class _Prepared:
  """A completion request made ready for the engine."""

  prompt_ids: list[int]
  params: SamplingParams
  keys: list[jax.Array | None]
  session: Session | None
  tools: bool  # parse tool calls out of the replies
  request: int = 0  # its number among its session's requests
  messages: list[dict] | None = None  # a chat call's messages as rendered (a session's next call continues them)
  sent: list[dict] | None = None  # and as the client sent them
  stops: tuple[str, ...] = ()  # stop strings: a reply ends at the first (_cut)
  opening: str = ""  # a forced tool call's opening, the end of the prompt and the start of each reply


class OpenAIServer:
  """The server (see the module docstring) on `batcher`, whose tokens it decodes with `tokenizer` and
  whose conversations it renders with `chat`. model_name: the one model id it answers to; keys: the
  draws of requests without a seed; tool_format: None refuses requests with tools; api_key: the
  Bearer key every route but GET /health requires (None: none); sessionless: whether the routes
  without a session are served (else 404: only sessions, what other modules add under /episodes/
  and /sessions/, and /health); max_n: the most choices a request may ask for (400 above it);
  max_queued: the most choices that may wait for a slot (a request that would pass it is a 429 with
  Retry-After, _check_queue); max_body_bytes: the largest request body (413 above it)."""

  def __init__(
    self,
    batcher: ContinuousBatcher,
    tokenizer,
    chat: ConfigChatParser,
    model_name: str,
    keys: StepKeys,
    tool_format: ToolFormat | None = None,
    api_key: str | None = None,
    sessionless: bool = True,
    max_n: int = 16,
    max_queued: int = 256,
    max_body_bytes: int = MAX_BODY_BYTES,
  ):
    self.batcher = batcher
    self._api_key = api_key
    self._sessionless = sessionless
    self.max_n, self.max_queued, self.max_body_bytes = max_n, max_queued, max_body_bytes
    self.tokenizer = tokenizer
    self.chat = chat
    self.model_name = model_name
    self.keys = keys
    self.tool_format = tool_format
    self.context_length = batcher.cache_size
    self._turn_end = tokenizer.convert_tokens_to_ids(chat.turn_end)  # the template's end of a model turn
    stops = (self._turn_end, tokenizer.eos_token_id, tokenizer.pad_token_id)
    self.eos_ids = tuple(dict.fromkeys(i for i in stops if i is not None))
    self._warned_fallback = False
    self.sessions = Sessions()
    self.responses = Responses()
    self._server: uvicorn.Server | None = None
    self._thread: threading.Thread | None = None
    self.app = self._build_app()

  # ------------------------------------------------------------------ sessions
  def open_session(self, sampling: SessionSampling | None = None) -> str:
    """A new session's id (unguessable); its requests go to /sessions/{id}/v1/... With `sampling` (a
    training session) its calls sample as that says, not as they ask."""
    return self.sessions.open(sampling)

  def session(self, session_id: str) -> Session:
    """The session's record (KeyError for an unknown id)."""
    session = self.sessions.get(session_id)
    if session is None:
      raise KeyError(session_id)
    return session

  def close_session(self, session_id: str) -> Session:
    """Forgets the session (its URL answers 404 from now on) and returns its record."""
    return self.sessions.close(session_id)

  def _session_of(self, request: fastapi.Request) -> Session | None:
    session_id = request.path_params.get("session_id")
    if session_id is None:
      return None
    session = self.sessions.get(session_id)
    if session is None:
      raise ApiError(404, f"unknown session {session_id!r}")
    return session

  # ------------------------------------------------------------------ running
  def _bind(self, host: str, port: int, keys=("serve_host", "serve_port")) -> tuple[socket.socket, str]:
    """A listening socket on host:port (port 0: any free port) and its base URL; `keys`: the settings
    that name host and port, for the error where it cannot listen there."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
      sock.bind((host, port))
    except OSError as e:
      sock.close()
      raise errors.InputError(f"{keys[0]}={host} {keys[1]}={port}: cannot listen there ({e.strerror})") from e
    bound_host, bound_port = sock.getsockname()[:2]
    return sock, f"http://{bound_host}:{bound_port}/v1"

  def run(self, host: str, port: int, log_level: str = "info") -> None:
    """Serves in the main thread until SIGINT or SIGTERM (port 0: any free port), which end it
    normally (requests in flight get up to 5 s); logs the base URL."""
    sock, url = self._bind(host, port)
    log.info("serving %s at %s", self.model_name, url)
    # uvicorn shuts down on the signal, then raises it again for the handler it found: this one.
    stopped: list[int] = []
    previous = {s: signal.signal(s, lambda signum, _: stopped.append(signum)) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
      uvicorn.Server(uvicorn.Config(self.app, log_level=log_level, timeout_graceful_shutdown=5)).run(sockets=[sock])
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)
    log.info("stopped by %s", ", ".join(signal.Signals(s).name for s in stopped) or "the server")

  def start(self, host: str = "127.0.0.1", port: int = 0, keys=("serve_host", "serve_port")) -> str:
    """Serves in a background thread; returns the base URL (http://host:port/v1). port 0: any free
    port; keys: the settings that name host and port."""
    sock, url = self._bind(host, port, keys)
    self._server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", timeout_graceful_shutdown=5))
    self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
    self._thread.start()
    deadline = time.monotonic() + 30
    while not self._server.started:
      if not self._thread.is_alive() or time.monotonic() > deadline:
        raise RuntimeError(f"the server did not start on {host}:{port}")
      time.sleep(0.01)
    return url

  def stop(self) -> None:
    """Stops a server that start() began (requests in flight get up to 5 s to finish)."""
    if self._server is not None and self._thread is not None:
      self._server.should_exit = True
      self._thread.join()
      self._server = self._thread = None

  # ------------------------------------------------------------------ requests
  def _check_model(self, model: str | None) -> None:
    if model is not None and model != self.model_name:
      raise ApiError(404, f"The model `{model}` does not exist.", "model")

  def _prepare(self, body: _Sampling, prompt_ids: list[int], session: Session | None, max_tokens: int | None):
    self._check_model(body.model)
    _refuse_unhonoured(body)
    if body.n > self.max_n:
      raise ApiError(400, f"n={body.n}: this server samples at most {self.max_n} choices a request", "n")
    stops = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    if len(stops) > MAX_STOPS or not all(stops):
      raise ApiError(400, f"stop: at most {MAX_STOPS} non-empty strings", "stop")
    room = self.context_length - len(prompt_ids)
    # a session's max_tokens past what is left is clamped to it (its agent cannot know the budget)
    if room < 1 or (max_tokens is not None and max_tokens > room and session is None):
      raise ApiError(
        400,
        f"This model's maximum context length is {self.context_length} tokens. However, you requested "
        f"{len(prompt_ids) + (max_tokens or 1)} tokens ({len(prompt_ids)} in the messages, {max_tokens or 1} in "
        "the completion). Please reduce the length of the messages or completion.",
        "max_tokens",
      )
    if body.top_k is not None and body.top_k < 1 and body.top_k != -1:
      raise ApiError(400, f"top_k must be -1 (off) or >= 1, got {body.top_k}", "top_k")
    fixed = session.sampling if session is not None else None
    left = session.budget_left(len(prompt_ids)) if session is not None else None
    if left is not None:
      if left < 1:
        budget = fixed.budget if fixed is not None else None
        raise ApiError(
          400,
          # worded as vLLM words a prompt past the context, which clients read as "the conversation is over
          # long" (verifiers ends such a rollout as truncated and scores it)
          f"This session's maximum context length is spent: its budget of {budget} tokens after its first prompt "
          "(max_response_length) is used up",
          "messages",
        )
      room = min(room, left)
    params = SamplingParams(
      max_new_tokens=min(max_tokens or room, room),
      temperature=body.temperature if fixed is None else fixed.temperature,
      top_p=body.top_p if fixed is None else fixed.top_p,
      top_k=(None if body.top_k in (None, -1) else body.top_k) if fixed is None else fixed.top_k,
      eos_ids=self.eos_ids,
    )
    if params.temperature == 0:
      keys: list[jax.Array | None] = [None] * body.n
    else:
      if session is not None and fixed is not None:
        key = fixed.key(session.next_turn())
      else:
        key = jax.random.PRNGKey(body.seed) if body.seed is not None else self.keys.next()
      keys = [jax.random.fold_in(key, i) for i in range(body.n)]
    request = session.next_request() if session is not None else 0
    return _Prepared(prompt_ids, params, keys, session, False, request, stops=tuple(stops))

  def _check_queue(self, n: int) -> None:
    """A 429 (Retry-After: a second for each full batch already waiting, at least 1) when `n` more
    choices would pass max_queued waiting for a slot."""
    queued = self.batcher.queued()
    if queued + n > self.max_queued:
      raise ApiError(
        429,
        f"{queued} choices are waiting for the {self.batcher.max_batch_size} decode slots and this server "
        f"queues at most {self.max_queued}: retry later",
        retry_after_s=max(1, -(-queued // self.batcher.max_batch_size)),
      )

  def _submit(self, prepared: _Prepared, on_tokens=None) -> list[concurrent.futures.Future]:
    n = len(prepared.keys)
    self._check_queue(n)
    owner = prepared.session.id if prepared.session is not None else None  # None: this request alone
    return self.batcher.submit_many(
      [prepared.prompt_ids] * n, prepared.params, prepared.keys, on_tokens or [None] * n, owner
    )

  def _text(self, done: Completion) -> str:
    if isinstance(done, _Cut):
      return done.text
    return self.tokenizer.decode((done.tokens[:-1] if done.stopped else done.tokens).tolist())

  def _cut(self, prepared: _Prepared, done: Completion) -> Completion:
    """A completion that ran into one of the request's stop strings ends there, as vLLM ends it: its
    text before the stop string; its tokens (recorded, returned and trained) up to and including the
    one that completed it (what was sampled after is dropped: the earlier tokens' log-probs do not
    depend on it)."""
    if not prepared.stops:
      return done
    tokens = done.tokens[:-1] if done.stopped else done.tokens
    text = self.tokenizer.decode(tokens.tolist())
    found = [(text.find(stop), stop) for stop in prepared.stops if stop in text]
    if not found:
      return done
    at, stop = min(found)
    k = next(k for k in range(1, len(tokens) + 1) if stop in self.tokenizer.decode(tokens[:k].tolist()))
    return _Cut(done.tokens[:k], done.logprobs[:k], done.versions[:k], False, text[:at])

  def _finish(self, prepared: _Prepared, done: Completion) -> tuple[str, str, list[dict]]:
    """(content, finish_reason, tool calls as OpenAI's, each with its id) of a completion, recorded
    in the request's session with those same calls; the content is the text before the calls where
    there are any."""
    text = prepared.opening + self._text(done)
    if prepared.tools and self.tool_format is not None:
      before, parsed = self.tool_format.calls(text)
      text = before if parsed else text
    else:
      parsed = []
    calls = [_tool_call(name, arguments) for name, arguments in parsed]
    reason = "tool_calls" if calls else ("stop" if done.stopped or isinstance(done, _Cut) else "length")
    session = prepared.session
    reply = text
    for name, arguments in parsed:
      reply = self._with_call(reply, name, arguments)
    if session is not None and prepared.messages is not None and len(prepared.keys) == 1:
      # What the next call continues: the reply as the client sends it back, and its exact tokens
      # a reply cut by the length limit gets the turn end the template writes after it
      ended = done.tokens.tolist() + ([] if done.stopped else [self._turn_end])
      sent: dict[str, Any] = {"role": "assistant", "content": text}
      if calls:
        sent["tool_calls"] = calls
      continued = (
        prepared.messages + [{"role": "assistant", "content": reply}],
        (prepared.sent or []) + [sent],
        list(prepared.prompt_ids) + ended,
      )
      session.remember(*continued)
    if session is not None:
      session.add(
        Call(
          prepared.request,
          np.asarray(prepared.prompt_ids, np.int32),
          done.tokens,
          done.logprobs,
          done.versions,
          prepared.params.temperature,
          reason,
          prepared.messages,
          reply,
        )
      )
    return text, reason, calls

  def _messages(self, body: ChatRequest | TokenizeRequest, tools: list[dict] | None) -> list[dict]:
    """The request's messages as the chat template takes them: each {role, content}, an assistant's
    tool calls written into its content as the model writes them, the tools offered in the system
    turn."""
    messages = []
    for index, m in enumerate(body.messages or []):
      _check_message(index, m)
      role, content = m.get("role"), m.get("content")
      if role not in ("system", "user", "assistant", "tool", "developer"):
        raise ApiError(400, f"message role {role!r} is not one of system, user, assistant, tool", "messages")
      text = _content_text(content)
      for call in m.get("tool_calls") or []:
        if self.tool_format is None:
          raise ApiError(400, "this server has no tool format; assistant tool_calls cannot be rendered", "messages")
        function = call.get("function", {})
        text = self._with_call(text, function.get("name", ""), _arguments(function))
      messages.append({"role": "system" if role == "developer" else role, "content": text})
    if tools:
      if self.tool_format is None:
        raise ApiError(400, "this server has no tool format; requests with tools are refused", "tools")
      offer = self.tool_format.prompt(tools)
      if messages and messages[0]["role"] == "system":
        system = messages[0]["content"]
        messages[0] = {"role": "system", "content": (system.rstrip() + "\n\n" + offer) if system else offer}
      else:
        messages.insert(0, {"role": "system", "content": offer})
    return messages

  def _whole(
    self,
    data: TextAsData,
    sent: list[dict],
    tools: list[dict] | None,
    messages: list[dict],
    add_generation_prompt: bool = True,
  ) -> str:
    """The conversation rendered whole by the model's own chat template (ConfigChatParser.render_whole,
    the assistant's turn opened unless add_generation_prompt is false): where the template writes
    tools, the messages as the client `sent` them (assistant `tool_calls`, `tool` results) and the
    tools; else `messages`, the tool calls written and the tools offered in the documented format.
    Every string the client wrote is held out by `data` first (TextAsData: `data.encode` gives the
    ids, where text that spells a control token is text)."""
    structured = self.chat.tools_in_template and (tools is not None or any(m.get("tool_calls") for m in sent))
    try:
      return self.chat.render_whole(
        data.protect([self._structured(m) for m in sent] if structured else messages),
        data.protect(tools),
        add_generation_prompt,
      )
    except ValueError as e:
      raise ApiError(400, str(e), "messages") from None

  @staticmethod
  def _structured(m: dict) -> dict:
    """A request message as chat templates take OpenAI's: text content, `tool_calls` with their
    arguments as objects where they are JSON, developer as system."""
    role = "system" if m.get("role") == "developer" else m.get("role")
    out = {k: v for k, v in m.items() if k in ("name", "tool_call_id")}
    out.update(role=role, content=_content_text(m.get("content")))
    calls = []
    for call in m.get("tool_calls") or []:
      function = {**call.get("function", {})}
      function["arguments"] = _arguments(function)
      calls.append({"type": "function", "id": call.get("id"), "function": function})
    if calls:
      out["tool_calls"] = calls
    return out

  def _with_call(self, text: str, name: str, arguments: Any) -> str:
    """An assistant message's text with one more tool call written after it."""
    assert self.tool_format is not None
    return text + ("\n" if text else "") + self.tool_format.call_text(name, arguments)

  def _continued(
    self, session: Session, messages: list[dict], sent: list[dict], tools: list[dict] | None
  ) -> list[int] | None:
    """The prompt ids of a session's chat call whose messages extend its last call's messages and
    reply: the exact tokens of that call's prompt and reply (a reply cut by the length limit followed
    by the template's turn-end token), then what the model's own template writes after that turn end
    when it renders the whole conversation (`_whole`: the earlier part rendered whole must be a prefix
    of the whole). Where it is not (a template that rewrites earlier turns, as Qwen3's drops their
    <think> blocks), the new messages are rendered after it as the run's chat parser writes them
    (ConfigChatParser.parse; logged once). None where they do not extend them (the messages are then
    rendered whole)."""
    last = session.continued_from(messages)
    if last is None:
      return None
    before, before_sent, stream = last
    end = self.chat.turn_end
    data = TextAsData(self.tokenizer)
    try:
      earlier = self._whole(data, before_sent, tools, before, add_generation_prompt=False)
      whole = self._whole(data, sent, tools, messages)
    except ApiError:
      earlier = whole = ""
    cut = earlier.rfind(end) if end else -1
    if cut >= 0 and whole.startswith(earlier):
      return stream + data.encode(earlier[cut + len(end) :] + whole[len(earlier) :])
    if not self._warned_fallback:
      self._warned_fallback = True
      log.warning(
        "The model's chat template does not render a session's conversation as an extension of its earlier "
        "turns; its continuations are rendered by %s after the sampled tokens (what trains is what was sampled)",
        "the prefix-preserving ChatML variant" if self.chat.prefix_preserving_variant else "the chat parser",
      )
    try:
      added = self.chat.parse(data.protect(messages[len(before) :]), add_generation_prompt=True, is_first_msg=False)
    except Exception:  # noqa: BLE001 (the template refuses the parser's anchor): rendered whole instead
      return None
    return stream + data.encode(self.chat.turn_end_suffix + added)

  def _encode(self, text: str, add_special_tokens: bool, data: bool = False) -> list[int]:
    """text's ids; `data`: text a client wrote (a completions prompt), whose control-token spellings
    are encoded as text (send token ids to write control tokens)."""
    return list(self.tokenizer(text, add_special_tokens=add_special_tokens, split_special_tokens=data).input_ids)

  def _chat_prepared(self, body: ChatRequest, request: fastapi.Request) -> _Prepared:
    session = self._session_of(request)
    self._check_model(body.model)
    if body.top_logprobs:
      raise ApiError(400, "top_logprobs is not supported (the engine records the sampled token's only)", "top_logprobs")
    for i, tool in enumerate(body.tools or []):
      _check_tool(i, tool)
    tools = body.tools if body.tools and body.tool_choice != "none" else None
    messages = self._messages(body, tools)
    sent = list(body.messages or [])
    ids = self._continued(session, messages, sent, tools) if session is not None else None
    if ids is None:
      data = TextAsData(self.tokenizer)
      ids = data.encode(self._whole(data, sent, tools, messages))
    forced = _forced_name(body) if tools is not None else None
    opening = ""
    if forced is not None and self.tool_format is not None:  # the reply opens the call, as context (not sampled)
      opening = self.tool_format.call_opening(forced or None)
      ids = ids + self._encode(opening, add_special_tokens=False)
    prepared = self._prepare(body, ids, session, body.max_completion_tokens or body.max_tokens)
    prepared.tools = tools is not None
    prepared.messages = messages
    prepared.sent = sent
    prepared.opening = opening
    return prepared

  def _token_logprobs(self, tokens: np.ndarray, logprobs: np.ndarray) -> list[dict]:
    out = []
    for t, lp in zip(tokens.tolist(), logprobs.tolist()):
      piece = self.tokenizer.decode([t])
      out.append({"token": piece, "logprob": lp, "bytes": list(piece.encode("utf-8")), "top_logprobs": []})
    return out

  async def _chat(self, body: ChatRequest, request: fastapi.Request):
    prepared = await asyncio.to_thread(self._chat_prepared, body, request)  # rendering: off the event loop
    if body.stream:
      return self._stream(prepared, body, chat=True)
    done = [self._cut(prepared, c) for c in await _unless_gone(self._submit(prepared), request)]
    created, choices = int(time.time()), []
    for i, c in enumerate(done):
      text, reason, calls = self._finish(prepared, c)
      message: dict[str, Any] = {"role": "assistant", "content": text}
      if calls:
        message["content"] = text or None
        message["tool_calls"] = calls
      choice: dict[str, Any] = {"index": i, "message": message, "finish_reason": reason, "logprobs": None}
      if body.logprobs:
        choice["logprobs"] = {"content": self._token_logprobs(c.tokens, c.logprobs)}
      if body.return_token_ids:
        choice["token_ids"] = c.tokens.tolist()
      choices.append(choice)
    out = {
      "id": f"chatcmpl-{uuid.uuid4().hex}",
      "object": "chat.completion",
      "created": created,
      "model": self.model_name,
      "choices": choices,
      "usage": _usage(prepared, done),
    }
    if body.return_token_ids:
      out["prompt_token_ids"] = prepared.prompt_ids
    return out

  async def _completions(self, body: CompletionRequest, request: fastapi.Request):
    session = self._session_of(request)
    self._check_model(body.model)
    if body.echo:
      raise ApiError(400, "echo is not supported", "echo")
    if isinstance(body.prompt, list):
      ids = list(body.prompt)
    else:
      ids = await asyncio.to_thread(self._encode, body.prompt, True, True)  # off the event loop
    if any(not 0 <= t < len(self.tokenizer) for t in ids):
      raise ApiError(400, f"prompt token ids must be from 0 to {len(self.tokenizer) - 1}", "prompt")
    prepared = self._prepare(body, ids, session, body.max_tokens)
    if body.stream:
      return self._stream(prepared, body, chat=False)
    done = [self._cut(prepared, c) for c in await _unless_gone(self._submit(prepared), request)]
    choices = []
    for i, c in enumerate(done):
      text, reason, _ = self._finish(prepared, c)
      choice: dict[str, Any] = {"index": i, "text": text, "finish_reason": reason, "logprobs": None}
      if body.logprobs is not None:
        pieces = [self.tokenizer.decode([t]) for t in c.tokens.tolist()]
        choice["logprobs"] = {
          "tokens": pieces,
          "token_logprobs": c.logprobs.tolist(),
          "top_logprobs": [{p: lp} for p, lp in zip(pieces, c.logprobs.tolist())],
          "text_offset": np.cumsum([0] + [len(p) for p in pieces[:-1]]).tolist(),
        }
      if body.return_token_ids:
        choice["token_ids"] = c.tokens.tolist()
        choice["prompt_token_ids"] = prepared.prompt_ids
      choices.append(choice)
    return {
      "id": f"cmpl-{uuid.uuid4().hex}",
      "object": "text_completion",
      "created": int(time.time()),
      "model": self.model_name,
      "choices": choices,
      "usage": _usage(prepared, done),
    }

  def _stream(self, prepared: _Prepared, body: _Sampling, chat: bool) -> responses.StreamingResponse:
    """Server-sent events: a chunk per decode chunk of each choice with the text it adds, then each
    choice's finish_reason (with tools, the content before the calls and the calls), then [DONE]."""
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()

    def pusher(i: int) -> Callable[[list[int], list[float]], None]:
      def push(tokens: list[int], logps: list[float]) -> None:
        # on the scheduler thread, right after it tagged this chunk with the version it reads
        chunk = (tokens, logps, self.batcher.version)
        loop.call_soon_threadsafe(queue.put_nowait, (i, chunk))

      return push

    def ended(i: int) -> Callable[[Any], None]:
      def push(_: Any) -> None:
        loop.call_soon_threadsafe(queue.put_nowait, (i, None))

      return push

    n = len(prepared.keys)
    futures = self._submit(prepared, [pusher(i) for i in range(n)])
    for i, f in enumerate(futures):
      f.add_done_callback(ended(i))
    response_id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
    created = int(time.time())

    def event(choice: dict) -> str:
      chunk = {
        "id": response_id,
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": created,
        "model": self.model_name,
        "choices": [choice],
      }
      return f"data: {json.dumps(chunk)}\n\n"

    def delta(i: int, text: str | None = None, reason: str | None = None, message=None, **extra) -> dict:
      if chat:
        d = {"role": "assistant"} if text is None and reason is None and not extra and not message else {}
        if text is not None:
          d["content"] = text
        return {"index": i, "delta": {**d, **(message or {})}, "finish_reason": reason, **extra}
      return {"index": i, "text": text or "", "finish_reason": reason, **extra}

    held = max((len(stop) for stop in prepared.stops), default=1) - 1  # text a stop string may still begin with

    async def events() -> AsyncIterator[str]:
      tokens: list[list[int]] = [[] for _ in range(n)]
      logps: list[list[float]] = [[] for _ in range(n)]
      versions: list[list[int]] = [[] for _ in range(n)]
      sent = [""] * n
      done: list[Completion | None] = [None] * n
      try:
        if chat:
          for i in range(n):
            yield event(delta(i))
        while any(d is None for d in done):
          i, chunk = await queue.get()
          if done[i] is not None:
            continue  # a choice ended by a stop string: its future's cancellation arrives after
          if chunk is not None:
            new, new_logps, version = chunk
            tokens[i] += new
            logps[i] += new_logps
            versions[i] += [version] * len(new)
            if prepared.stops:
              so_far = Completion(
                np.asarray(tokens[i], np.int32),
                np.asarray(logps[i], np.float32),
                np.asarray(versions[i], np.int32),
                False,
              )
              cut = self._cut(prepared, so_far)
              if cut is not so_far:  # a stop string completed: the choice ends here, its slot goes back
                futures[i].cancel()
                done[i] = cut
            if done[i] is None:
              if prepared.tools:
                continue  # the calls are known once the reply is complete
              text = self.tokenizer.decode([t for t in tokens[i] if t not in self.eos_ids])
              if text.endswith("\ufffd"):  # a character split across tokens: wait for the rest
                continue
              text = text[: len(text) - held] if held else text
              if len(text) > len(sent[i]):
                extra_logprobs: dict[str, Any] = {}
                if chat and getattr(body, "logprobs", False):
                  content = self._token_logprobs(np.asarray(new), np.asarray(new_logps))
                  extra_logprobs["logprobs"] = {"content": content}
                yield event(delta(i, text[len(sent[i]) :], **extra_logprobs))
                sent[i] = text
              continue
          else:
            done[i] = self._cut(prepared, futures[i].result())
          finished = done[i]
          assert finished is not None
          text, reason, calls = self._finish(prepared, finished)
          extra: dict[str, Any] = {}
          if body.return_token_ids:
            extra["token_ids"] = finished.tokens.tolist()
          if calls:
            message = {"tool_calls": [{"index": k, **c} for k, c in enumerate(calls)]}
            yield event(delta(i, text or None, "tool_calls", message=message, **extra))
          else:
            yield event(delta(i, text[len(sent[i]) :], reason, **extra))
        yield "data: [DONE]\n\n"
      finally:
        for f in futures:
          f.cancel()  # a client gone mid-stream gives its requests' slots back

    return responses.StreamingResponse(events(), media_type="text/event-stream")

  async def _responses(self, body: ResponsesRequest, request: fastapi.Request):
    """The Responses API on the chat route (responses_api)."""
    session = request.path_params.get("session_id")
    try:
      chat, history = self.responses.chat_body(body, session)
      as_chat = ChatRequest.model_validate(chat)
    except ResponsesError as e:
      raise ApiError(400, e.message, e.param) from None
    except pydantic.ValidationError as e:
      raise ApiError(400, _invalid(e.errors())) from None
    out = self.responses.response(body, await self._chat(as_chat, request), history, session)
    if body.stream:
      return responses.StreamingResponse(responses_api.events(out), media_type="text/event-stream")
    return out

  def _tokenize(self, body: TokenizeRequest, request: fastapi.Request):
    self._session_of(request)
    self._check_model(body.model)
    if (body.prompt is None) == (body.messages is None):
      raise ApiError(400, "give exactly one of prompt and messages", "prompt")
    if body.messages is not None:
      data = TextAsData(self.tokenizer)
      for i, tool in enumerate(body.tools or []):
        _check_tool(i, tool)
      tools = body.tools or None
      ids = data.encode(
        self._whole(data, body.messages, tools, self._messages(body, tools), body.add_generation_prompt)
      )
      bos = self.tokenizer.bos_token_id
      if body.add_special_tokens and bos is not None and ids[:1] != [bos]:
        ids = [bos, *ids]
    else:
      ids = self._encode(body.prompt or "", body.add_special_tokens is not False, data=True)
    return {"count": len(ids), "max_model_len": self.context_length, "tokens": ids}

  def _detokenize(self, body: DetokenizeRequest, request: fastapi.Request):
    self._session_of(request)
    self._check_model(body.model)
    if any(not 0 <= t < len(self.tokenizer) for t in body.tokens):
      raise ApiError(400, f"token ids must be from 0 to {len(self.tokenizer) - 1}", "tokens")
    return {"prompt": self.tokenizer.decode(body.tokens, skip_special_tokens=body.skip_special_tokens)}

  def _build_app(self) -> fastapi.FastAPI:
    app = fastapi.FastAPI(title="maxtext OpenAI-compatible server")

    @app.exception_handler(ApiError)
    async def api_error(_, e: ApiError):
      return _error_response(e.status, e.message, e.param, e.retry_after_s)

    @app.exception_handler(_ClientGone)
    async def gone(_, e: _ClientGone):
      return responses.Response(status_code=499)  # nobody reads it

    @app.exception_handler(fastapi.exceptions.RequestValidationError)
    async def invalid(_, e: fastapi.exceptions.RequestValidationError):
      return _error_response(400, _invalid(e.errors()))

    @app.exception_handler(404)
    async def not_found(_, e):
      return _error_response(404, getattr(e, "detail", None) or "not found")

    @app.exception_handler(413)
    async def too_large(_, e):
      return _too_large(self.max_body_bytes)

    # a chunked body past the limit (_Guard, added after it and so run before it, answers a declared
    # one): the 413 handler above answers it
    app.add_middleware(body_limit.RequestBodyLimitMiddleware, max_body_size=self.max_body_bytes)

    app.add_middleware(_Guard, server=self)  # added last, so it runs first

    @app.get("/health")
    def health():
      return {"status": "ok"}

    def models(request: fastapi.Request):
      self._session_of(request)
      return {
        "object": "list",
        "data": [
          {
            "id": self.model_name,
            "object": "model",
            "created": 0,
            "owned_by": "maxtext",
            "max_model_len": self.context_length,
          }
        ],
      }

    async def chat(body: ChatRequest, request: fastapi.Request):
      return await self._chat(body, request)

    async def chat_tokens(body: ChatTokensRequest, request: fastapi.Request):
      return await self._chat(body, request)

    async def completions(body: CompletionRequest, request: fastapi.Request):
      return await self._completions(body, request)

    async def responses_route(body: ResponsesRequest, request: fastapi.Request):
      return await self._responses(body, request)

    def tokenize(body: TokenizeRequest, request: fastapi.Request):
      return self._tokenize(body, request)

    def detokenize(body: DetokenizeRequest, request: fastapi.Request):
      return self._detokenize(body, request)

    for prefix in ("", "/sessions/{session_id}"):
      app.get(f"{prefix}/v1/models")(models)
      app.post(f"{prefix}/v1/chat/completions")(chat)
      app.post(f"{prefix}/v1/chat/completions/tokens")(chat_tokens)
      app.post(f"{prefix}/v1/completions")(completions)
      app.post(f"{prefix}/v1/responses")(responses_route)
      app.post(f"{prefix}/tokenize")(tokenize)
      app.post(f"{prefix}/detokenize")(detokenize)
    return app


async def _gather(futures: list[concurrent.futures.Future]) -> list[Completion]:
  """The completions, awaited without blocking the event loop (a cancelled await cancels them)."""
  return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))


@dataclasses.dataclass
class _Cut(Completion):
  """A completion ended by a stop string: its tokens through the one that completed it, `text` the
  reply before the stop string."""

  text: str = ""


class _Guard:
  """ASGI middleware of the server's every route but GET /health (pure ASGI, so a client's disconnect
  still reaches the route): the API key, a declared body over the limit (413), and with sessions
  only, no route outside /sessions/ and /episodes/ (404)."""

  def __init__(self, app, server: OpenAIServer):
    self.app, self.server = app, server

  async def __call__(self, scope, receive, send):
    refused = self._refused(scope) if scope["type"] == "http" and scope["path"] != "/health" else None
    if refused is None:
      return await self.app(scope, receive, send)
    await refused(scope, receive, send)

  def _refused(self, scope) -> responses.JSONResponse | None:
    server, path = self.server, scope["path"]
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    if server._api_key is not None:
      given = headers.get("authorization", "")
      if not secrets.compare_digest(given.encode(), f"Bearer {server._api_key}".encode()):
        return _error_response(
          401, "invalid or missing API key: send `Authorization: Bearer KEY` with the server's key"
        )
    declared = headers.get("content-length", "")
    if declared.isdigit() and int(declared) > server.max_body_bytes:
      return _too_large(server.max_body_bytes)
    if not server._sessionless and not path.startswith(("/sessions/", "/episodes/")):
      return _error_response(
        404, f"{path}: this training server serves sessions only (rl.agent_sessionless=true serves it)"
      )
    return None


class _ClientGone(Exception):
  """The client disconnected before its reply was ready."""


async def _unless_gone(futures: list[concurrent.futures.Future], request: fastapi.Request) -> list[Completion]:
  """The completions; _ClientGone where the client disconnects first, its requests cancelled (they
  leave the queue, or their slots before the next decode chunk)."""
  gathered = asyncio.ensure_future(_gather(futures))
  while True:
    done, _ = await asyncio.wait({gathered}, timeout=0.2)
    if done:
      return gathered.result()
    if await request.is_disconnected():
      gathered.cancel()
      raise _ClientGone


def _usage(prepared: _Prepared, done: list[Completion]) -> dict:
  completion = sum(len(c.tokens) for c in done)
  prompt = len(prepared.prompt_ids)
  return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _refuse_unhonoured(body: _Sampling) -> None:
  """A 400 naming a field the request sets to something this server does not do (rather than
  ignoring it): penalties, logit_bias, a tool_choice other than auto, none, required or one of its
  tools, parallel_tool_calls false, a response_format other than text, the legacy functions and
  function_call, audio and modalities beyond text, prediction, web search and a reasoning effort."""
  if body.frequency_penalty or body.presence_penalty:
    field = "frequency_penalty" if body.frequency_penalty else "presence_penalty"
    raise ApiError(400, f"{field} is not supported (sampling is the policy's, unpenalized)", field)
  if body.logit_bias:
    raise ApiError(400, "logit_bias is not supported", "logit_bias")
  if not isinstance(body, ChatRequest):
    return
  if body.tool_choice not in (None, "auto", "none") and _forced_name(body) is None:
    raise ApiError(
      400,
      f"tool_choice={json.dumps(body.tool_choice)}: expected auto, none, required or "
      '{"type": "function", "function": {"name": NAME}} naming one of the request\'s tools',
      "tool_choice",
    )
  for field in ("functions", "function_call", "audio", "prediction", "web_search_options", "reasoning_effort"):
    if getattr(body, field) is not None:
      use = " (use tools and tool_choice)" if field.startswith("function") else ""
      raise ApiError(400, f"{field} is not supported by this server{use}", field)
  if body.modalities not in (None, ["text"]):
    raise ApiError(400, f"modalities={body.modalities}: only ['text'] is supported", "modalities")
  if body.parallel_tool_calls is False:
    raise ApiError(
      400, "parallel_tool_calls=false is not supported: a reply's every call is returned", "parallel_tool_calls"
    )
  kind = (body.response_format or {}).get("type", "text")
  if kind != "text":
    raise ApiError(
      400, f"response_format {kind!r} is not supported: structured output needs guided decoding", "response_format"
    )


def _invalid(found: Any) -> str:
  """A 400's message for pydantic's validation errors: each field's path and what is wrong with it."""
  problems = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in found)
  return f"invalid request: {problems}"


def _forced_name(body: ChatRequest) -> str | None:
  """For tool_choice required: "" (any of the tools); for a named function among the tools: its name;
  else None."""
  names = [t.get("function", {}).get("name") for t in body.tools or [] if isinstance(t, dict)]
  choice = body.tool_choice
  if choice == "required" and names:
    return ""
  if isinstance(choice, dict) and choice.get("type") == "function":
    name = (choice.get("function") or {}).get("name")
    return name if isinstance(name, str) and name in names else None
  return None


def _check_tool(index: int, tool: dict) -> None:
  """A 400 for a tool that is not {"type": "function", "function": {"name": TEXT, ...}} with its
  description a text and its parameters an object, where they are given."""
  function = tool.get("function")
  if (
    tool.get("type") != "function"
    or not isinstance(function, dict)
    or not isinstance(function.get("name"), str)
    or not isinstance(function.get("description", ""), str)
    or not isinstance(function.get("parameters", {}), dict)
  ):
    raise ApiError(
      400,
      f"tools[{index}]: expected {{'type': 'function', 'function': {{'name': TEXT, 'description': TEXT, "
      "'parameters': OBJECT}}}",
      "tools",
    )


def _check_message(index: int, m: Any) -> None:
  """A 400 naming the field where a chat message is not OpenAI's shape: content a string, null or a
  list of parts (each an object with a string `type`, a text part's `text` a string), `tool_calls`
  a list of {function: {name: string, arguments: string or object}}."""
  where = f"messages[{index}]"
  if not isinstance(m, dict):
    raise ApiError(400, f"{where}: expected an object with role and content", "messages")
  content = m.get("content")
  if isinstance(content, list):
    for j, part in enumerate(content):
      if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise ApiError(400, f"{where}.content[{j}]: expected an object with a string type", "messages")
      if part["type"] == "text" and not isinstance(part.get("text"), str):
        raise ApiError(400, f"{where}.content[{j}].text: expected a string", "messages")
  elif content is not None and not isinstance(content, str):
    raise ApiError(400, f"{where}.content: expected a string, null or a list of content parts", "messages")
  calls = m.get("tool_calls")
  if calls is None:
    return
  if not isinstance(calls, list):
    raise ApiError(400, f"{where}.tool_calls: expected a list of tool calls", "messages")
  for j, call in enumerate(calls):
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
      raise ApiError(400, f"{where}.tool_calls[{j}].function: expected an object with a string name", "messages")
    if not isinstance(function.get("arguments", "{}"), (str, dict)):
      raise ApiError(
        400, f"{where}.tool_calls[{j}].function.arguments: expected a JSON string or an object", "messages"
      )


def _content_text(content: Any) -> str:
  """A message's content as text: a string as it is, content parts their text parts joined, null ""."""
  if isinstance(content, list):
    return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text")
  return content or ""


def _arguments(function: dict) -> Any:
  """A tool call's arguments: its JSON string parsed, else as it was (an object, or text the model
  wrote that is not JSON: rendered as it was)."""
  arguments = function.get("arguments", "{}")
  try:
    return json.loads(arguments) if isinstance(arguments, str) else arguments
  except json.JSONDecodeError:
    return arguments


def _too_large(limit: int) -> responses.JSONResponse:
  return _error_response(413, f"the request body is over this server's limit of {limit} bytes")


def _tool_call(name: str, arguments: Any) -> dict:
  return {
    "id": f"call_{uuid.uuid4().hex[:24]}",
    "type": "function",
    "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
  }
