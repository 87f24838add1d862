"""Hands actor, reference and tokenizer to Tunix: RLCluster plus its GRPO learner.

The private Tunix members used here are listed, with why, in private_api.py.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import time
from typing import Callable

import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner
from tunix.rl.rollout import base_rollout
from tunix.sft import metrics_logger

from maxtext.integration.tunix import metrics
from maxtext.integration.tunix.rollout import BatchedRolloutEngine, RolloutEngine
from maxtext.utils.mesh import DATA_AXES

Role = rl_cluster_lib.Role
Mode = rl_cluster_lib.Mode


def updates(cfg) -> int:
  """Optimizer updates of the run: rl.num_iterations per training step (one batch) of num_batches
  (MaxText: max_steps = num_batches x num_iterations). Tunix's trainer and its checkpoints count
  these; metrics.jsonl, eval_interval and the logs count steps."""
  return cfg.num_batches * cfg.rl.num_iterations


def steps_done(cluster: rl_cluster_lib.RLCluster, num_iterations: int) -> int:
  """Training steps (batches) finished, from the trainer's update count."""
  return cluster.actor_trainer.train_steps // num_iterations


def optimizer(cfg) -> optax.GradientTransformation:
  """AdamW on a warmup-cosine schedule over the run's updates, after global-norm clipping."""
  warmup = int(cfg.warmup_steps_fraction * updates(cfg))
  schedule = optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=warmup,
      decay_steps=max(updates(cfg), warmup + 1), end_value=0.0,
  )
  adamw = optax.adamw(schedule, b1=cfg.adam_b1, b2=cfg.adam_b2, weight_decay=cfg.adam_weight_decay)
  if cfg.gradient_clipping_threshold > 0:
    return optax.chain(optax.clip_by_global_norm(cfg.gradient_clipping_threshold), adamw)
  return adamw


# eval_sampling_strategy -> sampling parameters of evaluation.
EVAL_SAMPLING = {
    "greedy": {"temperature": 0.0, "top_p": None, "top_k": None},
    "standard": {"temperature": 0.7, "top_p": 0.95, "top_k": 50},
    "liberal": {"temperature": 0.85, "top_p": 1.0, "top_k": 2000},
}


def rollout_engine(cfg):
  """ClusterConfig.rollout_engine for cfg.rollout_engine: our engines bound to their settings, or
  Tunix's vLLM engine by name."""
  if cfg.rollout_engine == "batched":
    return functools.partial(BatchedRolloutEngine, seed=cfg.decode_seed, max_batch_size=cfg.rollout_max_batch_size)
  if cfg.rollout_engine == "vanilla":
    return functools.partial(RolloutEngine, seed=cfg.decode_seed)
  return "vllm"


def rollout_configs(cfg, eos_id: int) -> dict:
  """Sampling for training rollouts (greedy when decode_sampling_temperature is 0; with the sampler's
  log-probs for agentic runs on the batched engine) and for evaluation (eval_sampling_strategy)."""
  common = dict(
      max_tokens_to_generate=cfg.max_response_length,
      max_prompt_length=cfg.max_prompt_length,
      kv_cache_size=cfg.kv_cache_size,
      eos_tokens=[eos_id],
  )
  if cfg.rollout_engine == "vllm":
    common["rollout_vllm_model_version"] = cfg.load_parameters_path
  greedy = base_rollout.RolloutConfig(**EVAL_SAMPLING["greedy"], **common)
  train = greedy if cfg.decode_sampling_temperature == 0 else base_rollout.RolloutConfig(
      temperature=cfg.decode_sampling_temperature, top_p=cfg.decode_sampling_top_p,
      top_k=cfg.decode_sampling_top_k or None, **common,
  )
  evaluation = base_rollout.RolloutConfig(**EVAL_SAMPLING[cfg.eval_sampling_strategy], **common)
  if cfg.rl.use_agentic_rollout and cfg.rollout_engine == "batched":  # the agentic learner trains on them
    train, evaluation = (dataclasses.replace(c, return_logprobs=True) for c in (train, evaluation))
  return {Mode.TRAIN: train, Mode.EVAL: evaluation}


def build_cluster(cfg, actor: nnx.Module, tokenizer, trainer_mesh, sampler_mesh,
                  sinks: metrics.MetricSinks) -> rl_cluster_lib.RLCluster:
  reference = nnx.clone(actor) if cfg.rl.grpo_beta != 0.0 else None
  training = rl_cluster_lib.RLTrainingConfig(
      actor_optimizer=optimizer(cfg),
      eval_every_n_steps=updates(cfg) + 1,
      max_steps=updates(cfg),
      checkpoint_root_directory=os.path.join(cfg.run_dir, "checkpoints"),
      checkpointing_options=ocp.CheckpointManagerOptions(
          save_interval_steps=cfg.checkpoint_period * cfg.rl.num_iterations,
          max_to_keep=cfg.max_num_checkpoints_to_keep
      ),
      metrics_logging_options=metrics_logger.MetricsLoggerOptions(
          log_dir=os.path.join(cfg.run_dir, "tensorboard"),
          run_name=cfg.run_name,
          backend_kwargs={"custom_backend": sinks.factories()},
      ),
      data_sharding_axis=DATA_AXES,
      mini_batch_size=cfg.batch_size,
      train_micro_batch_size=cfg.train_micro_batch_size or None,
  )
  cluster_config = rl_cluster_lib.ClusterConfig(
      role_to_mesh={Role.ACTOR: trainer_mesh, Role.REFERENCE: trainer_mesh, Role.ROLLOUT: sampler_mesh},
      rollout_engine=rollout_engine(cfg),
      training_config=training,
      rollout_config=rollout_configs(cfg, tokenizer.eos_token_id),
  )
  cluster = rl_cluster_lib.RLCluster(actor=actor, reference=reference, tokenizer=tokenizer,
                                     cluster_config=cluster_config)
  # Tunix's end-of-training save omits the step a rerun restores the data position from; ours has it.
  cluster.actor_trainer._save_last_checkpoint = functools.partial(save_checkpoint, cluster)  # pylint: disable=protected-access
  if hasattr(cluster.rollout, "keys"):
    cluster.rollout.keys.step_source = lambda: cluster.global_steps
  return cluster


def save_checkpoint(cluster: rl_cluster_lib.RLCluster) -> int:
  """Saves the actor (model and optimizer) between global steps unless its step is saved already,
  with the global step Tunix restores the data position from (a rerun resumes there); returns the
  step."""
  trainer = cluster.actor_trainer
  step = trainer.train_steps
  if (trainer.checkpoint_manager.latest_step() or 0) < step:
    trainer.checkpoint_manager.save(step, trainer.model, trainer.optimizer, force=True,
                                    custom_metadata={"global_step": cluster.global_steps, "role": Role.ACTOR.value})
  return step


def grpo_algorithm_kwargs(cfg) -> dict:
  """The rl.* keys both GRPO learners (standard and agentic) take, under Tunix's names."""
  rl = cfg.rl
  return dict(
      num_generations=rl.num_generations,
      num_iterations=rl.num_iterations,
      beta=rl.grpo_beta,
      kl_loss_mode=rl.kl_loss_mode,
      epsilon=rl.grpo_epsilon,
      epsilon_high=rl.grpo_epsilon if rl.epsilon_high < 0 else rl.epsilon_high,
      loss_algo=rl.loss_algo,
      loss_agg_mode=rl.loss_agg_mode,
  )


@dataclasses.dataclass(kw_only=True)
class GRPOConfig(grpo_learner.GRPOConfig):
  """Tunix's standard GRPO config with the upper clipping epsilon its loss reads when present (its
  agentic config has the field; the standard one lacks it, so clip-higher was silently off)."""

  epsilon_high: float


def grpo_config(cfg) -> GRPOConfig:
  return GRPOConfig(**grpo_algorithm_kwargs(cfg))


def last(values):
  """A metric reduction: the last value logged."""
  return values[-1]


def rollout_metrics(cluster: rl_cluster_lib.RLCluster) -> dict:
  """Over the run so far, for the batched engine: rollout/prefix_reuse_fraction, and the decode steps'
  rollout/decode_tokens_per_s and rollout/decode_gb_per_s (bytes they read at least; compiling left out)."""
  metrics = {}
  reuse = getattr(cluster.rollout, "prefix_reuse", lambda: None)()
  if reuse is not None:
    metrics["rollout/prefix_reuse_fraction"] = (reuse, last)
  rate = getattr(cluster.rollout, "decode_rate", lambda: None)()
  if rate is not None:
    metrics["rollout/decode_tokens_per_s"] = (rate[0], last)
    metrics["rollout/decode_gb_per_s"] = (rate[1] / 1e9, last)
  return metrics


def zero_signal_groups(advantages, num_generations: int) -> tuple[int, int]:
  """(groups whose rewards are all equal, groups): GRPO's advantage is zero for every sample of such a
  group, so it carries no learning signal."""
  groups = np.asarray(advantages, np.float32).reshape(-1, num_generations)
  return int((np.abs(groups) < 1e-6).all(axis=1).sum()), len(groups)


class IdleClock:
  """trainer/idle_fraction: the share of a global step's wall time the trainer spent waiting for
  samples (rollouts, rewards and reference scoring). A step's window opens with the wait for its
  first batch (wait_ends(new_step=True)); step_starts() closes the previous window and logs it at
  that window's step."""

  def __init__(self, cluster: rl_cluster_lib.RLCluster):
    self._cluster = cluster
    self._window: tuple[float, int] | None = None  # (start time, global step)
    self._waited = 0.0
    self._wait_start = 0.0

  def wait_starts(self) -> None:
    self._wait_start = time.perf_counter()

  def wait_ends(self, new_step: bool = False) -> None:
    """The wait since wait_starts() is over; new_step: it was for the first batch of a new step."""
    if new_step:
      self.step_starts()
    self._waited += time.perf_counter() - self._wait_start

  def step_starts(self) -> None:
    if self._window is not None:
      start, step = self._window
      fraction = min(self._waited / max(self._wait_start - start, 1e-9), 1.0)
      self._cluster.buffer_metrics_async({"trainer/idle_fraction": (fraction, np.mean)}, mode=Mode.TRAIN, step=step)
    self._window, self._waited = (self._wait_start, self._cluster.global_steps), 0.0


class GRPOLearner(grpo_learner.GRPOLearner):
  """Tunix's GRPO learner that calls `before_step(steps_done)` before each global step, while the
  sampler holds the weights of the last step (used for evaluation every eval_interval steps), and
  logs trainer/idle_fraction (the share of the step spent generating and scoring samples),
  frac_reward_zero_std (the share of groups with equal rewards) and
  rollout_metrics."""

  def __init__(self, *args, before_step: Callable[[int], None] | None = None, **kwargs):
    super().__init__(*args, **kwargs)
    self._before_step = before_step
    self._sampling_s = 0.0
    # A resumed run fast-forwards the data by the trainer's micro-step count, which counts every batch
    # num_iterations times (google-tunix 0.1.7): it would skip data never trained on.
    self._last_iter_step //= self.algo_config.num_iterations

  def _generate_and_compute_advantage(self, training_input, mode=Mode.TRAIN):
    start = time.perf_counter()
    try:
      example = super()._generate_and_compute_advantage(training_input, mode)
    finally:
      self._sampling_s += time.perf_counter() - start
    if mode == Mode.TRAIN:
      zero, groups = zero_signal_groups(example.advantages, self.algo_config.num_generations)
      self.rl_cluster.buffer_metrics({metrics.ZERO_SIGNAL: (zero / groups, np.mean)}, mode=Mode.TRAIN)
    return example

  def _run_global_step(self, *args, **kwargs):
    if self._before_step is not None:
      self._before_step(steps_done(self.rl_cluster, self.algo_config.num_iterations))
    start, self._sampling_s = time.perf_counter(), 0.0
    out = super()._run_global_step(*args, **kwargs)
    fraction = min(self._sampling_s / max(time.perf_counter() - start, 1e-9), 1.0)
    self.rl_cluster.buffer_metrics({"trainer/idle_fraction": (fraction, np.mean), **rollout_metrics(self.rl_cluster)},
                                   mode=Mode.TRAIN)
    return out


def build_learner(cfg, cluster, reward_fns, before_step=None) -> GRPOLearner:
  return GRPOLearner(
      rl_cluster=cluster, algo_config=grpo_config(cfg), reward_fns=list(reward_fns), before_step=before_step,
  )
