"""Training steps and optimizer updates (rl.num_iterations per step), counted by hand."""

from maxtext.utils.steps import Steps
from tests.conftest import make_config


def test_steps_and_updates_by_hand():
  cfg = make_config("num_batches=8", "rl.num_iterations=3")
  steps = Steps.of(cfg.train, cfg.algorithm)
  assert (steps.steps, steps.updates_per_step, steps.updates) == (8, 3, 24)
  assert steps.updates_in(2) == 6
  assert [steps.done(u) for u in (0, 2, 3, 5, 6)] == [0, 0, 1, 1, 2]
  assert [steps.of_update(u) for u in (1, 3, 4, 6, 7)] == [1, 1, 2, 2, 3]  # 1-based updates and steps
  assert [u for u in range(10) if steps.ends_step(u)] == [0, 3, 6, 9]
