"""The sessions of the OpenAI-compatible server (inference/openai_server.py), free of HTTP: what each
session's calls sampled (`Call`), how a training session samples (`SessionSampling`), a session's
bookkeeping (`Session`: its calls, turn and request numbers, its token budget and what its next chat
call continues) and the registry of open sessions (`Sessions`, whose ids are unguessable: an id is
the capability to reach its session's records).
"""

from __future__ import annotations

import dataclasses
import secrets
import threading
from collections.abc import Callable

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class Call:
  """One sampled completion of a session: the request it answers (the session's requests numbered from
  0 in the order they arrived; n > 1 completions share one), the prompt's token ids, the sampled ids
  (EOS kept), each token's log-prob under softmax(logits / temperature) and the weights version that
  sampled it; a chat call's messages as the template rendered them and its reply's text (its tool
  calls written in as the model writes them)."""

  request: int
  prompt_ids: np.ndarray
  token_ids: np.ndarray
  logprobs: np.ndarray
  versions: np.ndarray
  temperature: float
  finish_reason: str  # stop, length or tool_calls
  messages: list[dict] | None = None  # None: a completions call
  reply: str = ""


@dataclasses.dataclass(frozen=True)
class SessionSampling:
  """How a training session samples, whatever its requests ask: the run's temperature, top_p and
  top_k, each call's key (`key(turn)`, turn counting the session's calls from 0) and `budget`, the
  tokens its calls may add after the first call's prompt, sampled and rendered together (None: no
  budget)."""

  temperature: float
  top_p: float
  top_k: int | None
  key: Callable[[int], jax.Array]
  budget: int | None = None


class Session:
  """The calls made under one session id, in the order they finished (thread-safe to read), and what
  its next chat call continues: the messages so far with the last reply, and their exact tokens."""

  def __init__(self, session_id: str, sampling: SessionSampling | None = None):
    self.id = session_id
    self.sampling = sampling
    self._calls: list[Call] = []
    self._lock = threading.Lock()
    self._turns = 0
    self._requests = 0
    self._first_prompt: int | None = None  # the first call's prompt length
    # the last call's messages and reply as rendered and as the client sent them, and its exact tokens
    self._last: tuple[list[dict], list[dict], list[int]] | None = None

  def next_turn(self) -> int:
    """The number of the session's next sampled call (its key's turn), counting from 0."""
    with self._lock:
      self._turns += 1
      return self._turns - 1

  def next_request(self) -> int:
    """The number of the session's next request, in arrival order, counting from 0."""
    with self._lock:
      self._requests += 1
      return self._requests - 1

  def budget_left(self, prompt: int) -> int | None:
    """What a call with a `prompt`-token prompt may sample under the session's budget: the budget less
    the tokens its calls added after the first call's prompt (None: no budget)."""
    with self._lock:
      if self._first_prompt is None:
        self._first_prompt = prompt
      first = self._first_prompt
    if self.sampling is None or self.sampling.budget is None:
      return None
    return self.sampling.budget - max(prompt - first, 0)

  @property
  def calls(self) -> list[Call]:
    with self._lock:
      return list(self._calls)

  def add(self, call: Call) -> None:
    with self._lock:
      self._calls.append(call)

  def remember(self, messages: list[dict], sent: list[dict], stream: list[int]) -> None:
    """What the session's next chat call may continue: the last call's messages and reply as rendered
    and as the client sent them, and their exact tokens (prompt, reply and turn end)."""
    with self._lock:
      self._last = (messages, sent, stream)

  def continued_from(self, messages: list[dict]) -> tuple[list[dict], list[dict], list[int]] | None:
    """The last call's (messages, sent, stream) where `messages` (as rendered) are its messages and
    reply followed by more; None where they are not (an edited history, or no earlier chat call)."""
    with self._lock:
      last = self._last
    if last is None:
      return None
    before = last[0]
    if len(messages) <= len(before) or messages[: len(before)] != before:
      return None
    return last


class Sessions:
  """The open sessions, by id (thread-safe)."""

  def __init__(self):
    self._sessions: dict[str, Session] = {}
    self._lock = threading.Lock()

  def open(self, sampling: SessionSampling | None = None) -> str:
    """A new session's id: 128 random bits, URL-safe."""
    session_id = secrets.token_urlsafe(16)
    with self._lock:
      self._sessions[session_id] = Session(session_id, sampling)
    return session_id

  def get(self, session_id: str) -> Session | None:
    with self._lock:
      return self._sessions.get(session_id)

  def close(self, session_id: str) -> Session:
    """Forgets the session and returns its record (KeyError for an unknown id)."""
    with self._lock:
      return self._sessions.pop(session_id)
