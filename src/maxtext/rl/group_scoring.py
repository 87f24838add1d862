"""The model-free part of scoring one agentic GRPO group (the num_generations episodes of one
prompt, rl/episode.py's records from whichever producer): laying the group out under one prompt
(`layout`), padding it to the trainer's fixed shapes (`pad`), choosing the old policy's log-probs, the
sampler importance weights, masking a group without signal, and the group's metrics.

What needs the model or the data (rewards, advantages, the trainer's and the reference's log-probs)
is computed by the caller between `pad` and `score`: `pad` gives the arrays those passes take, and
`score` takes their results. Metrics are {name: (value, reduction)}, the reduction combining a
step's values over its groups.

The layout (`layout`): the shared-prefix loss scores each group's prompt once, so every row of a group
has the same prompt ids, and no prompt is cut:
1. an episode whose first prompt is over max_prompt_length fails (it is never scored under a shorter
   context than it was sampled after);
2. the group's prompt is the longest common prefix of as many trained episodes' first prompts as can
   share it (`_shared_prompt`: those with the most common first prompt, then each other one whose
   joining keeps every one's completion within max_response_length once 3. is done);
3. a trained episode whose first prompt is longer than that keeps the rest as context (mask 0) at the
   start of its completion: it is scored under exactly the tokens it was sampled after; one whose
   first prompt does not begin with the group's prompt, or whose completion that takes over
   max_response_length, fails;
4. a failed episode's row is that prompt and no completion (without a trained episode, the first
   episode's prompt, its last max_prompt_length tokens): it trains nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.rl import shaping
from maxtext.rl.episode import Episode

Metrics = dict[str, tuple[Any, Callable]]  # {name: (a number, its reduction over a step's groups)}


@dataclasses.dataclass(frozen=True)
class Shapes:
  """The trainer's fixed shapes and the tokenizer's ids they are padded and judged with."""

  max_prompt_length: int
  max_response_length: int
  pad_id: int
  eos_id: int


@dataclasses.dataclass(frozen=True)
class PaddedGroup:
  """A group's episodes, laid out (`layout`), padded to the trainer's shapes, one row per episode:
  prompts left-padded with pad_id, completions right-padded with pad_id, masks with 0 and sampler
  log-probs with 0.0. sampler_logps is None unless asked for; an episode without them has a row of
  zeros. clipped counts the samples that have at least max_response_length tokens and whose mask's
  last entry is not eos_id (the mask entry, not the token, as Tunix 0.1.7 counts them: with an
  eos_id other than 0 and 1 that is every sample reaching the budget). prompt_length is the group's
  prompt's length."""

  prompt_ids: np.ndarray  # [G, max_prompt_length] int32
  completion_ids: np.ndarray  # [G, max_response_length] int32
  completion_mask: np.ndarray  # [G, max_response_length] int32
  sampler_logps: np.ndarray | None  # [G, max_response_length], the samples' own dtype promoted
  clipped: int
  prompt_length: int

  def prompt_metrics(self) -> Metrics:
    """generation/prompts/{mean,max,min}_length: the group's prompt's length."""
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


def layout(episodes: Sequence[Episode], shapes: Shapes) -> list[Episode]:
  """The group's episodes laid out under one prompt (the module docstring's rule), in their order;
  those it fails carry their reason (Episode.failure), for the caller to count."""
  budget, length = shapes.max_response_length, shapes.max_prompt_length
  out = [
    e.failing(f"its first prompt has {len(e.prompt_ids)} tokens, more than max_prompt_length={length}")
    if not e.failed and len(e.prompt_ids) > length
    else e
    for e in episodes
  ]
  prompt = _shared_prompt([e for e in out if not e.failed], budget)
  if prompt is None:
    prompt = np.asarray(next((e.prompt_ids for e in out if len(e.prompt_ids)), np.zeros(0, np.int32)))[-length:]
    return [_row(e, prompt) for e in out]
  return [_row(e, prompt) if e.failed else _under(e, prompt, budget) for e in out]


def _shared_prompt(trained: Sequence[Episode], budget: int) -> np.ndarray | None:
  """The group's prompt: the longest prefix of the trained episodes' first prompts that the most of
  them share with the rest of their prompt and their completion fitting `budget` (episodes whose
  whole first prompt is the most common come first, then the shorter; each next one joins where every
  episode taken so far still fits); None without a trained episode."""
  if not trained:
    return None
  counts: dict[bytes, int] = {}
  for e in trained:
    key = np.asarray(e.prompt_ids, np.int32).tobytes()
    counts[key] = counts.get(key, 0) + 1
  ordered = sorted(trained, key=lambda e: (-counts[np.asarray(e.prompt_ids, np.int32).tobytes()], len(e.prompt_ids)))
  prompt = np.asarray(ordered[0].prompt_ids)
  taken = [ordered[0]]
  for e in ordered[1:]:
    shorter = prompt[: _common_prefix([prompt, np.asarray(e.prompt_ids)])]
    if len(shorter) and all(len(t.prompt_ids) - len(shorter) + len(t.completion_ids) <= budget for t in [*taken, e]):
      prompt, taken = shorter, [*taken, e]
  return prompt


def _common_prefix(prompts: Sequence[np.ndarray]) -> int:
  """The length of the longest prefix all `prompts` share."""
  n = min(len(p) for p in prompts)
  first = np.asarray(prompts[0])[:n]
  for p in prompts[1:]:
    differs = np.flatnonzero(np.asarray(p)[:n] != first)
    n = int(differs[0]) if len(differs) else n
    first = first[:n]
  return n


def _row(e: Episode, prompt: np.ndarray) -> Episode:
  """A failed episode's row: the group's prompt and no completion; a trained one as it is."""
  if not e.failed:
    return e
  empty = np.zeros(0, np.int32)
  return dataclasses.replace(
    e,
    prompt_ids=prompt,
    completion_ids=empty,
    completion_mask=empty,
    logprobs=None if e.logprobs is None else np.zeros(0, np.float32),
    versions=None if e.versions is None else empty,
  )


def _under(e: Episode, prompt: np.ndarray, budget: int) -> Episode:
  """A trained episode under the group's `prompt`: the rest of its own first prompt as context before
  its completion; failed where its first prompt does not begin with `prompt` or that is over `budget`."""
  own = np.asarray(e.prompt_ids)
  shared = _common_prefix([prompt, own])
  rest = own[len(prompt) :]
  if shared == len(prompt) and not len(rest):
    return e
  if shared < len(prompt) or len(rest) + len(e.completion_ids) > budget:
    failed = e.failing(
      f"its first prompt of {len(own)} tokens differs from its group's after {shared}: the rest of its prompt "
      f"and its {len(e.completion_ids)} completion tokens do not fit in max_response_length={budget} "
      f"beside its group's (their context is trained as completion tokens, masked)"
    )
    return _row(failed, prompt)
  zeros = np.zeros(len(rest))
  return dataclasses.replace(
    e,
    prompt_ids=prompt,
    completion_ids=np.concatenate([rest, e.completion_ids]).astype(np.int32),
    completion_mask=np.concatenate([zeros, e.completion_mask]).astype(np.int32),
    logprobs=None if e.logprobs is None else np.concatenate([zeros, e.logprobs]).astype(np.asarray(e.logprobs).dtype),
    versions=None if e.versions is None else np.concatenate([zeros - 1, e.versions]).astype(np.int32),
  )


def pad(episodes: Sequence[Episode], shapes: Shapes, sampler_logps: bool) -> PaddedGroup:
  """The group, laid out (`layout`), padded to `shapes` (PaddedGroup), with the sampler's log-probs
  when asked for; a ValueError where it is not laid out (prompts that differ or are over
  max_prompt_length, a completion over max_response_length): nothing is cut here."""
  budget = shapes.max_response_length
  prompt = np.asarray(episodes[0].prompt_ids)
  for e in episodes:
    if not np.array_equal(e.prompt_ids, prompt) or len(prompt) > shapes.max_prompt_length:
      raise ValueError(
        f"group_scoring.pad: a group not laid out under one prompt of at most {shapes.max_prompt_length}"
      )
    if len(e.completion_ids) > budget:
      raise ValueError(f"group_scoring.pad: a completion of {len(e.completion_ids)} tokens, more than {budget}")
  logps = None
  if sampler_logps:
    logps = np.stack(
      [
        np.zeros(budget, np.float32) if e.logprobs is None else right_pad(e.logprobs, budget, 0.0, e.logprobs.dtype)
        for e in episodes
      ]
    )
  return PaddedGroup(
    prompt_ids=np.stack([left_pad(e.prompt_ids, shapes.max_prompt_length, shapes.pad_id) for e in episodes]),
    completion_ids=np.stack([right_pad(e.completion_ids, budget, shapes.pad_id) for e in episodes]),
    completion_mask=np.stack([right_pad(e.completion_mask, budget, 0) for e in episodes]),
    sampler_logps=logps,
    clipped=sum(bool(len(e.completion_ids) >= budget and e.completion_mask[-1] != shapes.eos_id) for e in episodes),
    prompt_length=len(prompt),
  )


def score(
  episodes: Sequence[Episode], padded: PaddedGroup, advantages, trainer_logps: jax.Array | None, options: Options
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
  metrics.update(timing_metrics(episodes))
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


def timing_metrics(episodes: Sequence[Episode]) -> Metrics:
  """trajectory/<kind>/<sub-key>/{mean,max,min} over the episodes, for every sub-key any episode has
  (0 for an episode without it)."""
  metrics: Metrics = {}
  for kind in dict.fromkeys(k for e in episodes for k in e.timings):
    times = [e.timings.get(kind, {}) for e in episodes]
    for sub_key in dict.fromkeys(k for t in times for k in t):
      values = [t.get(sub_key, 0.0) for t in times]
      prefix = f"trajectory/{kind}/{sub_key}"
      metrics[f"{prefix}/mean"] = (np.mean(values), np.mean)
      metrics[f"{prefix}/max"] = (np.max(values), np.max)
      metrics[f"{prefix}/min"] = (np.min(values), np.min)
  return metrics
