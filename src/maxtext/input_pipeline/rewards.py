"""The run's reward functions, bound to their config and checked: the task's own, or the user's
(reward_functions_path + reward_functions, MaxText's signature fn(prompts, completions, tmvp_config,
**kwargs) with the whole config's MaxText view as tmvp_config)."""

from __future__ import annotations

from maxtext.configs.sections import MaxTextView, TaskSection
from maxtext.input_pipeline import templates
from maxtext.tasks.task import RewardFn, Task
from maxtext.utils import user_code
from maxtext.utils.errors import InputError


class RewardFunctionError(InputError):
  """A reward function raised or returned something other than one number per completion; the
  message names the function and the example."""


def bind_config(
  fn: RewardFn, tmvp_config: TaskSection | MaxTextView, answer_prefix: str = "", source: str = ""
) -> RewardFn:
  """fn with tmvp_config bound and its output checked, keeping its name (Tunix logs rewards/<name>).

  answer_prefix: what the prompt ends with (reasoning_start_token_in_prompt), so the reward sees the
  completion as the model wrote it. source: where fn is defined, named in its errors
  (`reward_functions_path=<file>`; empty for a task's own).

  A call that raises, or returns anything but one number (a string is not one) per completion,
  raises RewardFunctionError naming the function and the example: when the whole batch raises, its
  examples are scored again one at a time to find the first that does.
  """
  who = f"{source}: reward function {fn.__name__}" if source else f"reward function {fn.__name__}"

  def call(prompts, completions, kwargs):
    return fn(prompts, [answer_prefix + c for c in completions], tmvp_config, **kwargs)

  def reward(prompts, completions, **kwargs):
    try:
      scores = call(prompts, completions, kwargs)
    except Exception as e:
      where = _first_raising(call, prompts, completions, kwargs)
      raise RewardFunctionError(f"{who} raised {type(e).__name__}: {_one_line(e)}{where}") from e
    if scores is None or not hasattr(scores, "__len__") or len(scores) != len(completions):
      got = f"{len(scores)} values" if hasattr(scores, "__len__") else repr(scores)
      raise RewardFunctionError(f"{who} returned {got} for {len(completions)} completions")
    values = [_number(x) for x in scores]
    for i, (x, value) in enumerate(zip(scores, values)):
      if value is None:
        raise RewardFunctionError(
          f"{who} returned {x!r} ({type(x).__name__}){_example(i, prompts, completions)}; expected a number"
        )
    return values

  reward.__name__ = fn.__name__
  return reward


def _number(x) -> float | None:
  """x as a float; None where x is not a number (a string, None, a list)."""
  if isinstance(x, (str, bytes)):
    return None
  try:
    return float(x)
  except (TypeError, ValueError):
    return None


def _first_raising(call, prompts, completions, kwargs) -> str:
  """_example of the first example that raises when scored alone (the arguments with one value per
  example sliced to its own) or, where none does, the batch's size."""
  n = len(completions)
  for i in range(n):
    one = {
      k: v[i : i + 1] if hasattr(v, "__len__") and not isinstance(v, str) and len(v) == n else v
      for k, v in kwargs.items()
    }
    try:
      call(prompts[i : i + 1], completions[i : i + 1], one)
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


def _one_line(e: Exception) -> str:
  return " ".join(str(e).split())


def reward_functions(spec: Task, task: TaskSection, tmvp_config: MaxTextView) -> list[RewardFn]:
  """The user's reward functions when reward_functions_path is set, else the task's."""
  prefix = templates.answer_prefix(task)
  if not task.reward_functions_path:
    return [bind_config(fn, task, prefix) for fn in spec.rewards(task)]
  path = task.reward_functions_path
  module = user_code.load_file(path, "reward_functions_path")
  missing = [n for n in task.reward_functions if not callable(getattr(module, n, None))]
  if missing:
    raise InputError(f"reward_functions: {missing} not defined in reward_functions_path={path}")
  return [
    bind_config(getattr(module, n), tmvp_config, prefix, f"reward_functions_path={path}") for n in task.reward_functions
  ]
