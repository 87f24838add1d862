"""A training run's folder, base_output_directory/run_name: who writes it, what a rerun resumes
from and with which settings, what a stop keeps, and the evaluations it has written.

    run.lock  config.yml  metrics.jsonl  eval.json  checkpoints/actor/<update>/  checkpoints/set_aside/
    tensorboard/  report.md  plots/  hf/

One run writes a folder at a time: `locked` holds run.lock (maxtext.utils.folder_lock) for the whole
run. A rerun must keep the settings that shape training (`check_config`), and a local folder must
have room for two checkpoints (`check_space`). Checkpoints are named by optimizer update
(rl.num_iterations per training step); metrics rows and evaluations by training step. Process 0
takes the lock and writes and moves the files, and the other processes of a job learn what it
found; Orbax checkpoints are written by every process.

On a bucket (gs://), Orbax writes the checkpoints there; the other files are written to a local copy
of the folder (`path`), fetched from the bucket at start by every process (but hf/, an earlier
export the run rewrites at its end) and uploaded by process 0
whenever `save` is called (between training steps and at the end), so a rerun resumes from what the
bucket holds.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from typing import Any

from maxtext.checkpoint_conversion import orbax_checkpoint
from maxtext.configs import config_yml, sections
from maxtext.configs.run_config import RunConfig
from maxtext.rl import episode
from maxtext.utils import distributed, errors, folder_lock, metrics_file, safe_files, storage
from maxtext.utils.steps import Steps

log = logging.getLogger(__name__)

# Keys a rerun may set otherwise and still resume: where the run writes and what it reports, the
# evaluation, the device layout, recomputation, the decode chunk, and where and to whom the policy is
# served. Every other key shapes the training trajectory (model and weights, data, template and rewards,
# algorithm, optimizer, batch shape and steps, sampling, seeds): a rerun that sets one otherwise is
# refused unless resume_with_changes=true.
RESUMABLE_KEYS = (
  *sections.yaml_keys(sections.RunSection).values(),
  *sections.yaml_keys(sections.EvalSection).values(),
  *sections.yaml_keys(sections.MeshSection).values(),
  "eval_dataset_name",
  "eval_split",
  "remat_policy",
  "decode_steps_per_dispatch",
  "math_verify_num_procs",
  "prompt",
  *sections.SECRET_KEYS,  # never written down, so never compared
  "rl.agent_host",
  "rl.agent_port",
  "rl.agent_sessionless",
)


def trajectory_changes(saved: dict[str, Any], config: RunConfig) -> list[tuple[str, Any, Any]]:
  """(key, saved value, value in config) of each key outside RESUMABLE_KEYS that `config` sets
  otherwise than a run's config.yml, `saved` (config_yml.read_written's values); a key only one of them has
  (config.yml written by another version) is not compared."""
  new = config_yml.written_values(config)
  return [(k, saved[k], new[k]) for k in new if k in saved and k not in RESUMABLE_KEYS and saved[k] != new[k]]


@contextlib.contextmanager
def locked(run: sections.RunSection) -> Iterator[None]:
  """Holds the lock of the run folder run.run_dir while the block runs: process 0 checks that it can
  write the folder and takes the lock, and every process raises the InputError naming the folder
  (and its holder when another run holds it). distributed.initialize() must have run."""
  lock, refused = None, None
  if distributed.is_main():
    try:
      storage.check_writable("base_output_directory", run.base_output_directory, run.run_dir)
      lock = folder_lock.acquire(run.run_dir)
    except errors.InputError as e:
      refused = str(e)
    except OSError as e:  # run.lock itself not writable (another user's), say
      refused = f"run folder {run.run_dir}: cannot take its lock {folder_lock.NAME} ({e})"
  refused = distributed.main_object(refused)
  if refused:
    raise errors.InputError(refused)
  try:
    yield
  finally:
    if lock:
      lock.release()


def _agreed(message: str | None) -> None:
  """Raises process 0's ConfigError `message` (None: none) on every process; every process calls it."""
  message = distributed.main_object(message)
  if message:
    raise errors.ConfigError(message)


class RunFolder:
  """The run folder, run.run_dir; `steps` says how its checkpoints' updates map to training steps."""

  def __init__(self, run: sections.RunSection, steps: Steps):
    """The folder of a run that holds it (`locked`, which refuses one that cannot be written)."""
    self.url = run.run_dir
    self.path = self.url
    if storage.is_url(self.url):
      self.path = tempfile.mkdtemp(prefix="maxtext-run-")
      atexit.register(shutil.rmtree, self.path, ignore_errors=True)
      if storage.exists("base_output_directory", self.url):
        # Neither Orbax's checkpoints, an earlier HF export (rewritten at the end) nor the lock is read locally.
        skip = ("checkpoints", "hf", folder_lock.NAME)
        storage.download("base_output_directory", self.url, self.path, skip=skip)
    self.base = run.base_output_directory
    self.checkpoints = storage.join(self.url, "checkpoints")
    self.config = os.path.join(self.path, "config.yml")
    self._history: list[str] = []  # comment lines of config.yml: the changes earlier reruns resumed with
    self.metrics = os.path.join(self.path, "metrics.jsonl")
    self.episodes = os.path.join(self.path, "episodes.jsonl")  # every step's episodes (rl/episode.py)
    self._pending_metrics = metrics_file.pending(self.metrics)
    self.evaluations = os.path.join(self.path, "eval.json")
    self._actor = storage.join(self.checkpoints, "actor")
    self._set_aside = storage.join(self.checkpoints, "set_aside")
    self._steps = steps
    self._in_bucket = self._local_files() if self.path != self.url else {}  # as fetched
    self.uploaded_steps: set[int] = set()  # on a bucket: the steps whose metrics rows the last save uploaded
    self.lost = False  # on a bucket: whether it stopped answering (a save found it unreachable)

  def _local_files(self) -> dict[str, tuple[int, int]]:
    """Relative path -> (size, mtime) of the files in the local copy."""
    files = {}
    for root, _, names in os.walk(self.path):
      for name in names:
        stat = os.stat(os.path.join(root, name))
        files[os.path.relpath(os.path.join(root, name), self.path)] = (stat.st_size, stat.st_mtime_ns)
    return files

  def save(self) -> None:
    """On a bucket, makes the bucket's files (but checkpoints/) those of the local copy: uploads the
    ones that changed since the last call and deletes the ones removed (process 0). Once a save
    found the bucket unreachable (storage.unreachable; `lost` is then set), later calls do nothing."""
    if self.path == self.url or not distributed.is_main() or self.lost:
      return
    now = self._local_files()
    try:
      for rel, stat in now.items():
        if self._in_bucket.get(rel) != stat:
          storage.upload(os.path.join(self.path, rel), storage.join(self.url, rel))
      for rel in self._in_bucket.keys() - now.keys():
        storage.remove(storage.join(self.url, rel))
    except Exception as e:
      self.lost = storage.unreachable(e)
      raise
    self._in_bucket = now
    self.uploaded_steps = set(metrics_file.logged_steps(self.metrics))

  def check_config(self, cfg: RunConfig) -> None:
    """Compares a rerun's config with the run's config.yml: a key that shapes training
    (trajectory_changes) set otherwise is a ConfigError naming each such key with its saved and its
    new value, unless run.resume_with_changes, when the changes are logged and the next config.yml
    records them in a comment line (after those of earlier reruns). A folder without config.yml
    takes any config."""
    message = None
    if distributed.is_main() and os.path.isfile(self.config):
      saved, self._history = config_yml.read_written(self.config)
      changes = trajectory_changes(saved, cfg)
      listed = "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in changes)
      if changes and not cfg.run.resume_with_changes:
        message = (
          f"run folder {self.url} holds a run whose config.yml sets keys that shape training otherwise ({listed}); "
          "rerun with its values to resume it, add resume_with_changes=true to resume it with these, or choose "
          "another run_name"
        )
      elif changes:
        log.warning("Resuming with changes (resume_with_changes=true): %s", listed)
        self._history.append(f"# {time.strftime('%Y-%m-%d %H:%M:%S %Z')}: resumed with changes: {listed}")
    _agreed(message)

  def check_space(self, checkpoint_bytes: int) -> None:
    """Refuses a run (ConfigError naming base_output_directory, the free and the needed bytes) whose
    local folder's filesystem cannot hold two checkpoints of `checkpoint_bytes`; a bucket is not
    checked."""
    message = None
    if distributed.is_main() and not storage.is_url(self.url):
      free, needed = storage.free_bytes(self.path), 2 * checkpoint_bytes
      if free < needed:
        message = (
          f"base_output_directory={self.base}: {free:,} bytes ({free / 1e9:.2f} GB) free on its filesystem, but "
          f"two checkpoints of this run (parameters and optimizer state) need {needed:,} bytes "
          f"({needed / 1e9:.2f} GB); free space or choose another base_output_directory"
        )
    _agreed(message)

  def write_config(self, cfg: RunConfig) -> None:
    """Writes config.yml (process 0, atomically), with the comment lines check_config kept and added;
    a run writes it only once nothing is left that could refuse its settings."""
    if not distributed.is_main():
      return
    os.makedirs(self.path, exist_ok=True)
    config_yml.write_yaml(cfg, self.config, self._history)
    self.save()

  def saved_steps(self) -> list[int]:
    """The training steps with a complete checkpoint, oldest first."""
    return [self._steps.done(u) for u in orbax_checkpoint.steps(self._actor) if self._steps.ends_step(u)]

  def logged_checkpoints(self) -> list[int]:
    """The training steps with a complete checkpoint whose steps all reached metrics.jsonl (or its
    pending rows), oldest first: the ones a rerun can resume from (process 0 reads metrics.jsonl)."""
    saved = self.saved_steps()
    logged = metrics_file.logged_steps(self.metrics) if saved else {}
    return [s for s in saved if all(k in logged for k in range(1, s + 1))]

  def drop_unfinished_checkpoints(self) -> int:
    """Deletes what a checkpoint save cut short left (process 0); returns the training step of the
    latest checkpoint a rerun can resume from (logged_checkpoints on process 0, whose metrics.jsonl
    the others do not read; 0: none)."""
    if not distributed.is_main():
      return max(self.saved_steps(), default=0)
    try:
      orbax_checkpoint.remove_unfinished(self._actor)
    except OSError as e:  # a save abandoned by a signal may still be writing there
      log.warning("What an unfinished checkpoint left is not all deleted (a rerun ignores it): %s", e)
    return max(self.logged_checkpoints(), default=0)

  def keep_checkpoints_through(self, step: int) -> list[int]:
    """Moves the checkpoints after training step `step` to checkpoints/set_aside/ (kept, not
    deleted), so Tunix's restore of the latest one finds `step`'s; returns the moved updates. Every
    process calls it; process 0 moves them."""
    moved = []
    if distributed.is_main():
      moved = orbax_checkpoint.set_aside(self._actor, self._steps.updates_in(step), self._set_aside)
    distributed.barrier("keep_checkpoints_through")
    return moved

  def resume(self) -> int:
    """Prepares a rerun to resume from the latest complete checkpoint whose steps all reached
    metrics.jsonl (a kill can land after a checkpoint but before its step's row was saved) and whose
    arrays all read back finite (orbax_checkpoint.unusable; an unusable one is named in a warning
    with the reason): newer checkpoints are set aside, metrics.jsonl is rewritten to hold exactly
    the rows through that step and episodes.jsonl its episodes, and the step is returned (0: a fresh
    run, whose folder may hold the rows of a run killed before its first checkpoint). Damaged metrics
    files are set aside first (metrics_file.logged_steps). Process 0 decides; every process returns
    its step. Tunix then restores the model, optimizer and step and fast-forwards the data."""
    step, saved = 0, []
    if distributed.is_main():
      saved = self.saved_steps()
      complete = self.logged_checkpoints() if saved else []
      while complete:
        reason = orbax_checkpoint.unusable(storage.join(self._actor, str(self._steps.updates_in(complete[-1]))))
        if reason is None:
          break
        log.warning("The checkpoint of step %d is set aside (checkpoints/set_aside/): %s", complete.pop(), reason)
      step = complete[-1] if complete else 0
    step = distributed.from_main(step)
    moved = self.keep_checkpoints_through(step)
    dropped = 0
    if distributed.is_main() and (step or os.path.exists(self.metrics) or os.path.exists(self._pending_metrics)):
      dropped = metrics_file.truncate_after(self.metrics, step)
    if distributed.is_main():
      episode.keep_through(self.episodes, step)
    self.save()
    if saved or dropped:  # process 0 logs it
      log.info(
        "Resuming from the checkpoint of step %d (newer checkpoints set aside: %s; %d later metrics rows dropped)",
        step,
        moved,
        dropped,
      )
    return step

  def check_layout(self, step: int, scan_layers: bool) -> None:
    """A run resumed at training step `step` keeps the decoder layout its checkpoint was written in
    (orbax_checkpoint.stacked_layers): another scan_layers is a ConfigError naming the key."""
    stacked = orbax_checkpoint.stacked_layers(storage.join(self._actor, str(self._steps.updates_in(step))))
    if stacked is not None and stacked != scan_layers:
      raise errors.ConfigError(
        f"scan_layers={str(scan_layers).lower()}: the run's checkpoints hold the decoder layers "
        f"{'stacked' if stacked else 'one per layer'} (written with scan_layers={str(stacked).lower()}); resume "
        f"with scan_layers={str(stacked).lower()}, or start a new run from them (load_parameters_path and "
        "lora_input_adapters_path load either layout)"
      )

  def check_shapes(self, step: int, ours: dict[str, tuple[int, ...]]) -> None:
    """A run resumed at training step `step` keeps the parameter shapes its checkpoint holds (the
    checkpoint's metadata is the evidence, with or without config.yml): a model whose parameter
    shapes (`ours`, orbax_checkpoint.param_shapes) differ is a ConfigError naming the first parameter
    that differs, both shapes and the count of others."""
    stored = orbax_checkpoint.stored_shapes(storage.join(self._actor, str(self._steps.updates_in(step))))
    differ = sorted(name for name in stored.keys() & ours.keys() if stored[name] != ours[name])
    if differ:
      first = differ[0]
      raise errors.ConfigError(
        f"run folder {self.url} holds checkpoints of another model: {first} is {list(stored[first])} there but "
        f"{list(ours[first])} in this config ({len(differ) - 1} more parameters differ); rerun with the run's model "
        "settings (emb_dim, mlp_dim, num_heads, ...) to resume it, or choose another run_name"
      )

  def previous_results(self, resumed: int) -> dict:
    """The evaluations a run resumed at step `resumed` keeps from eval.json: before training and
    during it up to that step (a fresh run starts empty). An eval.json that does not read back is
    set aside (safe_files.set_aside) and the run starts its evaluations afresh."""
    results: dict[str, Any] = {"before": None, "during": [], "after": None, "gain": None}
    if not (resumed and os.path.isfile(self.evaluations)):
      return results
    previous = None
    with open(self.evaluations, encoding="utf-8", errors="replace") as f, contextlib.suppress(ValueError):
      previous = json.load(f)
    during = previous.get("during") or [] if isinstance(previous, dict) else None
    if not (isinstance(during, list) and all(isinstance(d, dict) and isinstance(d.get("step"), int) for d in during)):
      if distributed.is_main():
        safe_files.set_aside(self.evaluations, "not the JSON of earlier evaluations; the evaluations start afresh")
      return results
    assert isinstance(previous, dict)
    results.update(before=previous.get("before"), during=[d for d in during if d["step"] <= resumed])
    return results

  def write_results(self, results: dict) -> None:
    """Writes eval.json (process 0), atomically."""
    if not distributed.is_main():
      return
    with safe_files.replaced(self.evaluations) as f:
      json.dump(results, f, indent=1)
    self.save()
