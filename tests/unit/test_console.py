"""The console: a line per trained step from its metrics row, and the libraries' log records that
never apply to these runs kept off it (and only those)."""

import inspect
import logging

from orbax.checkpoint._src.handlers import composite_checkpoint_handler
from orbax.checkpoint._src.metadata import checkpoint as orbax_metadata
from tunix.rl.agentic.environments import task_environment, tool_environment
from tunix.sft import utils as tunix_sft_utils

from maxtext.trainers.post_train.rl import progress
from maxtext.utils import log_filters


def test_a_step_line_has_step_reward_kl_loss_time_and_eta():
  lines = progress.StepLines(total=4)
  first = {"step": 1, "rewards/sum": 1.25, "kl": 0.0012, "loss": 0.5, "step_time_s": 42.0, "compile_s": 40.0}
  assert lines.line(first) == "step 1/4: reward 1.250, kl 0.0012, loss 0.5, 42 s (40 s of it compiling), ETA 6.0 s"
  second = {"step": 2, "reward": 2.0, "rewards/sum": 9.0, "kl": 0.002, "loss": 0.25, "step_time_s": 4.0, "compile_s": 0}
  # TRL's `reward` is preferred; the ETA is the steps' mean time less compiling: (2 + 4) / 2 x 2 steps left.
  assert lines.line(second) == "step 2/4: reward 2.000, kl 0.002, loss 0.25, 4.0 s, ETA 6.0 s"
  last = {"step": 4, "rewards/sum": 0.0, "step_time_s": 3725.0, "compile_s": 0.0}
  assert lines.line(last) == "step 4/4: reward 0.000, 1 h 02 min"


def test_only_the_records_that_never_apply_are_dropped():
  handler = logging.Handler()
  kept = []
  handler.emit = kept.append
  handler.addFilter(log_filters.NotApplicable())
  absl = logging.getLogger("absl")
  absl.addHandler(handler)
  try:
    absl.warning("Skipping non-TPU device: %s. You might be missing jax[tpu] dependency.", "cpu")
    absl.warning("No reward_fn provided, skipping trajectory reward computation.")
    absl.warning("Metadata file does not exist: /run/checkpoints/actor/2/model_params/_CHECKPOINT_METADATA")
    absl.warning("Some other warning of Orbax's")
    logging.getLogger("maxtext.x").addHandler(handler)
    logging.getLogger("maxtext.x").warning("No reward_fn provided (said by us)")
  finally:
    absl.removeHandler(handler)
    logging.getLogger("maxtext.x").removeHandler(handler)
  assert [r.getMessage() for r in kept] == ["Some other warning of Orbax's", "No reward_fn provided (said by us)"]


def test_the_filtered_messages_are_still_the_libraries_own():
  """Each filtered message is still written by the library it is filtered for, so none goes stale."""
  modules = (tunix_sft_utils, tool_environment, task_environment, orbax_metadata, composite_checkpoint_handler)
  sources = "".join(inspect.getsource(m) for m in modules)
  for _, start, _ in log_filters.NOT_APPLICABLE:
    assert start in sources, start
