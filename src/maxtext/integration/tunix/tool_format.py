"""The server's tool-call formats (inference/openai_server.ToolFormat): OpenAI function schemas in,
well-formed calls out. `for_tokenizer` picks the model's own: Llama 3.1's JSON calls where its chat
template writes assistant calls that way (LlamaJsonToolFormat), else the agentic learner's
(trajectories.ToolCallParser, Qwen's <tool_call>{"name": ..., "arguments": ...}</tool_call>:
QwenToolFormat, what Qwen3's template writes and the documented format for templates without
tools), so an agent served over HTTP sees and writes tools as the model was trained to."""

from __future__ import annotations

import json
from typing import Any

from maxtext.integration.tunix.trajectories import MALFORMED_CALL, ToolCallParser


class _Schema:
  """An OpenAI tool schema where Tunix's tool prompt expects a tool (it reads get_json_schema)."""

  def __init__(self, schema: dict):
    self._schema = schema

  def get_json_schema(self) -> dict:
    return self._schema


class QwenToolFormat:
  """ToolFormat of the server: the tool prompt the agentic learner writes into the system turn, and
  its parser; malformed calls are left in the reply's text (no tool_calls are made of them)."""

  def __init__(self):
    self._parser = ToolCallParser()

  def prompt(self, tools: list[dict]) -> str:
    return self._parser.get_tool_prompt([_Schema(t) for t in tools])

  def calls(self, text: str) -> tuple[str, list[tuple[str, Any]]]:
    calls = [(c.name, c.arguments) for c in self._parser.parse(text) if c.name != MALFORMED_CALL]
    return text.split(self._parser.tool_call_begin, 1)[0].strip(), calls

  def call_text(self, name: str, arguments: Any) -> str:
    call = json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False)
    return f"{self._parser.tool_call_begin}\n{call}\n{self._parser.tool_call_end}"

  def call_opening(self, name: str | None) -> str:
    head = f'{self._parser.tool_call_begin}\n{{"name": '
    return head + '"' if name is None else head + json.dumps(name, ensure_ascii=False) + ', "arguments": '


_PYTHON_TAG = "<|python_tag|>"


class LlamaJsonToolFormat:
  """Llama 3.1's custom-tool format, as its chat template writes an assistant's call: the reply is
  the JSON {"name": NAME, "parameters": {...}} (after an optional <|python_tag|>; several calls
  joined by ";", as vLLM's llama3_json parser reads them). A reply that is not wholly such calls is
  text (no tool_calls are made of it)."""

  def prompt(self, tools: list[dict]) -> str:
    """Llama 3.1's own words for custom tools (its template writes them into the first user turn;
    this offer is used only where a template writes no tools)."""
    listed = "".join(json.dumps(t, indent=4, ensure_ascii=False) + "\n\n" for t in tools)
    return (
      "Given the following functions, please respond with a JSON for a function call with its proper arguments "
      'that best answers the given prompt.\n\nRespond in the format {"name": function name, "parameters": '
      "dictionary of argument name and its value}.Do not use variables.\n\n" + listed
    ).rstrip()

  def calls(self, text: str) -> tuple[str, list[tuple[str, Any]]]:
    body = text.strip().removeprefix(_PYTHON_TAG).strip()
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(body):
      try:
        value, end = decoder.raw_decode(body, at)
      except json.JSONDecodeError:
        return text.strip(), []
      arguments = value.get("parameters", value.get("arguments")) if isinstance(value, dict) else None
      if not isinstance(arguments, dict) or not isinstance(value.get("name"), str):
        return text.strip(), []
      calls.append((value["name"], arguments))
      rest = body[end:].lstrip()
      if rest and not rest.startswith(";"):
        return text.strip(), []
      at = len(body) - len(rest.removeprefix(";").lstrip())
    return ("", calls) if calls else (text.strip(), [])

  def call_text(self, name: str, arguments: Any) -> str:
    return json.dumps({"name": name, "parameters": arguments}, ensure_ascii=False)

  def call_opening(self, name: str | None) -> str:
    return '{"name": "' if name is None else '{"name": ' + json.dumps(name, ensure_ascii=False) + ', "parameters": '


_PROBE_CALL = {"type": "function", "function": {"name": "probe_tool_name", "arguments": {"x": 1}}}


def for_tokenizer(tokenizer) -> QwenToolFormat | LlamaJsonToolFormat:
  """The model's own tool format: LlamaJsonToolFormat where the tokenizer's chat template writes an
  assistant's call as Llama 3.1's JSON, else QwenToolFormat."""
  probe = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [_PROBE_CALL]}]
  try:
    text = tokenizer.apply_chat_template(probe, tokenize=False)
  except Exception:  # a template that refuses tool calls  # noqa: BLE001
    return QwenToolFormat()
  return LlamaJsonToolFormat() if '{"name": "probe_tool_name", "parameters": ' in text else QwenToolFormat()
