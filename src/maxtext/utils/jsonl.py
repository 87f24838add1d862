"""JSON Lines files: one JSON object per line."""

from __future__ import annotations

import json

from maxtext.utils import errors


def read(path: str) -> list[dict]:
  """The objects of a .jsonl file (blank lines skipped); a bad line is a ValueError naming file and line."""
  return [row for _, row in numbered(path)]


def numbered(path: str) -> list[tuple[int, dict]]:
  """read's objects, each with its line number (from 1)."""
  rows = []
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if line.strip():
        try:
          rows.append((lineno, json.loads(line)))
        except json.JSONDecodeError as e:
          raise errors.InputError(f"{path}:{lineno}: not valid JSON ({e})") from e
  return rows
