"""A random digit: the prompt asks for one ("Random digit:"), the reward is 1 for a reply that starts
with a digit, else 0. SmolLM2-135M-Instruct mostly starts with words instead (greedy never answers
with a digit on the test prompts), so a few GRPO steps visibly change its greedy behaviour: the
learning tests' task. The train and test splits use different wordings."""

from __future__ import annotations

import re

from maxtext.configs.sections import TaskSection
from maxtext.tasks.task import RewardFn, Task, Verdict

TRAIN = [
  "Random digit:",
  "Give me a random digit:",
  "Digit, please:",
  "One random digit:",
  "A random digit:",
  "Random digit, please:",
  "Your random digit:",
  "Quick, a random digit:",
]
TEST = ["Random number:", "Some digit:", "Say a random digit:", "Random digit now:"]
_DIGIT_FIRST = re.compile(r"\s*(\d)")


def starts_with_digit(text: str) -> bool:
  return _DIGIT_FIRST.match(text) is not None


def digit_first(prompts, completions, tmvp_config, **kwargs) -> list[float]:
  """1 for a completion that starts with a digit (after whitespace), else 0."""
  return [float(starts_with_digit(c)) for c in completions]


def _rewards(task: TaskSection) -> tuple[RewardFn, ...]:
  return (digit_first,)


def _score(completions: list[str], truths: list[str], task: TaskSection) -> list[Verdict]:
  """Correct (and formatted) when the reply starts with a digit; the answer is that digit."""
  out = []
  for c in completions:
    found = _DIGIT_FIRST.match(c)
    ok = found is not None
    out.append({"answer": found.group(1) if found else None, "correct": ok, "partially_correct": ok, "formatted": ok})
  return out


def _split(split: str) -> list[dict]:
  return [{"question": q, "answer": "a digit"} for q in {"train": TRAIN * 4, "test": TEST * 5}[split]]


TASK = Task(
  name="random_digit",
  template="random_digit.json",
  rewards=_rewards,
  score=_score,
  all_rows=lambda: [*_split("train"), *_split("test")],
  splits=("train", "test"),
  split_rows=_split,
  reads=(),
)
