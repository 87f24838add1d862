"""Dynamic sampling (DAPO, rl.dynamic_sampling): the one rule both GRPO learners follow.

A group (rl.num_generations samples of one prompt) whose rewards are all equal has no learning
signal: GRPO gives each of its samples a zero advantage. Dynamic sampling samples reserve prompts in
its place, up to rl.dynamic_sampling_max_rounds rounds per step (`max_rounds`; round 0 is the step's
own batch of batch_size prompts, rounds 1 .. max_rounds - 1 are reserve prompts).

The contract:
- which groups train: a step trains batch_size groups. Standard GRPO samples whole batches, round
  after round, and trains the groups with varied rewards first, in sampling order, then, when fewer
  than batch_size have them after the last round, groups without signal in sampling order fill the
  batch (`StepRounds`, `select_groups`). Agentic GRPO decides per prompt slot (slot
  step * batch_size + row): a group trains when its rewards vary or when it is its slot's last
  round; otherwise it is dropped and the slot samples its next round (`Slots`). Both are one rule
  (`more_rounds`): another round is drawn while fewer groups than wanted vary and rounds are left.
- which reserve prompt: round r >= 1 of step s draws reserve batch s * (max_rounds - 1) + r - 1
  (`reserve_index`), whole in standard GRPO, its row `row` for slot s * batch_size + row in agentic
  GRPO; so a resumed run draws what an uninterrupted one would.
- the metrics, per step (`Tally.metrics`): dynamic_sampling/rounds, the rounds the step took (agentic:
  the most any of its slots took; at least 1); dynamic_sampling/sampled_zero_std_fraction, the share
  of every group sampled (dropped ones included) whose rewards were all equal;
  dynamic_sampling/short, 1 where the rounds ran out with fewer varied groups than wanted (agentic:
  where a slot's last group trained without signal), else 0.
- the warning: logged once per step (standard) or per slot (agentic) that runs out of rounds short.

Pure Python and numpy; the learners (integration/tunix/learner.py, agentic.py) apply it.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import threading
from collections.abc import Callable

import numpy as np

from maxtext.configs.sections import AlgorithmSection

log = logging.getLogger(__name__)

ROUNDS = "dynamic_sampling/rounds"
SAMPLED_ZERO_STD_FRACTION = "dynamic_sampling/sampled_zero_std_fraction"
SHORT = "dynamic_sampling/short"

# reserve(i): the i-th reserve batch of prompts, a dict of per-prompt columns.
Reserve = Callable[[int], dict]


def max_rounds(rl: AlgorithmSection) -> int:
  """Rounds of prompts per step (per slot in agentic GRPO): 1 without dynamic sampling."""
  return rl.dynamic_sampling_max_rounds if rl.dynamic_sampling else 1


def reserve_index(step: int, rnd: int, rounds: int) -> int:
  """The reserve batch that round rnd (1 .. rounds - 1) of `step` draws from, of `rounds` per step."""
  assert 1 <= rnd < rounds, f"round {rnd} of {rounds} draws no reserve batch"
  return step * (rounds - 1) + rnd - 1


def more_rounds(varied: int, wanted: int, taken: int, rounds: int) -> bool:
  """Whether another round is drawn: `varied` of `wanted` groups have varied rewards after `taken`
  rounds of at most `rounds`."""
  return varied < wanted and taken < rounds


def varied_groups(rewards, num_generations: int) -> np.ndarray:
  """Per group of num_generations consecutive rows: whether its rewards are not all equal."""
  grouped = np.asarray(rewards, dtype=np.float64).reshape(-1, num_generations)
  return grouped.max(axis=1) > grouped.min(axis=1)


def select_groups(varied, wanted: int) -> np.ndarray:
  """Indices of the `wanted` groups to train from the groups sampled so far (in sampling order):
  those with varied rewards first, then, when there are too few, groups without signal to fill the
  batch."""
  varied = np.asarray(varied, dtype=bool)
  order = np.concatenate([np.flatnonzero(varied), np.flatnonzero(~varied)])
  return np.sort(order[:wanted])


@dataclasses.dataclass
class Tally:
  """One step's counts behind its metrics: groups sampled, those without signal, rounds taken and
  whether it ran short."""

  sampled: int = 0
  sampled_zero: int = 0
  rounds: int = 0
  short: bool = False

  def sample(self, groups: int, varied: int) -> None:
    """A round (standard) or a group (agentic) was sampled: `groups` groups, `varied` of them varied."""
    self.sampled += groups
    self.sampled_zero += groups - varied

  def resolve(self, taken: int, varied: int, wanted: int) -> bool:
    """The rounds of the step (or of one of its slots) ended after `taken` rounds with `varied` of
    `wanted` groups varied; returns whether it ran short."""
    short = varied < wanted
    self.rounds = max(self.rounds, taken)
    self.short = self.short or short
    return short

  def metrics(self) -> dict[str, float]:
    return {
      ROUNDS: float(max(self.rounds, 1)),
      SAMPLED_ZERO_STD_FRACTION: self.sampled_zero / self.sampled,
      SHORT: float(self.short),
    }


def _warn_short(step: int, varied: int, wanted: int, rounds: int, where: str = "") -> None:
  log.warning(
    "dynamic sampling: %d of %d groups with varied rewards after rl.dynamic_sampling_max_rounds=%d rounds at "
    "step %d%s; groups without signal train",
    varied,
    wanted,
    rounds,
    step,
    where,
  )


class StepRounds:
  """Standard GRPO: one step's rounds of whole batches. Add each sampled round's `varied_groups`
  (`add`), draw the next round's prompts while `next_batch` gives them, then train `selected`'s
  groups and log `tally.metrics()`."""

  def __init__(self, rounds: int, reserve: Reserve | None, step: int, wanted: int):
    if reserve is None:
      raise ValueError("dynamic sampling needs the reserve batches")
    self._rounds, self._reserve, self._step, self._wanted = rounds, reserve, step, wanted
    self._varied: list[np.ndarray] = []
    self.tally = Tally()

  def add(self, varied: np.ndarray) -> None:
    """A round was sampled: per group, whether its rewards vary (in sampling order)."""
    varied = np.asarray(varied, dtype=bool)
    self._varied.append(varied)
    self.tally.sample(len(varied), int(varied.sum()))

  def next_batch(self) -> dict | None:
    """The prompts of the next round (a reserve batch of `wanted` prompts), or None when the step's
    rounds are done (then they are tallied and, short, warned about)."""
    varied = sum(int(v.sum()) for v in self._varied)
    taken = len(self._varied)
    if more_rounds(varied, self._wanted, taken, self._rounds):
      batch = self._reserve(reserve_index(self._step, taken, self._rounds))
      if len(batch["prompts"]) != self._wanted:
        raise ValueError(
          f"dynamic sampling: a reserve batch of {len(batch['prompts'])} prompts for {self._wanted} groups"
        )
      return batch
    if self.tally.resolve(taken, varied, self._wanted):
      _warn_short(self._step, varied, self._wanted, self._rounds)
    return None

  def selected(self) -> np.ndarray:
    """The indices of the groups that train, over all rounds in sampling order (select_groups)."""
    return select_groups(np.concatenate(self._varied), self._wanted)


class Slots:
  """Agentic GRPO: per prompt slot (slot step * batch_size + row), whether its finished group trains
  or its next round's reserve prompt is sampled in its place; and per step the tallies behind the
  metrics. Thread-safe: groups finish on several threads."""

  def __init__(self, rounds: int, reserve: Reserve | None, batch_size: int):
    if reserve is None:
      raise ValueError("dynamic sampling needs the reserve batches")
    self._rounds, self._reserve, self._batch_size = rounds, reserve, batch_size
    self._lock = threading.Lock()
    self._steps: dict[int, Tally] = collections.defaultdict(Tally)
    self.unresolved = 0  # slots started whose trained group is not decided yet

  def started(self, slots: int) -> None:
    """`slots` slots were started (their round-0 prompts handed to the producer)."""
    with self._lock:
      self.unresolved += slots

  def decide(self, slot: int, rnd: int, zero_signal: bool) -> dict | None:
    """The slot's group of round `rnd` finished (its rewards all equal where zero_signal): None when
    it trains, else the one-prompt batch of the slot's next round, sampled in its place."""
    step, row = divmod(slot, self._batch_size)
    varied = int(not zero_signal)
    replace = more_rounds(varied, 1, rnd + 1, self._rounds)
    with self._lock:
      tally = self._steps[step]
      tally.sample(1, varied)
      short = False
      if not replace:
        short = tally.resolve(rnd + 1, varied, 1)
        self.unresolved -= 1
    if short:
      _warn_short(step, varied, 1, self._rounds, f" (slot {row})")
    if not replace:
      return None
    batch = self._reserve(reserve_index(step, rnd + 1, self._rounds))
    return {k: v[row : row + 1] for k, v in batch.items()}

  def metrics(self, step: int) -> dict[str, float]:
    """The step's metrics so far (Tally.metrics)."""
    with self._lock:
      return self._steps[step].metrics()
