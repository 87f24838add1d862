"""Episodes handed to processes of the user's over HTTP (rl.agent=http): any program, in any language
and anywhere that can reach the server, takes an episode, talks to its session as to any OpenAI
endpoint and posts the reward. Routes added to the OpenAIServer that serves the sessions:

- POST /episodes/next {"wait_s": 10}: the next episode, {"session", "base_url", "model", "example"}:
  the session's id, its OpenAI base URL (/sessions/ID/v1 at the address the request came to), the
  model id to ask for and the example's fields; 204 when none was ready within wait_s (at most 60),
  410 once training has ended;
- POST /sessions/ID/reward {"reward": 1.0} ends the episode: a finite number is its reward, null (or no
  reward) lets the run's reward functions judge its last reply (`fields`, a JSON object, adds to the
  example's fields what they get), {"error": "..."} fails it; 410 for an
  episode that was taken and has ended without it (cancelled, or past its time limit), 404 for a
  session that is no episode taken.

Each handout (`hand_out`) is a Future that resolves to what was posted (`Posted`: the reward, and the
fields a TRL rollout_func returned besides its ids), or fails with
EpisodeFailed: an error posted, or no reward within the episode's time limit of its being taken. The
run's own agent processes (rl.agent=FILE:FN) are handed theirs by `claim` (the episode of a named
session, as /episodes/next gives it) and post rewards to the same route; where one raises or dies the
run `fail`s its episode.
Episodes wait in arrival order until a process takes them (their time limit does not run while they
wait); while episodes wait and no process has asked for one (at /episodes/next) for a minute, that is
logged every minute, and past `wait_s` the run stops (`on_no_taker` gets a NoTaker). `close` ends the
handouts: what waits is cancelled and /episodes/next answers 410.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import fastapi
import pydantic
from fastapi import responses

from maxtext.inference.openai_server import ApiError, OpenAIServer

log = logging.getLogger(__name__)

MAX_WAIT_S = 60.0
DEFAULT_WAIT_S = 10.0  # without a body


class EpisodeFailed(Exception):
  """The process that took an episode posted an error, or no reward in time; the message says which."""


class NoTaker(Exception):
  """Episodes waited longer than the run allows with no process asking for one."""


class NextRequest(pydantic.BaseModel):
  wait_s: float = pydantic.Field(DEFAULT_WAIT_S, ge=0.0, le=MAX_WAIT_S)


FLOAT32_MAX = 3.4028234663852886e38


class RewardRequest(pydantic.BaseModel):
  """A reward: a number a float32 holds (a boolean is no reward), or null; or an error. `fields`: the
  episode's fields the run's reward functions get besides the example's (a TRL rollout_func's extra
  fields), where they judge it."""

  reward: float | None = pydantic.Field(None, allow_inf_nan=False, ge=-FLOAT32_MAX, le=FLOAT32_MAX)
  error: str | None = None
  fields: dict[str, Any] | None = None  # more of the episode's fields, for the run's reward functions

  @pydantic.field_validator("reward", mode="before")
  @classmethod
  def _not_a_boolean(cls, value):
    if isinstance(value, bool):
      raise ValueError("a reward is a number, not a boolean")
    return value


@dataclasses.dataclass(frozen=True)
class Posted:
  """What the process posted for an episode: its reward (None: the run's reward functions judge) and
  the fields those functions get besides the example's."""

  reward: float | None
  fields: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Handout:
  session: str
  example: dict[str, Any]
  timeout_s: float
  limit: str  # the time limit's name for messages, e.g. "rl.agent_timeout_s=600"
  future: concurrent.futures.Future = dataclasses.field(default_factory=concurrent.futures.Future)
  timer: threading.Timer | None = None


class EpisodeHandouts:
  """The episodes of a run that processes take over HTTP (see the module docstring), on `server`."""

  def __init__(
    self,
    server: OpenAIServer,
    model: str,
    wait_s: float = float("inf"),
    on_no_taker: Callable[[NoTaker], None] | None = None,
    where: str = "",
    limit: str = "",
    log_every_s: float = 60.0,
  ):
    """where: the URL processes take episodes at, and limit: wait_s's name, for the log and NoTaker;
    log_every_s: how often a wait without a process asking is logged."""
    self._model = model
    self._lock = threading.Lock()
    self._waiting: collections.deque[_Handout] = collections.deque()
    self._taken: dict[str, _Handout] = {}
    self._ended: set[str] = set()  # taken episodes that ended without a reward posted
    self._closed = False
    self._asked = time.monotonic()  # the last request at /episodes/next (or the start)
    self._wait_s, self._on_no_taker, self._where, self._limit = wait_s, on_no_taker, where, limit
    server.app.post("/episodes/next")(self._next)
    server.app.post("/sessions/{session_id}/reward")(self._reward)
    if on_no_taker is not None:
      watch = threading.Thread(target=self._watch, args=(log_every_s,), name="episode-handouts-watch", daemon=True)
      watch.start()

  def _watch(self, every_s: float, tick_s: float = 0.25) -> None:
    """Logs every `every_s` that episodes wait with no process asking, and past wait_s stops the run."""
    logged = time.monotonic()
    while True:
      time.sleep(tick_s)
      with self._lock:
        if self._closed:
          return
        waiting = sum(not h.future.cancelled() for h in self._waiting)
        idle = time.monotonic() - self._asked
      if not waiting:
        logged = time.monotonic()
        continue
      if idle > self._wait_s:
        assert self._on_no_taker is not None
        self._on_no_taker(
          NoTaker(
            f"rl.agent=http: {waiting} episodes waited and no process asked for one at POST {self._where} "
            f"within {self._limit} s; start your agent processes against that URL, or raise it"
          )
        )
        return
      if idle >= every_s and time.monotonic() - logged >= every_s:
        logged = time.monotonic()
        log.warning(
          "rl.agent=http: %d episodes wait for agent processes at POST %s; none asked for %.0f s (the run stops at %s)",
          waiting,
          self._where,
          idle,
          self._limit,
        )

  def hand_out(self, session: str, example: dict, timeout_s: float, limit: str) -> concurrent.futures.Future:
    """Queues an episode of `session`; a Future of what is posted for it (Posted), or EpisodeFailed."""
    handout = _Handout(session, example, timeout_s, limit)
    with self._lock:
      if self._closed:
        handout.future.cancel()
      else:
        self._waiting.append(handout)
    return handout.future

  def close(self) -> None:
    """Training is over: waiting and taken episodes are cancelled; /episodes/next answers 410."""
    with self._lock:
      self._closed = True
      handouts = [*self._waiting, *self._taken.values()]
      self._ended.update(self._taken)
      self._waiting.clear()
      self._taken.clear()
    for h in handouts:
      if h.timer is not None:
        h.timer.cancel()
      h.future.cancel()

  def claim(self, session: str, root: str) -> dict[str, Any] | None:
    """Takes the waiting episode of `session` for a process the run manages (rl.agent=FILE:FN's
    workers), as /episodes/next would hand it to one asking at `root` (the server's URL); its time
    limit is the caller's to enforce (a worker past it is killed, then `fail`ed). None where it is
    not waiting (the handouts were closed)."""
    with self._lock:
      handout = next((h for h in self._waiting if h.session == session), None)
      if handout is None:
        return None
      self._waiting.remove(handout)
      self._taken[session] = handout
    return self._body(handout, root)

  def fail(self, session: str, why: str) -> None:
    """Fails the taken episode of `session` with EpisodeFailed(why), unless it has ended."""
    self._end(session, EpisodeFailed(why))

  def _body(self, handout: _Handout, root: str) -> dict[str, Any]:
    return {
      "session": handout.session,
      "base_url": f"{root.rstrip('/')}/sessions/{handout.session}/v1",
      "model": self._model,
      "example": handout.example,
    }

  def _take(self) -> _Handout | None:
    with self._lock:
      self._asked = time.monotonic()
      if self._closed:
        raise ApiError(410, "training has ended: no more episodes")
      while self._waiting:
        handout = self._waiting.popleft()
        if handout.future.cancelled():
          continue
        self._taken[handout.session] = handout
        handout.timer = threading.Timer(handout.timeout_s, self._expire, (handout,))
        handout.timer.daemon = True
        handout.timer.start()
        return handout
    return None

  def _expire(self, handout: _Handout) -> None:
    self._end(handout.session, EpisodeFailed(f"no reward posted within {handout.limit} s of taking the episode"))

  def _end(self, session: str, outcome: Posted | EpisodeFailed) -> str:
    """Resolves a taken episode: "ended", or "gone" where it ended before (cancelled, or past its
    limit), "unknown" where `session` is no episode taken."""
    with self._lock:
      handout = self._taken.pop(session, None)
      if handout is None:
        return "gone" if session in self._ended else "unknown"
      self._ended.add(session)
    if handout.timer is not None:
      handout.timer.cancel()
    try:
      if isinstance(outcome, EpisodeFailed):
        handout.future.set_exception(outcome)
      else:
        handout.future.set_result(outcome)
    except concurrent.futures.InvalidStateError:  # cancelled meanwhile: its episode ended without it
      return "gone"
    return "ended"

  async def _next(self, request: fastapi.Request, body: NextRequest | None = None):
    deadline = time.monotonic() + (body.wait_s if body is not None else DEFAULT_WAIT_S)
    while True:
      handout = self._take()
      if handout is not None:
        return self._body(handout, str(request.base_url))
      if time.monotonic() >= deadline:
        return responses.Response(status_code=204)
      await asyncio.sleep(0.02)

  def _reward(self, session_id: str, body: RewardRequest):
    outcome = (
      EpisodeFailed(f"its process posted an error: {body.error}")
      if body.error is not None
      else Posted(body.reward, body.fields or {})
    )
    ended = self._end(session_id, outcome)
    if ended == "gone":
      raise ApiError(410, f"episode {session_id!r} has ended (cancelled, or past its time limit): no reward is taken")
    if ended == "unknown":
      raise ApiError(404, f"session {session_id!r} is not an episode taken", "session_id")
    return {"session": session_id}
