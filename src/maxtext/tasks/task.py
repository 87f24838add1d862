"""What a task is: where its questions come from, the prompt template it ships, how its completions
are rewarded and how evaluation scores them. A task is selected by dataset_name (tasks.select).

Rows are raw (a task's own fields); `normalise` turns one into (prompt, answer), unless a
dataset_processor_path's process_data handles the raw rows itself. A task without a normaliser of its
own (a file, TFDS or Hugging Face dataset) reads them by column (`by_columns`): the prompt, text or a
conversation, and the reference answer, in the columns prompt_column and answer_column name or those
the row has of PROMPT_COLUMNS and ANSWER_COLUMNS. Reward functions have MaxText's
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


# A row's prompt: text (the question), or a conversation of {"role", "content"} messages.
Prompt = str | list[dict]

# The columns a row's prompt and reference answer are looked for in, in order, where prompt_column or
# answer_column is empty: TRL's `prompt`, then Tunix's and MaxText's `question`; GSM8K's (and Tunix's
# and MaxText's) `answer`, then TRL's `solution`.
PROMPT_COLUMNS = ("prompt", "question")
ANSWER_COLUMNS = ("answer", "solution")


def by_columns(row: dict, prompt_column: str = "", answer_column: str = "") -> tuple[Prompt, str, str, str]:
  """A row's (prompt, answer, the prompt's column, the answer's column): the prompt is prompt_column's
  value, text or a conversation (`conversation`), the answer final_answer of answer_column's (a
  string or a finite number); an empty column name takes the first of PROMPT_COLUMNS / ANSWER_COLUMNS
  the row has. A missing column, or a value of another type, is an InputError naming the column and
  the key that chooses it."""
  p_col = _column(row, prompt_column, PROMPT_COLUMNS, "prompt_column", "the prompt")
  a_col = _column(row, answer_column, ANSWER_COLUMNS, "answer_column", "the reference answer")
  prompt = row[p_col]
  if isinstance(prompt, (list, tuple)):
    prompt = conversation(prompt, p_col)
  elif not isinstance(prompt, str):
    raise errors.InputError(
      f'has {p_col} {prompt!r} ({_kind(prompt)}); expected a string or a list of {{"role", "content"}} messages'
    )
  answer = row[a_col]
  if not isinstance(answer, str) and not _finite_number(answer):
    raise errors.InputError(f"has {a_col} {answer!r} ({_kind(answer)}); expected a string or a number")
  return prompt, final_answer(str(answer)), p_col, a_col


def question_answer(row: dict) -> tuple[Prompt, str]:
  """A generated task's row: its `question` and `answer` columns (by_columns)."""
  prompt, answer, _, _ = by_columns(row, "question", "answer")
  return prompt, answer


def _column(row: dict, chosen: str, known: tuple[str, ...], key: str, what: str) -> str:
  if chosen:
    if chosen not in row:
      raise errors.InputError(f"has no column {chosen!r} ({key}={chosen}); its columns are {list(row)}")
    return chosen
  found = next((name for name in known if name in row), None)
  if found is None:
    raise errors.InputError(
      f"has none of the columns {list(known)} for {what} (its columns are {list(row)}); set {key} to the "
      "column that holds it, or dataset_processor_path to a file whose process_data builds the example"
    )
  return found


def conversation(messages, column: str) -> list[dict]:
  """A conversational prompt checked: a list of {"role": text, "content": text} messages (other keys
  kept) whose last turn is the user's; an InputError naming the column and the message otherwise."""
  for i, message in enumerate(messages):
    if not (
      isinstance(message, dict) and isinstance(message.get("role"), str) and isinstance(message.get("content"), str)
    ):
      raise errors.InputError(
        f'has {column} message {i} {message!r:.100}; expected {{"role": a string, "content": a string}}'
      )
  if not messages or messages[-1]["role"] != "user":
    last = f"ends in a {messages[-1]['role']!r} turn" if messages else "is empty"
    raise errors.InputError(f"has {column} that {last}; expected a conversation whose last turn is the user's")
  return [dict(m) for m in messages]


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
  # row -> (prompt, answer); None: the row is read by column (by_columns, with prompt_column and
  # answer_column), as a file, TFDS or Hugging Face dataset is.
  normalise: Callable[[dict], tuple[Prompt, str]] | None = question_answer
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
