"""One episode (a sample of a GRPO group) as every producer emits it: standard GRPO's and PPO's
sampling (rl/standard_step.py), agentic GRPO's own conversation
(integration/tunix/trajectories.TrajectoryEngine), a user's agent in a worker process (rl.agent=FILE:FN)
and one taken over HTTP (rl.agent=http; both integration/tunix/user_agent.AgentEpisode).

The record is flat, as prime-rl's TrainingSample and OpenEnv's TrainingTrace: the first prompt's
token ids, every token after it (sampled: mask 1, with the sampler's log-probs and the weights version
that sampled it; context the environment or the agent added: mask 0, log-prob 0, version -1), the
conversation as text and the example (what rewards read), and a status. A failed episode is a record
too (status FAILED, its reason, mask 0): it stays in its group, trains nothing and leaves its group's
baseline to the others (rl/group_scoring.py lays the group out). `log_row` is its line in the run's
episode log (episodes.jsonl).
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from maxtext.utils import safe_files

TRAINED = "trained"  # its sampled tokens train (masks may still be zero: an overlong filter, say)
FAILED = "failed"  # it trains nothing: `failure` says why


@dataclasses.dataclass(frozen=True)
class Calls:
  """What a user agent's session made: the calls trained (stitched into the conversation), the calls
  left out (`mismatched`: their prompt extends no trained call; `branches`: a second reply to a prompt
  already answered, parallel calls or n > 1; `retries`: an identical request answered again), and the
  sampled or context tokens cut past max_response_length."""

  calls: int = 0
  mismatched: int = 0
  branches: int = 0
  retries: int = 0
  cut: int = 0


@dataclasses.dataclass(frozen=True)
class Episode:
  """One sample of a GRPO group (see the module docstring). `ending` is the producer's own word for
  how the conversation ended (Tunix's trajectory status names for the run's own agent); `reward` the
  agent's own (None: the run's reward functions judge); `trajectory_reward` the environment's (0 without one)."""

  prompt_ids: np.ndarray  # [P] int32: the first prompt as the sampler saw it
  completion_ids: np.ndarray  # [C] int32: every token after it
  completion_mask: np.ndarray  # [C] int32: 1 sampled and trained, 0 context
  logprobs: np.ndarray | None  # [C] float: the sampler's (0 for context); None: the engine returned none
  versions: np.ndarray | None  # [C] int32: the weights version of each sampled token (-1: context)
  version: int | None  # the oldest weights version of a sampled token (the sampler's when none)
  conversation: list[dict]  # the messages as text, {role, content}
  example: dict  # the prompt record the episode started from
  group_id: Any
  status: str = TRAINED
  failure: str | None = None  # why a FAILED episode failed (its first line names it)
  ending: str = ""
  reward: float | None = None
  trajectory_reward: float = 0.0
  timings: Mapping[str, Mapping[str, float]] = dataclasses.field(default_factory=dict)
  calls: Calls | None = None  # a user agent's; None for the run's own

  def __post_init__(self):
    n = len(self.completion_ids)
    if len(self.completion_mask) != n or any(x is not None and len(x) != n for x in (self.logprobs, self.versions)):
      raise ValueError(
        f"Episode: {n} completion tokens, {len(self.completion_mask)} mask entries, "
        f"{None if self.logprobs is None else len(self.logprobs)} log-probs, "
        f"{None if self.versions is None else len(self.versions)} versions; expected one of each per token"
      )
    if (self.status == FAILED) != (self.failure is not None) or self.status not in (TRAINED, FAILED):
      raise ValueError(f"Episode: status {self.status!r} with failure {self.failure!r}")

  @property
  def failed(self) -> bool:
    return self.status == FAILED

  def failing(self, why: str) -> Episode:
    """This episode failed for `why`: it keeps its tokens (for the log) and trains none of them."""
    return dataclasses.replace(
      self, status=FAILED, failure=why, completion_mask=np.zeros(len(self.completion_ids), np.int32)
    )

  def log_row(self, decode, step: int, reward: float | None) -> dict[str, Any]:
    """The episode's line in episodes.jsonl: its step, group, status and reason, the reward it trained
    with, token counts, and the conversation as text: the messages, and the trained token stream
    decoded (`decode(ids) -> str`) with each sampled run marked by «...»."""
    trained = int(np.asarray(self.completion_mask).sum())
    return {
      "step": step,
      "group": self.group_id,
      "status": self.status,
      "failure": self.failure,
      "ending": self.ending,
      "reward": reward,
      "prompt_tokens": len(self.prompt_ids),
      "completion_tokens": len(self.completion_ids),
      "trained_tokens": trained,
      "version": self.version,
      "calls": dataclasses.asdict(self.calls) if self.calls is not None else None,
      "messages": [{"role": m.get("role"), "content": str(m.get("content", ""))} for m in self.conversation],
      "tokens": _marked(decode, self.prompt_ids, self.completion_ids, self.completion_mask),
    }


def _marked(decode, prompt, completion, mask) -> str:
  """The prompt and completion as text, each run of sampled tokens between « and »."""
  pieces = [decode(np.asarray(prompt).tolist())]
  mask = np.asarray(mask)
  start = 0
  for i in range(1, len(completion) + 1):
    if i == len(completion) or mask[i] != mask[start]:
      text = decode(np.asarray(completion[start:i]).tolist())
      pieces.append(f"«{text}»" if mask[start] else text)
      start = i
  return "".join(pieces)


class EpisodeLog:
  """The run's episode log, episodes.jsonl in its folder: a line per scored episode (Episode.log_row),
  appended as groups are scored, from any thread, at the step metrics.jsonl counts (the first is 1);
  `decode(ids) -> str` renders tokens."""

  def __init__(self, path: str, decode):
    self.path = path
    self._decode = decode
    self._lock = threading.Lock()

  def write(self, episodes: Sequence[Episode], rewards: Sequence[float], step: int) -> None:
    lines = [
      json.dumps(e.log_row(self._decode, step + 1, float(r)), ensure_ascii=False, default=_plain) + "\n"
      for e, r in zip(episodes, rewards)
    ]
    with self._lock, open(self.path, "a", encoding="utf-8") as f:
      f.writelines(lines)


def keep_through(path: str, step: int) -> int:
  """Makes the episode log at `path` hold only the episodes of steps through `step` (the checkpoint a
  rerun resumes from; it scores the later ones again), rewriting it whole; a line that does not read
  back (a torn tail) goes too. Returns how many lines were dropped."""
  if not os.path.isfile(path):
    return 0
  with open(path, encoding="utf-8", errors="replace") as f:
    lines = [line for line in f if line.strip()]
  kept = [line for line in lines if (at := _step_of(line)) is not None and at <= step]
  with safe_files.replaced(path) as f:
    f.writelines(line.rstrip("\n") + "\n" for line in kept)
  return len(lines) - len(kept)


def _step_of(line: str) -> int | None:
  """The step of an episode log line (None: not a row that reads back)."""
  try:
    row = json.loads(line)
  except ValueError:
    return None
  return row.get("step") if isinstance(row, dict) and type(row.get("step")) is int else None


def _plain(value):
  """JSON for numpy values in a row (a group id, say)."""
  if isinstance(value, np.generic):
    return value.item()
  if isinstance(value, np.ndarray):
    return value.tolist()
  raise TypeError(f"{type(value).__name__} is not JSON")
