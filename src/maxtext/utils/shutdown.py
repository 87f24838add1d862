"""Stopping a run before its last step: SIGINT / SIGTERM, non-finite training values, a full disk.

The first SIGINT or SIGTERM asks the run to stop at the next step boundary (the finished steps are
checkpointed and their metrics flushed); a second one in a step abandons it at once (the saves
already under way land), and a third, sent while that is done, kills the process. While the run
stops or closes (its files being written) a signal is logged and the next one kills the process.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class RunStopped(Exception):
  """The run stopped before its last step; `exit_code` is what the command exits with."""

  exit_code = 1


class Interrupted(RunStopped):
  """A signal stopped the run after `step` finished steps."""

  def __init__(self, signum: int, step: int):
    self.signum, self.step, self.exit_code = signum, step, 128 + signum
    super().__init__(
      f"stopped by {signal.Signals(signum).name} after step {step}; the checkpoint of step {step} "
      "is saved: rerun the same command to resume"
    )


class NonFiniteError(RunStopped):
  """A training value (loss, KL, gradient norm, a reward, or the parameters after an update) was NaN
  or infinite at `step`; `kept` is the newest checkpoint, the one a rerun resumes from."""

  def __init__(self, name: str, step: int, kept: int | None = None):
    """kept: None where the checkpoints are still being settled (TrainingRun raises it again with it)."""
    self.name, self.step = name, step
    super().__init__(
      f"{name}: not finite at step {step}; stopped without saving it: a rerun resumes from the checkpoint "
      f"of step {kept}, the last good one"
    )


def _kept(step: int) -> str:
  return f"the checkpoint of step {step} is kept" if step else "no checkpoint was saved"


class Abandoned(RunStopped):
  """A second signal (or a SIGINT outside training) stopped the run at once; `when` says what it
  cut short (e.g. "during step 3, which is abandoned"; empty outside training) and `kept` is the
  checkpoint a rerun resumes from."""

  def __init__(self, signum: int, when: str, kept: int):
    self.exit_code = 128 + signum
    name = signal.Signals(signum).name
    what = f"a second {name} {when}" if when else name
    super().__init__(f"stopped by {what}; {_kept(kept)} with its metrics: rerun the same command to resume")


class DiskFull(RunStopped):
  """A write to the run folder `folder` (a checkpoint, metrics, evaluations, TensorBoard events, the
  report) found no space left on its device; `kept` is the checkpoint a rerun resumes from."""

  def __init__(self, folder: str, kept: int):
    super().__init__(
      f"no space left on the device of {folder}; {_kept(kept)} with its metrics, and nothing of an unfinished "
      "one: free space and rerun the same command to resume"
    )


class StorageLost(RunStopped):
  """The storage of the run folder `folder` (a bucket) stopped answering (`reason`, one line); `kept`
  is the newest checkpoint this run saved there with its steps' metrics uploaded."""

  def __init__(self, folder: str, reason: str, kept: int):
    super().__init__(
      f"the storage of {folder} stopped answering ({reason}); {_kept(kept)} there with its metrics: rerun the "
      "same command once it answers to resume"
    )


KEPT_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def handlers_kept():
  """Puts back the SIGINT, SIGTERM and SIGHUP handlers of the block's start when it ends: Tunix's
  agentic learner installs ones that kill the process (after flushing its trajectory log)."""
  kept = {s: signal.getsignal(s) for s in KEPT_SIGNALS}
  try:
    yield
  finally:
    if threading.current_thread() is threading.main_thread():
      for s, handler in kept.items():
        if handler is not None:  # None: installed outside Python, cannot be put back
          signal.signal(s, handler)


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _abandoned_tracebacks(record: logging.LogRecord) -> bool:
  """Once a second signal abandoned a step, Orbax's log records with a traceback (of the interrupted
  wait, or of the abandoned save failing in its threads) are kept for log level DEBUG only: the run's
  last line says what the signal abandoned and what was kept."""
  if record.exc_info is None:
    return True
  record.levelno, record.levelname = logging.DEBUG, "DEBUG"
  return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


@contextlib.contextmanager
def _handling(handler):
  """SIGINT and SIGTERM go to `handler` while the block runs (on the main thread)."""
  if threading.current_thread() is not threading.main_thread():
    yield
    return
  previous = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
  try:
    yield
  finally:
    for s, old in previous.items():
      signal.signal(s, old)


def signals_kill():
  """SIGINT and SIGTERM kill the process at once while the block runs (the cleanup after a second
  signal or a fault)."""
  return _handling(signal.SIG_DFL)


def _noted(signum, frame):
  del frame
  for s in STOP_SIGNALS:
    signal.signal(s, signal.SIG_DFL)
  log.warning(
    "%s received while the run is stopping or closing: it ends once its files are written (send it again to kill "
    "the process at once)",
    signal.Signals(signum).name,
  )


def signals_noted():
  """While the block runs (a run's files being written as it stops or ends), SIGINT or SIGTERM is
  logged and the next one kills the process: raising KeyboardInterrupt there would cut the writes
  short, or be swallowed (and printed) where it lands in a callback."""
  return _handling(_noted)


class GracefulStop:
  """Context manager that turns the first SIGINT/SIGTERM into a stop request (`signum`) and a second
  (`second`) into KeyboardInterrupt, after which a third kills the process. `progress` (set by the
  run: its steps trained) is read at the first signal into `first_at`."""

  SIGNALS = STOP_SIGNALS

  def __init__(self):
    self.signum: int | None = None
    self.second: int | None = None
    self.progress: Callable[[], int] | None = None
    self.first_at: int | None = None
    self._previous = {}

  def _handle(self, signum, frame):
    del frame
    if self.signum is not None:
      self.second = signum
      for s in self.SIGNALS:
        signal.signal(s, signal.SIG_DFL)
      logging.getLogger("absl").addFilter(_abandoned_tracebacks)
      raise KeyboardInterrupt(f"second {signal.Signals(signum).name}: abandoning the current step")
    self.signum = signum
    self.first_at = self.progress() if self.progress is not None else None
    log.warning(
      "%s received: stopping after the current step (send it again to abandon the step)", signal.Signals(signum).name
    )

  def __enter__(self) -> GracefulStop:
    if threading.current_thread() is threading.main_thread():
      self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}
    return self

  def __exit__(self, *exc) -> None:
    for s, handler in self._previous.items():
      signal.signal(s, handler)
    self._previous = {}
