"""Numbers in answers, one definition for the data pipeline, the rewards and the evaluation."""

from __future__ import annotations

import re

# A number as written: sign, thousands commas, decimals (also without a leading digit).
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def last_number_text(text: str) -> str | None:
  """The last number in text as written (negatives, thousands commas; currency signs dropped), or None."""
  found = NUMBER.findall(text.replace("$", ""))
  return found[-1] if found else None


def first_number_text(text: str) -> str | None:
  """The first number in text as written, or None."""
  found = NUMBER.findall(text.replace("$", ""))
  return found[0] if found else None


def parse_number(text: str) -> float | None:
  """The last number in text (negatives, thousands commas; currency and units ignored), or None."""
  found = last_number_text(text)
  if found is None:
    return None
  try:
    return float(found.replace(",", ""))
  except ValueError:
    return None


def within(value: float | None, truth: float | None, tolerance: float) -> bool:
  """Whether value / truth lies in [1 - tolerance, 1 + tolerance] (never for a missing value or a
  zero truth)."""
  if value is None or not truth:
    return False
  return 1 - tolerance <= value / truth <= 1 + tolerance
