"""The times table: "What is a * b?" for 2 <= a, b <= 20 (361 questions, generated, no splits of
their own), the default demo's task. Rewarded and scored as a word problem (answer_format)."""

from __future__ import annotations

from maxtext.tasks import word_problems
from maxtext.tasks.task import Task


def _rows() -> list[dict]:
  return [{"question": f"What is {a} * {b}?", "answer": str(a * b)} for a in range(2, 21) for b in range(2, 21)]


TASK = Task(
  name="times_table",
  template="gsm8k_rl.json",
  rewards=word_problems.rewards,
  score=word_problems.score,
  all_rows=_rows,
)
