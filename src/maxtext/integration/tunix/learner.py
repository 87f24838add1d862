"""Tunix's standard GRPO learner (rl.use_agentic_rollout=false) with a step hook and per-step metrics.

The private Tunix members used here are listed, with why, in private_api.py.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner

from maxtext.integration.tunix import cluster as cluster_lib
from maxtext.integration.tunix import metrics, prefix_sharing, step_metrics
from maxtext.integration.tunix.algorithm import grpo_config


class GRPOLearner(grpo_learner.GRPOLearner):
  """Tunix's GRPO learner that calls `before_step(steps_done)` before each global step, while the
  sampler holds the weights of the last step (used for evaluation every eval_interval steps), and
  logs trainer/idle_fraction (the share of the step spent generating and scoring samples),
  frac_reward_zero_std (the share of groups with equal rewards) and step_metrics.rollout_metrics.

  The policy loss scores each group's prompt once (prefix_sharing.py).

  RLCluster keeps a host copy of the actor's weights from every weight sync for the agentic
  learner's old-policy log-probs; this learner takes its old log-probs from the sampler and never
  reads it, so the copy is dropped after each sync (a full copy of the weights less at the peak)."""

  def __init__(self, *args, before_step: Callable[[int], None] | None = None, **kwargs):
    super().__init__(*args, **kwargs)
    self._before_step = before_step
    self._idle = step_metrics.IdleClock()
    # A resumed run fast-forwards the data by the trainer's micro-step count, which counts every batch
    # num_iterations times (google-tunix 0.1.7): it would skip data never trained on.
    self._last_iter_step //= self.algo_config.num_iterations
    prefix_sharing.install(self.rl_cluster.actor_trainer, self.algo_config.num_generations)
    sync = self.rl_cluster.sync_weights

    def sync_without_snapshot():
      sync()
      self.rl_cluster._anchor_policy_state = None

    self.rl_cluster.sync_weights = sync_without_snapshot
    self.rl_cluster._anchor_policy_state = None

  def _generate_and_compute_advantage(self, training_input, mode=rl_cluster_lib.Mode.TRAIN):
    self._idle.wait_starts()
    try:
      example = super()._generate_and_compute_advantage(training_input, mode)
    finally:
      self._idle.wait_ends()
    prefix_sharing.check_groups(example.prompt_ids, self.algo_config.num_generations)
    if mode == rl_cluster_lib.Mode.TRAIN:
      zero, groups = step_metrics.zero_signal_groups(example.advantages, self.algo_config.num_generations)
      self.rl_cluster.buffer_metrics({metrics.ZERO_SIGNAL: (zero / groups, np.mean)}, mode=rl_cluster_lib.Mode.TRAIN)
    return example

  def _run_global_step(self, *args, **kwargs):
    if self._before_step is not None:
      self._before_step(cluster_lib.steps_done(self.rl_cluster, self.algo_config.num_iterations))
    self._idle.open(self.rl_cluster.global_steps)
    out = super()._run_global_step(*args, **kwargs)
    _, fraction = self._idle.close()
    self.rl_cluster.buffer_metrics(
      {"trainer/idle_fraction": (fraction, np.mean), **step_metrics.rollout_metrics(self.rl_cluster)},
      mode=rl_cluster_lib.Mode.TRAIN,
    )
    return out


def build_learner(cfg, cluster, reward_fns, before_step=None) -> GRPOLearner:
  return GRPOLearner(
    rl_cluster=cluster,
    algo_config=grpo_config(cfg),
    reward_fns=list(reward_fns),
    before_step=before_step,
  )
