"""Per-step training metrics both learners log through the cluster: trainer/idle_fraction, the share
of groups without learning signal, the batched engine's rollout rates, and the staleness and the tool
and turn counts of agentic conversations."""

from __future__ import annotations

import collections
import time

import numpy as np
from tunix.rl import rl_cluster as rl_cluster_lib

from maxtext.integration.tunix import rollout


def last(values):
  """A metric reduction: the last value logged."""
  return values[-1]


def rollout_metrics(cluster: rl_cluster_lib.RLCluster) -> dict:
  """Over the run so far, for the batched engine: rollout/prefix_reuse_fraction, and the decode steps'
  rollout/decode_tokens_per_s and rollout/decode_gb_per_s (bytes they read at least; compiling left out)."""
  metrics = {}
  engine: rollout.Engine = cluster.rollout
  reuse = engine.prefix_reuse()
  if reuse is not None:
    metrics["rollout/prefix_reuse_fraction"] = (reuse, last)
  rate = engine.decode_rate()
  if rate is not None:
    metrics["rollout/decode_tokens_per_s"] = (rate[0], last)
    metrics["rollout/decode_gb_per_s"] = (rate[1] / 1e9, last)
  return metrics


def staleness(version: int, versions) -> dict:
  """staleness/mean and staleness/max: the policy-version lag behind `version` of the samples tagged
  with `versions`."""
  lags = version - np.asarray(versions)
  return {"staleness/mean": (float(lags.mean()), np.mean), "staleness/max": (float(lags.max()), np.max)}


def zero_signal_groups(advantages, num_generations: int) -> tuple[int, int]:
  """(groups whose rewards are all equal, groups): GRPO's advantage is zero for every sample of such a
  group, so it carries no learning signal."""
  groups = np.asarray(advantages, np.float32).reshape(-1, num_generations)
  return int((np.abs(groups) < 1e-6).all(axis=1).sum()), len(groups)


class IdleClock:
  """trainer/idle_fraction: the share of a global step's wall time (its window, open() to close())
  the trainer spent waiting for samples (rollouts, rewards and reference scoring): the time between
  wait_starts() and wait_ends() calls."""

  def __init__(self):
    self._window: tuple[float, int] | None = None  # (start time, global step)
    self._waited = 0.0
    self.wait_start = 0.0

  def open(self, step: int, at: float | None = None) -> None:
    """Opens global step `step`'s window at time `at` (now by default)."""
    self._window, self._waited = (time.perf_counter() if at is None else at, step), 0.0

  def wait_starts(self) -> None:
    self.wait_start = time.perf_counter()

  def wait_ends(self) -> None:
    self._waited += time.perf_counter() - self.wait_start

  def close(self, at: float | None = None) -> tuple[int, float] | None:
    """Closes the open window at time `at` (now by default): (its step, its idle fraction), or None
    when no window is open."""
    if self._window is None:
      return None
    (start, step), self._window = self._window, None
    end = time.perf_counter() if at is None else at
    return step, min(self._waited / max(end - start, 1e-9), 1.0)


_TOOL_FAILURE = "Tool returned result: Error:"  # how the agent writes a failed tool's output


def conversation_counts(conversations: list[list[dict]]) -> collections.Counter:
  """Conversations, those with a tool call, tool calls, failed tool calls and model turns."""
  calls = [[m for m in c if m["role"] == "tool"] for c in conversations]
  return collections.Counter(
    conversations=len(conversations),
    with_calls=sum(bool(c) for c in calls),
    calls=sum(len(c) for c in calls),
    failed=sum(str(m["content"]).startswith(_TOOL_FAILURE) for c in calls for m in c),
    turns=sum(m["role"] == "assistant" for c in conversations for m in c),
  )


def conversation_metrics(counts: collections.Counter) -> dict[str, float]:
  """tools/calls and tools/failed_calls (counts), tools/call_frequency (share of conversations with
  a tool call), tools/failure_frequency (share of tool calls that failed) and turns/mean (model
  turns per conversation)."""
  return {
    "tools/calls": float(counts["calls"]),
    "tools/failed_calls": float(counts["failed"]),
    "tools/call_frequency": counts["with_calls"] / max(counts["conversations"], 1),
    "tools/failure_frequency": counts["failed"] / counts["calls"] if counts["calls"] else 0.0,
    "turns/mean": counts["turns"] / max(counts["conversations"], 1),
  }
