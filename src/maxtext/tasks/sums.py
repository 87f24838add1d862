"""Sums: "What is a + b?" for 0 <= a, b <= 20 (441 questions, generated, no splits of their own), a task
for small base models (with chat_template=plain). Rewarded and scored as a word problem (answer_format)."""

from __future__ import annotations

from maxtext.tasks import word_problems
from maxtext.tasks.task import Task


def _rows() -> list[dict]:
  return [{"question": f"What is {a} + {b}?", "answer": str(a + b)} for a in range(21) for b in range(21)]


TASK = Task(
  name="sums",
  template="sums.json",
  rewards=word_problems.rewards,
  score=word_problems.score,
  all_rows=_rows,
)
