"""The agentic learner's prompt feed: the queue between its training thread, which hands it one batch
per step, and its rollout producer, which samples the prompts one at a time.

- ProcessShare: across processes each samples its share of every batch; a prompt's slot
  (step * batch_size + row) names its group (its step, its sampling keys) as one process would.
- PromptFeed: takes this process's share of each step's batch and tags every prompt with its slot
  (SLOT) and dynamic sampling round (ROUND); with dynamic sampling (maxtext.rl.dynamic_sampling.Slots)
  a slot's replacement comes tagged, and the prompts outlast the end of the data while slots are
  undecided.
- single_prompts: a batch as one-prompt batches, the way Tunix's learner splits them.

Pure Python and numpy; integration/tunix/agentic.py drives it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import queue
from collections.abc import AsyncIterator, Iterator

import numpy as np

from maxtext.rl import dynamic_sampling
from maxtext.utils import columns

# Fields the feed adds to each prompt: its slot (see ProcessShare) and its dynamic sampling round.
SLOT, ROUND = "group_slot", "sampling_round"


def scalar(value) -> int:
  """A one-prompt batch's field (SLOT, ROUND) as an int."""
  return int(np.asarray(value).reshape(-1)[0])


@dataclasses.dataclass(frozen=True)
class ProcessShare:
  """Process `index` of `count` samples rows [index * size, (index + 1) * size) of every batch of
  batch_size prompts (size = batch_size / count). A prompt's slot, step * batch_size + row, names
  its group (its step, its sampling keys) as one process would."""

  index: int
  count: int
  batch_size: int

  @property
  def size(self) -> int:
    return self.batch_size // self.count

  def rows(self, batch: dict) -> dict:
    start = self.index * self.size
    return {k: v[start : start + self.size] for k, v in batch.items()}

  def slots(self, step: int) -> list[int]:
    start = step * self.batch_size + self.index * self.size
    return list(range(start, start + self.size))

  def step_of(self, slot: int) -> int:
    return slot // self.batch_size


def single_prompts(batch: dict) -> Iterator[dict]:
  """The batch's prompts as one-prompt batches: each field a one-element array (numpy arrays are
  flattened, a list or tuple is taken per element, anything else is one element; an element that is a
  list or a dict, a conversation say, stays whole in an object array), as Tunix's learner splits its
  micro-batches of one prompt."""
  fields = {
    k: v.reshape(-1)
    if isinstance(v, np.ndarray)
    else columns.as_array(list(v) if isinstance(v, (list, tuple)) else [v])
    for k, v in batch.items()
  }
  for i in range(len(next(iter(fields.values())))):
    yield {k: c[i : i + 1] for k, c in fields.items()}


_END = None  # what the queue holds after the last batch
_NOTHING = object()  # no batch within the poll interval


class PromptFeed:
  """Batches in, tagged one-prompt batches out (`prompts`). Thread-safe: the training thread puts
  the steps' batches (`put`, then `end` after the last), the scoring of a group puts its slot's
  replacement (`replace`), and `close` (training ended) ends the prompts even where slots are
  undecided."""

  def __init__(self, share: ProcessShare, slots: dynamic_sampling.Slots | None, first_step: int):
    self._share, self._slots = share, slots
    self._step = first_step  # the step of the next batch put
    self._queue: queue.Queue = queue.Queue()
    self._closing = False

  def put(self, batch: dict) -> None:
    """The next step's batch (every process's rows): this process's share, tagged."""
    slots = self._share.slots(self._step)
    self._step += 1
    if self._slots is not None:
      self._slots.started(len(slots))
    tags = {SLOT: np.asarray(slots), ROUND: np.zeros(len(slots), np.int64)}
    self._queue.put({**self._share.rows(batch), **tags})

  def replace(self, slot: int, rnd: int, prompt: dict) -> None:
    """Round `rnd` of `slot`: the one-prompt batch sampled in place of its dropped group."""
    self._queue.put({**prompt, SLOT: np.asarray([slot]), ROUND: np.asarray([rnd])})

  def end(self) -> None:
    """No batch follows (the data or max_steps ran out, or a batch came short)."""
    self._queue.put(_END)

  def close(self) -> None:
    """Training ended: the prompts end at the end of the data, whatever slots are undecided."""
    self._closing = True
    self._queue.put(_END)

  async def prompts(self, loop: asyncio.AbstractEventLoop) -> AsyncIterator[dict]:
    """The tagged one-prompt batches, in the order put, until the end of the data and, with dynamic
    sampling, until every slot is decided (or the feed is closed). The queue is read in `loop`'s
    executor and polled, so no thread waits on it past the end."""
    ended = False
    while not (ended and (self._closing or self._slots is None or self._slots.unresolved <= 0)):
      try:
        batch = await loop.run_in_executor(None, functools.partial(self._queue.get, timeout=0.2))
      except queue.Empty:
        batch = _NOTHING
      if batch is _END:
        ended = True
      elif batch is not _NOTHING:
        for prompt in single_prompts(batch):
          yield prompt
