"""JSON Lines files: one JSON object per line; and the UTF-8 lines of a text file they are read from."""

from __future__ import annotations

import json
from collections.abc import Iterator

from maxtext.utils import errors

# JSON's names of the values json.loads returns.
_JSON_TYPES = {
  dict: "an object",
  list: "an array",
  str: "a string",
  int: "a number",
  float: "a number",
  bool: "a boolean",
}


def read(path: str) -> list[dict]:
  """The objects of a .jsonl file (blank lines skipped); a bad line is an InputError naming file and line."""
  return [row for _, row in numbered(path)]


def numbered(path: str) -> list[tuple[int, dict]]:
  """read's objects, each with its line number (from 1). A line that is not UTF-8, not JSON or not a
  JSON object (an array, a string, null) is an InputError naming file and line."""
  rows = []
  for lineno, line in enumerate(text_lines(path), 1):
    if line.strip():
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise errors.InputError(f"{path}:{lineno}: not valid JSON ({e})") from e
      if not isinstance(row, dict):
        found = "null" if row is None else _JSON_TYPES.get(type(row), type(row).__name__)
        raise errors.InputError(f"{path}:{lineno}: {found}; expected a JSON object")
      rows.append((lineno, row))
  return rows


def text_lines(path: str) -> Iterator[str]:
  """The lines of a UTF-8 text file, with their line ends; bytes that are not UTF-8 are an InputError
  naming file and line."""
  with open(path, "rb") as f:
    for lineno, raw in enumerate(f, 1):
      try:
        yield raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise errors.InputError(
          f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start + 1} of the line)"
        ) from e
