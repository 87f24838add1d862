"""The server's sessions without HTTP (inference/sessions.py): ids, the budget after the first prompt,
turn and request numbers, calls recorded from many threads, and which chat call continues which."""

import threading

import jax
import numpy as np
import pytest

from maxtext.inference.sessions import Call, Sessions, SessionSampling


def _call(request: int) -> Call:
  ids = np.zeros(2, np.int32)
  return Call(request, ids, ids, np.zeros(2, np.float32), ids, 1.0, "stop")


def test_sessions_have_distinct_unguessable_ids_and_a_closed_one_is_gone():
  sessions = Sessions()
  ids = {sessions.open() for _ in range(200)}
  assert len(ids) == 200 and all(len(i) >= 22 for i in ids)  # 128 random bits, URL-safe
  some = next(iter(ids))
  assert sessions.close(some).id == some and sessions.get(some) is None
  with pytest.raises(KeyError):
    sessions.close(some)


def test_a_training_session_s_budget_counts_what_its_calls_add_after_the_first_prompt():
  sampling = SessionSampling(1.0, 1.0, None, lambda turn: jax.random.PRNGKey(turn), budget=10)
  sessions = Sessions()
  session = sessions.get(sessions.open(sampling))
  assert session.budget_left(50) == 10  # the first prompt sets the start
  assert session.budget_left(56) == 4  # 6 tokens added since (replies and new messages)
  assert session.budget_left(60) == 0
  assert sessions.get(sessions.open()).budget_left(1000) is None  # no budget without sampling


def test_turns_and_requests_are_numbered_in_order_and_calls_recorded_from_many_threads():
  sessions = Sessions()
  session = sessions.get(sessions.open())
  assert [session.next_turn() for _ in range(3)] == [0, 1, 2]
  numbers = []
  threads = [threading.Thread(target=lambda: numbers.append(session.next_request())) for _ in range(50)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert sorted(numbers) == list(range(50))
  adders = [threading.Thread(target=session.add, args=(_call(i),)) for i in range(50)]
  for t in adders:
    t.start()
  for t in adders:
    t.join()
  assert sorted(c.request for c in session.calls) == list(range(50))


def test_a_chat_call_continues_the_last_one_only_where_its_messages_extend_that_call_s_and_its_reply():
  sessions = Sessions()
  session = sessions.get(sessions.open())
  asked = [{"role": "user", "content": "2+3?"}]
  assert session.continued_from(asked) is None  # no earlier call
  replied = [*asked, {"role": "assistant", "content": "5"}]
  session.remember(replied, replied, [1, 2, 3])
  more = [*replied, {"role": "user", "content": "Sure?"}]
  assert session.continued_from(more) == (replied, replied, [1, 2, 3])
  assert session.continued_from(replied) is None  # nothing new
  edited = [asked[0], {"role": "assistant", "content": "6"}, more[-1]]
  assert session.continued_from(edited) is None  # an edited reply is rendered whole
