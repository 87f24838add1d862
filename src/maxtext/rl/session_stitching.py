"""One conversation to train on from the calls an agent's session made (inference/openai_server.py
records each: the request it answered, numbered in the order the session's requests arrived, its
prompt ids, sampled ids, their log-probs and weights versions), stitched by token prefix, not by the
order the calls finished.

A call extends another where its prompt begins with that call's prompt and reply, token for token
(the server builds such prompts where the agent sends the conversation back with the reply as it
came: `OpenAIServer._continued`); its parent is the call with the longest such prompt and reply. The
trained conversation is the longest chain of calls from the session's first request, each extending
the one before (among chains as long, the one ending in the latest request): its first prompt is
the conversation's prompt (a retry of that request may start it), each call's sampled tokens are
trained (mask 1, the sampler's log-probs, their versions), and the tokens a call's prompt adds after
its parent's reply, the messages the agent added (tool results, a user turn), are context (mask 0).
Calls off the chain are not trained
and are counted:
- `retries`: a call whose prompt is a chained call's, asked again in another request (an SDK's retry;
  the chain keeps the one a later call extends, else the latest);
- `branches`: a second reply of a chained call's request (n > 1), or a call that extends a chained
  call but is not the chain's next (parallel calls);
- `mismatched`: a call that extends no chained call (the agent edited or dropped earlier turns).
Tokens past `budget` after the prompt are cut (`cut`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from maxtext.rl.episode import Calls


class Call(Protocol):
  """What stitch reads of a recorded call (inference/sessions.Call)."""

  @property
  def request(self) -> int: ...

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
  sampled and trained, 0: context), log-probs (0 for context) and weights versions (-1 for context),
  the oldest weights version of a trained token (None without one), the indices of the calls trained
  (in the conversation's order) and the counts of what was left out (episode.Calls)."""

  prompt: np.ndarray
  tokens: np.ndarray
  masks: np.ndarray
  logprobs: np.ndarray
  versions: np.ndarray
  version: int | None
  chain: tuple[int, ...]
  counts: Calls


def _stream(call: Call) -> np.ndarray:
  return np.concatenate([np.asarray(call.prompt_ids, np.int32), np.asarray(call.token_ids, np.int32)])


def _extends(call: Call, stream: np.ndarray) -> bool:
  prompt = np.asarray(call.prompt_ids)
  return len(prompt) >= len(stream) and np.array_equal(prompt[: len(stream)], stream)


def chain(calls: Sequence[Call]) -> tuple[list[int], Calls]:
  """The indices of the trained chain of `calls` (in order) and the counts of the calls off it (the
  module docstring's rule); `cut` is 0 here."""
  order = sorted(range(len(calls)), key=lambda i: calls[i].request)
  first = np.asarray(calls[order[0]].prompt_ids)
  roots = {i for i in order if np.array_equal(calls[i].prompt_ids, first)}  # the first request, or asked again
  streams = {i: _stream(calls[i]) for i in order}
  parent: dict[int, int] = {}
  for i in order:
    if i in roots:
      continue
    extended = [j for j in order if j != i and _extends(calls[i], streams[j])]
    if extended:
      parent[i] = max(extended, key=lambda j: (len(streams[j]), calls[j].request))

  def path(i: int) -> list[int] | None:
    seen = [i]
    while seen[-1] not in roots:
      if seen[-1] not in parent or parent[seen[-1]] in seen:
        return None
      seen.append(parent[seen[-1]])
    return seen[::-1]

  paths = [p for p in (path(i) for i in order) if p is not None]
  best = max(paths, key=lambda p: (len(p), calls[p[-1]].request))
  on = set(best)
  retries = branches = mismatched = 0
  for i in order:
    if i in on:
      continue
    same_prompt = [j for j in on if np.array_equal(calls[j].prompt_ids, calls[i].prompt_ids)]
    if any(calls[j].request == calls[i].request for j in same_prompt):
      branches += 1
    elif same_prompt:
      retries += 1
    elif parent.get(i) in on:
      branches += 1
    else:
      mismatched += 1
  return best, Calls(calls=len(best), mismatched=mismatched, branches=branches, retries=retries)


def stitch(calls: Sequence[Call], budget: int) -> Stitched:
  """The conversation of `calls` (at least one, in any order) with at most `budget` tokens after its
  prompt (see the module docstring)."""
  if not calls:
    raise ValueError("stitch: a session without calls has no conversation")
  chained, counts = chain(calls)
  first = calls[chained[0]]
  prompt = np.asarray(first.prompt_ids, np.int32)
  stream = prompt
  tokens, masks, logprobs, versions = [], [], [], []
  for i in chained:
    call = calls[i]
    ids = np.asarray(call.prompt_ids, np.int32)
    context = ids[len(stream) :]
    sampled = np.asarray(call.token_ids, np.int32)
    tokens += [context, sampled]
    masks += [np.zeros(len(context), np.int32), np.ones(len(sampled), np.int32)]
    logprobs += [np.zeros(len(context), np.float32), np.asarray(call.logprobs, np.float32)]
    versions += [np.full(len(context), -1, np.int32), np.asarray(call.versions, np.int32)]
    stream = np.concatenate([ids, sampled])
  joined = np.concatenate(tokens)
  cut = max(len(joined) - budget, 0)
  kept = len(joined) - cut
  trained = np.concatenate(masks)[:kept]
  kept_versions = np.concatenate(versions)[:kept]
  sampled_versions = kept_versions[trained == 1]
  return Stitched(
    prompt=prompt,
    tokens=joined[:kept],
    masks=trained,
    logprobs=np.concatenate(logprobs)[:kept],
    versions=kept_versions,
    version=int(sampled_versions.min()) if len(sampled_versions) else None,
    chain=tuple(chained),
    counts=dataclasses.replace(counts, cut=cut),
  )
