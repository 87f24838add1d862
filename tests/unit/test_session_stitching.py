"""rl.session_stitching.stitch: a session's calls as one trained conversation by token prefix, whatever
order they finished in, with retries and branches counted; hand-computed."""

import dataclasses

import numpy as np
import pytest

from maxtext.rl.session_stitching import stitch


@dataclasses.dataclass(frozen=True)
class Call:
  request: int
  prompt_ids: np.ndarray
  token_ids: np.ndarray
  logprobs: np.ndarray
  versions: np.ndarray


_requests = iter(range(10**6))


def call(prompt, tokens, version=0, request=None):
  """A recorded call; requests numbered in the order the calls are written unless given."""
  return Call(
    next(_requests) if request is None else request,
    np.array(prompt),
    np.array(tokens),
    -np.arange(1, len(tokens) + 1) / 10,
    np.full(len(tokens), version),
  )


def test_calls_that_extend_the_conversation_join_it_with_the_added_messages_as_context():
  calls = [
    call([1, 2, 3], [10, 11, 99], version=4),  # prompt, reply ending at EOS 99
    call([1, 2, 3, 10, 11, 99, 7, 8], [12, 99], version=5),  # tool message 7 8 added by the agent
  ]
  s = stitch(calls, budget=100)
  assert s.prompt.tolist() == [1, 2, 3]
  assert s.tokens.tolist() == [10, 11, 99, 7, 8, 12, 99]
  assert s.masks.tolist() == [1, 1, 1, 0, 0, 1, 1]
  np.testing.assert_allclose(s.logprobs, [-0.1, -0.2, -0.3, 0, 0, -0.1, -0.2], rtol=1e-6)
  assert s.versions.tolist() == [4, 4, 4, -1, -1, 5, 5]
  assert s.version == 4  # the oldest trained token's version
  assert (s.counts.calls, s.counts.mismatched, s.counts.cut) == (2, 0, 0) and s.chain == (0, 1)


def test_a_call_that_does_not_extend_the_conversation_ends_it_and_is_counted():
  calls = [
    call([1, 2, 3], [10, 11, 99]),
    call([1, 2, 3, 10, 12, 99, 7], [13, 99]),  # the reply re-tokenized differently: not an extension
    call([1, 2, 3, 10, 12, 99, 7, 13, 99, 8], [14]),  # extends the second, not the trained conversation
  ]
  s = stitch(calls, budget=100)
  assert s.tokens.tolist() == [10, 11, 99] and s.masks.tolist() == [1, 1, 1]
  assert (s.counts.calls, s.counts.mismatched) == (1, 2)


def test_tokens_past_the_budget_are_cut_and_the_version_is_of_the_tokens_kept():
  calls = [call([5], [1, 2, 3], version=3), call([5, 1, 2, 3, 6], [4, 4], version=1)]
  s = stitch(calls, budget=4)
  assert s.tokens.tolist() == [1, 2, 3, 6] and s.masks.tolist() == [1, 1, 1, 0]
  assert (s.counts.cut, s.version) == (2, 3)  # the second call's tokens (version 1) were all cut


def test_a_session_without_calls_is_refused():
  with pytest.raises(ValueError, match="without calls"):
    stitch([], budget=10)


def test_calls_are_stitched_by_prefix_whatever_order_they_finished_in():
  first = call([1, 2], [10, 99], request=0)
  second = call([1, 2, 10, 99, 7], [11, 99], request=1)
  third = call([1, 2, 10, 99, 7, 11, 99, 8], [12], request=2)
  in_order = stitch([first, second, third], budget=100)
  finished = stitch([third, first, second], budget=100)  # recorded as they finished
  assert finished.tokens.tolist() == in_order.tokens.tolist() == [10, 99, 7, 11, 99, 8, 12]
  assert finished.masks.tolist() == in_order.masks.tolist() == [1, 1, 0, 1, 1, 0, 1]
  assert finished.counts.calls == 3 and finished.counts.mismatched == 0
  assert finished.chain == (1, 2, 0)  # indices into the calls as given


def test_a_retried_request_is_one_call_and_the_chain_keeps_the_reply_the_agent_continued():
  """An SDK retried the first request (another request, the same prompt, another sample); the agent
  went on from the retry's reply."""
  first = call([1, 2], [10, 99], request=0)
  retry = call([1, 2], [20, 99], request=1)
  then = call([1, 2, 20, 99, 7], [21], request=2)
  s = stitch([first, retry, then], budget=100)
  assert s.tokens.tolist() == [20, 99, 7, 21] and s.masks.tolist() == [1, 1, 0, 1]
  assert (s.counts.calls, s.counts.retries, s.counts.branches, s.counts.mismatched) == (2, 1, 0, 0)
  last = stitch([call([1, 2], [10, 99], request=0), call([1, 2], [20, 99], request=1)], budget=100)
  assert last.tokens.tolist() == [20, 99] and last.counts.retries == 1  # none continued: the latest


def test_n_replies_and_parallel_calls_are_branches_left_out_and_counted():
  """n=2 answers one request twice; later two calls in parallel both extend the first reply; the
  longest chain trains, the rest are branches."""
  a = call([1], [10, 99], request=0)
  b = call([1], [11, 99], request=0)  # the same request's second reply (n=2)
  left = call([1, 10, 99, 5], [30], request=1)
  right = call([1, 10, 99, 6], [40, 99], request=2)
  deeper = call([1, 10, 99, 6, 40, 99, 7], [50], request=3)
  s = stitch([a, b, left, right, deeper], budget=100)
  assert s.tokens.tolist() == [10, 99, 6, 40, 99, 7, 50]
  assert (s.counts.calls, s.counts.branches, s.counts.retries, s.counts.mismatched) == (3, 2, 0, 0)
