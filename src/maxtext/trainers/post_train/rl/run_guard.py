"""The run guard: what stops training at a step boundary before its last step.

Fed by the step: `observe(name, step, values)` gets every training scalar as it is logged (the
metric sinks hand it each one, on the process that writes metrics.jsonl) and keeps the first NaN
or infinite loss, KL, gradient norm or reward. `between_steps` raises shutdown.NonFiniteError for
such a value and shutdown.Interrupted for a signal to any process (`stop`, entered around
training); `check_update` raises NonFiniteError also when the updated parameters or optimizer state
are not finite. Every process takes the same branch: each one's flags are gathered. The errors are
raised out of Tunix's training loop, which has no other way out; what the run then keeps is the
caller's (TrainingRun).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from maxtext.utils import distributed, shutdown
from maxtext.utils.steps import Steps

_UNNAMED = "a watched value (see process 0)"  # what other processes call process 0's find


def watched(name: str) -> bool:
  """Metrics whose NaN or infinity stops a run: the loss, the KL, the gradient norm and the rewards."""
  return name in ("loss", "kl", "grad_norm") or name.startswith("rewards/")


def _aggregate(name: str) -> bool:
  """The summaries over reward functions (rewards/mean, rewards/std, rewards/score/max, ...)."""
  return name.startswith("rewards/") and name.rsplit("/", 1)[1] in ("sum", "std", "mean", "min", "max")


@jax.jit
def _all_finite(leaves: list) -> jax.Array:
  checks = [jnp.isfinite(x).all() for x in leaves if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.stack(checks).all() if checks else jnp.array(True)


def all_finite(tree) -> bool:
  """True when every floating-point array in the pytree is free of NaN and infinity (one compiled
  reduction; integer arrays, such as step counters, are skipped). Every process of a multi-process
  job gets the same answer for global arrays."""
  return bool(_all_finite(jax.tree.leaves(tree)))


class RunGuard:
  """See the module docstring. `steps`: the run's steps and their optimizer updates."""

  def __init__(self, steps: Steps):
    self.steps = steps
    self.stop = shutdown.GracefulStop()
    self.first_nonfinite: tuple[str, int] | None = None  # (metric, step) of the first non-finite watched value

  def observe(self, name: str, step: int, values: np.ndarray) -> None:
    """A training scalar `name` of `step` was logged; at one step a reward function's own name is
    kept rather than an aggregate of them."""
    if watched(name) and values.size and not np.isfinite(values).all():
      first = self.first_nonfinite
      if first is None or (first[1] == step and _aggregate(first[0]) and not _aggregate(name)):
        self.first_nonfinite = (name, step)

  def between_steps(self, steps_done: int) -> None:
    """Raises NonFiniteError on a non-finite value logged so far (on any process), else Interrupted
    on a signal to any process."""
    bad = self.first_nonfinite
    flags = distributed.gather(np.array([bad[1] if bad else 0, self.stop.signum or 0]))
    step, signum = int(flags[0, 0]), int(flags[:, 1].max())
    if step:
      raise shutdown.NonFiniteError(bad[0] if bad else _UNNAMED, step)
    if signum:
      raise shutdown.Interrupted(signum, steps_done)

  def check_update(self, update: int, model: nnx.Module, optimizer: nnx.Optimizer | None) -> None:
    """Raises NonFiniteError, before optimizer update `update` is saved, when a watched value logged
    so far or the updated parameters or optimizer state are not finite."""
    bad = self.first_nonfinite
    state = (nnx.state(model, nnx.Param), nnx.state(optimizer, nnx.optimizer.OptState) if optimizer else None)
    finite = all_finite(state)
    step = int(distributed.gather(np.array([bad[1] if bad else 0]))[:, 0].max())
    if step or not finite:
      name = bad[0] if bad else (_UNNAMED if step else "the updated parameters")
      raise shutdown.NonFiniteError(name, step or self.steps.of_update(update))
