"""A batch's column (one field of every example) as one NumPy array, as training batches hold them."""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import numpy as np


def as_array(values: Sequence) -> np.ndarray:
  """values as a 1-D array: all text or all numbers as NumPy makes them (a str or number dtype),
  anything else (lists, dicts, None, mixed kinds) an object array holding each value whole, so a row
  of the array is the value as it was."""
  if values and (
    all(isinstance(v, str) for v in values)
    or all(isinstance(v, (numbers.Number, np.bool_)) and not isinstance(v, np.ndarray) for v in values)
  ):
    return np.array(values)
  return whole(values)


def whole(values: Sequence) -> np.ndarray:
  """values as a 1-D object array holding each value whole (of its own type)."""
  out = np.empty(len(values), dtype=object)
  for i, value in enumerate(values):
    out[i] = value
  return out
