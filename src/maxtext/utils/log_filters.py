"""Libraries' log records that never apply to this program's runs, kept off the console.

Each entry is (logger, the message's start, why it does not apply). A record is dropped only where
both match; every other record, these libraries' other warnings included, is shown as logged.
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
  *(
    (
      "absl",
      f'Item "{item}" was found in the checkpoint, but could not be restored',
      "Tunix restoring the actor from a PPO run's checkpoint; the PPO learner restores the critic's items",
    )
    for item in ("critic_params", "critic_optimizer_state")
  ),
)


class NotApplicable(logging.Filter):
  """Drops the records NOT_APPLICABLE names."""

  def filter(self, record: logging.LogRecord) -> bool:
    message = record.getMessage()
    return not any(record.name == name and message.startswith(start) for name, start, _ in NOT_APPLICABLE)


def install() -> None:
  """Adds the filter to the root logger's handlers (after logging.basicConfig)."""
  for handler in logging.getLogger().handlers:
    handler.addFilter(NotApplicable())
