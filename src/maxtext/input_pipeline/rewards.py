"""The run's reward functions, bound to their config and checked, and how their scores become each
completion's reward (RewardSet): the task's own, or the user's (reward_functions_path +
reward_functions, weighted by reward_weights).

Reward functions are called by keyword, as TRL and Tunix call them (`call`): prompts=, completions=,
every field of the examples by name (dataset columns included) and MaxText's tmvp_config= (the whole
config's MaxText view); each receives only the names its signature takes (all of them with **kwargs).
So TRL's and Tunix's fn(prompts, completions, **kwargs), Tunix's check_answer(prompts, completions,
answer, **kwargs) and MaxText's fn(prompts, completions, tmvp_config, **kwargs) all run unchanged. A
user function that cannot be called so (a positional-only parameter; a required one that is neither
those nor a field of the data) is refused at start (signature_problem at load, RewardSet.check_fields
once the data's fields are known), naming it. Where the examples' `prompt` column holds conversations
(lists of {"role", "content"} messages, TRL's conversational data) the user's functions get `prompts`
as those message lists and `completions` as [[{"role": "assistant", "content": text}], ...], as TRL
gives them (`as_messages`).

A function may return None for a completion it does not apply to, as in TRL (a NaN or infinite value
is a fault that stops the run, as a non-finite reward always has); RewardSet.score
says what then counts.

The task's own run in the trainer's process. The user's run in worker processes (utils/worker_pool.py),
each call bounded by reward_timeout_s: a call past it is killed, and one that calls sys.exit or ends its
process, like one that raises or returns anything but one number (or None) per completion, stops the
run with one RewardFunctionError naming the function; threads a function starts die with its worker,
never holding the trainer. The file is loaded in the trainer too, at start, so that its errors come
first.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import math
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from maxtext.configs.sections import MaxTextView, TaskSection
from maxtext.input_pipeline import templates
from maxtext.tasks.task import RewardFn, Task
from maxtext.utils import user_code, worker_pool
from maxtext.utils.errors import InputError

log = logging.getLogger(__name__)

# The names every call gives beside the examples' fields (`mode`: Tunix's "train").
PROVIDED = ("prompts", "completions", "tmvp_config", "mode")

FORMS = (
  "expected keyword parameters, as TRL and Tunix call reward functions: fn(prompts, completions, **kwargs), "
  "fields of the data by name as in fn(prompts, completions, answer, **kwargs), or MaxText's "
  "fn(prompts, completions, tmvp_config, **kwargs)"
)


class NonFiniteReward(ValueError):
  """A reward (`name`: rewards/<function>) that is NaN, infinite or past float32's range."""

  def __init__(self, name: str):
    super().__init__(f"{name}: not finite (NaN, infinite, or past float32's range)")
    self.name = name


class RewardFunctionError(InputError):
  """A reward function raised, exited, ran past reward_timeout_s or returned something other than one
  number per completion; the message names the function and the example or batch."""


def call(fn: Callable, prompts: list, completions: list, tmvp_config: Any, fields: dict[str, Any]) -> Any:
  """The calling convention of reward functions: what fn returns for the batch, called by keyword with
  prompts, completions, the run's config as tmvp_config and the examples' other fields by name, each
  only where fn's signature takes it (every one where it has **kwargs)."""
  offered = {**fields, "prompts": prompts, "completions": completions, "tmvp_config": tmvp_config}
  params = inspect.signature(fn).parameters.values()
  if not any(p.kind is p.VAR_KEYWORD for p in params):
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    offered = {k: v for k, v in offered.items() if k in named}
  return fn(**offered)


def signature_problem(fn: Callable) -> str | None:
  """Why `call` cannot call fn (a positional-only parameter, or no signature to read); None where it can."""
  try:
    params = inspect.signature(fn).parameters.values()
  except (TypeError, ValueError):
    return "has no signature to read"
  only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY]
  return f"takes {only[0]!r} by position only" if only else None


def required_fields(fn: Callable) -> tuple[str, ...]:
  """The parameters fn requires (no default) beyond those every call gives (PROVIDED): fields of the data."""
  params = inspect.signature(fn).parameters.values()
  return tuple(
    p.name
    for p in params
    if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.default is p.empty and p.name not in PROVIDED
  )


def is_conversation(x: Any) -> bool:
  """x is a list of {"role", "content"} messages (a list, tuple or array of mappings with a role)."""
  return (
    isinstance(x, (list, tuple, np.ndarray)) and len(x) > 0 and all(isinstance(m, Mapping) and "role" in m for m in x)
  )


def as_messages(prompts: list, completions: list, fields: dict[str, Any]) -> tuple[list, list, dict[str, Any]]:
  """TRL's conversational form of a batch: where its `prompt` field holds conversations, the prompts
  are those message lists (the field itself is then not passed again) and each completion is
  [{"role": "assistant", "content": text}]; otherwise the batch as it is."""
  conversations = fields.get("prompt")
  if conversations is None or len(conversations) == 0 or not is_conversation(conversations[0]):
    return prompts, completions, fields
  prompts = [[dict(m) for m in c] for c in conversations]
  completions = [[{"role": "assistant", "content": c}] for c in completions]
  return prompts, completions, {k: v for k, v in fields.items() if k != "prompt"}


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

  It returns one float per completion, NaN where the function returned None or NaN ("does not
  apply", as in TRL). A call that raises, or returns anything but a sequence of one number or None (a
  string is not one) per completion, raises RewardFunctionError naming the function and the example:
  when the whole batch raises, its examples are scored again one at a time to find the first that
  does. A call that gives no result (worker_pool.CallFailed: past its time limit, an exit) raises it naming the batch.
  """
  who = _who(name, source)

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
    # None: does not apply (NaN here). A NaN the function returns is a fault, not that: it is kept
    # non-finite (as inf), and RewardSet.score stops the run on it.
    values = [math.nan if x is None else _not_applying_nan(_number(x)) for x in scores]
    for i, (x, value) in enumerate(zip(scores, values)):
      if value is None:
        raise RewardFunctionError(
          f"{who} returned {x!r} ({type(x).__name__}){_example(i, prompts, completions)}; expected a number or None"
        )
    return values

  reward.__name__ = name
  return reward


def _not_applying_nan(value: float | None) -> float | None:
  """A returned number, a NaN as inf (NaN stands for None, "does not apply", in the values)."""
  return math.inf if value is not None and math.isnan(value) else value


def _described(e: Exception) -> str:
  """'Type: message' of an exception, raised here or in a worker process (worker_pool.CallRaised)."""
  return str(e) if isinstance(e, worker_pool.CallRaised) else f"{type(e).__name__}: {worker_pool.one_line(e)}"


def _number(x) -> float | None:
  """x as a float; None where x is not a number (a string, a list)."""
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


def reward_functions(spec: Task, task: TaskSection, tmvp_config: MaxTextView) -> RewardSet:
  """The user's reward functions when reward_functions_path is set (the file loaded here first, so that
  its errors come before anything else, a function `call` cannot call among them; each call runs in a
  worker process), else the task's; weighted by reward_weights (1.0 each where empty)."""
  prefix = templates.answer_prefix(task)
  if not task.reward_functions_path:
    own = spec.rewards(task)
    return RewardSet([bind_config(fn, task, prefix) for fn in own], (1.0,) * len(own), tuple(() for _ in own))
  path = task.reward_functions_path
  module = user_code.load_file(path, "reward_functions_path")
  missing = [n for n in task.reward_functions if not callable(getattr(module, n, None))]
  if missing:
    raise InputError(f"reward_functions: {missing} not defined in reward_functions_path={path}")
  source = f"reward_functions_path={path}"
  user = [getattr(module, name) for name in task.reward_functions]
  for name, fn in zip(task.reward_functions, user):
    problem = signature_problem(fn)
    if problem:
      raise InputError(f"{_who(name, source)}{_signature(fn)} {problem}; {FORMS}")
  workers = worker_pool.WorkerPool(
    functools.partial(user_scorer, path, tuple(task.reward_functions), tmvp_config),
    task.reward_timeout_s,
    f"reward_timeout_s={task.reward_timeout_s:g}",
  )
  return RewardSet(
    [checked(name, functools.partial(workers.call, name), prefix, source) for name in task.reward_functions],
    tuple(task.reward_weights) or (1.0,) * len(user),
    tuple(required_fields(fn) for fn in user),
    source,
  )


def user_scorer(path: str, names: tuple[str, ...], tmvp_config: MaxTextView) -> Callable[..., Any]:
  """What a reward worker runs (its WorkerPool `load`): reward_functions_path loaded in the worker; the
  handler (name, prompts, completions, fields) returns what function `name` returned for the batch,
  in TRL's conversational form where the batch is a conversation's (as_messages)."""
  module = user_code.load_file(path, "reward_functions_path")
  functions = {name: getattr(module, name) for name in names}

  def score(name: str, prompts: list, completions: list, fields: dict[str, Any]) -> Any:
    prompts, completions, fields = as_messages(prompts, completions, fields)
    return call(functions[name], prompts, completions, tmvp_config, fields)

  return score


def _who(name: str, source: str) -> str:
  return f"{source}: reward function {name}" if source else f"reward function {name}"


def _signature(fn: Callable) -> str:
  try:
    return str(inspect.signature(fn))
  except (TypeError, ValueError):
    return ""


Metrics = dict[str, tuple[float, Callable]]  # {name: (a number, its reduction over a step's calls)}


@dataclasses.dataclass
class RewardSet:
  """The run's reward functions (each as `checked` makes it: one float per completion, NaN where it
  does not apply), their weights, the fields of the data each requires (required_fields) and where
  they are defined (`source`, named in errors; empty for a task's own)."""

  functions: list[RewardFn]
  weights: tuple[float, ...]
  required: tuple[tuple[str, ...], ...]
  source: str = ""
  _warned: bool = dataclasses.field(default=False, repr=False)

  def with_function(self, fn: RewardFn, weight: float, alone: bool) -> RewardSet:
    """This set with `fn` (a checked reward function, needing no field of the data) added at `weight`;
    `alone`: the others kept at weight 0 (computed and logged, paying nothing)."""
    weights = tuple(0.0 for _ in self.weights) if alone else self.weights
    return dataclasses.replace(
      self, functions=[*self.functions, fn], weights=(*weights, weight), required=(*self.required, ())
    )

  def check_fields(self, fields: Collection[str]) -> None:
    """An InputError naming the first function that requires a parameter which is neither one every
    call gives (PROVIDED) nor one of the data's `fields`."""
    for fn, needs in zip(self.functions, self.required):
      missing = [n for n in needs if n not in fields]
      if missing:
        raise InputError(
          f"{_who(fn.__name__, self.source)} requires {missing[0]!r}, which is neither prompts, completions, "
          f"tmvp_config nor a field of the data ({', '.join(sorted(fields))}); {FORMS}"
        )

  def score(
    self, prompts: list, completions: list, fields: dict[str, Any], group_size: int
  ) -> tuple[np.ndarray, Metrics]:
    """Each completion's reward and the call's metrics. The completions come in groups of group_size
    (one prompt's samples). A function's value that is infinite, a NaN it returned, or past float32's
    range is a NonFiniteReward naming the function (rewards/<name>), before any update is made of it.

    A completion's reward is the weighted sum of the functions that apply to it (TRL's: a function's
    None counts nothing). One that no function applies to gets the mean reward of its group's others
    that some function applies to (0 where none does), so that its advantage is 0 (TRL 1.16 gives it
    advantage 0 too, leaving it out of its group's mean and std); the first such is warned of.

    Metrics, each of this call (a step's calls are averaged, counts summed): rewards/sum and
    rewards/std, the mean and std of the weighted sums over the completions some function applies to
    (TRL's reward and reward_std); rewards/mean, rewards/min and rewards/max, of the functions' values
    (unweighted; rewards/mean averages each completion's values); per function rewards/<name> and
    rewards/<name>/std, the mean and std of its values where it applies (TRL's rewards/<name>/mean and
    /std), and rewards/<name>/nones, the completions it returned None for; rewards/unscored, the
    completions no function applies to. A mean over no value is not logged."""
    values = np.array([fn(prompts, completions, **fields) for fn in self.functions], dtype=float).T
    applies = ~np.isnan(values)
    with np.errstate(over="ignore"):
      beyond = applies & ~np.isfinite(values.astype(np.float32))  # infinite, a NaN returned, past float32
    if beyond.any():
      raise NonFiniteReward(f"rewards/{self.functions[int(np.flatnonzero(beyond.any(axis=0))[0])].__name__}")
    totals = np.where(applies, values * np.asarray(self.weights), 0.0).sum(axis=1)
    scored = applies.any(axis=1)
    metrics: Metrics = {"rewards/unscored": (float((~scored).sum()), np.sum)}
    if scored.any():
      metrics.update(summaries(totals[scored], values[scored]))
    for fn, column, applied in zip(self.functions, values.T, applies.T):
      name = f"rewards/{fn.__name__}"
      metrics[f"{name}/nones"] = (float((~applied).sum()), np.sum)
      if applied.any():
        metrics[name] = (float(column[applied].mean()), np.mean)
        metrics[f"{name}/std"] = (float(column[applied].std()), np.mean)
    if scored.all():
      return totals, metrics
    if not self._warned:
      self._warned = True
      i = int(np.flatnonzero(~scored)[0])
      log.warning(
        "Every reward function returned None%s: it gets its group's mean reward (advantage 0); "
        "rewards/unscored counts such completions",
        _example(i, prompts, completions),
      )
    return others_mean_where(totals, ~scored, group_size), metrics


def summaries(totals: np.ndarray, values: np.ndarray) -> Metrics:
  """rewards/sum and rewards/std of the completions' weighted sums `totals`; rewards/mean, /min and
  /max of the functions' `values` [completions, functions] (NaN where one does not apply), each
  completion's averaged for the mean. Every completion has a value."""
  return {
    "rewards/sum": (float(totals.mean()), np.mean),
    "rewards/std": (float(totals.std()), np.mean),
    "rewards/mean": (float(np.nanmean(values, axis=1).mean()), np.mean),
    "rewards/min": (float(np.nanmin(values)), np.min),
    "rewards/max": (float(np.nanmax(values)), np.max),
  }


def others_mean_where(values: np.ndarray, left_out: np.ndarray, group_size: int) -> np.ndarray:
  """`values` (groups of group_size, one prompt's samples each) with those `left_out` replaced by
  the mean of their group's others (0 where the whole group is left out): a left-out sample then has
  advantage 0 and leaves its group's mean as the others set it."""
  groups, kept = values.reshape(-1, group_size), ~left_out.reshape(-1, group_size)
  counts = kept.sum(axis=1, keepdims=True)
  means = np.where(kept, groups, 0.0).sum(axis=1, keepdims=True) / np.maximum(counts, 1)
  return np.where(kept, groups, means).reshape(-1)
