"""The agentic learner's prompt feed (maxtext.rl.prompt_feed): each process's share of a batch, the
slot and round every prompt carries, one-prompt batches as Tunix splits them, and when the prompts
end: at the end of the data, with dynamic sampling only once every slot is decided, and at once when
the feed is closed."""

import asyncio

import numpy as np

from maxtext.rl import dynamic_sampling
from maxtext.rl.prompt_feed import ROUND, SLOT, ProcessShare, PromptFeed, single_prompts


def test_process_shares_cover_each_batch_once_with_the_slots_one_process_gives():
  """Two processes take disjoint halves of every batch; their slots (step * batch_size + row) are the
  ones one process gives the same prompts."""
  batch = {"prompts": np.array(["a", "b", "c", "d"]), "answer": ["1", "2", "3", "4"]}
  shares = [ProcessShare(i, 2, 4) for i in range(2)]
  assert [s.rows(batch)["prompts"].tolist() for s in shares] == [["a", "b"], ["c", "d"]]
  assert [s.rows(batch)["answer"] for s in shares] == [["1", "2"], ["3", "4"]]
  assert [s.slots(3) for s in shares] == [[12, 13], [14, 15]]
  assert ProcessShare(0, 1, 4).slots(3) == [12, 13, 14, 15]
  assert ProcessShare(1, 2, 4).step_of(15) == 3


def test_single_prompts_are_one_element_arrays_of_every_field():
  batch = {"prompts": np.array(["ab", "c"]), "answer": ["1", "2"], "n": np.array([[3], [4]])}
  prompts = list(single_prompts(batch))
  assert [p["prompts"].tolist() for p in prompts] == [["ab"], ["c"]]
  assert [p["answer"].tolist() for p in prompts] == [["1"], ["2"]]
  assert [p["n"].tolist() for p in prompts] == [[3], [4]]


def test_single_prompts_keep_a_conversation_or_a_list_whole():
  """A field whose values are conversations (of different lengths) or lists: each prompt's value is
  the one it had, in a one-element array."""
  chats = [[{"role": "user", "content": "a"}], [{"role": "system", "content": "s"}, {"role": "user", "content": "b"}]]
  column = np.empty(2, dtype=object)
  column[0], column[1] = chats
  batch = {"prompts": np.array(["a", "b"]), "prompt": column, "tags": [["x", "y"], ["z", "w"]]}
  prompts = list(single_prompts(batch))
  assert [(p["prompt"].shape, p["prompt"][0]) for p in prompts] == [((1,), chats[0]), ((1,), chats[1])]
  assert [(p["tags"].shape, p["tags"][0]) for p in prompts] == [((1,), ["x", "y"]), ((1,), ["z", "w"])]


def _drain(feed: PromptFeed, limit: int = 100) -> list[dict]:
  async def run():
    out = []
    async for prompt in feed.prompts(asyncio.get_running_loop()):
      out.append(prompt)
      if len(out) >= limit:
        break
    return out

  return asyncio.run(run())


def _batch(*prompts):
  return {"prompts": np.array(prompts), "answer": [p.upper() for p in prompts]}


def test_prompts_carry_their_slot_and_round_and_end_with_the_data():
  feed = PromptFeed(ProcessShare(1, 2, 4), None, first_step=5)
  feed.put(_batch("a", "b", "c", "d"))
  feed.put(_batch("e", "f", "g", "h"))
  feed.end()
  feed.put(_batch("i", "j", "k", "l"))  # after the end: not read
  prompts = _drain(feed)
  assert [p["prompts"].tolist() for p in prompts] == [["c"], ["d"], ["g"], ["h"]]
  assert [int(p[SLOT][0]) for p in prompts] == [22, 23, 26, 27]
  assert {int(p[ROUND][0]) for p in prompts} == {0}


def test_with_dynamic_sampling_the_prompts_outlast_the_data_until_every_slot_is_decided():
  slots = dynamic_sampling.Slots(2, lambda i: _batch("r0", "r1"), batch_size=2)
  feed = PromptFeed(ProcessShare(0, 1, 2), slots, first_step=0)
  feed.put(_batch("a", "b"))
  feed.end()
  assert slots.unresolved == 2
  assert [p["prompts"].tolist() for p in _drain(feed, limit=2)] == [["a"], ["b"]]
  assert slots.decide(0, 0, zero_signal=False) is None  # slot 0 trains
  replacement = slots.decide(1, 0, zero_signal=True)  # slot 1 samples its next round
  feed.replace(1, 1, replacement)
  [again] = _drain(feed, limit=1)
  assert (again["prompts"].tolist(), int(again[SLOT][0]), int(again[ROUND][0])) == (["r1"], 1, 1)
  assert slots.decide(1, 1, zero_signal=True) is None  # its last round trains
  assert slots.unresolved == 0
  feed.end()
  assert _drain(feed) == []


def test_a_closed_feed_ends_whatever_slots_are_undecided():
  slots = dynamic_sampling.Slots(3, lambda i: _batch("r0", "r1"), batch_size=2)
  feed = PromptFeed(ProcessShare(0, 1, 2), slots, first_step=0)
  feed.put(_batch("a", "b"))
  feed.close()
  assert len(_drain(feed)) == 2 and slots.unresolved == 2
