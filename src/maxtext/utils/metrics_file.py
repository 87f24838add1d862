"""metrics.jsonl on disk, read back: the rows a run wrote and the rows it still held
(`<path>.pending`, mirrored by the JSONL sink whenever a step begins); a resume cuts the file back
to the checkpoint it resumes from."""

from __future__ import annotations

import json
import os


def pending(path: str) -> str:
  """The file in which the metrics.jsonl at `path` mirrors the rows it holds (not yet final)."""
  return path + ".pending"


def logged_steps(path: str) -> dict[int, dict]:
  """Rows of a (possibly killed) run's metrics.jsonl, with the rows it still held when it died."""
  rows = {}
  if os.path.isfile(pending(path)):
    with open(pending(path), encoding="utf-8") as f:
      rows.update({r["step"]: r for r in json.load(f)})
  if os.path.isfile(path):
    with open(path, encoding="utf-8") as f:
      rows.update({r["step"]: r for r in map(json.loads, filter(str.strip, f))})
  return rows


def truncate_after(path: str, step: int) -> int:
  """Makes metrics.jsonl hold exactly the logged steps up to `step` (the checkpoint a rerun resumes
  from), pending rows merged in; returns how many later rows were dropped (the rerun logs them)."""
  rows = logged_steps(path)
  if os.path.isfile(pending(path)):
    os.remove(pending(path))
  with open(path, "w", encoding="utf-8") as f:
    f.writelines(json.dumps(rows[s]) + "\n" for s in sorted(rows) if s <= step)
  return sum(s > step for s in rows)
