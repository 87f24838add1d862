"""Whether arrays hold only finite values, answered on the device."""

from __future__ import annotations

import jax
import jax.numpy as jnp


@jax.jit
def _all_finite(leaves: list) -> jax.Array:
  checks = [jnp.isfinite(x).all() for x in leaves if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.stack(checks).all() if checks else jnp.array(True)


def all_finite(tree) -> bool:
  """True when every floating-point array in the pytree is free of NaN and infinity (one compiled
  reduction; integer arrays, such as step counters, are skipped). Every process of a multi-process
  job gets the same answer for global arrays."""
  return bool(_all_finite(jax.tree.leaves(tree)))
