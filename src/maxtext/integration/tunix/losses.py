"""The advantage estimators and policy losses a run selects (rl.advantage_estimator,
rl.policy_loss_fn), with the loss algorithm and aggregation they combine with; `register` puts them
in Tunix's function registry, through which both learners dispatch.

An advantage estimator is fn(rewards [B * G], num_generations G) -> advantages [B * G], the rows
grouped by prompt. A policy loss is fn(model, train_example, algo_config, pad_id, eos_id) ->
(loss, aux) with Tunix's aux keys (the agentic learner logs all of them). The shared-prefix
contract: with prefix sharing the model a loss receives is a SharedPrefix wrapper (models/
shared_prefix.py) that scores each group's prompt once and returns hidden states (or logits) at
completion positions only, so a loss computes its log-probs through scoring.completion_logps, as
below, never by running the model on whole sequences itself.

Every policy loss here is `_policy_loss(surrogate)`: the forward pass, the KL penalty, the
aggregation, the sampler importance weights, the diagnostics and the sampler/trainer mismatch are
shared, and the surrogate gives the per-token loss from the log-probs, their log ratio to the old
ones and the advantages (`_Terms`). A new loss is one surrogate function added to POLICY_LOSSES under a name
added to sections.PolicyLossFn (the choices of rl.policy_loss_fn, which the config checks at start; its meaning is the
doc of that field) and its tests; a new estimator likewise goes to ADVANTAGE_ESTIMATORS and sections.AdvantageEstimator.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np
from tunix.rl import algo_core, common, function_registry

from maxtext.configs.sections import AdvantageEstimator, PolicyLossFn
from maxtext.integration.tunix import scoring

_EPS = 1e-6


def reinforce_pp(rewards, num_generations: int) -> np.ndarray:
  """REINFORCE++ with batch normalisation: the reward minus the batch's mean reward, divided by the
  batch's standard deviation (no per-prompt baseline; `num_generations` is not used)."""
  del num_generations
  r = np.asarray(rewards, dtype=np.float64)
  return ((r - r.mean()) / (r.std() + _EPS)).astype(np.float32)


ADVANTAGE_ESTIMATORS: dict[AdvantageEstimator, Callable[..., Any]] = {
  # Tunix's: (r - group mean) / (group std (ddof 1) + 1e-6)
  "grpo": algo_core.compute_advantages,
  # Tunix's Dr. GRPO: r - group mean (no division by the group's std)
  "dr_grpo": algo_core.compute_drgrpo_advantages,
  # Tunix's REINFORCE leave-one-out: r - mean of the group's other rewards
  "rloo": algo_core.compute_rloo_advantages,
  "reinforce_pp": reinforce_pp,
}


@flax.struct.dataclass(frozen=True)
class _Terms:
  """A surrogate's per-token loss and the parts Tunix's diagnostics report: the log ratio and ratio
  it used, where it clipped, its unclipped loss -A * r and its clipped loss."""

  loss: jax.Array
  log_ratio: jax.Array
  ratio: jax.Array
  clipped: jax.Array
  unclipped: jax.Array
  clipped_loss: jax.Array
  clipped_lower: jax.Array | None = None  # where dual clip bounded the loss (ppo_clip's epsilon_c)


def _aux(terms: _Terms, token_log_ratio, adv, mask, agg_mode: str) -> dict[str, jax.Array]:
  """The diagnostics Tunix's learners log, as its GRPO loss computes them (pg_clipfrac_lower aggregated
  as the loss is, rl.loss_agg_mode)."""
  adv = jnp.broadcast_to(adv, mask.shape)
  live = mask > 0
  return {
    "pg_clipfrac": algo_core.masked_mean(terms.clipped.astype(jnp.float32), mask),
    "ppo_kl": algo_core.masked_mean(-token_log_ratio, mask),
    "pg_clipfrac_lower": (
      jnp.float32(0.0)
      if terms.clipped_lower is None
      else common.aggregate_loss(terms.clipped_lower.astype(jnp.float32), mask, agg_mode)
    ),
    "is_ratio/mean": algo_core.masked_mean(terms.ratio, mask),
    "is_ratio/max": jnp.max(jnp.where(live, terms.ratio, 0.0)),
    "is_ratio/min": jnp.min(jnp.where(live, terms.ratio, jnp.inf)),
    "log_ratio/abs_mean": algo_core.masked_mean(jnp.abs(terms.log_ratio), mask),
    "pg_loss/unclipped_mean": algo_core.masked_mean(terms.unclipped, mask),
    "pg_loss/clipped_mean": algo_core.masked_mean(terms.clipped_loss, mask),
    "advantage/abs_mean": algo_core.masked_mean(jnp.abs(adv), mask),
    "advantage/max": jnp.max(jnp.where(live, adv, -jnp.inf)),
    "advantage/min": jnp.min(jnp.where(live, adv, jnp.inf)),
    "advantage/nonzero_frac": algo_core.masked_mean((jnp.abs(adv) > 1e-8).astype(jnp.float32), mask),
  }


def _ppo_clip(logps, log_ratio, adv, mask, algo_config) -> _Terms:
  """PPO's clipped surrogate, per token: max(-A * r, -A * clip(r, 1 - epsilon, 1 + epsilon_high)),
  and with dual clip (epsilon_c > 0, Ye et al. 2020) at most -epsilon_c * A where A < 0.
  rl.loss_algo=gspo-token (GSPO) takes the sequence's ratio, the geometric mean of its tokens'
  ratios, at every token (the gradient still flows through each token's log-prob)."""
  if algo_config.loss_algo == "gspo-token":
    sequence = (log_ratio * mask).sum(axis=-1) / jnp.clip(mask.sum(axis=-1), min=1)
    log_ratio = jnp.minimum(logps - jax.lax.stop_gradient(logps) + jax.lax.stop_gradient(sequence)[:, None], 10.0)
  ratio = jnp.exp(log_ratio)
  unclipped = -adv * ratio
  clipped = -adv * jnp.clip(ratio, 1.0 - algo_config.epsilon, 1.0 + algo_config.epsilon_high)
  loss = jnp.maximum(unclipped, clipped)
  lower = None
  epsilon_c = getattr(algo_config, "epsilon_c", None)
  if epsilon_c is not None:
    bound = -epsilon_c * adv
    lower = (adv < 0) & (loss > bound)
    loss = jnp.where(lower, bound, loss)
  return _Terms(loss, log_ratio, ratio, clipped > unclipped, unclipped, clipped, lower)


def _cispo(logps, log_ratio, adv, mask, algo_config) -> _Terms:
  """CISPO (MiniMax-M1): every token's log-prob weighted by its importance ratio to the sampling
  policy, truncated above at 1 + epsilon_high and held constant (stop-gradient), times the advantage:
  -sg(min(r, 1 + epsilon_high)) * A * log p. No token is dropped from the gradient, as PPO's clip
  drops those outside the trust region."""
  del mask
  ratio = jnp.exp(log_ratio)
  cap = 1.0 + algo_config.epsilon_high
  loss = -jax.lax.stop_gradient(jnp.minimum(ratio, cap)) * adv * logps
  return _Terms(loss, log_ratio, ratio, ratio > cap, -adv * ratio, loss)


def _mismatch(trainer_logps, sampler_logps, mask) -> dict[str, jax.Array]:
  """How far the sampler's per-token log-probs are from the trainer's over the completion tokens."""
  live = mask > 0
  diff = jnp.abs(trainer_logps - sampler_logps)
  prob_diff = jnp.abs(jnp.exp(trainer_logps) - jnp.exp(sampler_logps))
  return {
    "sampler_trainer/logp_diff_mean": algo_core.masked_mean(diff, mask),
    "sampler_trainer/logp_diff_max": jnp.max(jnp.where(live, diff, 0.0)),
    "sampler_trainer/prob_diff_mean": algo_core.masked_mean(prob_diff, mask),
    "sampler_trainer/prob_diff_max": jnp.max(jnp.where(live, prob_diff, 0.0)),
  }


# The metrics _mismatch adds to a loss's aux, with how the trainer reduces them over micro-batches.
MISMATCH_METRICS: dict[str, Callable[..., Any]] = {
  "sampler_trainer/logp_diff_mean": np.mean,
  "sampler_trainer/logp_diff_max": np.max,
  "sampler_trainer/prob_diff_mean": np.mean,
  "sampler_trainer/prob_diff_max": np.max,
}


# The loss's terms every learner logs beside Tunix's: the policy's entropy (rl.entropy_coef's bonus) and
# where dual clip bounded the loss (rl.epsilon_c).
LOSS_TERM_METRICS: dict[str, Callable[..., Any]] = {"entropy": np.mean, "pg_clipfrac_lower": np.mean}


def mismatch_from_old(algo_config) -> bool:
  """Whether the old log-probs a loss receives are the sampler's and it reports the sampler/trainer
  mismatch from them (MISMATCH_METRICS): agentic GRPO on the batched engine (use_rollout_logps),
  where the trainer recomputes nothing, unless sampler_is=token has it recompute them (Tunix then
  logs the mismatch itself). Off-policy samples (rl.off_policy_steps > 0) add the policy's movement
  since sampling to it."""
  return bool(getattr(algo_config, "use_rollout_logps", False)) and getattr(algo_config, "sampler_is", None) != "token"


@flax.struct.dataclass(frozen=True)
class SampledExample(common.TrainExample):
  """Tunix's TrainExample with the sampler's per-token log-probs of the completion, from which the
  loss reports the sampler/trainer mismatch (MISMATCH_METRICS) at no extra forward pass."""

  sampler_logps: jax.Array | None = None


def _policy_loss(surrogate):
  """A policy loss from a per-token surrogate(logps, log_ratio, adv, mask, algo_config) -> _Terms,
  log_ratio being log p - log p_old clipped to [-20, 20]: the KL penalty, the entropy bonus
  (rl.entropy_coef), the aggregation (rl.loss_agg_mode), the sampler importance weights and the
  diagnostics are common to every loss."""

  def loss_fn(model, train_example, algo_config, pad_id, eos_id, **kwargs):
    del kwargs
    mask = train_example.completion_mask
    logps, entropy = scoring.completion_logps(
      model, train_example.prompt_ids, train_example.completion_ids, pad_id, eos_id, algo_config.temperature
    )
    logps = logps.astype(jnp.float32)
    given = train_example.old_per_token_logps
    old = jax.lax.stop_gradient(logps) if given is None else given.astype(jnp.float32)
    advantages = train_example.advantages.astype(jnp.float32)
    adv = advantages if advantages.ndim == 2 else advantages[:, None]
    terms = surrogate(logps, jnp.clip(logps - old, -20.0, 20.0), adv, mask, algo_config)
    per_token_loss = terms.loss.astype(jnp.float32)
    sampler_is = getattr(train_example, "sampler_is_weights", None)
    if sampler_is is not None:
      per_token_loss = per_token_loss * sampler_is.astype(jnp.float32)
    loss = common.aggregate_loss(per_token_loss, mask, algo_config.loss_agg_mode)
    aux = _aux(terms, logps - old, adv, mask, algo_config.loss_agg_mode)
    aux.update(pg_loss=loss, kl=jnp.float32(0.0), kl_loss=jnp.float32(0.0))
    aux["sampler_is/weight_mean"] = jnp.float32(1.0) if sampler_is is None else algo_core.masked_mean(sampler_is, mask)
    aux["sampler_is/weight_min"] = (
      jnp.float32(1.0) if sampler_is is None else jnp.min(jnp.where(mask > 0, sampler_is, jnp.inf))
    )
    sampler_logps = getattr(train_example, "sampler_logps", None)
    if sampler_logps is not None:  # the trainer's log-probs before this step's updates: `old`
      aux.update(_mismatch(old, sampler_logps.astype(jnp.float32), mask))
    elif mismatch_from_old(algo_config):  # `old` is the sampler's
      aux.update(_mismatch(jax.lax.stop_gradient(logps), old, mask))
    if train_example.ref_per_token_logps is not None:
      kl = common.compute_kl_divergence(
        logps, train_example.ref_per_token_logps, algo_config.kl_loss_mode, clamp_value=algo_config.kl_clamp_value
      )
      aux["kl"] = algo_core.masked_mean(kl, mask).astype(jnp.float32)
      aux["kl_loss"] = common.aggregate_loss(kl, mask, algo_config.loss_agg_mode)
      if algo_config.beta:
        loss = loss + algo_config.beta * aux["kl_loss"]
    entropy_loss = common.aggregate_loss(entropy.astype(jnp.float32), mask, algo_config.loss_agg_mode)
    entropy_coef = getattr(algo_config, "entropy_coef", 0.0)
    if entropy_coef:
      loss = loss - entropy_coef * entropy_loss
    aux["entropy"] = jax.lax.stop_gradient(entropy_loss)
    return loss, aux

  loss_fn.__name__ = surrogate.__name__.lstrip("_")
  loss_fn.__doc__ = surrogate.__doc__
  return loss_fn


POLICY_LOSSES: dict[PolicyLossFn, Callable[..., Any]] = {
  "ppo_clip": _policy_loss(_ppo_clip),
  "cispo": _policy_loss(_cispo),
}


def register() -> None:
  """Puts every estimator and loss here in Tunix's registry under its name (idempotent)."""
  for category, functions in (("advantage_estimator", ADVANTAGE_ESTIMATORS), ("policy_loss_fn", POLICY_LOSSES)):
    held = function_registry.default_registry.list_functions(category)
    for name, fn in functions.items():
      if name not in held or function_registry.default_registry.get(category, name) is not fn:
        function_registry.default_registry.register(category, name)(fn)
