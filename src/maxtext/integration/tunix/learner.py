"""Tunix's standard GRPO learner (rl.use_agentic_rollout=false) with a step hook, per-step metrics,
dynamic sampling (the rule of maxtext.rl.dynamic_sampling, in rounds of whole batches) and the sample
shaping of shaping.py (overlong punishment, truncated-completion masking, sampler importance
correction). With the batched engine each step's example carries the sampler's
log-probs (losses.SampledExample), from which the loss logs the sampler/trainer mismatch every step.

The private Tunix members used here are listed, with why, in private_api.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from tunix.rl import common, function_registry
from tunix.rl import rl_cluster as rl_cluster_lib
from tunix.rl.grpo import grpo_learner

from maxtext.configs.sections import AlgorithmSection, SamplingSection, TrainSection
from maxtext.integration.tunix import losses, shaping
from maxtext.integration.tunix.algorithm import grpo_config
from maxtext.integration.tunix.wiring import LearnerWiring
from maxtext.rl import dynamic_sampling
from maxtext.utils import distributed
from maxtext.utils.steps import Steps

TRAIN = rl_cluster_lib.Mode.TRAIN


@dataclasses.dataclass
class _Round:
  """One round of sampling and scoring: Tunix's example, its rewards, per group whether they vary,
  and the sampler's log-probs (None where the engine returns none)."""

  example: common.TrainExample
  rewards: np.ndarray
  varied: np.ndarray
  sampler_logps: np.ndarray | None


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
    **kwargs,
  ):
    """steps: the run's training steps and their optimizer updates; shape: what is done to each
    step's samples; reserve(i): the i-th batch of further prompts for dynamic
    sampling."""
    super().__init__(*args, **kwargs)
    self._wire(before_step)
    self._shape = shape
    if shape.sampler_logps:
      self._log_loss_mismatch()
    self._reserve = reserve
    # A resumed run fast-forwards the data by training steps, not the trainer's micro-step count
    # (docs/decisions.md, "Resume position of the standard learner").
    self._steps = steps
    self._last_iter_step: int = self._steps.done(self.rl_cluster.actor_trainer.iter_steps)
    self._anchor = None  # the host copy of the weights RLCluster keeps from each sync: never read here

  def _generate_and_compute_advantage(self, training_input, mode=TRAIN):
    """The step's example (_shaped_example). Training only: the learner is given no evaluation data
    (train_rl evaluates with evaluate_rl)."""
    assert mode == TRAIN, f"the standard learner samples only for training, not {mode}"
    self._idle.wait_starts()
    try:
      example = self._shaped_example(training_input)
    finally:
      self._idle.wait_ends()
    self._check_batch(example.prompt_ids)
    zero, groups = self._zero_signal(example.advantages)
    self._log_zero_signal(zero / groups)
    return example

  def _sample_round(self, training_input) -> _Round:
    """One round of the step's sampling: the sampler's completions of the batch's prompts (each
    already repeated num_generations times), their rewards (the reward functions' sum, plus the
    overlong penalty), the algorithm's advantages, the reference's log-probs (when grpo_beta != 0)
    and the old policy's (when num_iterations > 1), as Tunix's TrainExample; logs the rewards
    (each function's and their sum) and the completion lengths."""
    cluster, generations = self.rl_cluster, self.algo_config.num_generations
    prompts = list(training_input["prompts"])
    fields = {k: v for k, v in training_input.items() if k != "prompts"}
    rollout_rows, logps_rows = self._micro_batches(len(prompts))
    out = cluster.generate(prompts=prompts, mode=TRAIN, micro_batch_size=rollout_rows)
    pad, eos = cluster.rollout.pad_id(), cluster.rollout.eos_id()
    width = cluster.get_rollout_config(TRAIN).max_tokens_to_generate
    completions = np.full((len(out.tokens), width), pad, np.int32)
    for row, tokens in zip(completions, out.tokens):
      row[: len(tokens)] = tokens
    prompt_ids, completion_ids = jnp.asarray(out.left_padded_prompt_tokens), jnp.asarray(completions)
    ref_logps = old_logps = None
    if self.algo_config.beta != 0.0:
      ref_logps = cluster.get_ref_per_token_logps(
        prompt_tokens=prompt_ids, completion_tokens=completion_ids, pad_id=pad, eos_id=eos, micro_batch_size=logps_rows
      )
    if self.algo_config.num_iterations > 1:
      old_logps = cluster.get_old_per_token_logps(
        prompt_tokens=prompt_ids, completion_tokens=completion_ids, micro_batch_size=logps_rows
      )
    rewards = self._rewards(prompts, out, fields)
    advantages = function_registry.get_advantage_estimator(self.algo_config.advantage_estimator)(
      rewards=rewards, num_generations=generations
    )
    lengths = (completions != pad).sum(axis=-1)
    self._log(
      {
        **{
          f"rewards/score/{k}": (float(f(rewards)), f) for k, f in (("mean", np.mean), ("max", np.max), ("min", np.min))
        },
        **{
          f"completions/{k}_length": (float(f(lengths)), f)
          for k, f in (("mean", np.mean), ("max", np.max), ("min", np.min))
        },
      }
    )
    example = common.TrainExample(
      prompt_ids=prompt_ids,
      prompt_mask=prompt_ids != pad,
      completion_ids=completion_ids,
      completion_mask=jnp.asarray(completions != pad),
      ref_per_token_logps=ref_logps,
      advantages=jax.device_put(advantages),
      old_per_token_logps=old_logps,
    )
    sampler_logps = None
    if out.logprobs is not None:
      sampler_logps = np.zeros((len(out.logprobs), width), np.float32)
      for row, lp in zip(sampler_logps, out.logprobs):
        row[: len(lp)] = np.asarray(lp)[:width]
    return _Round(example, rewards, dynamic_sampling.varied_groups(rewards, generations), sampler_logps)

  def _micro_batches(self, rows: int) -> tuple[int, int]:
    """(sampling, log-prob scoring) micro-batch sizes in rows for a batch of `rows` rows: the
    training config's rollout_micro_batch_size and compute_logps_micro_batch_size (in prompts), else
    its train_micro_batch_size, else its mini_batch_size, else the whole batch, times num_generations."""
    config, generations = self.rl_cluster.cluster_config.training_config, self.algo_config.num_generations
    fallback = config.train_micro_batch_size or config.mini_batch_size or rows // generations
    return (
      (config.rollout_micro_batch_size or fallback) * generations,
      (config.compute_logps_micro_batch_size or fallback) * generations,
    )

  def _rewards(self, prompts: list, out, fields: dict) -> np.ndarray:
    """The sum of the reward functions' rewards of the completions (each function's logged by
    Tunix's reward manager), plus the overlong penalty (shaping.overlong_penalty) when set."""
    info = self.reward_manager(prompts=prompts, completions=out.text, mode=str(TRAIN), **fields)
    self.rl_cluster.buffer_metrics(info["log_metrics"], mode=TRAIN)
    rewards = np.asarray(info["rewards"])
    shape = self._shape
    if shape.overlong_buffer_length:
      lengths = [len(t) for t in out.tokens]
      penalty = shaping.overlong_penalty(
        lengths, shape.max_response_length, shape.overlong_buffer_length, shape.overlong_penalty
      )
      rewards = rewards + penalty
      self._log({"rewards/overlong_penalty": (float(penalty.mean()), np.mean)})
    return rewards

  def _shaped_example(self, training_input) -> common.TrainExample:
    """The step's example after dynamic sampling, truncated-completion masking and the sampler
    importance correction, as self._shape says."""
    shape = self._shape
    generations = self.algo_config.num_generations
    first = self._sample_round(training_input)
    example, sampler_logps = first.example, first.sampler_logps
    if shape.dynamic_sampling_rounds > 1:
      example, sampler_logps = self._dynamically_sampled(first, len(first.rewards) // generations)
    if sampler_logps is not None and shape.sampler_is:
      trainer_logps = example.old_per_token_logps
      if trainer_logps is None:
        trainer_logps = self.rl_cluster.get_old_per_token_logps(
          example.prompt_ids, example.completion_ids, micro_batch_size=self._micro_batches(len(example.prompt_ids))[1]
        )
      trainer_logps = distributed.host_array(trainer_logps)
      weights = shaping.sampler_is_weights(trainer_logps, sampler_logps, shape.sampler_is_threshold)
      example = example.replace(sampler_is_weights=jnp.asarray(weights))
    if shape.sampler_logps:  # the loss reports the sampler/trainer mismatch from its own forward pass
      assert sampler_logps is not None, "the batched engine returned no log-probs"
      fields = {f.name: getattr(example, f.name) for f in dataclasses.fields(example)}
      example = losses.SampledExample(**fields, sampler_logps=jnp.asarray(sampler_logps))
    if shape.mask_truncated_completions:
      eos = self.rl_cluster.rollout.eos_id()
      cut = shaping.truncated(np.asarray(example.completion_ids), np.asarray(example.completion_mask), eos)
      example = example.replace(completion_mask=example.completion_mask * jnp.asarray(~cut)[:, None])
      self._log({"completions/masked_truncated_fraction": (float(cut.mean()), np.mean)})
    return example

  def _dynamically_sampled(self, first: _Round, wanted: int) -> tuple[common.TrainExample, np.ndarray | None]:
    """Dynamic sampling (maxtext.rl.dynamic_sampling.StepRounds): further rounds of reserve prompts
    after `first` while the rule asks for them, then the example of the `wanted` groups that train
    (all of a single round), with their sampler log-probs."""
    generations = self.algo_config.num_generations
    step = self.rl_cluster.global_steps
    plan = dynamic_sampling.StepRounds(self._shape.dynamic_sampling_rounds, self._reserve, step, wanted)
    rounds = [first]
    plan.add(first.varied)
    while (batch := plan.next_batch()) is not None:
      batch = {k: np.repeat(np.asarray(v), generations, axis=0) for k, v in batch.items()}
      batch["trajectory_ids"] = trajectory_ids(step, len(batch["prompts"]) // generations, generations)
      rounds.append(self._sample_round(batch))
      plan.add(rounds[-1].varied)
    self._log({k: (v, np.mean) for k, v in plan.tally.metrics().items()})
    if len(rounds) == 1:
      return first.example, first.sampler_logps
    groups = plan.selected()
    rows = (groups[:, None] * generations + np.arange(generations)).reshape(-1)
    merged = jax.tree.map(lambda *xs: jnp.concatenate(xs)[rows], *[r.example for r in rounds])
    logps = [r.sampler_logps for r in rounds if r.sampler_logps is not None]
    return merged, np.concatenate(logps)[rows] if len(logps) == len(rounds) else None

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


def trajectory_ids(step: int, prompts: int, generations: int) -> list[str]:
  """The reward functions' `trajectory_ids` of a batch of `prompts` prompts sampled at `step`, each
  repeated `generations` times: "{row}_{sample}" with rows numbered from step * prompts, as Tunix
  names the step's first batch."""
  return [f"{step * prompts + row}_{sample}" for row in range(prompts) for sample in range(generations)]


def build_learner(
  train: TrainSection,
  rl: AlgorithmSection,
  sampling: SamplingSection,
  cluster,
  reward_fns,
  before_step=None,
  reserve=None,
) -> GRPOLearner:
  """reserve: see GRPOLearner (needed with rl.dynamic_sampling)."""
  return GRPOLearner(
    rl_cluster=cluster,
    algo_config=grpo_config(rl, sampling),
    reward_fns=list(reward_fns),
    steps=Steps.of(train, rl),
    before_step=before_step,
    shape=shaping.Shaping.from_config(rl, sampling),
    reserve=reserve,
  )
