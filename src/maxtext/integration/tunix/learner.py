"""Tunix's standard GRPO learner (rl.use_agentic_rollout=false) with a step hook and per-step
metrics, whose step's example is the batch of maxtext.rl.standard_step (sampling rounds, dynamic
sampling, rewards, advantages, shaping), made through this module's adapter of Tunix's RLCluster and
reward manager (`_Services`). With the batched engine each step's example carries the sampler's
log-probs (losses.SampledExample), from which the loss logs the sampler/trainer mismatch every step.

The private Tunix members used here are listed, with why, in private_api.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np
from tunix.rl import common, function_registry
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner

from maxtext.configs.sections import AlgorithmSection, SamplingSection, TrainSection
from maxtext.input_pipeline.rewards import RewardSet
from maxtext.integration.tunix import losses
from maxtext.integration.tunix.algorithm import grpo_config
from maxtext.integration.tunix.wiring import LearnerWiring
from maxtext.rl import shaping, standard_step
from maxtext.rl.episode import EpisodeLog
from maxtext.utils.steps import Steps

TRAIN = rl_cluster_lib.Mode.TRAIN


class GRPOLearner(LearnerWiring, grpo_learner.GRPOLearner):
  """Tunix's GRPO learner that calls `before_step(steps_done)` before each global step, while the
  sampler holds the weights of the last step (used for evaluation every eval_interval steps), and
  logs trainer/idle_fraction (the share of the step spent generating and scoring samples),
  frac_reward_zero_std (the share of groups with equal rewards) and step_metrics.rollout_metrics.

  The policy loss scores each group's prompt once (prefix_sharing.py).

  RLCluster keeps a host copy of the actor's weights from every weight sync for the agentic
  learner's old-policy log-probs; this learner takes its old log-probs from the sampler and never
  reads it, so the copy is dropped before each global step and when training ends (a full copy of
  the weights less at the step's peak)."""

  def __init__(
    self,
    *args,
    steps: Steps,
    shape: shaping.Shaping,
    before_step: Callable[[int], None] | None = None,
    reserve: Callable[[int], dict] | None = None,
    rewards: RewardSet,
    episode_log: EpisodeLog | None = None,
    **kwargs,
  ):
    """steps: the run's training steps and their optimizer updates; shape: what is done to each
    step's samples; reserve(i): the i-th batch of further prompts for dynamic
    sampling; rewards: the run's reward functions and weights (its reward manager's); episode_log:
    the run's episode log, None where this process writes none."""
    super().__init__(*args, reward_fns=[rewards], **kwargs)  # Tunix builds our manager (reward_manager.py)
    self._episode_log = episode_log
    self._wire(before_step)
    self._shape = shape
    if shape.sampler_logps:
      self._log_loss_mismatch()
    self._step = standard_step.StandardStep(self._step_settings(), shape, _Services(self), reserve)
    # A resumed run fast-forwards the data by training steps, not the trainer's micro-step count
    # (docs/decisions.md, "Resume position of the standard learner").
    self._steps = steps
    self._last_iter_step: int = self._steps.done(self.rl_cluster.actor_trainer.iter_steps)
    self._anchor = None  # the host copy of the weights RLCluster keeps from each sync: never read here

  def _generate_and_compute_advantage(self, training_input, mode=TRAIN):
    """The step's example: the batch of maxtext.rl.standard_step as Tunix's TrainExample. Training
    only: the learner is given no evaluation data (train_rl evaluates with evaluate_rl)."""
    assert mode == TRAIN, f"the standard learner samples only for training, not {mode}"
    self._idle.wait_starts()
    try:
      example = self._example(self._step.batch(training_input, self.rl_cluster.global_steps))
    finally:
      self._idle.wait_ends()
    self._check_batch(example.prompt_ids)
    zero, groups = self._zero_signal(example.advantages)
    self._log_zero_signal(zero / groups)
    return example

  def _example(self, batch: standard_step.StepBatch) -> common.TrainExample:
    """The batch as Tunix's TrainExample, as losses.SampledExample where the loss reports the
    sampler/trainer mismatch from the sampler's log-probs."""
    example = common.TrainExample(
      prompt_ids=batch.prompt_ids,
      prompt_mask=batch.prompt_mask,
      completion_ids=batch.completion_ids,
      completion_mask=batch.completion_mask,
      ref_per_token_logps=batch.ref_logps,
      advantages=batch.advantages,
      old_per_token_logps=batch.old_logps,
      sampler_is_weights=batch.sampler_is_weights,
    )
    if not self._shape.sampler_logps:
      return example
    assert batch.sampler_logps is not None, "the batched engine returned no log-probs"
    fields = {f.name: getattr(example, f.name) for f in dataclasses.fields(example)}
    return losses.SampledExample(**fields, sampler_logps=jnp.asarray(batch.sampler_logps))

  def _advantages(self, rewards: np.ndarray) -> np.ndarray | None:
    """The advantages of a round's rewards (standard_step.StepServices.advantages): the estimator's."""
    algo = self.algo_config
    estimator = function_registry.get_advantage_estimator(algo.advantage_estimator)
    return estimator(rewards=rewards, num_generations=algo.num_generations)

  def _step_settings(self) -> standard_step.StepSettings:
    """The step's settings from the algorithm, rollout and training configs: a sampling call takes
    rollout_micro_batch_size prompts, a scoring call compute_logps_micro_batch_size, each else
    train_micro_batch_size, else mini_batch_size, else the whole batch."""
    cluster, algo = self.rl_cluster, self.algo_config
    config = cluster.cluster_config.training_config
    fallback = config.train_micro_batch_size or config.mini_batch_size
    return standard_step.StepSettings(
      generations=algo.num_generations,
      reference=algo.beta != 0.0,
      old=algo.num_iterations > 1,
      width=cluster.get_rollout_config(TRAIN).max_tokens_to_generate,
      pad=cluster.rollout.pad_id(),
      eos=cluster.rollout.eos_id(),
      sample_prompts=config.rollout_micro_batch_size or fallback,
      score_prompts=config.compute_logps_micro_batch_size or fallback,
    )

  def train(self, *args, **kwargs):
    try:
      super().train(*args, **kwargs)
    finally:
      self._anchor = None  # the last weight sync's host copy

  def _run_global_step(self, *args, **kwargs):
    self._anchor = None  # the previous step's weight sync made a host copy; this learner never reads it
    self._step_starts(self._steps.done(self.rl_cluster.actor_trainer.train_steps))
    self._idle.open(self.rl_cluster.global_steps)
    out = super()._run_global_step(*args, **kwargs)
    self._log_idle(self._idle.close(), rollouts=True)
    return out


class _Services:
  """standard_step.StepServices through the learner's RLCluster and reward manager."""

  def __init__(self, learner: GRPOLearner):
    self._learner = learner
    self._cluster = learner.rl_cluster

  def generate(self, prompts: list[str], rows: int) -> standard_step.Completions:
    out = self._cluster.generate(prompts=prompts, mode=TRAIN, micro_batch_size=rows)
    return standard_step.Completions(out.left_padded_prompt_tokens, out.tokens, out.text, out.logprobs)

  def reference_logps(self, prompt_ids, completion_ids, rows: int):
    rollout = self._cluster.rollout
    return self._cluster.get_ref_per_token_logps(
      prompt_tokens=prompt_ids,
      completion_tokens=completion_ids,
      pad_id=rollout.pad_id(),
      eos_id=rollout.eos_id(),
      micro_batch_size=rows,
    )

  def old_logps(self, prompt_ids, completion_ids, rows: int):
    return self._cluster.get_old_per_token_logps(
      prompt_tokens=prompt_ids, completion_tokens=completion_ids, micro_batch_size=rows
    )

  def rewards(self, prompts: list[str], completions: list[str], fields: dict) -> np.ndarray:
    info = self._learner.reward_manager(prompts=prompts, completions=completions, mode=str(TRAIN), **fields)
    self._cluster.buffer_metrics(info["log_metrics"], mode=TRAIN)
    return np.asarray(info["rewards"])

  def advantages(self, rewards: np.ndarray) -> np.ndarray | None:
    return self._learner._advantages(rewards)

  def log(self, values: dict) -> None:
    self._learner._log(values)

  def episodes(self, episodes, rewards: np.ndarray, step: int) -> None:
    if self._learner._episode_log is not None:
      self._learner._episode_log.write(episodes, np.asarray(rewards).tolist(), step)


def build_learner(
  train: TrainSection,
  rl: AlgorithmSection,
  sampling: SamplingSection,
  cluster,
  rewards: RewardSet,
  before_step=None,
  reserve=None,
  episode_log: EpisodeLog | None = None,
) -> GRPOLearner:
  """reserve, episode_log: see GRPOLearner (reserve is needed with rl.dynamic_sampling)."""
  return GRPOLearner(
    rl_cluster=cluster,
    algo_config=grpo_config(rl, sampling),
    rewards=rewards,
    steps=Steps.of(train, rl),
    before_step=before_step,
    shape=shaping.Shaping.from_config(rl, sampling),
    reserve=reserve,
    episode_log=episode_log,
  )
