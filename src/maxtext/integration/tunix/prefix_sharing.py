"""Both learners' policy loss with each GRPO group's prompt scored once (models/shared_prefix.py).

Tunix lays a batch out as each prompt's num_generations samples in a row (the standard learner
repeats every prompt, the agentic learner concatenates whole groups) and cuts micro-batches at whole
groups; the learners check every batch for that layout (check_groups) before it reaches the loss.
"""

from __future__ import annotations

import numpy as np

from maxtext.models.shared_prefix import SharedPrefix


class SharedPrefixLoss:
  """Tunix's policy loss called with the model wrapped in SharedPrefix."""

  def __init__(self, policy_loss, group: int):
    self.policy_loss, self.group = policy_loss, group

  def __call__(self, model, train_example, algo_config):
    shared = SharedPrefix(model, train_example.prompt_ids.shape[1], self.group)
    return self.policy_loss(shared, train_example, algo_config)


def install(trainer, group: int) -> None:
  """Wraps the loss Tunix's learner gave its actor trainer (the learner's __init__ sets it)."""
  trainer.with_loss_fn(SharedPrefixLoss(trainer.loss_fn, group), has_aux=True)


def check_groups(prompt_ids, group: int) -> None:
  """Raises unless the rows of prompt_ids [B, P] come in runs of `group` equal prompts."""
  prompts = np.asarray(prompt_ids)
  if len(prompts) % group or not (prompts.reshape(-1, group, prompts.shape[1]) == prompts[::group, None]).all():
    raise RuntimeError(
      f"a batch of {len(prompts)} samples does not hold each prompt {group} times in a row; the "
      "shared-prefix GRPO loss needs that layout"
    )
