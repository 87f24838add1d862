"""What the standard learner does to a step's samples between sampling and training, each a setting:

- dynamic sampling (DAPO, rl.dynamic_sampling): its rule is maxtext.rl.dynamic_sampling, shared with
  the agentic learner; here only its number of rounds (`dynamic_sampling_rounds`);
- soft overlong punishment (DAPO, rl.overlong_buffer_length > 0): a reward penalty growing linearly over
  the last rl.overlong_buffer_length tokens of the response budget (`overlong_penalty`);
- masking truncated completions (rl.mask_truncated_completions): a completion that used the whole budget
  without ending trains no token (`truncated`);
- sampler importance correction (rl.sampler_is=token): each token's loss is weighted by the trainer's
  over the sampler's probability of it, truncated at rl.sampler_is_threshold and held constant
  (`sampler_is_weights`).

The functions here take and return numpy arrays (the importance weights JAX arrays); the steps
(standard_step.py, group_scoring.py) apply them.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.configs.sections import AlgorithmSection, SamplingSection
from maxtext.rl import dynamic_sampling


@dataclasses.dataclass(frozen=True)
class Shaping:
  """The settings above, read once from the config (`from_config`)."""

  dynamic_sampling_rounds: int  # 1: no dynamic sampling
  overlong_buffer_length: int  # 0: no overlong punishment
  overlong_penalty: float
  max_response_length: int
  mask_truncated_completions: bool
  sampler_is: bool
  sampler_is_threshold: float
  sampler_logps: bool  # the engine returns the sampler's log-probs (batched)

  @classmethod
  def from_config(cls, rl: AlgorithmSection, sampling: SamplingSection) -> Shaping:
    return cls(
      dynamic_sampling_rounds=dynamic_sampling.max_rounds(rl),
      overlong_buffer_length=rl.overlong_buffer_length,
      overlong_penalty=rl.overlong_penalty,
      max_response_length=sampling.max_response_length,
      mask_truncated_completions=rl.mask_truncated_completions,
      sampler_is=rl.sampler_is == "token",
      sampler_is_threshold=rl.sampler_is_threshold,
      sampler_logps=sampling.rollout_engine == "batched",
    )


def overlong_penalty(lengths, max_length: int, buffer: int, factor: float) -> np.ndarray:
  """DAPO's soft overlong punishment of completions of `lengths` tokens: 0 up to max_length - buffer,
  then falling linearly to -factor at max_length (and -factor beyond)."""
  lengths = np.asarray(lengths, dtype=np.float64)
  start = max_length - buffer
  return (-factor * np.clip((lengths - start) / buffer, 0.0, 1.0)).astype(np.float32)


def truncated(completion_ids, completion_mask, eos_id: int) -> np.ndarray:
  """Rows that filled the whole response budget without ending on EOS (a completion that stopped at
  a sampled pad token leaves it masked, so it does not fill the budget)."""
  ids, mask = np.asarray(completion_ids), np.asarray(completion_mask)
  return (mask.sum(axis=-1) == mask.shape[-1]) & (ids[:, -1] != eos_id)


def importance_ratios(trainer_logps, sampler_logps) -> jax.Array:
  """p_trainer / p_sampler per token, the log-ratio clipped to [-20, 20] first; float32 JAX arrays
  (numpy inputs go to the default device, global arrays stay where they are)."""
  log_ratio = jnp.asarray(trainer_logps, jnp.float32) - jnp.asarray(sampler_logps, jnp.float32)
  return jnp.exp(jnp.clip(log_ratio, -20.0, 20.0))


def sampler_is_weights(trainer_logps, sampler_logps, threshold: float) -> jax.Array:
  """min(importance_ratios, threshold) per token (truncated importance sampling): both learners'
  rule."""
  return jnp.minimum(importance_ratios(trainer_logps, sampler_logps), threshold)
