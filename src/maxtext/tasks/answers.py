"""The one answer extractor and the equality of answers, for every task's rewards and scoring.

answer_format=tags: the content of the last complete answer block (solution_start_token ...
solution_end_token; the inside of a \\boxed{} in it, if any); answer_format=last_number: the text's last
number. Two answers are equal when their numbers are, or when math_verify finds them equivalent (1/2 and
0.5); a check that outlives math_verify_timeout counts as undecided (None).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing
import re
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from maxtext.configs.sections import TaskSection
from maxtext.utils import numbers

if TYPE_CHECKING:
  from multiprocessing.pool import Pool

log = logging.getLogger(__name__)

_BOXED = "\\boxed{"


def tags(task: TaskSection) -> tuple[str, str, str, str]:
  """reasoning start and end, solution start and end."""
  return task.reasoning_start_token, task.reasoning_end_token, task.solution_start_token, task.solution_end_token


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


def extract_answer(completion: str, task: TaskSection) -> str | None:
  """The completion's answer per answer_format (see the module docstring); None when there is none."""
  if task.answer_format == "last_number":
    return numbers.last_number_text(completion)
  _, _, start, end = tags(task)
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
      atexit.register(self.close)
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
      atexit.unregister(self.close)


_VERIFIER = MathVerifier()


def answers_match(guesses: list[str | None], truths: list, task: TaskSection) -> list[bool | None]:
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
  verdicts = _VERIFIER.equivalent(unsure_pairs, task.math_verify_timeout, task.math_verify_num_procs)
  for i, ok in zip(unsure, verdicts):
    matches[i] = ok
  return matches
