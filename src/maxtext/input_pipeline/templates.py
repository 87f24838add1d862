"""Prompt templates: a data template JSON rendered role-aware through the tokenizer's chat template.

Fields: SYSTEM_PROMPT and TEMPLATE (required), EXAMPLES (optional): demonstration turns, a list of
{"role": "user" | "assistant" | "tool", "content": "..."} placed between the system turn and the
question's user turn in every prompt (training, agentic rollouts and evaluation). Small models copy
a format, a tool call for instance, from a demonstrated conversation far more readily than from an
instruction.

SYSTEM_PROMPT and TEMPLATE are formatted as MaxText and Tunix format them: {question},
{system_prompt} (TEMPLATE only) and the config's tag tokens ({reasoning_start_token}, ...). A TEMPLATE
that places {system_prompt} itself gets no system turn of its own. A TEMPLATE that already holds the
chat's turn markers (one of the tokenizer's special tokens, or any chat family's markers, such as
Gemma's <start_of_turn> or ChatML's <|im_start|>; MaxText's and Tunix's Gemma templates hold them) is
the whole prompt, on every model, as MaxText takes it: it is used as plain text after the tokenizer's
BOS (where its chat template starts with one), never wrapped in the chat template a second time (on a
model of another family the markers are then plain text); agentic runs, which build conversations turn
by turn, refuse it."""

from __future__ import annotations

import json
import os
import string

from maxtext.configs.sections import TEMPLATE_DIR, TaskSection
from maxtext.input_pipeline.text_as_data import Rendered, rendered
from maxtext.utils import errors


def template_path(task: TaskSection, default: str) -> str:
  """data_template_path as given, a shipped template's bare file name (configs/templates/), or the
  shipped `default` (the task's) when empty."""
  path = task.data_template_path or default
  shipped = os.path.join(TEMPLATE_DIR, path)
  return shipped if not os.path.exists(path) and os.path.basename(path) == path and os.path.isfile(shipped) else path


_FIELDS = ("SYSTEM_PROMPT", "TEMPLATE")
_TAGS = ("reasoning_start_token", "reasoning_end_token", "solution_start_token", "solution_end_token")
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


def _placeholders(text: str, what: str, accepted: tuple[str, ...], path: str) -> set[str]:
  """The {fields} text formats; an InputError naming the file where one is not among `accepted` or
  the braces do not parse (a literal brace is written {{ or }})."""
  try:
    names = {name for _, name, _, _ in string.Formatter().parse(text) if name is not None}
  except ValueError as e:
    raise errors.InputError(
      f"data_template_path={path}: {what} does not format ({e}); write a literal brace as {{{{ or }}}}"
    ) from e
  unknown = sorted(names - set(accepted))
  if unknown:
    listed = ", ".join(f"{{{n}}}" for n in unknown)
    expected = ", ".join(f"{{{n}}}" for n in accepted)
    raise errors.InputError(f"data_template_path={path}: {what} has field(s) {listed}; expected among {expected}")
  return names


# The turn markers of the chat families a template may be written for, whatever the model's tokenizer
# (MaxText writes a TEMPLATE holding them as the whole prompt for any model).
FAMILY_MARKERS = (
  "<start_of_turn>",  # Gemma
  "<end_of_turn>",
  "<|im_start|>",  # ChatML: Qwen, SmolLM2
  "<|im_end|>",
  "<|start_header_id|>",  # Llama 3
  "<|eot_id|>",
)


def _turn_markers(text: str, tokenizer) -> list[str]:
  """The tokenizer's special tokens (its chat's turn markers among them) and the chat families' turn
  markers (FAMILY_MARKERS) that `text` holds."""
  special = {*tokenizer.all_special_tokens, *(t.content for t in tokenizer.added_tokens_decoder.values() if t.special)}
  return sorted(t for t in {*special, *FAMILY_MARKERS} if t and t in text)


class PromptTemplate:
  """SYSTEM_PROMPT (formatted with the config's tag tokens), EXAMPLES and TEMPLATE (formatted with
  {question}, {system_prompt} and the tag tokens). `agentic`: the template serves agentic rollouts,
  which need a TEMPLATE without turn markers."""

  def __init__(self, task: TaskSection, tokenizer, default: str, agentic: bool = False):
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
    self._tags = {k: getattr(task, k) for k in _TAGS}
    _placeholders(data["SYSTEM_PROMPT"], "SYSTEM_PROMPT", _TAGS, path)
    fields = _placeholders(data["TEMPLATE"], "TEMPLATE", ("question", "system_prompt", *_TAGS), path)
    self.config = data
    self.system_prompt = data["SYSTEM_PROMPT"].format(**self._tags)
    self.template = data["TEMPLATE"]
    self.examples = _example_turns(data, path)
    self.tokenizer = tokenizer
    self.answer_prefix = answer_prefix(task)
    self._system_in_template = "system_prompt" in fields
    self.turn_markers = _turn_markers(self.template, tokenizer)
    self._prefix = self._bos() if self.turn_markers else ""  # before a TEMPLATE that is the whole prompt
    if self.turn_markers and agentic:
      raise errors.InputError(
        f"data_template_path={path}: TEMPLATE holds the chat's turn markers {self.turn_markers}, and agentic "
        "runs build each conversation through the chat template; expected a TEMPLATE of the user turn alone "
        '(such as "{question}")'
      )
    if self.turn_markers and self.examples:
      raise errors.InputError(
        f"data_template_path={path}: TEMPLATE holds the chat's turn markers {self.turn_markers}, so it is the "
        "whole prompt and EXAMPLES turns have no place in it; write them into TEMPLATE or drop the markers"
      )

  def user_content(self, question: str) -> str:
    return self.template.format(question=question, system_prompt=self.system_prompt, **self._tags)

  def messages(self, question: str) -> list[dict[str, str]]:
    """The system turn (left out when SYSTEM_PROMPT is empty: the chat template's default applies,
    and when TEMPLATE places it), the example turns and the user turn."""
    own_turn = self.system_prompt and not self._system_in_template
    system = [{"role": "system", "content": self.system_prompt}] if own_turn else []
    return [*system, *self.examples, {"role": "user", "content": self.user_content(question)}]

  def render(self, question: str) -> Rendered:
    """The prompt up to and including the assistant turn's opening (and the reasoning start token
    when reasoning_start_token_in_prompt is set): through the chat template, or a TEMPLATE that holds
    the turn markers as it is, after the BOS the chat template would write. The question is data:
    what in it spells a control token is text in the prompt's ids (text_as_data.Rendered)."""
    if self.turn_markers:
      return rendered(self.tokenizer, lambda q: self._prefix + self.user_content(q) + self.answer_prefix, question)
    chat = lambda q: self.tokenizer.apply_chat_template(self.messages(q), add_generation_prompt=True, tokenize=False)
    return rendered(self.tokenizer, lambda q: chat(q) + self.answer_prefix, question)

  def render_conversation(self, messages: list[dict]) -> Rendered:
    """A conversational prompt of the data (its own turns, a system turn among them or not) as the
    prompt text: through the chat template as given, as TRL renders it, up to and including the
    assistant turn's opening (and the reasoning start token when reasoning_start_token_in_prompt is
    set). SYSTEM_PROMPT, EXAMPLES and TEMPLATE do not apply: a conversation without a system turn gets
    the chat template's default, if any. The messages' text is data, as in `render`."""
    chat = lambda ms: self.tokenizer.apply_chat_template(ms, add_generation_prompt=True, tokenize=False)
    return rendered(self.tokenizer, lambda ms: chat(ms) + self.answer_prefix, messages)

  def _bos(self) -> str:
    """The tokenizer's BOS where its chat template starts a conversation with it, else ''."""
    bos = self.tokenizer.bos_token
    if not bos or self.template.startswith(bos):
      return ""
    probe = self.tokenizer.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
    return bos if probe.startswith(bos) else ""
