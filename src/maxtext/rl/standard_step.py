"""One step of standard GRPO (rl.use_agentic_rollout=false), from the step's prompts to the batch it
trains on, free of Tunix: the learner's adapter (integration/tunix/learner.py) gives it the sampler,
the scorers and the reward functions as a `StepServices` and turns its `StepBatch` into Tunix's
TrainExample.

In order (`StandardStep.batch`):
1. a round (`_round`): the sampler completes the batch's prompts (each already repeated
   num_generations times); the reference scores the completions (when grpo_beta != 0), the old policy
   too (when num_iterations > 1); the rewards are the reward functions' sum plus the overlong penalty
   (shaping.overlong_penalty, when set); the advantages are the algorithm's; the rewards and completion
   lengths are logged;
2. dynamic sampling (maxtext.rl.dynamic_sampling.StepRounds): further rounds of reserve prompts while
   the rule asks for them, then the batch of the groups that train;
3. the sampler importance weights (rl.sampler_is=token: shaping.sampler_is_weights of the trainer's
   over the sampler's log-probs);
4. truncated-completion masking (rl.mask_truncated_completions: shaping.truncated rows train no token).

Each completion is an rl.episode.Episode (its prompt, tokens, mask, the sampler's log-probs, the
step whose weights sampled it, the user turn and reply as text, its example and group), padded into
the batch by group_scoring.pad, the padder of every producer; the episodes the step trains on go to
`StepServices.episodes` with the rewards they train with (for the run's episode log).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from maxtext.rl import dynamic_sampling, group_scoring, shaping
from maxtext.rl.episode import Episode
from maxtext.utils import distributed


@dataclasses.dataclass(frozen=True)
class Completions:
  """The sampler's completions of a batch of prompts: the prompts' tokens (left-padded, one row per
  completion), each completion's tokens and text, and its tokens' log-probs (None where the engine
  returns none)."""

  prompt_ids: np.ndarray
  tokens: list
  text: list[str]
  logprobs: list | None


class StepServices(Protocol):
  """What a step asks of the learner; `rows` is the most rows one call of the model takes."""

  def generate(self, prompts: list[str], rows: int) -> Completions:
    """Completes each prompt once."""
    ...

  def reference_logps(self, prompt_ids: jax.Array, completion_ids: jax.Array, rows: int) -> jax.Array:
    """The reference model's log-probs of the completions' tokens."""
    ...

  def old_logps(self, prompt_ids: jax.Array, completion_ids: jax.Array, rows: int) -> jax.Array:
    """The old policy's log-probs of the completions' tokens (the weights that sampled them)."""
    ...

  def rewards(self, prompts: list[str], completions: list[str], fields: dict) -> np.ndarray:
    """The reward functions' sum per completion (`fields`: the batch's other columns); each function's
    rewards are logged."""
    ...

  def advantages(self, rewards: np.ndarray) -> np.ndarray | None:
    """The algorithm's advantages of the rewards, in groups of num_generations rows (None where the
    learner computes them later, from more than the rewards)."""
    ...

  def log(self, values: dict[str, tuple[float, Callable]]) -> None:
    """Buffers metrics {name: (value, reduction)} for the current step."""
    ...

  def episodes(self, episodes: list[Episode], rewards: np.ndarray, step: int) -> None:
    """The episodes global step `step` trains on, in the batch's order, with their rewards."""
    ...


@dataclasses.dataclass(frozen=True)
class StepSettings:
  """generations: rl.num_generations; reference: the reference scores the completions (grpo_beta != 0);
  old: the old policy scores them (num_iterations > 1); width: the response budget in tokens; pad, eos:
  the tokenizer's ids; sample_prompts, score_prompts: the prompts one sampling or one scoring call
  takes (None: the whole batch)."""

  generations: int
  reference: bool
  old: bool
  width: int
  pad: int
  eos: int
  sample_prompts: int | None
  score_prompts: int | None

  def rows(self, prompts: int | None, batch_rows: int) -> int:
    """The rows of one call taking `prompts` prompts (None: the whole batch of batch_rows rows)."""
    return (prompts or batch_rows // self.generations) * self.generations


@dataclasses.dataclass(frozen=True)
class StepBatch:
  """What a step trains on, one row per completion: the prompts' tokens (left-padded) and mask, the
  completions' tokens (right-padded to the budget) and mask, the rewards (host, as the reward
  functions and shaping gave them), the advantages (None where the learner computes them from the
  rewards itself: PPO's, per token), the reference's and old policy's log-probs (None where not scored),
  the sampler's log-probs (host, None where the engine returns none) and the sampler importance weights
  (None unless rl.sampler_is=token)."""

  prompt_ids: jax.Array
  prompt_mask: jax.Array
  completion_ids: jax.Array
  completion_mask: jax.Array
  rewards: np.ndarray
  advantages: jax.Array | None
  ref_logps: jax.Array | None = None
  old_logps: jax.Array | None = None
  sampler_logps: np.ndarray | None = None
  sampler_is_weights: jax.Array | None = None

  def rows(self, rows: np.ndarray, *others: StepBatch) -> StepBatch:
    """The given rows of this batch and `others` laid end to end (a field None in any is None)."""
    fields: dict[str, Any] = {}
    for field in dataclasses.fields(self):
      parts = [getattr(b, field.name) for b in (self, *others)]
      if any(p is None for p in parts):
        fields[field.name] = None
      elif isinstance(parts[0], np.ndarray):
        fields[field.name] = np.concatenate(parts)[rows]
      else:
        fields[field.name] = jnp.concatenate(parts)[rows]
    return StepBatch(**fields)


@dataclasses.dataclass(frozen=True)
class _Round:
  """One round's batch, its episodes (one per row), its rewards and, per group, whether they vary."""

  batch: StepBatch
  episodes: list[Episode]
  rewards: np.ndarray
  varied: np.ndarray


class StandardStep:
  """The batch of each step of standard GRPO (the module's docstring says how)."""

  def __init__(
    self,
    settings: StepSettings,
    shape: shaping.Shaping,
    services: StepServices,
    reserve: Callable[[int], dict] | None = None,
  ):
    """reserve(i): the i-th batch of reserve prompts (needed with dynamic sampling)."""
    self._settings = settings
    self._shape = shape
    self._services = services
    self._reserve = reserve

  def batch(self, batch: dict[str, Any], step: int) -> StepBatch:
    """The batch global step `step` trains on, from its prompts (batch["prompts"], each repeated
    num_generations times) and their other columns."""
    shape = self._shape
    first = self._round(batch, step, 0)
    out, episodes = first.batch, first.episodes
    if shape.dynamic_sampling_rounds > 1:
      out, episodes = self._dynamically_sampled(first, step)
    if out.sampler_logps is not None and shape.sampler_is:
      out = self._importance_weighted(out)
    if shape.mask_truncated_completions:
      cut = shaping.truncated(np.asarray(out.completion_ids), np.asarray(out.completion_mask), self._settings.eos)
      out = dataclasses.replace(out, completion_mask=out.completion_mask * jnp.asarray(~cut)[:, None])
      episodes = [
        dataclasses.replace(e, completion_mask=np.zeros_like(e.completion_mask)) if c else e
        for e, c in zip(episodes, cut)
      ]
      self._services.log({"completions/masked_truncated_fraction": (float(cut.mean()), np.mean)})
    self._services.episodes(episodes, out.rewards, step)
    return out

  def _round(self, batch: dict[str, Any], step: int, first_group: int) -> _Round:
    """A round on `batch`, its groups numbered on from `first_group` (the step's earlier rounds')."""
    settings, services = self._settings, self._services
    prompts = list(batch["prompts"])
    fields = {k: v for k, v in batch.items() if k != "prompts"}
    out = services.generate(prompts, settings.rows(settings.sample_prompts, len(prompts)))
    episodes = self._episodes(out, batch, step, first_group)
    shapes = group_scoring.Shapes(np.shape(out.prompt_ids)[1], settings.width, settings.pad, settings.eos)
    groups = [
      group_scoring.pad(episodes[g : g + settings.generations], shapes, out.logprobs is not None)
      for g in range(0, len(episodes), settings.generations)
    ]
    prompt_ids = jnp.asarray(np.concatenate([g.prompt_ids for g in groups]))
    completions = np.concatenate([g.completion_ids for g in groups])
    completion_ids = jnp.asarray(completions)
    score_rows = settings.rows(settings.score_prompts, len(prompts))
    ref_logps = services.reference_logps(prompt_ids, completion_ids, score_rows) if settings.reference else None
    old_logps = services.old_logps(prompt_ids, completion_ids, score_rows) if settings.old else None
    rewards = self._rewards([str(p) for p in prompts], out, fields)  # the text, as reward functions read it
    advantages = services.advantages(rewards)
    lengths = (completions != settings.pad).sum(axis=-1)
    services.log(
      {
        **{f"rewards/score/{k}": (float(f(rewards)), f) for k, f in _SUMMARIES},
        **{f"completions/{k}_length": (float(f(lengths)), f) for k, f in _SUMMARIES},
      }
    )
    sampler_logps = None
    if out.logprobs is not None:
      sampler_logps = np.concatenate([g.sampler_logps for g in groups]).astype(np.float32)
    step_batch = StepBatch(
      prompt_ids=prompt_ids,
      prompt_mask=prompt_ids != settings.pad,
      completion_ids=completion_ids,
      completion_mask=jnp.asarray(np.concatenate([g.completion_mask for g in groups])),
      rewards=rewards,
      advantages=None if advantages is None else jax.device_put(advantages),
      ref_logps=ref_logps,
      old_logps=old_logps,
      sampler_logps=sampler_logps,
    )
    return _Round(step_batch, episodes, rewards, dynamic_sampling.varied_groups(rewards, settings.generations))

  def _episodes(self, out: Completions, batch: dict[str, Any], step: int, first_group: int) -> list[Episode]:
    """A round's completions as episodes: each row's prompt without its left padding, its tokens (a
    sampled pad token, which ends a completion, masked as padding), the sampler's log-probs, the
    step whose weights sampled it, its user turn and reply as text, its example and its group
    ("step:group", the step's groups numbered from first_group)."""
    pad, generations = self._settings.pad, self._settings.generations
    episodes = []
    for row, (prompt, tokens, text) in enumerate(zip(np.asarray(out.prompt_ids), out.tokens, out.text)):
      tokens = np.asarray(tokens, np.int32)
      start = int(np.argmax(prompt != pad)) if (prompt != pad).any() else len(prompt)
      example = {k: v[row] for k, v in batch.items()}
      user = example.get("user_content", example["prompts"])
      episodes.append(
        Episode(
          prompt_ids=np.asarray(prompt[start:], np.int32),
          completion_ids=tokens,
          completion_mask=(tokens != pad).astype(np.int32),
          logprobs=None if out.logprobs is None else np.asarray(out.logprobs[row], np.float32),
          versions=None,
          version=step,
          conversation=[{"role": "user", "content": str(user)}, {"role": "assistant", "content": text}],
          example=example,
          group_id=f"{step}:{first_group + row // generations}",
        )
      )
    return episodes

  def _rewards(self, prompts: list[str], out: Completions, fields: dict) -> np.ndarray:
    """The reward functions' sum, plus the overlong penalty when set (logged)."""
    rewards = np.asarray(self._services.rewards(prompts, out.text, fields))
    shape = self._shape
    if shape.overlong_buffer_length:
      penalty = shaping.overlong_penalty(
        [len(t) for t in out.tokens], shape.max_response_length, shape.overlong_buffer_length, shape.overlong_penalty
      )
      rewards = rewards + penalty
      self._services.log({"rewards/overlong_penalty": (float(penalty.mean()), np.mean)})
    return rewards

  def _dynamically_sampled(self, first: _Round, step: int) -> tuple[StepBatch, list[Episode]]:
    """Rounds of reserve prompts after `first` while the rule asks for them, then the batch of the
    groups that train (all of a single round) and their episodes; logs the rule's metrics."""
    generations = self._settings.generations
    wanted = len(first.rewards) // generations
    plan = dynamic_sampling.StepRounds(self._shape.dynamic_sampling_rounds, self._reserve, step, wanted)
    rounds = [first]
    plan.add(first.varied)
    while (batch := plan.next_batch()) is not None:
      batch = {k: np.repeat(np.asarray(v), generations, axis=0) for k, v in batch.items()}
      batch["trajectory_ids"] = trajectory_ids(step, len(batch["prompts"]) // generations, generations)
      rounds.append(self._round(batch, step, sum(len(r.episodes) for r in rounds) // generations))
      plan.add(rounds[-1].varied)
    self._services.log({k: (v, np.mean) for k, v in plan.tally.metrics().items()})
    if len(rounds) == 1:
      return first.batch, first.episodes
    groups = plan.selected()
    rows = (groups[:, None] * generations + np.arange(generations)).reshape(-1)
    episodes = [e for r in rounds for e in r.episodes]
    return rounds[0].batch.rows(rows, *(r.batch for r in rounds[1:])), [episodes[i] for i in rows]

  def _importance_weighted(self, batch: StepBatch) -> StepBatch:
    """The batch with the sampler importance weights, from the old policy's log-probs (scored now
    where the round did not)."""
    assert batch.sampler_logps is not None
    trainer_logps = batch.old_logps
    if trainer_logps is None:
      rows = self._settings.rows(self._settings.score_prompts, len(batch.prompt_ids))
      trainer_logps = self._services.old_logps(batch.prompt_ids, batch.completion_ids, rows)
    weights = shaping.sampler_is_weights(
      distributed.host_array(trainer_logps), batch.sampler_logps, self._shape.sampler_is_threshold
    )
    return dataclasses.replace(batch, sampler_is_weights=jnp.asarray(weights))


def trajectory_ids(step: int, prompts: int, generations: int) -> list[str]:
  """The reward functions' `trajectory_ids` of a batch of `prompts` prompts sampled at `step`, each
  repeated `generations` times: "{row}_{sample}" with rows numbered from step * prompts, as Tunix
  names the step's first batch."""
  return [f"{step * prompts + row}_{sample}" for row in range(prompts) for sample in range(generations)]


_SUMMARIES = (("mean", np.mean), ("max", np.max), ("min", np.min))
