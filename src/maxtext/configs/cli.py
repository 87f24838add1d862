"""The shared shape of our command-line programs: config from argv, logs on stderr, exit codes.

A job may return records; they are printed as JSON lines on stdout, which holds nothing else
(whatever the libraries print while the job runs goes to stderr). Exit 0 on success, 2 on a config
or input error (errors.InputError: one line naming the key or file, its traceback logged at DEBUG for
log_level=debug; any other exception keeps its traceback), 128 + N when signal N stopped a run (a SIGINT
the job does not handle: one line, "stopped: interrupted by SIGINT"), 1 when a
non-finite value, a full disk or a storage server that stopped answering did (one line, "stopped: ...").
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable

from absl import logging as absl_logging

from maxtext.configs import pyconfig
from maxtext.utils import errors, log_filters, shutdown, xla_flags


def print_help(program: str) -> None:
  print(
    f"usage: python -m {program} [config.yml] [key=value ...]\n\n"
    "Keys (dotted keys reach nested sections; defaults from configs/base.yml):"
  )
  for key, default, meaning in pyconfig.reference():
    print(f"  {key} = {default or '(see base.yml)'}\n      {meaning}")
  print(f"\nModels: {', '.join(pyconfig.known_models())}")


def reference_markdown() -> str:
  """The config reference as docs/configuration.md's Markdown table (`python -m maxtext.configs.cli` prints it)."""
  rows = ["| key | default | meaning |", "| --- | --- | --- |"]
  for key, default, meaning in pyconfig.reference():
    cell = f"`{default}`" if default else "(see base.yml)"
    rows.append(f"| `{key}` | {cell.replace('|', '&#124;')} | {meaning.replace('|', '&#124;')} |")
  return "\n".join(rows) + "\n"


def main(argv: list[str], job: Callable[[pyconfig.RunConfig], list[dict] | None]) -> int:
  xla_flags.use_sequential_cpu_scheduler()  # before JAX starts
  if any(a in ("-h", "--help") for a in argv[1:]):
    spec = getattr(sys.modules[job.__module__], "__spec__", None)
    print_help(spec.name if spec else job.__module__)
    return 0
  try:
    cfg = pyconfig.initialize(argv)
  except errors.InputError as e:
    print(f"config error: {e}", file=sys.stderr)
    return 2
  logging.basicConfig(
    level=cfg.run.log_level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
  )
  log_filters.install()
  # Tunix and Orbax log through absl at INFO in volume; keep them to warnings unless debugging.
  absl_logging.set_verbosity("debug" if cfg.run.log_level == "debug" else "warning")
  if cfg.run.jax_cache_dir:
    import jax

    jax.config.update("jax_compilation_cache_dir", os.path.expanduser(cfg.run.jax_cache_dir))
  try:
    cfg = pyconfig.with_local_inputs(cfg)
    with contextlib.redirect_stdout(sys.stderr):
      records = job(cfg)
  except errors.InputError as e:  # a config or input error; anything else keeps its traceback
    logging.getLogger(__name__).debug("the input error's traceback (log_level=debug):", exc_info=e)
    print(f"error: {e}", file=sys.stderr)
    return 2
  except shutdown.RunStopped as e:
    print(f"stopped: {e}", file=sys.stderr)
    return e.exit_code
  except KeyboardInterrupt as e:  # a SIGINT the job does not turn into a RunStopped (while loading, say)
    logging.getLogger(__name__).debug("the interrupt's traceback (log_level=debug):", exc_info=e)
    print("stopped: interrupted by SIGINT", file=sys.stderr)
    return 128 + signal.SIGINT
  for record in records or []:
    print(json.dumps(record, ensure_ascii=False))
  return 0


if __name__ == "__main__":
  print(reference_markdown(), end="")
