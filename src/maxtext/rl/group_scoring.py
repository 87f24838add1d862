"""The model-free part of scoring one agentic GRPO group (the num_generations conversations of one
prompt): padding its samples to the trainer's fixed shapes, choosing the old policy's log-probs,
the sampler importance weights, masking a group without signal, and the group's metrics.

What needs the model or the data (rewards, advantages, the trainer's and the reference's log-probs)
is computed by the caller between `pad` and `score`: `pad` gives the arrays those passes take, and
`score` takes their results. Metrics are {name: (value, reduction)}, the reduction combining a
step's values over its groups.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.rl import shaping

Metrics = dict[str, tuple[Any, Callable]]  # {name: (a number, its reduction over a step's groups)}


@dataclasses.dataclass(frozen=True)
class Sample:
  """One conversation as sampled. completion_tokens are every token after the prompt (the model's
  and the environment's), completion_mask marks the model's (1) from the environment's (0), and
  sampler_logps are the sampler's log-probs of them (None: the engine returned none). timings are
  the conversation's timing dicts by kind (env_time, reward_time: {sub-key: seconds})."""

  prompt_tokens: np.ndarray
  completion_tokens: np.ndarray
  completion_mask: np.ndarray
  sampler_logps: np.ndarray | None
  timings: Mapping[str, Mapping[str, float]]


@dataclasses.dataclass(frozen=True)
class Shapes:
  """The trainer's fixed shapes and the tokenizer's ids they are padded and judged with."""

  max_prompt_length: int
  max_response_length: int
  pad_id: int
  eos_id: int


@dataclasses.dataclass(frozen=True)
class PaddedGroup:
  """A group's samples padded to the trainer's shapes, one row per sample: prompts left-padded
  with pad_id (a longer prompt keeps its last max_prompt_length tokens), completions right-padded
  with pad_id, masks with 0 and sampler log-probs with 0.0 (a longer completion keeps its first
  max_response_length). sampler_logps is None unless asked for; a sample without them has a row of
  zeros. clipped counts the samples that have at least max_response_length tokens and whose mask's
  last entry is not eos_id (the mask entry, not the token, as Tunix 0.1.7 counts them: with an
  eos_id other than 0 and 1 that is every sample reaching the budget). prompt_length is the first
  sample's prompt length as sampled."""

  prompt_ids: np.ndarray  # [G, max_prompt_length] int32
  completion_ids: np.ndarray  # [G, max_response_length] int32
  completion_mask: np.ndarray  # [G, max_response_length] int32
  sampler_logps: np.ndarray | None  # [G, max_response_length], the samples' own dtype promoted
  clipped: int
  prompt_length: int

  def prompt_metrics(self) -> Metrics:
    """generation/prompts/{mean,max,min}_length: the first sample's prompt length."""
    n = self.prompt_length
    return {
      "generation/prompts/mean_length": (n, np.mean),
      "generation/prompts/max_length": (n, np.max),
      "generation/prompts/min_length": (n, np.min),
    }


@dataclasses.dataclass(frozen=True)
class Options:
  """sampler_is: the sampler importance correction (rl.sampler_is=token) and its truncation;
  mask_degenerate: a group whose advantages are all zero trains on no token."""

  sampler_is: bool
  sampler_is_threshold: float
  mask_degenerate: bool


@dataclasses.dataclass(frozen=True)
class ScoredGroup:
  """What the group trains with beside its padded tokens, and its metrics. completion_mask is the
  padded mask, all zeros for a masked degenerate group; old_logps are the trainer's where it
  recomputed them and either no sampler log-probs exist or the sampler correction is on, else the
  sampler's (None: neither exists); sampler_is_weights are set only with the correction and both
  log-probs."""

  completion_mask: jax.Array
  old_logps: jax.Array | None
  sampler_is_weights: jax.Array | None
  metrics: Metrics


def left_pad(x, length: int, pad, dtype=np.int32) -> np.ndarray:
  """x's last `length` entries, with `pad` before them to that length."""
  x = np.asarray(x, dtype=dtype)
  if x.size >= length:
    return x[-length:]
  return np.concatenate([np.full(length - x.size, pad, dtype), x])


def right_pad(x, length: int, pad, dtype=np.int32) -> np.ndarray:
  """x's first `length` entries, with `pad` after them to that length."""
  x = np.asarray(x, dtype=dtype)
  if x.size >= length:
    return x[:length]
  return np.concatenate([x, np.full(length - x.size, pad, dtype)])


def pad(samples: Sequence[Sample], shapes: Shapes, sampler_logps: bool) -> PaddedGroup:
  """The group padded to `shapes` (PaddedGroup), with the sampler's log-probs when asked for."""
  budget = shapes.max_response_length
  logps = None
  if sampler_logps:
    logps = np.stack(
      [
        np.zeros(budget, np.float32)
        if s.sampler_logps is None
        else right_pad(s.sampler_logps, budget, 0.0, s.sampler_logps.dtype)
        for s in samples
      ]
    )
  return PaddedGroup(
    prompt_ids=np.stack([left_pad(s.prompt_tokens, shapes.max_prompt_length, shapes.pad_id) for s in samples]),
    completion_ids=np.stack([right_pad(s.completion_tokens, budget, shapes.pad_id) for s in samples]),
    completion_mask=np.stack([right_pad(s.completion_mask, budget, 0) for s in samples]),
    sampler_logps=logps,
    clipped=sum(bool(len(s.completion_tokens) >= budget and s.completion_mask[-1] != shapes.eos_id) for s in samples),
    prompt_length=len(samples[0].prompt_tokens),
  )


def score(
  samples: Sequence[Sample], padded: PaddedGroup, advantages, trainer_logps: jax.Array | None, options: Options
) -> ScoredGroup:
  """The group's ScoredGroup from its advantages [G] and the trainer's log-probs [G, R] of its
  completions (None: not recomputed). Its metrics: the completions' lengths (tokens the model
  sampled, after degenerate masking), clip ratio and advantages; where both log-probs exist the
  sampler/trainer agreement (sampler_trainer/*) and, with the correction on, the importance weights
  (sampler_is/*), both over the trained tokens; and the samples' timings
  (trajectory/<kind>/<sub-key>/{mean,max,min})."""
  mask = jnp.asarray(padded.completion_mask)
  if options.mask_degenerate and jnp.all(jnp.isclose(advantages, 0.0)):
    mask = jnp.zeros_like(mask)
  sampler = None if padded.sampler_logps is None else jnp.asarray(padded.sampler_logps)
  old = trainer_logps if trainer_logps is not None and (sampler is None or options.sampler_is) else sampler
  metrics = completion_metrics(mask, padded.clipped, advantages)
  weights = None
  if sampler is not None and trainer_logps is not None:
    metrics.update(agreement_metrics(sampler, trainer_logps, mask))
    if options.sampler_is:
      weights, is_metrics = sampler_is_weights(sampler, trainer_logps, mask, options.sampler_is_threshold)
      metrics.update(is_metrics)
  metrics.update(timing_metrics(samples))
  return ScoredGroup(completion_mask=mask, old_logps=old, sampler_is_weights=weights, metrics=metrics)


def completion_metrics(mask: jax.Array, clipped: int, advantages) -> Metrics:
  """generation/completions/{mean,max,min}_length (trained tokens per sample), clip_ratio (clipped
  samples' share) and rewards/advantage/{mean,max,min,std}."""
  lengths = mask.sum(axis=-1)
  return {
    "generation/completions/mean_length": (np.mean(lengths), np.mean),
    "generation/completions/max_length": (np.max(lengths), np.max),
    "generation/completions/min_length": (np.min(lengths), np.min),
    "generation/completions/clip_ratio": (clipped / mask.shape[0], np.mean),
    "rewards/advantage/mean": (np.mean(advantages), np.mean),
    "rewards/advantage/max": (np.max(advantages), np.max),
    "rewards/advantage/min": (np.min(advantages), np.min),
    "rewards/advantage/std": (np.std(advantages), np.mean),
  }


def agreement_metrics(sampler: jax.Array, trainer: jax.Array, mask: jax.Array) -> Metrics:
  """The sampler's and trainer's per-token agreement over the masked tokens (a token whose
  log-prob is exactly 0 counts): the mean and max of |log-prob difference| and of |probability
  difference|, and the Pearson correlation of the probabilities (0 where either has no variance).
  With no masked token the means divide by 1."""
  keep = mask.astype(jnp.bool_)
  weight = keep.astype(jnp.float32)
  count = jnp.maximum(weight.sum(), 1.0)
  diff = jnp.abs(sampler - trainer)
  p_sampler, p_trainer = jnp.exp(sampler), jnp.exp(trainer)
  prob_diff = jnp.abs(p_sampler - p_trainer)
  flat = weight.reshape(-1)
  d_sampler = (p_sampler.reshape(-1) - (p_sampler.reshape(-1) * flat).sum() / count) * flat
  d_trainer = (p_trainer.reshape(-1) - (p_trainer.reshape(-1) * flat).sum() / count) * flat
  cov = (d_sampler * d_trainer).sum() / count
  var = ((d_sampler * d_sampler).sum() / count) * ((d_trainer * d_trainer).sum() / count)
  return {
    "sampler_trainer/logp_diff_mean": (float((diff * weight).sum() / count), np.mean),
    "sampler_trainer/logp_diff_max": (float(jnp.where(keep, diff, 0.0).max()), np.max),
    "sampler_trainer/prob_diff_mean": (float((prob_diff * weight).sum() / count), np.mean),
    "sampler_trainer/prob_diff_max": (float(jnp.where(keep, prob_diff, 0.0).max()), np.max),
    "sampler_trainer/probs_pearson_corr": (float(cov / jnp.sqrt(jnp.maximum(var, 1e-12))), np.mean),
  }


def sampler_is_weights(
  sampler: jax.Array, trainer: jax.Array, mask: jax.Array, threshold: float
) -> tuple[jax.Array, Metrics]:
  """Per-token truncated importance weights (shaping.sampler_is_weights), 0 off the mask, and their
  metrics over the masked tokens: sampler_is/weight_mean, weight_max and frac_clipped_at_threshold
  (the share of tokens whose ratio exceeds the threshold). With no masked token the means divide by 1."""
  weight = mask.astype(jnp.float32)
  ratio = shaping.importance_ratios(trainer, sampler)
  weights = jnp.minimum(ratio, threshold) * weight
  count = jnp.maximum(weight.sum(), 1.0)
  clipped = ((ratio > threshold) & (weight > 0)).astype(jnp.float32).sum() / count
  return weights, {
    "sampler_is/weight_mean": (float((weights * weight).sum() / count), np.mean),
    "sampler_is/weight_max": (float(jnp.where(weight > 0, weights, 0.0).max()), np.max),
    "sampler_is/frac_clipped_at_threshold": (float(clipped), np.mean),
  }


def timing_metrics(samples: Sequence[Sample]) -> Metrics:
  """trajectory/<kind>/<sub-key>/{mean,max,min} over the samples, for every sub-key any sample has
  (0 for a sample without it)."""
  metrics: Metrics = {}
  for kind in dict.fromkeys(k for s in samples for k in s.timings):
    times = [s.timings.get(kind, {}) for s in samples]
    for sub_key in dict.fromkeys(k for t in times for k in t):
      values = [t.get(sub_key, 0.0) for t in times]
      prefix = f"trajectory/{kind}/{sub_key}"
      metrics[f"{prefix}/mean"] = (np.mean(values), np.mean)
      metrics[f"{prefix}/max"] = (np.max(values), np.max)
      metrics[f"{prefix}/min"] = (np.min(values), np.min)
  return metrics
