"""Tunix's reward managers (standard and agentic GRPO) whose rewards and metrics are the run's
RewardSet's (maxtext.input_pipeline.rewards.RewardSet.score: reward functions called by keyword,
weighted by reward_weights, a function's None counting nothing). The agentic one, like Tunix's, adds
each conversation's trajectory reward to it.

They reach the learners through Tunix's public reward-manager registry: `register` puts them there
under STANDARD and AGENTIC, which the learners' algorithm configs name (algorithm.py), and a learner
is given the run's RewardSet as its one reward function (`reward_fns=[reward_set]`), which Tunix hands
to the manager it builds.
"""

from __future__ import annotations

from typing import Any

from tunix.rl import function_registry, reward_manager

from maxtext.input_pipeline.rewards import NonFiniteReward, RewardSet
from maxtext.utils import shutdown

STANDARD = "maxtext-sequence-level"
AGENTIC = "maxtext-agentic-sequence-level"


class _Scored:
  """The RewardSet's scores as Tunix's manager's rewards and log_metrics (num_generations completions
  per group); built by Tunix as reward_manager_fn(reward_fns=[reward_set], algo_config=...)."""

  algo_config: Any

  def __init__(self, reward_fns, algo_config, **_):
    reward_set = reward_fns[0] if isinstance(reward_fns, (list, tuple)) and len(reward_fns) == 1 else reward_fns
    if not isinstance(reward_set, RewardSet):
      raise TypeError(f"{type(self).__name__}: reward_fns {reward_fns!r}; expected [RewardSet]")
    super().__init__(list(reward_set.functions), algo_config)  # type: ignore[call-arg]
    self.reward_set = reward_set

  def _compute_rewards(self, prompts, completions, **kwargs) -> dict[str, Any]:
    """A non-finite reward stops the run here, before any update is made of it: NonFiniteError naming
    the reward, its step 0 (the training run names the step it stopped at)."""
    try:
      scores, metrics = self.reward_set.score(
        list(prompts), list(completions), kwargs, self.algo_config.num_generations
      )
    except NonFiniteReward as e:
      raise shutdown.NonFiniteError(e.name, 0) from None
    return {"rewards": scores, "log_metrics": metrics}


class StandardRewardManager(_Scored, reward_manager.SequenceRewardManager):
  """Standard GRPO's and PPO's."""


class AgenticRewardManager(_Scored, reward_manager.AgenticSequenceRewardManager):
  """Agentic GRPO's (the call's trajectory_rewards are added)."""


def register() -> None:
  """Puts both managers in Tunix's registry under STANDARD and AGENTIC (idempotent)."""
  registry = function_registry.default_registry
  for name, manager in ((STANDARD, StandardRewardManager), (AGENTIC, AgenticRewardManager)):
    held = registry.list_functions("reward_manager")
    if name not in held or registry.get("reward_manager", name) is not manager:
      registry.register("reward_manager", name)(manager)
