"""The chat parser the agentic learner renders conversations with, driven by our config and the
tokenizer's template. It answers what Tunix's agentic learner and trajectory engine ask of a parser
(`parse` and `assistant_token`) without being one of Tunix's parser classes.

Tunix renders a conversation message by message and concatenates the token pieces, so rendering
must be prefix-preserving: render(conversation[:k]) must be a prefix of render(conversation[:k+1])
for the conversations an agent builds (system, user, assistant, tool, assistant, ...). At
construction the parser checks this on such a conversation with the tokenizer's own chat template.
When it fails (Qwen3's template drops earlier turns' <think> blocks and adds an empty one to the
last assistant turn), the parser says so and uses PREFIX_PRESERVING_CHATML: plain ChatML with tool
results as Qwen's <tool_response> user turns, which renders every message independently.

Message content is coerced to text (Tunix passes dataset fields as numpy scalars or arrays) and an
empty system message gets the configured system prompt (rl.system_prompt, else the data template's).
The parser also holds the data template's example turns, which every conversation opens with after
the system turn.
"""

from __future__ import annotations

import functools
import logging

import jinja2
import numpy as np

from maxtext.configs.sections import AgenticSection
from maxtext.input_pipeline.templates import PromptTemplate
from maxtext.input_pipeline.text_as_data import TextAsData

log = logging.getLogger(__name__)

PREFIX_PRESERVING_CHATML = (
  "{% for m in messages %}"
  "{% if m['role'] == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m['content'] }}\n</tool_response><|im_end|>\n"
  "{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
  "{% endfor %}"
  "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# The conversation shape the prefix check renders: every role an agent produces, two assistant turns.
_PROBE = [
  {"role": "system", "content": "S"},
  {"role": "user", "content": "U"},
  {"role": "assistant", "content": "A1"},
  {"role": "tool", "content": "T"},
  {"role": "assistant", "content": "A2"},
]


def as_text(content) -> str:
  """Message content as a str (numpy scalars and one-element arrays included)."""
  if isinstance(content, np.ndarray):
    content = content.reshape(-1)[0] if content.size == 1 else " ".join(str(x) for x in content.reshape(-1))
  if isinstance(content, bytes):
    return content.decode("utf-8")
  return str(content)


class ConfigChatParser:
  """Renders role-aware messages with the tokenizer's chat template (or the ChatML variant)."""

  def __init__(self, tokenizer, system_prompt: str, example_turns=()):
    self.system_prompt = system_prompt
    self.example_turns = tuple(example_turns)
    self.template = tokenizer.chat_template
    self.tokenizer = tokenizer
    problem = self._prefix_problem()
    if problem:
      log.warning(
        "The tokenizer's chat template is not prefix-preserving (%s); using the prefix-preserving "
        "ChatML variant for agentic rollouts",
        problem,
      )
      self.template = PREFIX_PRESERVING_CHATML
      if self._prefix_problem():
        raise ValueError("no prefix-preserving chat template for this tokenizer")
    self.prefix_preserving_variant = self.template == PREFIX_PRESERVING_CHATML
    anchor = _PROBE[:2]
    # What the template adds to a conversation to open the model's turn.
    self.generation_prompt = self.render(anchor, add_generation_prompt=True)[len(self.render(anchor)) :]

  @property
  def assistant_token(self) -> str:
    """What opens an assistant turn; Tunix strips it from assistant messages (the generation prompt
    already holds it)."""
    return self.generation_prompt

  def render(self, messages, add_generation_prompt: bool = False) -> str:
    msgs = [{"role": m["role"], "content": as_text(m["content"])} for m in messages]
    if msgs and msgs[0]["role"] == "system" and not msgs[0]["content"]:
      msgs[0]["content"] = self.system_prompt
    tok = self.tokenizer
    if self.template == tok.chat_template:
      return tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)
    env = jinja2.Environment()
    return env.from_string(self.template).render(messages=msgs, add_generation_prompt=add_generation_prompt)

  @functools.cached_property
  def turn_end(self) -> str:
    """The token the template ends a model turn with (ChatML's <|im_end|>, Gemma's <end_of_turn>):
    the first special or added token it writes after an assistant turn's content; the tokenizer's
    EOS where it writes none."""
    turn = self.render(_PROBE[:3])
    after = turn.rindex(_PROBE[2]["content"]) + len(_PROBE[2]["content"])
    tokens = {*self.tokenizer.all_special_tokens, *(t.content for t in self.tokenizer.added_tokens_decoder.values())}
    found = [(turn.find(t, after), -len(t), t) for t in tokens if t and turn.find(t, after) >= 0]
    return min(found)[2] if found else (self.tokenizer.eos_token or "")

  @property
  def turn_end_suffix(self) -> str:
    """What the template writes after a model turn's end token (`turn_end`) before the next message
    ("\n" in ChatML)."""
    turn = self.render(_PROBE[:3])
    end = turn.find(self.turn_end, turn.rindex(_PROBE[2]["content"])) if self.turn_end else -1
    return turn[end + len(self.turn_end) :] if end >= 0 else ""

  @functools.cached_property
  def tools_in_template(self) -> bool:
    """Whether the tokenizer's own chat template writes the tools it is given (Qwen3's, Llama 3.1's);
    where it does not (SmolLM2's, Gemma 3's), tools are offered in the system turn in the
    documented format (integration/tunix/tool_format.py)."""
    probe = {"type": "function", "function": {"name": "probe_tool_name", "parameters": {"type": "object"}}}
    try:
      text = self.tokenizer.apply_chat_template(_PROBE[1:2], tools=[probe], tokenize=False, add_generation_prompt=True)
    except Exception:  # a template that refuses tools  # noqa: BLE001
      return False
    return "probe_tool_name" in text

  def render_whole(self, messages: list[dict], tools: list[dict] | None = None, add_generation_prompt=True) -> str:
    """A conversation rendered whole by the tokenizer's own chat template (the assistant's turn
    opened unless add_generation_prompt is false), as `tokenizer.apply_chat_template(messages,
    tools=tools, add_generation_prompt=True)` writes it: messages as OpenAI's (an assistant's
    `tool_calls`, `tool` results), tools where the template writes them (`tools_in_template`; where
    it does not, the caller offers them in the documented format). A template that refuses a `tool`
    turn gets each tool result as a user turn in <tool_response> tags (as Qwen's ChatML writes them;
    consecutive ones in one turn); a ValueError with the template's reason where it refuses the
    conversation."""
    msgs = [{**m, "content": as_text(m.get("content") or "")} for m in messages]
    if msgs and msgs[0]["role"] == "system" and not msgs[0]["content"]:
      msgs[0]["content"] = self.system_prompt
    kwargs = {"tools": tools} if tools and self.tools_in_template else {}
    render = lambda ms: self.tokenizer.apply_chat_template(
      ms, tokenize=False, add_generation_prompt=add_generation_prompt, **kwargs
    )
    try:
      return render(msgs)
    except Exception as refused:  # noqa: BLE001 (jinja2's TemplateError, or what the template raises)
      if not any(m["role"] == "tool" for m in msgs):
        raise ValueError(f"the model's chat template refuses this conversation: {refused}") from refused
    as_user = [
      {"role": "user", "content": f"<tool_response>\n{m['content']}\n</tool_response>"} if m["role"] == "tool" else m
      for m in msgs
    ]
    try:
      return render(_merged_users(as_user))
    except Exception as refused:  # noqa: BLE001
      raise ValueError(f"the model's chat template refuses this conversation: {refused}") from refused

  def _prefix_problem(self) -> str | None:
    for k in range(2, len(_PROBE)):
      try:
        before, after = self.render(_PROBE[:k]), self.render(_PROBE[: k + 1])
      except Exception as refused:  # noqa: BLE001 (jinja2's TemplateError, or what the template raises)
        return f"it refuses a {_PROBE[k]['role']} turn: {refused}"
      if not after.startswith(before):
        return f"adding a {_PROBE[k]['role']} turn rewrites the earlier text"
      if _PROBE[k]["role"] == "assistant":
        prompt = self.render(_PROBE[:k], add_generation_prompt=True)
        if not after.startswith(prompt):
          return "an assistant turn does not start with the generation prompt"
    return None

  def encode_added(self, messages: list[dict]) -> list[int]:
    """The ids of messages an environment adds to a conversation after a model turn (tool results,
    say), each rendered as `parse` continues a conversation, the last with the generation prompt,
    their text as data (TextAsData)."""
    ids: list[int] = []
    for i, m in enumerate(messages):
      data = TextAsData(self.tokenizer)
      message = data.protect({"role": m["role"], "content": as_text(m["content"])})
      text = self.parse([message], add_generation_prompt=i == len(messages) - 1, is_first_msg=False)
      ids += data.encode(text)
    return ids

  def parse(self, messages, add_generation_prompt: bool = False, is_first_msg: bool = False) -> str:
    """The text of `messages`; a continuation (is_first_msg=False) is rendered as what it adds to a
    conversation, so pieces concatenate to the whole."""
    if is_first_msg:
      return self.render(messages, add_generation_prompt)
    anchor = _PROBE[:2]
    base = self.render(anchor)
    return self.render(anchor + list(messages), add_generation_prompt)[len(base) :]


def _merged_users(messages: list[dict]) -> list[dict]:
  """Consecutive tool results (user turns in <tool_response> tags) joined into one turn."""
  response = lambda x: x["role"] == "user" and x["content"].startswith("<tool_response>")
  out: list[dict] = []
  for m in messages:
    if out and response(m) and response(out[-1]):
      out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + m["content"]}
    else:
      out.append(m)
  return out


def for_config(agentic: AgenticSection, template: PromptTemplate) -> ConfigChatParser:
  """The run's parser: system prompt rl.system_prompt (else the data template's SYSTEM_PROMPT) and the
  data template's example turns, through the template's tokenizer."""
  return ConfigChatParser(template.tokenizer, agentic.system_prompt or template.system_prompt, template.examples)
