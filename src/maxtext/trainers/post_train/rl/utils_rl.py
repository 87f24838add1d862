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
With answer_format=last_number the answer is the completion's last number and the one built-in reward
is last_number_correct: reward_exact_answer when that number is right, else 0 (the tag weights and
penalties do not apply and are refused).
check_numbers counts an answer as equal when its last number equals the truth or math_verify finds
the two equivalent (e.g. 1/2 and 0.5); a check that outlives math_verify_timeout scores 0.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from maxtext.input_pipeline import templates
from maxtext.utils import numbers, user_code
from maxtext.utils.errors import ConfigError

if TYPE_CHECKING:
  from multiprocessing.pool import Pool

log = logging.getLogger(__name__)

_BOXED = "\\boxed{"


def _tags(cfg):
  return cfg.reasoning_start_token, cfg.reasoning_end_token, cfg.solution_start_token, cfg.solution_end_token


def last_boxed(text: str) -> str | None:
  """Content of the last \\boxed{...} in text, nested braces included, or None."""
  start = text.rfind(_BOXED)
  if start < 0:
    return None
  depth, i = 1, start + len(_BOXED)
  for j in range(i, len(text)):
    depth += {"{": 1, "}": -1}.get(text[j], 0)
    if depth == 0:
      return text[i:j]
  return None


def extract_answer(completion: str, cfg) -> str | None:
  """answer_format=tags: the content of the last complete answer block (the inside of a \\boxed{} in
  it, if any); answer_format=last_number: the completion's last number. None when there is none."""
  if cfg.answer_format == "last_number":
    return numbers.last_number_text(completion)
  _, _, start, end = _tags(cfg)
  found = re.findall(re.escape(start) + r"(.*?)" + re.escape(end), completion, flags=re.DOTALL)
  if not found:
    return None
  boxed = last_boxed(found[-1])
  return found[-1] if boxed is None else boxed


def _verify_pair(guess: str, truth: str) -> bool:
  """math_verify's equivalence of two answers (runs in a worker process)."""
  from math_verify import parse, verify

  try:
    return bool(verify(parse(truth), parse(guess)))
  except Exception:  # unparseable answers are simply not equal
    return False


class MathVerifier:
  """math_verify in a pool of worker processes with one deadline per batch of checks.

  A check still running at the deadline gives None (the sample scores 0); the pool is then terminated (a hung sympy
  call cannot be interrupted otherwise) and restarted on the next batch, so a run never hangs.
  """

  def __init__(self, check: Callable[[str, str], bool] = _verify_pair):
    self._check = check
    self._pool: Pool | None = None
    self._procs = 0

  def equivalent(self, pairs: list[tuple[str, str]], timeout: float, num_procs: int) -> list[bool | None]:
    """True / False per pair; None for a check cut off by the deadline."""
    if not pairs:
      return []
    if self._pool is None or self._procs != num_procs:
      self.close()
      self._pool = multiprocessing.get_context("spawn").Pool(num_procs)
      self._procs = num_procs
    pending = [self._pool.apply_async(self._check, pair) for pair in pairs]
    deadline = time.monotonic() + timeout
    out: list[bool | None] = []
    timed_out = 0
    for result in pending:
      try:
        out.append(bool(result.get(max(deadline - time.monotonic(), 0.0))))
      except multiprocessing.TimeoutError:
        out.append(None)
        timed_out += 1
    if timed_out:
      log.warning("math_verify: %d of %d checks passed the %.1f s deadline and score 0", timed_out, len(pairs), timeout)
      self.close()
    return out

  def close(self):
    if self._pool is not None:
      self._pool.terminate()
      self._pool = None


_VERIFIER = MathVerifier()
atexit.register(_VERIFIER.close)


def answers_match(guesses: list[str | None], truths: list, cfg) -> list[bool | None]:
  """Whether each extracted answer equals its truth: the same number, or math_verify-equivalent;
  None when math_verify ran out of time."""
  matches: list[bool | None] = []
  unsure: list[int] = []
  unsure_pairs: list[tuple[str, str]] = []
  for i, (guess, truth) in enumerate(zip(guesses, truths)):
    value, true_value = (numbers.parse_number(guess) if guess is not None else None), numbers.parse_number(str(truth))
    matches.append(value is not None and value == true_value)
    if guess is not None and guess.strip() and not matches[-1]:
      unsure.append(i)
      unsure_pairs.append((guess, str(truth)))
  verdicts = _VERIFIER.equivalent(unsure_pairs, cfg.math_verify_timeout, cfg.math_verify_num_procs)
  for i, ok in zip(unsure, verdicts):
    matches[i] = ok
  return matches


def match_format_exactly(prompts, completions, tmvp_config, **kwargs) -> list[float]:
  rs, re_, ss, se = (re.escape(t) for t in _tags(tmvp_config))
  pattern = re.compile(rf"^\s*{rs}.+?{re_}\s*{ss}.+?{se}\s*$", flags=re.DOTALL)
  return [tmvp_config.reward_exact_format_match if pattern.search(c) else 0.0 for c in completions]


def match_format_approximately(prompts, completions, tmvp_config, **kwargs) -> list[float]:
  scores = []
  for c in completions:
    scores.append(
      sum(
        tmvp_config.reward_partial_format_match if c.count(tag) == 1 else tmvp_config.penalty_incorrect_format
        for tag in _tags(tmvp_config)
      )
    )
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
      value, true_value = numbers.parse_number(guess), numbers.parse_number(truth)
      if numbers.within(value, true_value, 0.1):
        scores.append(cfg.reward_ratio_guess_to_answer_high)
      elif numbers.within(value, true_value, 0.2):
        scores.append(cfg.reward_ratio_guess_to_answer_low)
      else:
        scores.append(cfg.penalty_incorrect_answer)
  return scores


def check_numbers(prompts, completions, tmvp_config, answer, **kwargs) -> list[float]:
  guesses = [extract_answer(c, tmvp_config) for c in completions]
  correct = answers_match(guesses, list(answer), tmvp_config)
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
  guesses = [extract_answer(c, tmvp_config) for c in completions]
  correct = answers_match(guesses, list(answer), tmvp_config)
  return [tmvp_config.reward_exact_answer if ok else 0.0 for ok in correct]


# answer_format -> the built-in reward functions.
DEFAULT_REWARD_FUNCTIONS = {
  "tags": (match_format_exactly, match_format_approximately, check_answer, check_numbers),
  "last_number": (last_number_correct,),
}


class RewardFunctionError(ValueError):
  """A reward function raised or returned something other than one float per completion."""


def bind_config(fn, cfg):
  """fn with tmvp_config bound and its output checked, keeping its name (Tunix logs rewards/<name>).

  With reasoning_start_token_in_prompt the prompt ends with the reasoning start token, so the
  reward sees the completion with that token in front, as the model wrote it.
  """
  prefix = templates.answer_prefix(cfg)

  def reward(prompts, completions, **kwargs):
    try:
      scores = fn(prompts, [prefix + c for c in completions], cfg, **kwargs)
    except Exception as e:
      raise RewardFunctionError(f"reward function {fn.__name__} raised {type(e).__name__}: {e}") from e
    if scores is None or len(scores) != len(completions):
      got = "None" if scores is None else f"{len(scores)} values"
      raise RewardFunctionError(f"reward function {fn.__name__} returned {got} for {len(completions)} completions")
    return [float(x) for x in scores]

  reward.__name__ = fn.__name__
  return reward


def reward_functions(cfg) -> list:
  """The run's reward functions, bound to cfg: the user's (reward_functions_path + reward_functions)
  or the built-in ones."""
  if not cfg.reward_functions_path:
    if cfg.reward_functions:
      raise ConfigError("reward_functions: set reward_functions_path to the file that defines them")
    return [bind_config(fn, cfg) for fn in DEFAULT_REWARD_FUNCTIONS[cfg.answer_format]]
  path = cfg.reward_functions_path
  module = user_code.load_file(path, "reward_functions_path")
  if not cfg.reward_functions:
    raise ConfigError(f"reward_functions: name the functions of {path} to use")
  missing = [n for n in cfg.reward_functions if not callable(getattr(module, n, None))]
  if missing:
    raise ConfigError(f"reward_functions: {missing} not defined in reward_functions_path={path}")
  return [bind_config(getattr(module, n), cfg) for n in cfg.reward_functions]
