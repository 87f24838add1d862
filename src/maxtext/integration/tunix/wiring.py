"""What both learners add to Tunix's in the same way (a mixin placed before Tunix's learner class):
a hook before each global step, the policy loss with each group's prompt scored once
(prefix_sharing), the check of every batch's group layout, the trainer's idle clock and the
per-step metrics both log (trainer/idle_fraction, frac_reward_zero_std, the rollout rates, the
policy's entropy and dual clip's fraction: losses.LOSS_TERM_METRICS, and the loss's sampler/trainer
mismatch where the learner gives the loss the sampler's log-probs: `_log_loss_mismatch`).

A learner calls `_wire(before_step)` in its __init__ after Tunix's, `_step_starts(steps_done)` where
a global step begins, `_check_batch(prompt_ids)` on each batch it trains, and logs through `_log`:
at the current step (the standard learner, which samples and trains in turn) or at a given one (the
agentic learner, whose producer runs ahead of the trainer).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from tunix.rl import rl_cluster as rl_cluster_lib

from maxtext.integration.tunix import cluster, losses, metrics, prefix_sharing, step_metrics

TRAIN = rl_cluster_lib.Mode.TRAIN


class LearnerWiring:
  rl_cluster: rl_cluster_lib.RLCluster
  algo_config: Any  # the learner's own Tunix algorithm config

  def _wire(self, before_step: Callable[[int], None] | None) -> None:
    self._before_step = before_step
    self._idle = step_metrics.IdleClock()
    prefix_sharing.install(self.rl_cluster.actor_trainer, self._group)
    trainer = self.rl_cluster.actor_trainer
    trainer.with_rl_metrics_to_log({**trainer.rl_metrics_to_log, **losses.LOSS_TERM_METRICS})

  @property
  def _anchor(self):
    """The weights the old policy's log-probs are computed with: the host copy RLCluster keeps from
    each weight sync (None: none kept)."""
    return cluster.anchor(self.rl_cluster)

  @_anchor.setter
  def _anchor(self, state) -> None:
    cluster.set_anchor(self.rl_cluster, state)

  def _log_loss_mismatch(self) -> None:
    """Has the trainer log the sampler/trainer mismatch the policy loss reports in its aux
    (losses.MISMATCH_METRICS), beside the aux keys Tunix's learner logs."""
    trainer = self.rl_cluster.actor_trainer
    trainer.with_rl_metrics_to_log({**trainer.rl_metrics_to_log, **losses.MISMATCH_METRICS})

  @property
  def _group(self) -> int:
    return self.algo_config.num_generations

  def _step_starts(self, steps_done: int) -> None:
    """Runs before_step(steps_done) (it may raise to stop training)."""
    if self._before_step is not None:
      self._before_step(steps_done)

  def _check_batch(self, prompt_ids) -> None:
    prefix_sharing.check_groups(prompt_ids, self._group)

  def _log(self, values: dict, step: int | None = None) -> None:
    """Buffers training metrics {name: (value, reduction)} for the current step, or for `step`."""
    if step is None:
      self.rl_cluster.buffer_metrics(values, mode=TRAIN)
    else:
      self.rl_cluster.buffer_metrics_async(values, mode=TRAIN, step=step)

  def _zero_signal(self, advantages) -> tuple[int, int]:
    """(groups without learning signal, groups) of a batch's advantages."""
    return step_metrics.zero_signal_groups(advantages, self._group)

  def _log_zero_signal(self, fraction: float, reduction=np.mean, step: int | None = None) -> None:
    self._log({metrics.ZERO_SIGNAL: (fraction, reduction)}, step)

  def _log_idle(self, closed: tuple[int, float] | None, at_its_step: bool = False, rollouts: bool = False) -> None:
    """Logs a closed idle window's trainer/idle_fraction (at the window's step when at_its_step),
    with step_metrics.rollout_metrics when `rollouts`."""
    if closed is None:
      return
    step, fraction = closed
    values = {"trainer/idle_fraction": (fraction, np.mean)}
    if rollouts:
      values.update(step_metrics.rollout_metrics(self.rl_cluster))
    self._log(values, step if at_its_step else None)
