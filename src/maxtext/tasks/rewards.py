"""The run's reward functions, bound to their config and checked: the task's own, or the user's
(reward_functions_path + reward_functions, MaxText's signature fn(prompts, completions, tmvp_config,
**kwargs) with the whole config's MaxText view as tmvp_config)."""

from __future__ import annotations

from maxtext.configs.sections import MaxTextView, TaskSection
from maxtext.input_pipeline import templates
from maxtext.tasks.task import RewardFn, Task
from maxtext.utils import user_code
from maxtext.utils.errors import ConfigError


class RewardFunctionError(ValueError):
  """A reward function raised or returned something other than one float per completion."""


def bind_config(fn: RewardFn, tmvp_config: TaskSection | MaxTextView, answer_prefix: str = "") -> RewardFn:
  """fn with tmvp_config bound and its output checked, keeping its name (Tunix logs rewards/<name>).

  answer_prefix: what the prompt ends with (reasoning_start_token_in_prompt), so the reward sees the
  completion as the model wrote it.
  """

  def reward(prompts, completions, **kwargs):
    try:
      scores = fn(prompts, [answer_prefix + c for c in completions], tmvp_config, **kwargs)
    except Exception as e:
      raise RewardFunctionError(f"reward function {fn.__name__} raised {type(e).__name__}: {e}") from e
    if scores is None or len(scores) != len(completions):
      got = "None" if scores is None else f"{len(scores)} values"
      raise RewardFunctionError(f"reward function {fn.__name__} returned {got} for {len(completions)} completions")
    return [float(x) for x in scores]

  reward.__name__ = fn.__name__
  return reward


def reward_functions(task: Task, cfg: TaskSection, tmvp_config: MaxTextView) -> list[RewardFn]:
  """The user's reward functions when reward_functions_path is set, else the task's."""
  prefix = templates.answer_prefix(cfg)
  if not cfg.reward_functions_path:
    if cfg.reward_functions:
      raise ConfigError("reward_functions: set reward_functions_path to the file that defines them")
    return [bind_config(fn, cfg, prefix) for fn in task.rewards(cfg)]
  path = cfg.reward_functions_path
  module = user_code.load_file(path, "reward_functions_path")
  if not cfg.reward_functions:
    raise ConfigError(f"reward_functions: name the functions of {path} to use")
  missing = [n for n in cfg.reward_functions if not callable(getattr(module, n, None))]
  if missing:
    raise ConfigError(f"reward_functions: {missing} not defined in reward_functions_path={path}")
  return [bind_config(getattr(module, n), tmvp_config, prefix) for n in cfg.reward_functions]
