"""One conversation to train on from the calls an agent's session made (inference/openai_server.py
records each: prompt ids, sampled ids, their log-probs and weights versions).

The first call's prompt is the conversation's prompt. Each call's sampled tokens are trained (mask
1, the sampler's log-probs); a later call whose prompt extends everything before it (the previous
prompt and reply, token for token) adds the tokens in between, the messages the agent added (tool
results, a user turn), as context (mask 0). The server builds such prompts itself where the agent
sends back the conversation with the reply as it came (`OpenAIServer._continued`). A call whose
prompt does not extend the conversation (the agent edited or dropped earlier turns) ends it: that
call and every later one are not trained on, and are counted (`mismatched`). Tokens past `budget`
after the prompt are cut (`cut`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np


class Call(Protocol):
  """What stitch reads of a recorded call (openai_server.Call)."""

  @property
  def prompt_ids(self) -> np.ndarray: ...

  @property
  def token_ids(self) -> np.ndarray: ...

  @property
  def logprobs(self) -> np.ndarray: ...

  @property
  def versions(self) -> np.ndarray: ...


@dataclasses.dataclass(frozen=True)
class Stitched:
  """A session's calls as one conversation: its prompt, the tokens after it with their masks (1:
  sampled and trained, 0: context) and log-probs (0 for context), the oldest weights version of a
  trained token (None without one), the calls trained, the calls left out (mismatched) and the
  tokens cut past the budget."""

  prompt: np.ndarray
  tokens: np.ndarray
  masks: np.ndarray
  logprobs: np.ndarray
  version: int | None
  calls: int
  mismatched: int
  cut: int


def stitch(calls: Sequence[Call], budget: int) -> Stitched:
  """The conversation of `calls` (at least one, in the order they were made) with at most `budget`
  tokens after its prompt (see the module docstring)."""
  if not calls:
    raise ValueError("stitch: a session without calls has no conversation")
  prompt = np.asarray(calls[0].prompt_ids, np.int32)
  stream = prompt
  tokens, masks, logprobs, versions = [], [], [], []
  used = 0
  for call in calls:
    ids = np.asarray(call.prompt_ids, np.int32)
    if len(ids) < len(stream) or not np.array_equal(ids[: len(stream)], stream):
      break
    context = ids[len(stream) :]
    sampled = np.asarray(call.token_ids, np.int32)
    tokens += [context, sampled]
    masks += [np.zeros(len(context), np.int32), np.ones(len(sampled), np.int32)]
    logprobs += [np.zeros(len(context), np.float32), np.asarray(call.logprobs, np.float32)]
    versions.append(np.asarray(call.versions))
    stream = np.concatenate([ids, sampled])
    used += 1
  joined = np.concatenate(tokens)
  cut = max(len(joined) - budget, 0)
  kept = len(joined) - cut
  trained = np.concatenate(masks)[:kept]
  all_versions = np.concatenate(versions)[: int(trained.sum())] if versions else np.zeros(0)
  return Stitched(
    prompt=prompt,
    tokens=joined[:kept],
    masks=trained,
    logprobs=np.concatenate(logprobs)[:kept],
    version=int(all_versions.min()) if len(all_versions) else None,
    calls=used,
    mismatched=len(calls) - used,
    cut=cut,
  )
