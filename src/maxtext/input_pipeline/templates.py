"""Prompt templates: a data template JSON rendered role-aware through the tokenizer's chat template.

Fields: SYSTEM_PROMPT and TEMPLATE (required), EXAMPLES (optional): demonstration turns, a list of
{"role": "user" | "assistant" | "tool", "content": "..."} placed between the system turn and the
question's user turn in every prompt (training, agentic rollouts and evaluation). Small models copy
a format, a tool call for instance, from a demonstrated conversation far more readily than from an
instruction."""

from __future__ import annotations

import json
import os

from maxtext.configs.sections import TEMPLATE_DIR, TaskSection
from maxtext.utils import errors


def template_path(task: TaskSection, default: str) -> str:
  """data_template_path as given, a shipped template's bare file name (configs/templates/), or the
  shipped `default` (the task's) when empty."""
  path = task.data_template_path or default
  shipped = os.path.join(TEMPLATE_DIR, path)
  return shipped if not os.path.exists(path) and os.path.basename(path) == path and os.path.isfile(shipped) else path


_FIELDS = ("SYSTEM_PROMPT", "TEMPLATE")
_EXAMPLE_ROLES = ("user", "assistant", "tool")


def _example_turns(data: dict, path: str) -> list[dict[str, str]]:
  """EXAMPLES checked: a list of {role, content} turns with roles user, assistant or tool."""
  turns = data.get("EXAMPLES", [])
  expected = f'expected a list of {{"role": one of {list(_EXAMPLE_ROLES)}, "content": text}}'
  if not isinstance(turns, list):
    raise errors.InputError(f"data_template_path={path}: EXAMPLES is {type(turns).__name__}; {expected}")
  for i, turn in enumerate(turns):
    if (
      not isinstance(turn, dict)
      or set(turn) != {"role", "content"}
      or turn["role"] not in _EXAMPLE_ROLES
      or not isinstance(turn["content"], str)
    ):
      raise errors.InputError(f"data_template_path={path}: EXAMPLES[{i}] is {turn!r}; {expected}")
  return [dict(t) for t in turns]


def answer_prefix(task: TaskSection) -> str:
  """What the prompt ends with and the model's completion therefore lacks: the reasoning start
  token when reasoning_start_token_in_prompt is set."""
  return task.reasoning_start_token if task.reasoning_start_token_in_prompt else ""


class PromptTemplate:
  """SYSTEM_PROMPT (formatted with the config's tag tokens), EXAMPLES and TEMPLATE (formatted with
  {question})."""

  def __init__(self, task: TaskSection, tokenizer, default: str):
    path = template_path(task, default)
    try:
      with open(path, encoding="utf-8") as f:
        data = json.load(f)
    except OSError as e:
      raise errors.MissingInputError(f"data_template_path={path}: cannot read ({e.strerror})") from e
    except json.JSONDecodeError as e:
      raise errors.InputError(f"data_template_path={path}: not valid JSON ({e})") from e
    missing = [k for k in _FIELDS if k not in data]
    if missing:
      raise errors.InputError(f"data_template_path={path}: missing field(s) {missing}; expected {list(_FIELDS)}")
    tags = {
      k: getattr(task, k)
      for k in ("reasoning_start_token", "reasoning_end_token", "solution_start_token", "solution_end_token")
    }
    self.config = data
    self.system_prompt = data["SYSTEM_PROMPT"].format(**tags)
    self.template = data["TEMPLATE"]
    self.examples = _example_turns(data, path)
    self.tokenizer = tokenizer
    self.answer_prefix = answer_prefix(task)

  def user_content(self, question: str) -> str:
    return self.template.format(question=question)

  def messages(self, question: str) -> list[dict[str, str]]:
    """The system turn (left out when SYSTEM_PROMPT is empty: the chat template's default applies),
    the example turns and the user turn."""
    system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
    return [*system, *self.examples, {"role": "user", "content": self.user_content(question)}]

  def render(self, question: str) -> str:
    """The prompt text up to and including the assistant turn's opening (and the reasoning start
    token when reasoning_start_token_in_prompt is set)."""
    text = self.tokenizer.apply_chat_template(self.messages(question), add_generation_prompt=True, tokenize=False)
    return text + self.answer_prefix
