"""What a task is: where its questions come from, the prompt template it ships, how its completions
are rewarded and how evaluation scores them. A task is selected by dataset_name (tasks.select).

Rows are raw (a task's own fields); `normalise` turns one into (question, answer), unless a
dataset_processor_path's process_data handles the raw rows itself. Reward functions have MaxText's
signature fn(prompts, completions, tmvp_config, **kwargs) -> one float per completion, where a
task's own functions receive the task section as tmvp_config (user functions receive the whole
config's MaxText view; input_pipeline.rewards binds either). `score` gives one verdict per completion:
{"answer": the extracted answer or None, "correct", "partially_correct", "formatted"}.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable

import numpy as np

from maxtext.configs.sections import TaskSection
from maxtext.utils import errors

RewardFn = Callable[..., list[float]]
Verdict = dict


def question_answer(row: dict) -> tuple[str, str]:
  """A row's `question` (a string) and `answer` (a string or a finite number) fields; GSM8K's answer is
  the text after '####' (thousands separators removed). Fields missing or of another type (a list,
  null) are an InputError naming them."""
  missing = [k for k in ("question", "answer") if k not in row]
  if missing:
    raise errors.InputError(f"lacks field(s) {missing}; expected 'question' and 'answer'")
  question, answer = checked(row["question"], row["answer"])
  return question, final_answer(answer)


def checked(question, answer) -> tuple[str, str]:
  """A row's question (a string) and answer (a string or a finite number, as text); another type is an
  InputError naming the field, its value and its type."""
  if not isinstance(question, str):
    raise errors.InputError(f"has question {question!r} ({_kind(question)}); expected a string")
  if not isinstance(answer, str) and not _finite_number(answer):
    raise errors.InputError(f"has answer {answer!r} ({_kind(answer)}); expected a string or a number")
  return question, str(answer)


def _finite_number(value) -> bool:
  """An int or float (NumPy's too, as TFDS gives them), not a bool, NaN or infinity."""
  return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_)) and math.isfinite(value)


def _kind(value) -> str:
  return "null" if value is None else f"a {type(value).__name__}"


def final_answer(answer: str) -> str:
  """The text after GSM8K's '####' (thousands separators removed), or the whole answer."""
  return answer.split("####")[-1].strip().replace(",", "")


# The task-section keys a task's rewards and scoring may read; the template keys and the user's
# reward functions are read whatever the task.
REWARD_KEYS = tuple(
  f.name
  for f in dataclasses.fields(TaskSection)
  if f.name
  not in ("data_template_path", "reasoning_start_token_in_prompt", "reward_functions_path", "reward_functions")
)


@dataclasses.dataclass(frozen=True)
class Task:
  name: str
  template: str  # the shipped template (configs/templates/) used when data_template_path is empty
  rewards: Callable[[TaskSection], tuple[RewardFn, ...]]
  score: Callable[[list[str], list[str], TaskSection], list[Verdict]]
  # The task's own raw rows: every row (split by train_fraction where a split is missing), and the
  # rows of each of its `splits`; without all_rows the rows come from dataset_name as a file, TFDS or
  # Hugging Face dataset.
  all_rows: Callable[[], list[dict]] | None = None
  splits: tuple[str, ...] = ()
  split_rows: Callable[[str], list[dict]] | None = None
  normalise: Callable[[dict], tuple[str, str]] = question_answer
  reads: tuple[str, ...] = REWARD_KEYS  # the REWARD_KEYS its rewards and scoring read

  def ignored(self, changed: list[str], user_rewards: bool) -> str | None:
    """Why a reward key set away from its default has no effect: this task never reads it (None: every
    one is read, or the user's reward functions, which may read any key, replace the task's)."""
    if user_rewards:
      return None
    for key in changed:
      if key in REWARD_KEYS and key not in self.reads:
        return (
          f"{key}: dataset_name={self.name} would ignore it (its rewards read "
          f"{', '.join(self.reads) or 'no config key'}); remove it"
        )
    return None
