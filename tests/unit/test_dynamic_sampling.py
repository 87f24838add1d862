"""Dynamic sampling's rule (maxtext.rl.dynamic_sampling) against hand computations, without Tunix:
which groups train, which reserve prompt is drawn, the metrics and the warning, for the standard
learner's rounds of whole batches and the agentic learner's per-slot decisions."""

import logging
import threading

import numpy as np
import pytest

from maxtext.configs import pyconfig
from maxtext.rl import dynamic_sampling as ds


def _reserve(batch_size: int):
  """reserve(i): prompts named r{i}-{row}, recording which batches were drawn."""
  drawn: list[int] = []

  def reserve(i: int) -> dict:
    drawn.append(i)
    return {"prompts": np.array([f"r{i}-{j}" for j in range(batch_size)]), "answer": np.arange(batch_size)}

  return reserve, drawn


def test_reserve_indices_by_hand():
  # 4 rounds a step: rounds 1, 2, 3 of step s draw batches 3s, 3s + 1, 3s + 2
  assert [ds.reserve_index(0, r, 4) for r in (1, 2, 3)] == [0, 1, 2]
  assert [ds.reserve_index(5, r, 4) for r in (1, 2, 3)] == [15, 16, 17]
  assert ds.reserve_index(2, 1, 2) == 2  # 2 rounds: one reserve batch a step
  with pytest.raises(AssertionError):
    ds.reserve_index(0, 0, 4)  # round 0 is the step's own batch
  with pytest.raises(AssertionError):
    ds.reserve_index(0, 4, 4)


def test_more_rounds_while_short_of_varied_groups_and_rounds_are_left():
  assert ds.more_rounds(varied=2, wanted=4, taken=1, rounds=3)
  assert not ds.more_rounds(varied=4, wanted=4, taken=1, rounds=3)
  assert not ds.more_rounds(varied=2, wanted=4, taken=3, rounds=3)


def test_max_rounds_of_the_config():
  on = pyconfig.initialize(["x", "rl.yml", "rl.dynamic_sampling=true", "rl.dynamic_sampling_max_rounds=3"])
  assert ds.max_rounds(on.algorithm) == 3
  assert ds.max_rounds(pyconfig.initialize(["x", "rl.yml"]).algorithm) == 1


def test_varied_groups_and_the_selection_of_groups_to_train():
  rewards = [1, 1, 1, 0, 1, 0, 2, 0, 2, 0.5, 0.5, 0.5]  # groups of 3: equal, varied, varied, equal
  varied = ds.varied_groups(rewards, 3)
  assert varied.tolist() == [False, True, True, False]
  assert ds.select_groups(varied, 2).tolist() == [1, 2]  # the varied ones, in sampling order
  assert ds.select_groups(varied, 3).tolist() == [0, 1, 2]  # one without signal fills the batch
  assert ds.select_groups([True, False, True, True], 2).tolist() == [0, 2]
  assert ds.select_groups([False, False, True, False], 3).tolist() == [0, 1, 2]  # unvaried in order


def test_standard_rounds_stop_once_enough_groups_vary():
  reserve, drawn = _reserve(4)
  plan = ds.StepRounds(4, reserve, step=2, wanted=4)
  plan.add(np.array([True, False, False, True]))
  batch = plan.next_batch()
  assert batch is not None and batch["prompts"].tolist() == ["r6-0", "r6-1", "r6-2", "r6-3"]
  plan.add(np.array([False, True, False, False]))
  assert plan.next_batch()["prompts"][0] == "r7-0"
  plan.add(np.array([False, False, True, True]))  # 5 varied of 4 wanted: done after 3 rounds
  assert plan.next_batch() is None and drawn == [6, 7]
  # varied groups first, in sampling order: 0, 3 (round 0), 5 (round 1), 10 (round 2)
  assert plan.selected().tolist() == [0, 3, 5, 10]
  assert plan.tally.metrics() == {
    "dynamic_sampling/rounds": 3.0,
    "dynamic_sampling/sampled_zero_std_fraction": 7 / 12,
    "dynamic_sampling/short": 0.0,
  }


def test_standard_rounds_that_run_out_fill_the_batch_with_unvaried_groups_and_warn(caplog):
  reserve, drawn = _reserve(3)
  plan = ds.StepRounds(2, reserve, step=1, wanted=3)
  plan.add(np.array([False, True, False]))
  assert plan.next_batch()["prompts"].tolist() == ["r1-0", "r1-1", "r1-2"]
  plan.add(np.array([False, False, False]))
  with caplog.at_level(logging.WARNING, logger=ds.__name__):
    assert plan.next_batch() is None
  assert drawn == [1]
  assert plan.selected().tolist() == [0, 1, 2]  # the varied one, then the first unvaried ones
  assert plan.tally.metrics() == {
    "dynamic_sampling/rounds": 2.0,
    "dynamic_sampling/sampled_zero_std_fraction": 5 / 6,
    "dynamic_sampling/short": 1.0,
  }
  assert "1 of 3 groups with varied rewards" in caplog.text and "step 1" in caplog.text


def test_standard_single_round_with_signal_draws_nothing(caplog):
  reserve, drawn = _reserve(2)
  plan = ds.StepRounds(3, reserve, step=0, wanted=2)
  plan.add(np.array([True, True]))
  with caplog.at_level(logging.WARNING, logger=ds.__name__):
    assert plan.next_batch() is None
  assert drawn == [] and caplog.text == ""
  assert plan.tally.metrics() == {
    "dynamic_sampling/rounds": 1.0,
    "dynamic_sampling/sampled_zero_std_fraction": 0.0,
    "dynamic_sampling/short": 0.0,
  }


def test_a_reserve_batch_of_the_wrong_size_is_refused():
  reserve, _ = _reserve(3)
  plan = ds.StepRounds(2, reserve, step=0, wanted=4)
  plan.add(np.zeros(4, bool))
  with pytest.raises(ValueError, match="a reserve batch of 3 prompts for 4 groups"):
    plan.next_batch()


def test_no_reserve_is_refused():
  with pytest.raises(ValueError, match="needs the reserve batches"):
    ds.StepRounds(2, None, step=0, wanted=4)
  with pytest.raises(ValueError, match="needs the reserve batches"):
    ds.Slots(2, None, batch_size=4)


def test_a_slots_group_without_signal_is_replaced_by_its_next_reserve_prompt(caplog):
  """A slot's group without signal is replaced by row `row` of reserve batch step * (rounds - 1) +
  round (as standard GRPO draws) while rounds are left; the last round trains whatever it gets and
  marks the step short; the metrics count every sampled group."""
  reserve, drawn = _reserve(4)
  slots = ds.Slots(3, reserve, batch_size=4)
  slots.started(4)
  slot = 2 * 4 + 1  # step 2, row 1
  first = slots.decide(slot, 0, zero_signal=True)
  assert first is not None and first["prompts"].tolist() == ["r4-1"] and first["answer"].tolist() == [1]
  assert slots.decide(slot, 1, zero_signal=True)["prompts"].tolist() == ["r5-1"]
  with caplog.at_level(logging.WARNING, logger=ds.__name__):
    assert slots.decide(slot, 2, zero_signal=True) is None  # rounds spent: it trains
  assert "0 of 1 groups with varied rewards" in caplog.text and "step 2 (slot 1)" in caplog.text
  assert slots.decide(slot - 1, 0, zero_signal=False) is None
  assert drawn == [4, 5] and slots.unresolved == 2
  assert slots.metrics(2) == {
    "dynamic_sampling/rounds": 3.0,
    "dynamic_sampling/sampled_zero_std_fraction": 0.75,
    "dynamic_sampling/short": 1.0,
  }


def test_slot_metrics_are_per_step_and_start_at_one_round():
  reserve, _ = _reserve(2)
  slots = ds.Slots(4, reserve, batch_size=2)
  slots.started(4)
  assert slots.decide(0, 0, zero_signal=True) is not None  # step 0 undecided so far
  assert slots.metrics(0) == {
    "dynamic_sampling/rounds": 1.0,
    "dynamic_sampling/sampled_zero_std_fraction": 1.0,
    "dynamic_sampling/short": 0.0,
  }
  assert slots.decide(3, 0, zero_signal=False) is None  # step 1, row 1 trains at once
  assert slots.decide(0, 1, zero_signal=False) is None  # step 0, row 0 trains on its second round
  assert slots.metrics(0) == {
    "dynamic_sampling/rounds": 2.0,
    "dynamic_sampling/sampled_zero_std_fraction": 0.5,
    "dynamic_sampling/short": 0.0,
  }
  assert slots.metrics(1)["dynamic_sampling/sampled_zero_std_fraction"] == 0.0
  assert slots.unresolved == 2


def test_slots_tally_groups_finishing_on_several_threads():
  reserve, _ = _reserve(8)
  slots = ds.Slots(2, reserve, batch_size=8)
  slots.started(8 * 50)

  def finish(step: int) -> None:
    for row in range(8):
      slots.decide(step * 8 + row, 1, zero_signal=row % 2 == 0)

  threads = [threading.Thread(target=finish, args=(step,)) for step in range(50)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert slots.unresolved == 0
  assert all(slots.metrics(s)["dynamic_sampling/sampled_zero_std_fraction"] == 0.5 for s in range(50))
