"""A verifiers ToolEnv written with verifiers 0.1.14's own API: the policy may call `add(a, b)` (a
typed function with a docstring, as verifiers' tools are), and the rubric rewards a final reply holding
the row's answer."""

import verifiers as vf
from datasets import Dataset


def add(a: int, b: int) -> int:
  """Adds two integers.

  Args:
    a: the first.
    b: the second.
  """
  return a + b


def load_environment(max_turns: int = 3) -> vf.Environment:
  dataset = Dataset.from_list([{"question": f"What is {i} + 5? Use the tool.", "answer": str(i + 5)} for i in range(4)])

  def correct(completion, answer, **kwargs) -> float:
    return float(answer in str(completion[-1].get("content") or ""))

  return vf.ToolEnv(dataset=dataset, tools=[add], max_turns=max_turns, rubric=vf.Rubric(funcs=[correct]))
