"""XLA settings a program applies before JAX starts its backend (XLA reads XLA_FLAGS then)."""

from __future__ import annotations

import os

_CPU_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"


def use_sequential_cpu_scheduler() -> None:
  """Gives XLA's CPU backend its sequential, memory-aware scheduler unless XLA_FLAGS already sets the
  flag (why: docs/decisions.md, "Sequential CPU scheduler"). Takes effect only when called before
  JAX computes anything; the command-line programs call it first."""
  flags = os.environ.get("XLA_FLAGS", "")
  if _CPU_SCHEDULER_FLAG not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {_CPU_SCHEDULER_FLAG}=false".strip()
