"""The actor's checkpoint manager: Tunix's, with our Orbax manager in it.

Same items and layout as Tunix's (either restores the other's checkpoints); arrays are written
without compression (orbax_checkpoint.uncompressed_manager); every save request first goes to
`before_save`, and a save to a local folder without room for its arrays raises an ENOSPC OSError
before anything is written (orbax_checkpoint.check_room). Why: docs/decisions.md, "Uncompressed
checkpoints" and "Checkpoint room check".
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import orbax.checkpoint as ocp
from flax import nnx
from tunix.sft import checkpoint_manager

from maxtext.checkpoint_conversion import orbax_checkpoint
from maxtext.utils import storage


class CheckpointManager(checkpoint_manager.CheckpointManager):
  """Tunix's checkpoint manager writing uncompressed arrays, after before_save and a room check."""

  def __init__(
    self,
    root_directory: str,
    options: ocp.CheckpointManagerOptions,
    before_save: Callable[[int, nnx.Module, nnx.Optimizer | None], None] | None = None,
  ):
    """before_save(step, model, optimizer): called on every save request, before anything is
    written (also for steps the save policy skips); an exception it raises stops the save."""
    super().__init__(None, options)  # a disabled manager; it gets the Orbax manager built here
    self._before_save = before_save
    self._root = root_directory
    self._checkpoint_manager = orbax_checkpoint.uncompressed_manager(root_directory, options)

  def save(self, step, model, optimizer=None, save_only_lora_params=False, force=False, custom_metadata=None):
    """Tunix's save (same parameters), after before_save and the room check; every process of a job
    calls it alike and gets process 0's answer."""
    if self._before_save is not None:
      self._before_save(step, model, optimizer)
    if not storage.is_url(self._root) and (force or self._checkpoint_manager.should_save(step)):
      state = nnx.state(model, nnx.LoRAParam) if save_only_lora_params else nnx.state(model)
      arrays = jax.tree.leaves(state)
      if optimizer is not None:
        arrays += jax.tree.leaves(nnx.state(optimizer, nnx.optimizer.OptState))
      orbax_checkpoint.check_room(self._root, step, arrays)
    return super().save(step, model, optimizer, save_only_lora_params, force, custom_metadata)
