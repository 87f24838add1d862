"""PPO (rl.algorithm=ppo): the standard learner, whose step's advantages come from a learned critic.

Each step, after the standard step's batch is sampled and rewarded (maxtext.rl.standard_step), the
critic scores the completions (the values the batch was sampled with) and each row's reward is placed
on its last live token, less rl.kl_in_reward_coef times each token's KL estimate between the policy
that sampled it and the reference (rewards/kl_penalty logs its mean per completion). GAE gives every
token its advantage and return (rl.gamma, rl.gae_lambda: maxtext.rl.ppo), the advantages are whitened
over the batch's live tokens, and the critic makes one update per critic.mini_batch_size completions
towards the returns (integration/tunix/critic.py), logged as critic/*: a phase of the step on its whole
batch (the learner refuses a cluster that would hand it a step in parts). The policy then trains on the
per-token advantages with the run's policy loss. In the
first critic.warmup_steps steps the policy trains on no token (its update moves nothing and does not
count towards its schedule: cluster.unless_without_signal), so the critic learns the returns of the
starting policy first.

The critic's parameters and optimizer state are saved in the actor's checkpoints (items
critic_params, critic_optimizer_state) and restored with them."""

from __future__ import annotations

import dataclasses
import logging

import jax.numpy as jnp
import numpy as np

from maxtext.configs.sections import AlgorithmSection, CriticSection, SamplingSection, TrainSection
from maxtext.input_pipeline.rewards import RewardSet
from maxtext.integration.tunix import learner as learner_lib
from maxtext.integration.tunix.algorithm import ppo_config
from maxtext.integration.tunix.critic import CriticTrainer
from maxtext.integration.tunix.step_metrics import zero_signal_groups
from maxtext.models.critic import Critic
from maxtext.rl import ppo, shaping, standard_step
from maxtext.rl.episode import EpisodeLog
from maxtext.utils.steps import Steps

log = logging.getLogger(__name__)


class PPOLearner(learner_lib.GRPOLearner):
  """The standard learner with a critic (see the module's docstring)."""

  def __init__(self, *args, critic: CriticTrainer, warmup_steps: int, **kwargs):
    training = kwargs["rl_cluster"].cluster_config.training_config
    if training.rollout_micro_batch_size != training.mini_batch_size:
      raise RuntimeError(
        f"PPO whitens its advantages over the step's batch and updates its critic on all of it once per step, so "
        f"Tunix must hand the learner the whole step ({training.mini_batch_size} prompts) in one call, not "
        f"rollout_micro_batch_size={training.rollout_micro_batch_size} (cluster.training_config sets it)"
      )
    super().__init__(*args, **kwargs)
    self._critic = critic
    self._warmup_steps = warmup_steps
    trainer = self.rl_cluster.actor_trainer
    trainer.checkpoint_manager.with_items(critic.items)
    if trainer.train_steps:  # the actor resumed from this checkpoint: the critic resumes with it
      critic.restore(trainer.checkpoint_manager.restore_items(trainer.train_steps, critic.items()))
      log.info("Restored the critic from the checkpoint of update %d", trainer.train_steps)

  def _advantages(self, rewards: np.ndarray) -> None:
    """None: PPO's advantages come per token from the critic (_example)."""
    del rewards

  def _example(self, batch: standard_step.StepBatch):
    algo = self.algo_config
    mask = batch.completion_mask
    values = self._critic.values(batch.prompt_ids, batch.completion_ids)
    rewards = ppo.token_rewards(jnp.asarray(batch.rewards, jnp.float32), mask)
    if algo.kl_in_reward_coef:
      assert batch.old_logps is not None and batch.ref_logps is not None  # _step_settings asks for both
      penalty = ppo.kl_penalty(batch.old_logps, batch.ref_logps, mask, algo.kl_in_reward_coef, algo.kl_in_reward_method)
      rewards = rewards + penalty
      per_row = np.asarray(penalty.sum(axis=1))
      self._log({"rewards/kl_penalty": (float(per_row.mean()), np.mean)})
    advantages, returns = ppo.gae(rewards, values, mask, algo.gamma, algo.gae_lambda)
    self._update_critic(batch, values, returns)
    advantages = ppo.whiten(advantages, mask)
    if self.rl_cluster.global_steps < self._warmup_steps:
      mask = jnp.zeros_like(mask)  # the critic's warmup: the policy trains on no token
    if algo.num_iterations == 1:  # old log-probs scored for the penalty alone: the loss's ratio stays exactly 1
      batch = dataclasses.replace(batch, old_logps=None)
    return super()._example(dataclasses.replace(batch, advantages=advantages, completion_mask=mask))

  def _update_critic(self, batch: standard_step.StepBatch, values, returns) -> None:
    """The step's critic phase: its updates towards the returns over the whole step's batch (one call
    per step: __init__ checks it), before the policy trains on the step; logged as critic/*."""
    trained = self._critic.train(batch.prompt_ids, batch.completion_ids, batch.completion_mask, values, returns)
    self._log({name: (value, np.mean) for name, value in trained.items()})

  def _step_settings(self) -> standard_step.StepSettings:
    """The standard step's settings; with a KL penalty inside the reward the reference and the weights
    that sampled (the old policy) score every completion."""
    settings = super()._step_settings()
    if not self.algo_config.kl_in_reward_coef:
      return settings
    return dataclasses.replace(settings, reference=True, old=True)

  def _zero_signal(self, advantages) -> tuple[int, int]:
    """(groups whose every token's advantage is zero, groups)."""
    return zero_signal_groups(np.abs(np.asarray(advantages)).max(axis=1), self._group)


def build_learner(
  train: TrainSection,
  rl: AlgorithmSection,
  section: CriticSection,
  sampling: SamplingSection,
  cluster,
  rewards: RewardSet,
  critic: Critic,
  mesh,
  before_step=None,
  episode_log: EpisodeLog | None = None,
) -> PPOLearner:
  """The PPO learner on `cluster` with `critic` (models.critic.from_policy's, laid out on the trainer's
  `mesh`), scoring critic.mini_batch_size completions at a time (0: train_micro_batch_size's, else
  all) and updating on as many, rl.num_iterations passes a step, each group's prompt computed once; its
  learning-rate schedule spans the run's critic updates; episode_log: see learner.GRPOLearner."""
  rows = section.mini_batch_size or (train.train_micro_batch_size * rl.num_generations) or None
  per_pass = (train.batch_size * rl.num_generations) // rows if rows else 1
  rollout = cluster.rollout
  return PPOLearner(
    rl_cluster=cluster,
    algo_config=ppo_config(rl),
    rewards=rewards,
    steps=Steps.of(train, rl),
    before_step=before_step,
    shape=shaping.Shaping.from_config(rl, sampling),
    critic=CriticTrainer(
      critic,
      section,
      train,
      mesh,
      rollout.pad_id(),
      rollout.eos_id(),
      rows,
      rl.num_iterations,
      rl.num_generations,
      updates=train.num_batches * rl.num_iterations * per_pass,
    ),
    warmup_steps=section.warmup_steps,
    episode_log=episode_log,
  )
