"""The algorithm config of each learner (standard or agentic GRPO, PPO), every rl.* key it reads mapped to
Tunix's names."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from tunix.rl.agentic import agentic_grpo_learner
from tunix.rl.grpo import grpo_learner

from maxtext.configs.sections import AgenticSection, AlgorithmSection, SamplingSection
from maxtext.integration.tunix import losses, reward_manager

log = logging.getLogger(__name__)


@dataclasses.dataclass(kw_only=True)
class GRPOConfig(grpo_learner.GRPOConfig):
  """Tunix's standard GRPO config with the upper clipping epsilon its loss reads when present
  (docs/decisions.md, "Clip-higher in standard GRPO"), the dual-clip bound and entropy bonus our
  losses read (losses.py), and our reward manager (reward_manager.py)."""

  epsilon_high: float
  reward_manager: str = reward_manager.STANDARD
  epsilon_c: float | None = None  # None: no dual clip, as Tunix's losses read it
  entropy_coef: float = 0.0


@dataclasses.dataclass(kw_only=True)
class AgenticGRPOConfig(agentic_grpo_learner.GRPOConfig):
  """Tunix's agentic GRPO config with the dual-clip bound and entropy bonus our losses read (losses.py)
  and our reward manager (reward_manager.py)."""

  reward_manager: str = reward_manager.AGENTIC

  epsilon_c: float | None = None  # None: no dual clip, as Tunix's losses read it
  entropy_coef: float = 0.0


def _common(rl: AlgorithmSection) -> dict[str, Any]:
  """The fields of every learner's config, with the estimator, loss and reward manager they name
  registered."""
  losses.register()
  reward_manager.register()
  return dict(
    advantage_estimator=rl.advantage_estimator,
    policy_loss_fn=rl.policy_loss_fn,
    num_generations=rl.num_generations,
    num_iterations=rl.num_iterations,
    beta=rl.grpo_beta,
    kl_loss_mode=rl.kl_loss_mode,
    epsilon=rl.grpo_epsilon,
    epsilon_high=rl.grpo_epsilon if rl.epsilon_high < 0 else rl.epsilon_high,
    loss_algo=rl.loss_algo,
    loss_agg_mode=rl.loss_agg_mode,
    epsilon_c=rl.epsilon_c or None,
    entropy_coef=rl.entropy_coef,
  )


@dataclasses.dataclass(kw_only=True)
class PPOConfig(GRPOConfig):
  """The standard learner's config for PPO (rl.algorithm=ppo): GAE's discount and lambda, the KL penalty
  inside the reward (its coefficient, 0 for none, and KL estimate); any number
  of samples per prompt (Tunix's GRPOConfig refuses fewer than 2, which GRPO needs and PPO does not)."""

  gamma: float
  gae_lambda: float
  kl_in_reward_coef: float = 0.0
  kl_in_reward_method: str = "kl"

  def __post_init__(self):
    pass  # the choices of every field were checked with the run's config


def ppo_config(rl: AlgorithmSection) -> PPOConfig:
  """PPO's algorithm config: the standard learner's fields (its advantage estimator unused) with
  gamma, gae_lambda and the KL penalty inside the reward."""
  return PPOConfig(
    **_common(rl),
    gamma=rl.gamma,
    gae_lambda=rl.gae_lambda,
    kl_in_reward_coef=rl.kl_in_reward_coef,
    kl_in_reward_method=rl.kl_in_reward_method,
  )


def grpo_config(
  rl: AlgorithmSection, sampling: SamplingSection, agentic: AgenticSection | None = None, system_prompt: str = ""
) -> GRPOConfig | AgenticGRPOConfig:
  """The learner's algorithm config: agentic GRPO's (with the conversations' system prompt) when
  `agentic` says rl.use_agentic_rollout, else standard GRPO's; the estimator and loss it names are
  registered."""
  common = _common(rl)
  if agentic is None or not agentic.use_agentic_rollout:
    return GRPOConfig(**common)
  config = AgenticGRPOConfig(
    **{**common, "num_iterations": 1},  # agentic GRPO trains each batch once (rl.num_iterations: standard only)
    system_prompt=system_prompt,
    max_concurrency=agentic.max_concurrency,
    off_policy_steps=agentic.off_policy_steps,
    max_response_length=sampling.max_response_length,
    sampler_is=rl.sampler_is or None,
    sampler_is_threshold=rl.sampler_is_threshold,
    degenerate_group_masking=rl.filter_zero_variance_groups,
    use_rollout_logps=sampling.rollout_engine == "batched",
  )
  log.info("Agentic GRPO algorithm config: %s", config)
  return config
