"""The agentic learner's tool-call format (trajectories.ToolCallParser, Qwen's
<tool_call>{"name": ..., "arguments": ...}</tool_call>) as the OpenAI-compatible server's ToolFormat
(inference/openai_server.py): OpenAI function schemas in, well-formed calls out, so an agent served
over HTTP sees and writes tools as the agentic learner trains it to."""

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
