"""How training steps map to optimizer updates, in one place.

A training step trains one batch: metrics.jsonl rows, eval_interval, checkpoint_period, resuming and
the logs count steps. With rl.num_iterations = mu a step makes mu optimizer updates, which Tunix's
trainer, its learning-rate schedule and Orbax's checkpoint names count (MaxText: max_steps =
num_batches x num_iterations).
"""

from __future__ import annotations

import dataclasses

from maxtext.configs.sections import AlgorithmSection, TrainSection


@dataclasses.dataclass(frozen=True)
class Steps:
  steps: int  # training steps of the run (num_batches)
  updates_per_step: int = 1  # rl.num_iterations

  @classmethod
  def of(cls, train: TrainSection, algorithm: AlgorithmSection) -> Steps:
    return cls(train.num_batches, algorithm.num_iterations)

  @property
  def updates(self) -> int:
    """Optimizer updates of the whole run."""
    return self.steps * self.updates_per_step

  def updates_in(self, steps: int) -> int:
    """Optimizer updates of `steps` training steps."""
    return steps * self.updates_per_step

  def done(self, updates: int) -> int:
    """Training steps finished after `updates` optimizer updates."""
    return updates // self.updates_per_step

  def of_update(self, update: int) -> int:
    """The 1-based training step the 1-based optimizer update `update` belongs to."""
    return -(-update // self.updates_per_step)

  def ends_step(self, updates: int) -> bool:
    """Whether `updates` optimizer updates end a training step."""
    return updates % self.updates_per_step == 0
