"""A verifiers SingleTurnEnv written with verifiers 0.1.14's own API, for the learning test of
rl.agent=verifiers (tests/integration/test_learning.py): the random_digit task's rule as an environment.
Its arguments are the rows' prompts and the system prompt (the test passes the random_digit task's), and
`sign`: the rubric gives sign (1.0, or -1.0) for a reply that starts with a digit, else 0."""

import re

import verifiers as vf
from datasets import Dataset


def load_environment(prompts: list[str], system_prompt: str, sign: float = 1.0) -> vf.Environment:
  def digit_first(completion, **kwargs) -> float:
    return sign * float(re.match(r"\s*\d", completion[-1]["content"] or "") is not None)

  dataset = Dataset.from_list([{"question": p, "answer": ""} for p in prompts])
  return vf.SingleTurnEnv(dataset=dataset, system_prompt=system_prompt, rubric=vf.Rubric(funcs=[digit_first]))
