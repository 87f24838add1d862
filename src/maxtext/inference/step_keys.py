"""Sampling keys of the rollout engines: a fresh key for every generation call, reproducible across
a resume and independent of the order in which concurrent calls arrive."""

from __future__ import annotations

import threading
from collections.abc import Callable

import jax


class StepKeys:
  """Sampling keys of an engine's calls that bring no key of their own (rollout config seed None):
  `next()` draws fold_in(fold_in(seed, training step), call within that step), so a resumed run
  draws what an uninterrupted one would. `step_source` returns the training step (RLCluster's
  global step).

  A caller that names its draws computes their key itself with `for_request(*ids)`, a pure function
  of the seed and the ids, and passes it in the call's rollout config: the agentic learner names each
  model turn by (group, dynamic sampling round, sample, turn), so its draws depend neither on the
  order in which its threads' calls arrive nor on the process that makes them."""

  def __init__(self, seed: int):
    self._seed = seed
    self.step_source: Callable[[], int] = lambda: 0
    self._step = 0
    self._calls = 0
    self._lock = threading.Lock()

  def for_request(self, *ids: int) -> jax.Array:
    """fold_in(seed, *ids): the key of the call named by ids, whatever calls came before it."""
    key = jax.random.PRNGKey(self._seed)
    for i in ids:
      key = jax.random.fold_in(key, i)
    return key

  def next(self) -> jax.Array:
    """The key of the next unnamed call of the current training step."""
    with self._lock:
      step = self.step_source()
      if step != self._step:
        self._step, self._calls = step, 0
      self._calls += 1
      call = self._calls - 1
    return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(self._seed), step), call)
