"""The continuous batcher's slot table and admission policy, on the host: which slot a waiting
request takes, which prefix of its prompt it reuses instead of prefilling, and how many cache rows
the batch needs. Pure bookkeeping (numpy and the standard library): the batcher's scheduler thread
calls it between decode chunks and runs the device programs it implies.

A `Slots` table has `max_batch_size` slots, each busy with one request or free. A free slot holds
the keys and values its last request left behind (prompt and completion, see `_cached`) until the
slot is needed again or the weights change. Waiting requests are admitted fairly: each has an
owner (the caller's request or session), and a free slot goes to the owner holding the fewest
slots now, the earliest arrival among equals, so one caller's many choices wait behind a single
choice of another rather than ahead of it. A new request goes to the free slot whose held tokens
share the longest prefix with its prompt and prefills only the rest: a later turn of a conversation
re-reads only the tool output, and conversations that share a system prompt read it once per slot.
A request also copies a common prefix from a busy slot or from a request admitted with it, so a
GRPO group's samples read their prompt once, whether they arrive together or not. A prompt's last
token is never reused (the request's first decode step feeds it). Among equal choices the lowest
slot wins, so busy slots stay low and the cache can shrink. Held prefixes are dropped when the
weights version changes, so reused keys and values always come from the current weights.

Cache rows come in powers of two (at most `max_batch_size`): they grow to fit the highest admitted
slot and halve when the busy slots fit a quarter of them and nothing waits; the prefixes held in
dropped rows are forgotten.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, NamedTuple

import numpy as np


@dataclasses.dataclass
class Request:
  """One generate request as the scheduler tracks it. params: its sampling parameters (a
  continuous_batching.SamplingParams; the policy reads none of them); future: what the caller waits
  on; on_tokens: the caller's callback for each chunk of tokens (opaque here)."""

  prompt: np.ndarray
  params: Any
  key: np.ndarray  # uint32[2]
  future: Any = None
  on_tokens: Any = None
  owner: Any = None
  version: int = 0  # weights version at admission; its keys and values are reusable only under it
  tokens: list = dataclasses.field(default_factory=list)
  logprobs: list = dataclasses.field(default_factory=list)
  versions: list = dataclasses.field(default_factory=list)


class Admission(NamedTuple):
  """A waiting request admitted into `slot`: the first `reused` tokens of its prompt are not
  prefilled; they are held by the slot itself (source None) or copied from slot `source` (busy, or
  admitted earlier in the same round and prefilled first)."""

  slot: int
  request: Request
  reused: int
  source: int | None


def _bucket(n: int, cap: int) -> int:
  """The smallest power of two >= n, at most cap (bounds the compiled shapes)."""
  size = 1
  while size < n:
    size *= 2
  return min(size, cap)


def _chunk_width(remaining: int, cap: int) -> int:
  """Prefill chunk width: the largest of 16, 64, 256, ... (at most cap) that the longest remaining
  prompt part fills, so few shapes compile and little padding is computed; 16 for shorter parts."""
  width = min(16, cap)
  while width * 4 <= min(remaining, cap):
    width *= 4
  return width


def _shared_prefix(a: np.ndarray, b: np.ndarray) -> int:
  """Length of the longest common prefix of two token arrays."""
  n = min(len(a), len(b))
  differ = np.flatnonzero(a[:n] != b[:n])
  return int(differ[0]) if len(differ) else n


def _filled(r: Request) -> int:
  """How many positions of a request's slot hold keys and values: its prompt and sampled tokens but
  the last one (a decode step feeds that one, the prompt's last token before the first). The next
  decode step writes at this position."""
  return len(r.prompt) - 1 + len(r.tokens)


def _cached(r: Request) -> np.ndarray:
  """The tokens whose keys and values a request's slot holds (see _filled)."""
  return np.concatenate([r.prompt, np.asarray(r.tokens, np.int32)])[: _filled(r)]


def _nothing() -> np.ndarray:
  return np.zeros(0, np.int32)


def _fair(waiting: collections.deque[Request], count: int, holding: list[Any]) -> list[Request]:
  """Takes up to `count` requests out of `waiting` (left in arrival order): one at a time, the
  earliest of the owner that holds the fewest slots (`holding`: the owners of the busy slots, plus
  each request taken), the owner whose earliest request came first among equals."""
  if count >= len(waiting) or len({r.owner for r in waiting}) == 1:
    return [waiting.popleft() for _ in range(min(count, len(waiting)))]
  queues: dict[Any, collections.deque[int]] = {}
  for i, r in enumerate(waiting):
    queues.setdefault(r.owner, collections.deque()).append(i)
  held = collections.Counter(holding)
  taken: list[int] = []
  while len(taken) < count:
    owner = min(queues, key=lambda o: (held[o], queues[o][0]))
    taken.append(queues[owner].popleft())
    held[owner] += 1
    if not queues[owner]:
      del queues[owner]
  chosen = set(taken)
  picked = [waiting[i] for i in taken]
  rest = [r for i, r in enumerate(waiting) if i not in chosen]
  waiting.clear()
  waiting.extend(rest)
  return picked


class Slots:
  """The slot table: `requests[slot]` is the request decoding in a slot (None when free), `held[slot]`
  the tokens whose keys and values a free slot holds, `admitting` the requests taken from the queue
  by the last `admit` and not yet placed, `version` the weights version held prefixes belong to."""

  def __init__(self, max_batch_size: int, version: int = 0):
    self.max_batch_size = max_batch_size
    self.requests: list[Request | None] = [None] * max_batch_size
    self.held: list[np.ndarray] = [_nothing()] * max_batch_size
    self.admitting: list[Request] = []
    self.version = version

  def busy(self) -> bool:
    """Some slot is decoding a request."""
    return any(r is not None for r in self.requests)

  def has_free(self) -> bool:
    """Some slot is free (a waiting request could be admitted)."""
    return any(r is None for r in self.requests)

  def highest_busy(self) -> int:
    """The busy slots fit this many rows (the highest busy slot + 1; 0 when none is busy)."""
    return max((i + 1 for i, r in enumerate(self.requests) if r is not None), default=0)

  def set_version(self, version: int, stale: bool = False) -> bool:
    """Takes the weights version read before a round; when it changed (or stale: the weights
    changed under the same version) held prefixes are dropped. Returns whether they were."""
    changed = version != self.version or stale
    if changed:  # held keys and values came from older weights
      self.held = [_nothing()] * self.max_batch_size
    self.version = version
    return changed

  def admit(self, waiting: collections.deque[Request]) -> list[Admission]:
    """Takes waiting requests while slots are free (each free slot to the owner holding the fewest
    slots, the earliest arrival among equals; see _fair) and tags them with the current version. A
    request reuses the longest prefix of its prompt that a free slot holds (it then goes
    to that slot), or, when longer, copies one from a busy slot of this version or from a request
    admitted earlier in this round (it then goes to the lowest free slot). A prompt's last token is
    never reused: the first decode step feeds it. Among equals the lowest slot wins (and a free
    slot's own prefix wins over an equal copy)."""
    free = [i for i, r in enumerate(self.requests) if r is None]
    if not (free and waiting):  # the usual case between decode steps: nothing to admit
      self.admitting = []
      return []
    sources = [
      (slot, _cached(r)) for slot, r in enumerate(self.requests) if r is not None and r.version == self.version
    ]
    taken: list[Admission] = []
    for r in _fair(waiting, len(free), [q.owner for q in self.requests if q is not None]):
      r.version = self.version
      room = len(r.prompt) - 1
      held = [min(_shared_prefix(self.held[i], r.prompt), room) for i in free]
      best = max(range(len(free)), key=lambda j: (held[j], -free[j]))
      shared, source = max(
        ((min(_shared_prefix(tokens, r.prompt), room), slot) for slot, tokens in sources), default=(0, None)
      )
      if shared > held[best]:
        taken.append(Admission(free.pop(0), r, shared, source))
      else:
        taken.append(Admission(free.pop(best), r, held[best], None))
        sources.append((taken[-1].slot, _cached(r)))  # what its slot holds once prefilled
    self.admitting = [a.request for a in taken]
    return taken

  def place(self, admitted: list[Admission]) -> None:
    """Admitted requests (prefilled) take their slots; none is admitting any more."""
    for a in admitted:
      self.requests[a.slot] = a.request
    self.admitting = []

  def release(self, slot: int) -> Request:
    """A finished request leaves its slot, which keeps holding what the request's keys and values
    cover (nothing if they came from an older version). Returns the request."""
    r = self.requests[slot]
    assert r is not None, f"slot {slot} is free"
    self.requests[slot] = None
    self.held[slot] = _cached(r) if r.version == self.version else _nothing()
    return r

  def grown_rows(self, rows: int, admitted: list[Admission]) -> int:
    """The cache rows needed once `admitted` take their slots: `rows` when the highest slot fits,
    else the smallest power of two (at most max_batch_size) that fits it."""
    needed = max((a.slot + 1 for a in admitted), default=0)
    return _bucket(needed, self.max_batch_size) if needed > rows else rows

  def shrink(self, rows: int, waiting: bool) -> int:
    """The cache rows after a decode chunk: half of `rows` when the busy slots fit a quarter of them
    and nothing waits (prefixes held in the dropped rows are forgotten), else `rows`. An idle table
    keeps its rows (and held prefixes)."""
    busy = self.highest_busy()
    if not (busy and not waiting and 4 * busy <= rows):
      return rows
    rows //= 2
    self.held[rows:] = [_nothing()] * (self.max_batch_size - rows)
    return rows

  def clear(self) -> list[Request]:
    """Empties every slot; returns the requests that were decoding or admitting."""
    requests = [r for r in self.requests if r is not None] + self.admitting
    self.requests = [None] * self.max_batch_size
    self.admitting = []
    return requests
