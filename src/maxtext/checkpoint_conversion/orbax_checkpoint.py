"""Orbax parameter checkpoints in the layout train_rl writes: `<root>/<step>/model_params`, in a
local folder or on a bucket (gs://).

train_rl's checkpoints (through Tunix; the manager is integration/tunix/cluster.py's CheckpointManager) and
`to_maxtext` share this layout, so either loads through `load_parameters_path`.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx
from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

from maxtext.utils import distributed, errors, storage

PARAMS_ITEM = "model_params"  # the item Tunix's manager saves the model's parameters as
# The items of arrays a step may hold beside the parameters: the optimizer's state and, in a PPO run,
# the critic's parameters and optimizer state.
CRITIC_ITEMS = ("critic_params", "critic_optimizer_state")  # its parameters, its optimizer state
OPTIONAL_ITEMS = ("optimizer_state", *CRITIC_ITEMS)

# TensorStore's requests to GCS, in the contexts Orbax builds, give up as gcsfs's do (storage.py):
# 5 retries backing off 1 to 16 s, rather than 32 retries backing off up to 32 s (some 15 minutes).
storage.bound_requests()
logging.getLogger("absl").addFilter(storage.fault_tracebacks)  # Orbax logs a failed background save
for _context in (ts_utils._BASE_TS_CONTEXT, ts_utils._DEFAULT_OCDBT_TS_CONTEXT):
  _context["gcs_request_retries"] = {"max_retries": storage.RETRIES - 1, "initial_delay": "1s", "max_delay": "16s"}


def uncompressed_manager(root_directory: str, options: ocp.CheckpointManagerOptions) -> ocp.CheckpointManager:
  """An Orbax manager with Tunix's items (model_params, optimizer_state, custom_metadata) and a PPO
  run's critic (critic_params, critic_optimizer_state), whose arrays are written without zstd
  compression (read back like compressed ones), with OCDBT except on Pathways (as Tunix's)."""
  use_ocdbt = "proxy" not in os.getenv("JAX_PLATFORMS", "")
  arrays = lambda: ocp.PyTreeCheckpointHandler(use_ocdbt=use_ocdbt, use_compression=False)
  return ocp.CheckpointManager(
    root_directory,
    options=options,
    item_handlers={
      PARAMS_ITEM: arrays(),
      **{item: arrays() for item in OPTIONAL_ITEMS},
      "custom_metadata": ocp.JsonCheckpointHandler(),
    },
  )


def check_room(root: str, step: int, arrays: list) -> None:
  """Raises an ENOSPC OSError, before anything is written, when the local filesystem of `root` has
  less room than `arrays` take (the checkpoint of `step`). Every process of a job calls it alike and
  gets process 0's answer."""
  needed = sum(a.nbytes for a in arrays)
  free = distributed.main_object(storage.free_bytes(root) if distributed.is_main() else 0)
  if free < needed:
    raise OSError(
      errno.ENOSPC, f"No space left on device for the checkpoint of step {step} ({needed:,} bytes; {free:,} free)", root
    )


def _path(path: str) -> epath.Path:
  """Orbax reads and writes only absolute paths; a gs:// URL is one."""
  storage.use_emulator()
  return epath.Path(storage.join(path))


def save_params(root: str, model: nnx.Module, step: int = 0) -> str:
  """Writes the model's parameters as step `step` under `root`, as the actor's checkpoint manager
  saves them (uncompressed, after the room check of a local folder); returns the step folder."""
  directory = str(_path(root))
  params = nnx.state(model)
  if not storage.is_url(directory):
    check_room(directory, step, jax.tree.leaves(params))
  manager = uncompressed_manager(directory, ocp.CheckpointManagerOptions(max_to_keep=None))
  item = ocp.args.PyTreeSave(item=params, save_args=jax.tree.map(lambda _: ocp.SaveArgs(), params))
  manager.save(step, args=ocp.args.Composite(**{PARAMS_ITEM: item}), custom_metadata={}, force=True)  # as Tunix saves
  manager.close()
  return str(_path(root) / str(step))


def steps(root: str) -> list[int]:
  """The complete steps under a checkpoint root, oldest first (a save cut short leaves a temporary
  folder, or on a bucket a step folder without Orbax's commit marker: neither is a step)."""
  folder = _path(root)
  if not folder.is_dir():
    return []
  return sorted(
    int(d.name)
    for d in folder.iterdir()
    if d.name.isdigit() and (d / PARAMS_ITEM).is_dir() and ocp.step.is_path_finalized(d)
  )


def set_aside(root: str, after: int, folder: str) -> list[int]:
  """Moves the steps newer than `after` from root into folder (kept, not deleted), so a restore of
  the latest step finds `after`."""
  moved = [s for s in steps(root) if s > after]
  for s in moved:
    storage.move(str(_path(root) / str(s)), str(_path(folder) / f"{s}_{int(time.time())}"))
  return moved


def _process_local_checkpointer() -> ocp.Checkpointer:
  """A checkpointer whose reads wait for no other process: Orbax's default one ends each restore at a
  barrier of every process, a collective that a read by one process alone pairs with whatever
  collective the others run next."""
  local = ocp.options.MultiprocessingOptions(primary_host=jax.process_index(), active_processes={jax.process_index()})
  return ocp.Checkpointer(ocp.PyTreeCheckpointHandler(multiprocessing_options=local), multiprocessing_options=local)


def unusable(step_dir: str, batch_bytes: int = 1 << 30) -> str | None:
  """Why the arrays a step folder holds cannot be resumed from (an item or array that does not read
  back in full, or a NaN or infinity in a floating-point one), or None when every array reads back
  finite. Reads on the host, a batch of arrays of at most batch_bytes (or one larger array) at a time,
  in this process alone (another process may be doing something else meanwhile)."""
  checkpointer = _process_local_checkpointer()
  for item in (PARAMS_ITEM, *OPTIONAL_ITEMS):
    folder = _path(step_dir) / item
    if item != PARAMS_ITEM and not folder.is_dir():
      continue  # a parameters-only checkpoint (to_maxtext's), or a GRPO run's (no critic)
    try:
      leaves = jax.tree_util.tree_flatten_with_path(checkpointer.metadata(str(folder)).item_metadata.tree)[0]
      for batch in _batches(leaves, batch_bytes):
        tree = _nested(batch)
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        restored = checkpointer.restore(
          str(folder), args=ocp.args.PyTreeRestore(item=tree, restore_args=as_numpy, partial_restore=True)
        )
        for keys, value in jax.tree_util.tree_flatten_with_path(restored)[0]:
          value = np.asarray(value)
          if np.issubdtype(value.dtype, np.inexact) and not np.isfinite(value).all():
            return f"{item}/{'/'.join(str(_key(k)) for k in keys)} holds NaN or infinite values"
    except Exception as e:  # noqa: BLE001 (whatever a damaged checkpoint makes Orbax or TensorStore raise)
      return f"{item} does not read back: {type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
  return None


def _batches(leaves: list, batch_bytes: int):
  """(path, metadata) leaves in consecutive batches of at most batch_bytes of arrays (or one array)."""
  batch: list = []
  size = 0
  for path, meta in leaves:
    nbytes = int(np.prod(meta.shape)) * np.dtype(meta.dtype).itemsize
    if batch and size + nbytes > batch_bytes:
      yield batch
      batch, size = [], 0
    batch.append((path, meta))
    size += nbytes
  if batch:
    yield batch


def _nested(leaves: list) -> dict:
  """The nested dict that holds each (path of dict keys, value)."""
  tree: dict = {}
  for path, value in leaves:
    node = tree
    for key in path[:-1]:
      node = node.setdefault(_key(key), {})
    node[_key(path[-1])] = value
  return tree


def _key(entry):
  """A pytree path entry's dict key or sequence index (Orbax's metadata trees hold both)."""
  return getattr(entry, "key", getattr(entry, "idx", entry))


def remove_unfinished(root: str) -> None:
  """Deletes the saves cut short under a checkpoint root (which `steps` does not count): temporary
  step folders, and on a bucket step folders without Orbax's commit marker."""
  folder = _path(root)
  if not folder.is_dir():
    return
  finished = {str(s) for s in steps(root)}
  for d in folder.iterdir():
    if re.fullmatch(r"\d+(\.orbax-checkpoint-tmp.*)?", d.name) and d.name not in finished:
      d.rmtree()


def is_orbax_checkpoint(path: str) -> bool:
  folder = _path(path)
  return folder.is_dir() and (
    (folder / PARAMS_ITEM).is_dir() or bool(steps(str(folder))) or (folder / "actor").is_dir()
  )


def resolve(path: str) -> str:
  """The model_params folder of a step folder, or of the latest step under a checkpoint root
  (a run's checkpoints/ folder holds the policy under actor/)."""
  folder = _path(path)
  if (folder / PARAMS_ITEM).is_dir():
    return str(folder / PARAMS_ITEM)
  if (folder / "actor").is_dir():
    return resolve(str(folder / "actor"))
  saved = steps(str(folder))
  if not saved:
    raise errors.MissingInputError(f"{folder}: no Orbax checkpoint (expected <step>/{PARAMS_ITEM} folders)")
  return str(folder / str(saved[-1]) / PARAMS_ITEM)


def stacked_layers(path: str) -> bool | None:
  """Whether the decoder layers' parameters saved at `path` (a step or checkpoint root, as
  restore_arrays reads it) are stacked, as a scan_layers=true decoder holds them, rather than one per
  layer; None when it holds no layers' parameters. Reads the checkpoint's metadata only."""
  layers = ocp.PyTreeCheckpointer().metadata(resolve(path)).item_metadata.tree.get("layers")
  if not isinstance(layers, dict) or not layers:
    return None
  return not all(str(key).isdigit() for key in layers)


def stored_shapes(path: str) -> dict[str, tuple[int, ...]]:
  """Dotted parameter name -> shape of each array saved at `path` (a step or checkpoint root, as
  restore_arrays reads it), from the checkpoint's metadata only."""
  tree = ocp.PyTreeCheckpointer().metadata(resolve(path)).item_metadata.tree
  named = (((keys[:-1] if keys[-1] == "value" else keys), meta) for keys, meta in _flatten(tree))  # nnx's value field
  return {".".join(keys): tuple(meta.shape) for keys, meta in named if hasattr(meta, "shape")}


def param_shapes(model: nnx.Module) -> dict[str, tuple[int, ...]]:
  """Dotted parameter name -> shape of a model's parameters, named as stored_shapes names them."""
  tree = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  return {".".join(keys): tuple(value.shape) for keys, value in _flatten(tree)}


def _flatten(tree, prefix=()):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _flatten(value, prefix + (str(key),))
    else:
      yield prefix + (str(key),), value


def restore_arrays(path: str) -> dict[str, np.ndarray]:
  """Dotted parameter name -> host array, as saved."""
  folder = resolve(path)
  checkpointer = ocp.PyTreeCheckpointer()
  metadata = checkpointer.metadata(folder).item_metadata.tree
  as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
  tree = checkpointer.restore(folder, args=ocp.args.PyTreeRestore(restore_args=as_numpy))
  out = {}
  for keys, value in _flatten(tree):
    keys = keys[:-1] if keys[-1] == "value" else keys  # nnx.Variable leaves are saved as {"value": ...}
    out[".".join(keys)] = np.asarray(value)
  return out
