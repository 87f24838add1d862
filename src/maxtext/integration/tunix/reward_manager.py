"""Tunix's reward managers (standard and agentic GRPO) whose rewards and metrics are the run's
RewardSet's (maxtext.input_pipeline.rewards.RewardSet.score: reward functions called by keyword,
weighted by reward_weights, a function's None counting nothing). The agentic one, like Tunix's, adds
each conversation's trajectory reward to it. The learners put one in place of the manager Tunix builds.
"""

from __future__ import annotations

from typing import Any

from tunix.rl import reward_manager

from maxtext.input_pipeline.rewards import RewardSet


class _Scored:
  """The RewardSet's scores as Tunix's manager's rewards and log_metrics (num_generations completions
  per group)."""

  algo_config: Any

  def __init__(self, rewards: RewardSet, algo_config):
    super().__init__(list(rewards.functions), algo_config)  # type: ignore[call-arg]
    self.reward_set = rewards

  def _compute_rewards(self, prompts, completions, **kwargs) -> dict[str, Any]:
    scores, metrics = self.reward_set.score(list(prompts), list(completions), kwargs, self.algo_config.num_generations)
    return {"rewards": scores, "log_metrics": metrics}


class StandardRewardManager(_Scored, reward_manager.SequenceRewardManager):
  """Standard GRPO's."""


class AgenticRewardManager(_Scored, reward_manager.AgenticSequenceRewardManager):
  """Agentic GRPO's (the call's trajectory_rewards are added)."""
