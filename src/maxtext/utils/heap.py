"""Giving freed heap memory back to the system.

On CPU, XLA allocates each step's temporaries (many of 1 to 8 MiB) with malloc; glibc keeps what is
freed in its heaps, spread over up to 8 arenas per core, and returns to the system only what sits at
a heap's top, so freed but kept pages add up over a run's training micro-batches (docs/decisions.md,
"Heap release"). `release()` hands them back
(glibc's malloc_trim); the trainer calls it before each micro-batch and after each step's training
(cluster.py), load_model after reading the weights, train_rl after every XLA compile (the compiler's
working memory, held through the first rollout otherwise). Elsewhere (no glibc) it
does nothing.
"""

from __future__ import annotations

import ctypes
import platform

import jax

_LIBC = ctypes.CDLL(None) if platform.libc_ver()[0] == "glibc" else None


def release() -> None:
  """Returns the free pages of every malloc arena to the system."""
  if _LIBC is not None:
    _LIBC.malloc_trim(0)


_COMPILED = "/jax/core/compile/backend_compile_duration"


def release_after_compiling() -> None:
  """Calls release() after every XLA compile from now on in this process (once, however often called)."""
  try:
    jax.monitoring.unregister_event_duration_listener(_after_compile)
  except AssertionError:  # not registered
    pass
  jax.monitoring.register_event_duration_secs_listener(_after_compile)


def _after_compile(event: str, duration_secs: float, **kwargs) -> None:
  del duration_secs, kwargs
  if event == _COMPILED:
    release()
