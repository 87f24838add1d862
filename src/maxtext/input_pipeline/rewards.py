"""The run's reward functions, bound to their config and checked: the task's own, or the user's
(reward_functions_path + reward_functions, MaxText's signature fn(prompts, completions, tmvp_config,
**kwargs) with the whole config's MaxText view as tmvp_config).

The task's own run in the trainer's process. The user's run in worker processes (utils/worker_pool.py),
each call bounded by reward_timeout_s: a call past it is killed, and one that calls sys.exit or ends its
process, like one that raises or returns anything but one number per completion, stops the run with one
RewardFunctionError naming the function; threads a function starts die with its worker, never holding
the trainer. The file is loaded in the trainer too, at start, so that its errors come first.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from maxtext.configs.sections import MaxTextView, TaskSection
from maxtext.input_pipeline import templates
from maxtext.tasks.task import RewardFn, Task
from maxtext.utils import user_code, worker_pool
from maxtext.utils.errors import InputError


class RewardFunctionError(InputError):
  """A reward function raised, exited, ran past reward_timeout_s or returned something other than one
  number per completion; the message names the function and the example or batch."""


def call(fn: Callable, prompts: list, completions: list, tmvp_config: Any, fields: dict[str, Any]) -> Any:
  """The calling convention of reward functions: what fn returns for the batch (prompts, completions,
  the run's config as tmvp_config, the examples' other fields by name)."""
  return fn(prompts, completions, tmvp_config, **fields)


# Scores a batch: (prompts, completions, the examples' other fields) -> what the function returned.
_Scorer = Callable[[list, list, dict[str, Any]], Any]


def bind_config(
  fn: RewardFn, tmvp_config: TaskSection | MaxTextView, answer_prefix: str = "", source: str = ""
) -> RewardFn:
  """fn, run in this process, with tmvp_config bound and its output checked (see checked)."""
  return checked(fn.__name__, lambda p, c, fields: call(fn, p, c, tmvp_config, fields), answer_prefix, source)


def checked(name: str, score: _Scorer, answer_prefix: str = "", source: str = "") -> RewardFn:
  """The reward function `name` that scores a batch with `score`, its output checked, keeping its name
  (Tunix logs rewards/<name>).

  answer_prefix: what the prompt ends with (reasoning_start_token_in_prompt), so the reward sees the
  completion as the model wrote it. source: where the function is defined, named in its errors
  (`reward_functions_path=<file>`; empty for a task's own).

  A call that raises, or returns anything but a sequence of one number (a string is not one) per
  completion, raises RewardFunctionError naming the function and the example: when the whole batch
  raises, its examples are scored again one at a time to find the first that does. A call that gives
  no result (worker_pool.CallFailed: past its time limit, an exit) raises it naming the batch.
  """
  who = f"{source}: reward function {name}" if source else f"reward function {name}"

  def score_as_written(prompts, completions, fields):
    return score(prompts, [answer_prefix + c for c in completions], fields)

  def reward(prompts, completions, **kwargs):
    try:
      scores = score_as_written(prompts, completions, kwargs)
    except worker_pool.CallFailed as e:
      raise RewardFunctionError(f"{who}: {e} on a batch of {len(completions)} completions") from None
    except Exception as e:
      where = _first_raising(score_as_written, prompts, completions, kwargs)
      raise RewardFunctionError(f"{who} raised {_described(e)}{where}") from e
    if isinstance(scores, (Mapping, str, bytes)) or not (
      isinstance(scores, Sequence) or getattr(scores, "ndim", None) == 1
    ):
      got = f"a {type(scores).__name__}" if scores is not None else "None"
      raise RewardFunctionError(f"{who} returned {got}; expected a list of one number per completion")
    if len(scores) != len(completions):
      raise RewardFunctionError(f"{who} returned {len(scores)} values for {len(completions)} completions")
    values = [_number(x) for x in scores]
    for i, (x, value) in enumerate(zip(scores, values)):
      if value is None:
        raise RewardFunctionError(
          f"{who} returned {x!r} ({type(x).__name__}){_example(i, prompts, completions)}; expected a number"
        )
    return values

  reward.__name__ = name
  return reward


def _described(e: Exception) -> str:
  """'Type: message' of an exception, raised here or in a worker process (worker_pool.CallRaised)."""
  return str(e) if isinstance(e, worker_pool.CallRaised) else f"{type(e).__name__}: {worker_pool.one_line(e)}"


def _number(x) -> float | None:
  """x as a float; None where x is not a number (a string, None, a list)."""
  if isinstance(x, (str, bytes)):
    return None
  try:
    return float(x)
  except (TypeError, ValueError):
    return None


def _first_raising(score: _Scorer, prompts, completions, kwargs) -> str:
  """_example of the first example that raises when scored alone (the arguments with one value per
  example sliced to its own) or, where none does, the batch's size."""
  n = len(completions)
  for i in range(n):
    one = {
      k: v[i : i + 1] if hasattr(v, "__len__") and not isinstance(v, str) and len(v) == n else v
      for k, v in kwargs.items()
    }
    try:
      score(prompts[i : i + 1], completions[i : i + 1], one)
    except Exception:
      return _example(i, prompts, completions)
  return f" on a batch of {n} completions (none raises alone)"


def _example(i: int, prompts, completions) -> str:
  """' on completion i of n (prompt ..., completion ...)', with the end of its prompt and the start of
  its completion."""
  prompt, completion = str(prompts[i]), str(completions[i])
  head = prompt if len(prompt) <= _EXCERPT else "..." + prompt[-_EXCERPT:]
  tail = completion if len(completion) <= _EXCERPT else completion[:_EXCERPT] + "..."
  return f" on completion {i} of {len(completions)} (prompt {head!r}, completion {tail!r})"


_EXCERPT = 60  # characters of a prompt's end and a completion's start in an error


def reward_functions(spec: Task, task: TaskSection, tmvp_config: MaxTextView) -> list[RewardFn]:
  """The user's reward functions when reward_functions_path is set (the file loaded here first, so that
  its errors come before anything else; each call runs in a worker process), else the task's."""
  prefix = templates.answer_prefix(task)
  if not task.reward_functions_path:
    return [bind_config(fn, task, prefix) for fn in spec.rewards(task)]
  path = task.reward_functions_path
  module = user_code.load_file(path, "reward_functions_path")
  missing = [n for n in task.reward_functions if not callable(getattr(module, n, None))]
  if missing:
    raise InputError(f"reward_functions: {missing} not defined in reward_functions_path={path}")
  workers = worker_pool.WorkerPool(
    functools.partial(user_scorer, path, tuple(task.reward_functions), tmvp_config),
    task.reward_timeout_s,
    f"reward_timeout_s={task.reward_timeout_s:g}",
  )
  source = f"reward_functions_path={path}"
  return [checked(name, functools.partial(workers.call, name), prefix, source) for name in task.reward_functions]


def user_scorer(path: str, names: tuple[str, ...], tmvp_config: MaxTextView) -> Callable[..., Any]:
  """What a reward worker runs (its WorkerPool `load`): reward_functions_path loaded in the worker; the
  handler (name, prompts, completions, fields) returns what function `name` returned for the batch."""
  module = user_code.load_file(path, "reward_functions_path")
  functions = {name: getattr(module, name) for name in names}

  def score(name: str, prompts: list, completions: list, fields: dict[str, Any]) -> Any:
    return call(functions[name], prompts, completions, tmvp_config, fields)

  return score
