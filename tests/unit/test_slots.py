"""The continuous batcher's slot table and admission policy on their own: no threads, no JAX, no
model. Every expectation is worked out by hand from the policy's rules (slots.py's docstring)."""

import ast
import collections
import importlib.util
import subprocess
import sys

import numpy as np

from maxtext.inference.slots import Admission, Request, Slots, _bucket, _cached, _chunk_width, _filled, _shared_prefix


def _request(prompt, tokens=()) -> Request:
  r = Request(np.array(prompt, np.int32), params=None, key=np.zeros(2, np.uint32))
  r.tokens.extend(tokens)
  return r


def _admit(table: Slots, *requests: Request) -> list[Admission]:
  return table.admit(collections.deque(requests))


def _plan(admitted: list[Admission]) -> list[tuple[int, int, int | None]]:
  """(slot, reused, source) of each admission."""
  return [(a.slot, a.reused, a.source) for a in admitted]


def _run(table: Slots, *requests: Request) -> list[Admission]:
  """Admits and places requests (as the batcher does once their prefill is dispatched)."""
  admitted = _admit(table, *requests)
  table.place(admitted)
  return admitted


def test_the_policy_imports_neither_jax_nor_threading():
  path = importlib.util.find_spec("maxtext.inference.slots").origin
  imported = set()
  for node in ast.walk(ast.parse(open(path).read())):
    if isinstance(node, ast.Import):
      imported.update(a.name.split(".")[0] for a in node.names)
    elif isinstance(node, ast.ImportFrom):
      assert node.level == 0 and node.module
      imported.add(node.module.split(".")[0])
  assert imported <= {"__future__", "collections", "dataclasses", "typing", "numpy"}, imported
  assert not imported & {"jax", "jaxlib", "flax", "threading", "concurrent", "maxtext"}
  # And in a fresh interpreter importing it loads no JAX.
  check = "import sys, maxtext.inference.slots; assert not {'jax', 'flax'} & set(sys.modules), sorted(sys.modules)"
  subprocess.run([sys.executable, "-c", check], check=True)


def test_helpers():
  assert [_bucket(n, 8) for n in (0, 1, 2, 3, 4, 5, 8, 9)] == [1, 1, 2, 4, 4, 8, 8, 8]
  assert _bucket(5, 6) == 6  # capped at max_batch_size, even when not a power of two
  # 16, 64, 256, ...: the largest the remaining part fills (at most cap); 16 (or cap) below that.
  assert [_chunk_width(n, 256) for n in (1, 15, 63, 64, 255, 256, 1000)] == [16, 16, 16, 64, 64, 256, 256]
  assert _chunk_width(1000, 100) == 64 and _chunk_width(5, 8) == 8
  assert _shared_prefix(np.array([1, 2, 3]), np.array([1, 2, 4])) == 2
  assert _shared_prefix(np.array([1, 2]), np.array([1, 2, 3])) == 2
  assert _shared_prefix(np.array([], np.int32), np.array([1])) == 0
  r = _request([1, 2, 3], tokens=[4, 5])
  assert _filled(r) == 4  # the prompt and the tokens but the last sampled one (the next step feeds it)
  assert _cached(r).tolist() == [1, 2, 3, 4]
  assert _cached(_request([1, 2, 3])).tolist() == [1, 2]


def test_a_grpo_group_admitted_together_prefills_its_prompt_once():
  table = Slots(8)
  group = [_request([5, 6, 7, 8, 9]) for _ in range(8)]
  waiting = collections.deque(group)
  admitted = table.admit(waiting)
  # The first is prefilled into slot 0 (all but its last token: 4); the seven others copy those 4
  # from slot 0 into slots 1..7 and prefill nothing more.
  assert _plan(admitted) == [(0, 0, None)] + [(slot, 4, 0) for slot in range(1, 8)]
  assert [a.request for a in admitted] == group and not waiting
  assert table.admitting == group and not table.busy()
  table.place(admitted)
  assert table.requests == group and table.admitting == [] and not table.has_free()


def test_a_sample_arriving_later_copies_its_prompt_from_the_busy_slot():
  table = Slots(4)
  first, other, late = _request([5, 6, 7, 8, 9]), _request([1, 2, 3]), _request([5, 6, 7, 8, 9])
  _run(table, first, other)
  first.tokens.extend([10, 11])
  # slot 0 holds [5, 6, 7, 8, 9, 10]; the late sample shares its prompt but the last token.
  assert _plan(_admit(table, late)) == [(2, 4, 0)]


def test_admission_stops_when_the_slots_are_full():
  table = Slots(2)
  waiting = collections.deque([_request([1, 2]), _request([3, 4]), _request([5, 6])])
  admitted = table.admit(waiting)
  assert [a.slot for a in admitted] == [0, 1] and table.has_free()  # free until placed
  assert [r.prompt.tolist() for r in waiting] == [[5, 6]]
  table.place(admitted)
  assert table.admit(waiting) == [] and table.admitting == [] and not table.has_free()
  assert [r.prompt.tolist() for r in waiting] == [[5, 6]]
  table.release(1)
  assert _plan(table.admit(waiting)) == [(1, 0, None)] and not waiting


def test_a_later_turn_goes_to_the_slot_holding_its_conversation():
  table = Slots(4)
  r0, r1, r2 = _request([10, 11, 12]), _request([20, 21, 22, 23]), _request([30, 31])
  assert _plan(_run(table, r0, r1, r2)) == [(0, 0, None), (1, 0, None), (2, 0, None)]
  r0.tokens.extend([13])
  r1.tokens.extend([24, 25, 2])  # ended on EOS 2
  assert table.release(1) is r1 and table.release(0) is r0
  assert table.requests == [None, None, r2, None]
  assert table.held[1].tolist() == [20, 21, 22, 23, 24, 25]  # 4 + 3 - 1 positions: the EOS was never fed
  assert table.held[0].tolist() == [10, 11, 12]
  turn = _request([20, 21, 22, 23, 24, 25, 2, 40, 41, 42])  # the conversation, the EOS and a tool's reply
  # Free slots 0, 1, 3 share 0, 6, 0 tokens; busy slot 2 holds [30]: slot 1, reusing its own 6.
  assert _plan(_admit(table, turn)) == [(1, 6, None)]


def test_among_equal_prefixes_the_lowest_slot_wins_and_a_held_prefix_wins_over_an_equal_copy():
  table = Slots(4)
  group = [_request([7, 8, 9, 10]) for _ in range(3)]
  assert _plan(_run(table, *group)) == [(0, 0, None), (1, 3, 0), (2, 3, 0)]
  group[0].tokens.extend([14])  # slot 0 (busy) holds [7, 8, 9, 10]
  group[1].tokens.extend([11, 12])
  group[2].tokens.extend([11, 13])
  table.release(2)
  table.release(1)
  assert table.held[1].tolist() == table.held[2].tolist() == [7, 8, 9, 10, 11]
  # Slots 1 and 2 both hold 5 tokens of it (busy slot 0 would give 4): slot 1.
  assert _plan(_admit(table, _request([7, 8, 9, 10, 11, 99]))) == [(1, 5, None)]
  # Slots 1 and 2 hold 4 of it, as busy slot 0 does: a slot's own prefix wins over an equal copy.
  assert _plan(_admit(table, _request([7, 8, 9, 10, 14, 15]))) == [(1, 4, None)]
  # Nothing held shares anything: the lowest free slot, nothing reused.
  assert _plan(_admit(table, _request([50, 51]))) == [(1, 0, None)]


def test_the_last_prompt_token_is_never_reused():
  table = Slots(2)
  r = _request([1, 2, 3, 4, 5, 6])
  _run(table, r)
  table.release(0)  # holds [1, 2, 3, 4, 5]
  # A prompt the slot holds whole (or more than) reuses all of it but its last token.
  assert _plan(_admit(table, _request([1, 2, 3]))) == [(0, 2, None)]
  assert _plan(_admit(table, _request([1, 2, 3, 4, 5]))) == [(0, 4, None)]
  assert _plan(_admit(table, _request([1]))) == [(0, 0, None)]
  # The same for a copy: two identical one-token prompts both prefill nothing, one from no source.
  assert _plan(_admit(table, _request([9]), _request([9]))) == [(0, 0, None), (1, 0, None)]


def test_a_weights_version_change_drops_held_prefixes():
  table = Slots(2, version=3)
  _run(table, _request([1, 2, 3, 4]))
  table.release(0)
  assert table.held[0].tolist() == [1, 2, 3]
  assert table.set_version(3) is False and table.held[0].tolist() == [1, 2, 3]
  assert table.set_version(4) is True and table.version == 4
  assert [h.tolist() for h in table.held] == [[], []]
  r = _request([1, 2, 3, 4])
  assert _plan(_run(table, r)) == [(0, 0, None)] and r.version == 4
  table.release(0)
  assert table.set_version(4, stale=True) is True and table.held[0].tolist() == []  # weights_changed()


def test_a_request_of_older_weights_is_neither_copied_nor_held():
  table = Slots(4)
  old = _request([1, 2, 3, 4])
  _run(table, old)
  assert old.version == 0
  table.set_version(1)
  # Busy slot 0's keys and values came from version 0: the same prompt prefills again.
  new = _request([1, 2, 3, 4])
  assert _plan(_run(table, new)) == [(1, 0, None)] and new.version == 1
  table.release(0)
  assert table.held[0].tolist() == []
  table.release(1)
  assert table.held[1].tolist() == [1, 2, 3]


def test_the_cache_grows_to_a_power_of_two_that_fits_the_highest_admitted_slot():
  table = Slots(6)
  r = _request([1, 2])
  assert table.grown_rows(1, []) == 1
  assert table.grown_rows(1, [Admission(0, r, 0, None)]) == 1
  assert table.grown_rows(1, [Admission(0, r, 0, None), Admission(1, r, 0, None)]) == 2
  assert table.grown_rows(1, [Admission(2, r, 0, None)]) == 4
  assert table.grown_rows(4, [Admission(2, r, 0, None)]) == 4
  assert table.grown_rows(8, [Admission(0, r, 0, None)]) == 8  # never shrinks here
  assert table.grown_rows(4, [Admission(4, r, 0, None)]) == 6  # 8 capped at max_batch_size


def test_the_cache_halves_when_the_busy_slots_fit_a_quarter_and_nothing_waits():
  table = Slots(8)
  assert table.shrink(8, waiting=False) == 8  # idle: rows and held prefixes stay
  requests = [_request([i, 100 + i]) for i in range(8)]
  _run(table, *requests)
  for slot in range(2, 8):
    table.release(slot)
  assert table.highest_busy() == 2
  assert table.shrink(8, waiting=True) == 8  # a waiting request will take a slot
  assert table.shrink(8, waiting=False) == 4  # 4 * 2 <= 8
  assert [h.tolist() for h in table.held] == [[], [], [2], [3], [], [], [], []]  # rows 4..7 are gone
  assert table.shrink(4, waiting=False) == 4  # 4 * 2 > 4
  table.release(1)
  assert table.shrink(4, waiting=False) == 2 and table.shrink(2, waiting=False) == 2
  table.release(0)
  assert table.shrink(2, waiting=False) == 2 and not table.busy()


def test_clear_returns_decoding_and_admitting_requests():
  table = Slots(4)
  busy, admitting = _request([1, 2]), _request([3, 4])
  _run(table, busy)
  _admit(table, admitting)
  assert table.clear() == [busy, admitting]
  assert table.requests == [None] * 4 and table.admitting == []


def _owned(owner, first_token: int) -> Request:
  r = _request([first_token, 1, 2])
  r.owner = owner
  return r


def test_a_free_slot_goes_to_the_owner_holding_the_fewest_slots_not_to_the_earliest_arrival():
  table = Slots(4)
  _run(table, *[_owned("big", 10 + i) for i in range(3)])  # "big" holds 3 of 4 slots
  waiting = collections.deque([_owned("big", 20), _owned("big", 21), _owned("small", 30)])
  (taken,) = table.admit(waiting)
  assert (taken.request.owner, taken.request.prompt[0]) == ("small", 30)  # it came last, holds none
  assert [r.prompt[0] for r in waiting] == [20, 21]  # the others keep their order
  table.place([taken])
  # Two slots free up: each holds one now, so "big" (whose waiting request came first) takes one,
  # and then "small", holding fewer, the other.
  table.release(0), table.release(1)
  waiting.append(_owned("small", 31))
  assert [(a.request.owner, a.request.prompt[0]) for a in table.admit(waiting)] == [("big", 20), ("small", 31)]
  assert [r.prompt[0] for r in waiting] == [21]


def test_owners_holding_equally_take_turns_in_the_order_they_first_arrived():
  table = Slots(4)
  waiting = collections.deque([_owned("a", 1), _owned("a", 2), _owned("a", 3), _owned("b", 4), _owned("c", 5)])
  assert [a.request.prompt[0] for a in table.admit(waiting)] == [1, 4, 5, 2]
  assert [r.prompt[0] for r in waiting] == [3]


def test_one_owner_or_room_for_all_admits_in_arrival_order():
  table = Slots(2)
  waiting = collections.deque([_owned("a", 1), _owned("a", 2), _owned("a", 3)])
  assert [a.request.prompt[0] for a in table.admit(waiting)] == [1, 2]
  table = Slots(4)
  waiting = collections.deque([_owned("a", 1), _owned("b", 2), _owned("a", 3)])
  assert [a.request.prompt[0] for a in table.admit(waiting)] == [1, 2, 3] and not waiting
