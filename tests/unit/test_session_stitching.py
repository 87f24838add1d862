"""rl.session_stitching.stitch: a session's calls as one trained conversation, hand-computed."""

import dataclasses

import numpy as np
import pytest

from maxtext.rl.session_stitching import stitch


@dataclasses.dataclass(frozen=True)
class Call:
  prompt_ids: np.ndarray
  token_ids: np.ndarray
  logprobs: np.ndarray
  versions: np.ndarray


def call(prompt, tokens, version=0):
  return Call(np.array(prompt), np.array(tokens), -np.arange(1, len(tokens) + 1) / 10, np.full(len(tokens), version))


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
  assert (s.version, s.calls, s.mismatched, s.cut) == (4, 2, 0, 0)  # the oldest trained token's version


def test_a_call_that_does_not_extend_the_conversation_ends_it_and_is_counted():
  calls = [
    call([1, 2, 3], [10, 11, 99]),
    call([1, 2, 3, 10, 12, 99, 7], [13, 99]),  # the reply re-tokenized differently: not an extension
    call([1, 2, 3, 10, 12, 99, 7, 13, 99, 8], [14]),  # extends the second, not the trained conversation
  ]
  s = stitch(calls, budget=100)
  assert s.tokens.tolist() == [10, 11, 99] and s.masks.tolist() == [1, 1, 1]
  assert (s.calls, s.mismatched) == (1, 2)


def test_tokens_past_the_budget_are_cut_and_the_version_is_of_the_tokens_kept():
  calls = [call([5], [1, 2, 3], version=3), call([5, 1, 2, 3, 6], [4, 4], version=1)]
  s = stitch(calls, budget=4)
  assert s.tokens.tolist() == [1, 2, 3, 6] and s.masks.tolist() == [1, 1, 1, 0]
  assert (s.cut, s.version) == (2, 3)  # the second call's tokens (version 1) were all cut


def test_a_session_without_calls_is_refused():
  with pytest.raises(ValueError, match="without calls"):
    stitch([], budget=10)
