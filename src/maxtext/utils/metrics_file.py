"""metrics.jsonl on disk, read back: the rows a run wrote and the rows it still held
(`<path>.pending`, mirrored by the JSONL sink whenever a step begins and at every checkpoint
request); a resume cuts the file back to the checkpoint it resumes from.

A kill can leave metrics.jsonl with a torn last line, and a crash on some filesystems a zero-filled
tail; any damage to either file is set aside (safe_files.set_aside, one warning line) and the rows
that read back are kept, so the steps whose rows were lost count as not logged."""

from __future__ import annotations

import json
import os

from maxtext.utils import safe_files


def pending(path: str) -> str:
  """The file in which the metrics.jsonl at `path` mirrors the rows it holds (not yet final)."""
  return path + ".pending"


def _row(item) -> dict | None:
  """`item` where it is a metrics row (a dict with an integer step), else None."""
  return item if isinstance(item, dict) and type(item.get("step")) is int else None


def _parsed(line: str):
  """The JSON value of a line, or None where it is not JSON."""
  try:
    return json.loads(line)
  except ValueError:
    return None


def _pending_rows(path: str) -> dict[int, dict]:
  """The rows of the pending file; one that does not read back whole is moved aside (its steps count
  as not logged)."""
  file = pending(path)
  if not os.path.isfile(file):
    return {}
  with open(file, encoding="utf-8", errors="replace") as f:
    items = _parsed(f.read())
  rows = [_row(item) for item in items] if isinstance(items, list) else [None]
  if None in rows:
    safe_files.set_aside(file, "not a JSON list of metrics rows; its steps count as not logged")
    return {}
  return {r["step"]: r for r in rows if r is not None}


def _jsonl_rows(path: str) -> dict[int, dict]:
  """The rows of metrics.jsonl; a file with lines that do not read back (a torn or zero-filled tail)
  is copied aside and rewritten with the rows that do."""
  if not os.path.isfile(path):
    return {}
  with open(path, encoding="utf-8", errors="replace") as f:
    lines = [(n, line, _row(_parsed(line))) for n, line in enumerate(f, 1) if line.strip()]
  bad = [n for n, _, row in lines if row is None]
  if bad:
    safe_files.set_aside(
      path,
      f"{len(bad)} of its {len(lines)} lines, the first line {bad[0]}, are not metrics rows (a write cut short "
      "or a zero-filled tail); the rows that read back are kept, the steps whose rows were lost count as not logged",
      keep=True,
    )
    with safe_files.replaced(path) as f:
      f.writelines(line.rstrip("\n") + "\n" for _, line, row in lines if row is not None)
  return {row["step"]: row for _, _, row in lines if row is not None}


def logged_steps(path: str) -> dict[int, dict]:
  """Rows of a (possibly killed) run's metrics.jsonl, with the rows it still held when it died;
  damaged files are set aside first (see the module's docstring)."""
  rows = _pending_rows(path)
  rows.update(_jsonl_rows(path))
  return rows


def truncate_after(path: str, step: int) -> int:
  """Makes metrics.jsonl hold exactly the logged steps up to `step` (the checkpoint a rerun resumes
  from), pending rows merged in, rewriting it atomically before the pending file goes (a kill
  between leaves rows that the next resume merges again); returns how many later rows were dropped
  (the rerun logs them)."""
  rows = logged_steps(path)
  with safe_files.replaced(path) as f:
    f.writelines(json.dumps(rows[s]) + "\n" for s in sorted(rows) if s <= step)
  if os.path.isfile(pending(path)):
    os.remove(pending(path))
  return sum(s > step for s in rows)
