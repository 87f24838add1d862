"""Libraries' log records that never apply to this program's runs, kept off the console.

Each entry is (logger, the message's start or its %-template's start, why it does not apply). A record
is dropped only where both match; every other record, these libraries' other warnings included, is
shown as logged.
"""

from __future__ import annotations

import logging

NOT_APPLICABLE = (
  ("absl", "Skipping non-TPU device", "Tunix's TPU memory probe; this program measures memory itself (footprint.py)"),
  ("absl", "No reward_fn provided", "Tunix's agentic environments; agentic rewards are scored by the learner"),
  (
    "absl",
    "Metadata file does not exist",
    "Orbax reading the checkpoints Tunix writes without that file; they resume whole (run_folder.py checks them)",
  ),
  (
    "absl",
    'Item "%s" was found in the checkpoint, but could not',
    "Tunix's checkpoint manager, restoring the actor from a PPO run's checkpoint, has no handler for the "
    "critic's items (critic_params, critic_optimizer_state), which the PPO learner restores",
  ),
)


class NotApplicable(logging.Filter):
  """Drops the records NOT_APPLICABLE names."""

  def filter(self, record: logging.LogRecord) -> bool:
    texts = (record.getMessage(), str(record.msg))
    return not any(
      record.name == name and any(text.startswith(start) for text in texts) for name, start, _ in NOT_APPLICABLE
    )


def install() -> None:
  """Adds the filter to the root logger's handlers (after logging.basicConfig)."""
  for handler in logging.getLogger().handlers:
    handler.addFilter(NotApplicable())
