"""Sampling keys of the rollout engines: a fresh key for every generation call, reproducible across
a resume and independent of the order in which concurrent calls arrive."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

import jax


class StepKeys:
  """Sampling keys: fold_in(fold_in(seed, training step), call within that step), so a resumed run
  draws what an uninterrupted one would. `step_source` returns the training step (RLCluster's global
  step). Within `request(ids)` a thread draws fold_in(seed, *ids) instead: the agentic learner names
  each model turn by (group, sample, turn), so its draws do not depend on the order in which its
  threads' calls arrive (nor on the process that makes them)."""

  def __init__(self, seed: int):
    self._seed = seed
    self.step_source: Callable[[], int] = lambda: 0
    self._step = 0
    self._calls = 0
    self._lock = threading.Lock()
    self._request = threading.local()

  @contextlib.contextmanager
  def request(self, *ids: int):
    self._request.ids = ids
    try:
      yield
    finally:
      self._request.ids = None

  def next(self) -> jax.Array:
    ids = getattr(self._request, "ids", None)
    if ids is not None:
      key = jax.random.PRNGKey(self._seed)
      for i in ids:
        key = jax.random.fold_in(key, i)
      return key
    with self._lock:
      step = self.step_source()
      if step != self._step:
        self._step, self._calls = step, 0
      self._calls += 1
      call = self._calls - 1
    return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(self._seed), step), call)
