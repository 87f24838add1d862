"""GSM8K-style reward functions with MaxText's signature `fn(prompts, completions, tmvp_config, **kwargs)`.

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
"""

from __future__ import annotations

import re

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def _tags(cfg):
  return cfg.reasoning_start_token, cfg.reasoning_end_token, cfg.solution_start_token, cfg.solution_end_token


def extract_answer(completion: str, cfg) -> str | None:
  """Content of the last complete answer block, or None."""
  _, _, start, end = _tags(cfg)
  found = re.findall(re.escape(start) + r"(.*?)" + re.escape(end), completion, flags=re.DOTALL)
  return found[-1] if found else None


def parse_number(text: str) -> float | None:
  """The last number in text (commas, currency and units ignored), or None."""
  found = _NUMBER.findall(text.replace("$", ""))
  if not found:
    return None
  try:
    return float(found[-1].replace(",", ""))
  except ValueError:
    return None


def match_format_exactly(prompts, completions, tmvp_config, **kwargs) -> list[float]:
  rs, re_, ss, se = (re.escape(t) for t in _tags(tmvp_config))
  pattern = re.compile(rf"^\s*{rs}.+?{re_}\s*{ss}.+?{se}\s*$", flags=re.DOTALL)
  return [tmvp_config.reward_exact_format_match if pattern.search(c) else 0.0 for c in completions]


def match_format_approximately(prompts, completions, tmvp_config, **kwargs) -> list[float]:
  scores = []
  for c in completions:
    scores.append(sum(
        tmvp_config.reward_partial_format_match if c.count(tag) == 1 else tmvp_config.penalty_incorrect_format
        for tag in _tags(tmvp_config)
    ))
  return scores


def check_answer(prompts, completions, tmvp_config, answer, **kwargs) -> list[float]:
  cfg = tmvp_config
  scores = []
  for c, truth in zip(completions, answer):
    guess, truth = extract_answer(c, cfg), str(truth)
    if guess is None:
      scores.append(0.0)
    elif guess == truth:
      scores.append(cfg.reward_exact_answer)
    elif guess.strip() == truth.strip():
      scores.append(cfg.reward_white_space_format_match)
    else:
      value, true_value = parse_number(guess), parse_number(truth)
      ratio = value / true_value if value is not None and true_value else None
      if ratio is not None and 0.9 <= ratio <= 1.1:
        scores.append(cfg.reward_ratio_guess_to_answer_high)
      elif ratio is not None and 0.8 <= ratio <= 1.2:
        scores.append(cfg.reward_ratio_guess_to_answer_low)
      else:
        scores.append(cfg.penalty_incorrect_answer)
  return scores


def check_numbers(prompts, completions, tmvp_config, answer, **kwargs) -> list[float]:
  scores = []
  for c, truth in zip(completions, answer):
    guess = extract_answer(c, tmvp_config)
    if guess is None:
      scores.append(0.0)
      continue
    value, true_value = parse_number(guess), parse_number(str(truth))
    correct = value is not None and true_value is not None and value == true_value
    scores.append(tmvp_config.reward_exact_answer if correct else tmvp_config.penalty_incorrect_answer)
  return scores


DEFAULT_REWARD_FUNCTIONS = (match_format_exactly, match_format_approximately, check_answer, check_numbers)


def bind_config(fn, cfg):
  """fn with tmvp_config bound, keeping its name (Tunix logs rewards/<name>)."""

  def reward(prompts, completions, **kwargs):
    return fn(prompts, completions, cfg, **kwargs)

  reward.__name__ = fn.__name__
  return reward
