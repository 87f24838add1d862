"""The advantage estimators and policy losses a run selects (rl.advantage_estimator,
rl.policy_loss_fn), with the loss algorithm and aggregation they combine with; `register` puts them
in Tunix's function registry, through which both learners dispatch.

An advantage estimator is fn(rewards [B * G], num_generations G) -> advantages [B * G], the rows
grouped by prompt. A policy loss is fn(model, train_example, algo_config, pad_id, eos_id) ->
(loss, aux) with Tunix's aux keys (the agentic learner logs all of them). The shared-prefix
contract: with prefix sharing the model a loss receives is a SharedPrefix wrapper (models/
shared_prefix.py) that scores each group's prompt once and returns logits at completion positions
only, so a loss computes its log-probs through tunix.rl.common.compute_per_token_logps, as below,
never by running the model on whole sequences itself.

A new loss is one function added to POLICY_LOSSES (its name becomes a choice of rl.policy_loss_fn,
documented in base.yml) and its tests.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tunix.rl import algo_core, common, function_registry

from maxtext.configs.sections import AlgorithmSection
from maxtext.utils.errors import ConfigError

_EPS = 1e-6


def reinforce_pp(rewards, num_generations: int) -> np.ndarray:
  """REINFORCE++ with batch normalisation: the reward minus the batch's mean reward, divided by the
  batch's standard deviation (no per-prompt baseline; `num_generations` is not used)."""
  del num_generations
  r = np.asarray(rewards, dtype=np.float64)
  return ((r - r.mean()) / (r.std() + _EPS)).astype(np.float32)


ADVANTAGE_ESTIMATORS: dict[str, Callable[..., Any]] = {
  # Tunix's: (r - group mean) / (group std (ddof 1) + 1e-6)
  "grpo": algo_core.compute_advantages,
  # Tunix's Dr. GRPO: r - group mean (no division by the group's std)
  "dr_grpo": algo_core.compute_drgrpo_advantages,
  # Tunix's REINFORCE leave-one-out: r - mean of the group's other rewards
  "rloo": algo_core.compute_rloo_advantages,
  "reinforce_pp": reinforce_pp,
}


def _aux(per_token_loss, log_ratio, ratio, adv, mask, clipped) -> dict[str, jax.Array]:
  """The diagnostics Tunix's learners log, as its GRPO loss computes them."""
  adv = jnp.broadcast_to(adv, mask.shape)
  live = mask > 0
  return {
    "pg_clipfrac": algo_core.masked_mean(clipped.astype(jnp.float32), mask),
    "ppo_kl": algo_core.masked_mean(-log_ratio, mask),
    "pg_clipfrac_lower": jnp.float32(0.0),
    "is_ratio/mean": algo_core.masked_mean(ratio, mask),
    "is_ratio/max": jnp.max(jnp.where(live, ratio, 0.0)),
    "is_ratio/min": jnp.min(jnp.where(live, ratio, jnp.inf)),
    "log_ratio/abs_mean": algo_core.masked_mean(jnp.abs(log_ratio), mask),
    "pg_loss/unclipped_mean": algo_core.masked_mean(-adv * ratio, mask),
    "pg_loss/clipped_mean": algo_core.masked_mean(per_token_loss, mask),
    "advantage/abs_mean": algo_core.masked_mean(jnp.abs(adv), mask),
    "advantage/max": jnp.max(jnp.where(live, adv, -jnp.inf)),
    "advantage/min": jnp.min(jnp.where(live, adv, jnp.inf)),
    "advantage/nonzero_frac": algo_core.masked_mean((jnp.abs(adv) > 1e-8).astype(jnp.float32), mask),
  }


def cispo(model, train_example, algo_config, pad_id, eos_id, **kwargs):
  """CISPO (MiniMax-M1): every token's log-prob weighted by its importance ratio to the sampling
  policy, truncated above at 1 + epsilon_high and held constant (stop-gradient), times the advantage:
  loss_t = -sg(min(r_t, 1 + epsilon_high)) * A * log p_t. No token is dropped from the gradient, as
  PPO's clip drops those outside the trust region. The KL penalty, aggregation and sampler
  importance weights are as in Tunix's GRPO loss."""
  del kwargs
  mask = train_example.completion_mask
  graphdef, state = nnx.split(model)
  logps, logits = common.compute_per_token_logps(
    graphdef,
    state,
    prompt_tokens=train_example.prompt_ids,
    completion_tokens=train_example.completion_ids,
    pad_id=pad_id,
    eos_id=eos_id,
    stop_gradient=False,
    return_logits=True,
    segment_ids=getattr(train_example, "segment_ids", None),
    segment_positions=getattr(train_example, "segment_positions", None),
    temperature=algo_config.temperature,
  )
  logps = logps.astype(jnp.float32)
  old = train_example.old_per_token_logps
  old = jax.lax.stop_gradient(logps) if old is None else old.astype(jnp.float32)
  log_ratio = jnp.clip(logps - old, -20.0, 20.0)
  ratio = jnp.exp(log_ratio)
  cap = 1.0 + algo_config.epsilon_high
  weight = jax.lax.stop_gradient(jnp.minimum(ratio, cap))
  advantages = train_example.advantages.astype(jnp.float32)
  adv = advantages if advantages.ndim == 2 else advantages[:, None]
  per_token_loss = -weight * adv * logps
  sampler_is = getattr(train_example, "sampler_is_weights", None)
  if sampler_is is not None:
    per_token_loss = per_token_loss * sampler_is.astype(jnp.float32)
  loss = common.aggregate_loss(per_token_loss, mask, algo_config.loss_agg_mode)
  aux = _aux(per_token_loss, log_ratio, ratio, adv, mask, ratio > cap)
  aux.update(pg_loss=loss, kl=jnp.float32(0.0), kl_loss=jnp.float32(0.0))
  aux["sampler_is/weight_mean"] = jnp.float32(1.0) if sampler_is is None else algo_core.masked_mean(sampler_is, mask)
  aux["sampler_is/weight_min"] = (
    jnp.float32(1.0) if sampler_is is None else jnp.min(jnp.where(mask > 0, sampler_is, jnp.inf))
  )
  if train_example.ref_per_token_logps is not None:
    kl = common.compute_kl_divergence(
      logps, train_example.ref_per_token_logps, algo_config.kl_loss_mode, clamp_value=algo_config.kl_clamp_value
    )
    aux["kl"] = algo_core.masked_mean(kl, mask).astype(jnp.float32)
    aux["kl_loss"] = common.aggregate_loss(kl, mask, algo_config.loss_agg_mode)
    if algo_config.beta:
      loss = loss + algo_config.beta * aux["kl_loss"]
  aux["entropy"] = common.aggregate_loss(algo_core.compute_entropy_from_logits(logits), mask, algo_config.loss_agg_mode)
  return loss, aux


POLICY_LOSSES: dict[str, Callable[..., Any]] = {
  "ppo_clip": algo_core.grpo_loss_fn,  # Tunix's clipped surrogate (rl.loss_algo: token or sequence ratio)
  "cispo": cispo,
}
LOSS_ALGOS = ("grpo", "gspo-token")  # the ratio of ppo_clip: per token, or the sequence's (GSPO)
# The modes tunix.rl.common.aggregate_loss implements (a contract test checks them).
LOSS_AGGREGATIONS = (
  "token-mean",
  "sequence-mean-token-mean",
  "sequence-mean-token-scale",
  "seq-mean-token-sum",
  "sequence-mean-token-sum-norm",
)


def check(rl: AlgorithmSection, agentic: bool) -> None:
  """Refuses an algorithm key whose value no registry here holds, naming the key, the value and the
  choices, and combinations that would not do what they say (`agentic`: rl.use_agentic_rollout)."""
  for key, value, choices in (
    ("rl.advantage_estimator", rl.advantage_estimator, tuple(ADVANTAGE_ESTIMATORS)),
    ("rl.policy_loss_fn", rl.policy_loss_fn, tuple(POLICY_LOSSES)),
    ("rl.loss_algo", rl.loss_algo, LOSS_ALGOS),
    ("rl.loss_agg_mode", rl.loss_agg_mode, LOSS_AGGREGATIONS),
  ):
    if value not in choices:
      raise ConfigError(f"{key}={value!r}: expected one of {', '.join(choices)}")
  if rl.policy_loss_fn == "cispo" and rl.loss_algo != "grpo":
    raise ConfigError(
      f"rl.loss_algo={rl.loss_algo!r} with rl.policy_loss_fn=cispo: the sequence-level ratio belongs to "
      "ppo_clip; cispo weights tokens (expected rl.loss_algo=grpo)"
    )
  if rl.advantage_estimator == "reinforce_pp" and rl.dynamic_sampling:
    raise ConfigError(
      "rl.advantage_estimator='reinforce_pp' with rl.dynamic_sampling=true: REINFORCE++ normalises over the "
      "sampled batch, not the groups dynamic sampling keeps (expected grpo, dr_grpo or rloo)"
    )
  if rl.advantage_estimator == "reinforce_pp" and agentic:
    raise ConfigError(
      "rl.advantage_estimator='reinforce_pp' with rl.use_agentic_rollout=true: agentic GRPO scores one "
      "group at a time, so there is no batch to normalise over (expected grpo, dr_grpo or rloo)"
    )


def register() -> None:
  """Puts every estimator and loss here in Tunix's registry under its name (idempotent)."""
  for category, functions in (("advantage_estimator", ADVANTAGE_ESTIMATORS), ("policy_loss_fn", POLICY_LOSSES)):
    held = function_registry.default_registry.list_functions(category)
    for name, fn in functions.items():
      if name not in held or function_registry.default_registry.get(category, name) is not fn:
        function_registry.default_registry.register(category, name)(fn)
