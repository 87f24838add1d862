"""How agentic conversations are collected and what is trained and rewarded of them.

- TrajectoryEngine: Tunix's trajectory collection with full-length responses kept and later turns
  sampled from the conversation's exact token stream;
- ConversationAgent: the conversation (system turn, the data template's example turns, the templated
  `prompts` field as the user turn, replies, with rl.tools the tools' answers), where malformed
  tool-call arguments reach the tool as an error instead of stopping training and a malformed tool
  call is answered with an error text (ToolCallParser);
- what rewards and metrics see: the conversation without example turns, every assistant turn joined;
- the first prompt (system prompt with the tools' descriptions, example turns, user turn), which
  max_prompt_length must bound.

The private Tunix members used here are listed, with why, in private_api.py.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
from tunix.rl.agentic.agents import agent_types
from tunix.rl.agentic.environments import tool_environment
from tunix.rl.agentic.parser.tool_parser import qwen_parser
from tunix.rl.agentic.tools import base_tool, tool_manager
from tunix.rl.agentic.trajectory import trajectory_collect_engine

from maxtext.configs.sections import ToolsSection
from maxtext.input_pipeline.chat_parser import ConfigChatParser


class TrajectoryEngine(trajectory_collect_engine.TrajectoryCollectEngine):
  """Tunix's trajectory collection with two guarantees.

  Full-length responses kept: a completion that uses the whole response budget (a short completion
  plus its EOS can reach it too) is recorded and trained: the budget check right after the model call
  is skipped; the next step's check ends the episode with the response recorded (docs/decisions.md,
  "Trajectory engine").

  Token in, token out: the trainer trains on the first prompt's tokens followed by each turn's
  sampled tokens and the environment's tokens, but Tunix samples every later turn from the
  conversation re-rendered as text and re-tokenized, which differs wherever sampled tokens
  re-tokenize differently. Here every later turn is sampled from that exact token stream
  (`prompt_ids`, passed to the learner's model call). The environment's tokens start with what the
  template writes after a turn's EOS token ("\n" in ChatML; Tunix left it out), so the stream is
  the template's rendering of the conversation.
  """

  model_call_kwargs: dict[str, Any]  # set by TrajectoryCollectEngine.__init__

  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self._model_just_answered = False
    model_call = self.model_call

    def call_and_mark(*call_args, **call_kwargs):
      out = model_call(*call_args, **call_kwargs)
      self._model_just_answered = True
      return out

    self.model_call = call_and_mark

  async def _one_step(self) -> bool:
    if self.agent.trajectory.steps:
      self.model_call_kwargs = {**self.model_call_kwargs, "prompt_ids": self.token_stream()}
    done = await super()._one_step()
    self._prepend_turn_end()
    return done

  def _prepend_turn_end(self) -> None:
    step = self.agent.get_current_step()
    suffix = getattr(self.chat_parser, "turn_end_suffix", "")
    if step is None or getattr(step, "env_tokens", None) is None or not suffix:
      return
    tokens = self.tokenizer.encode(suffix, add_special_tokens=False)
    step.env_tokens = np.concatenate([np.asarray(tokens, step.env_tokens.dtype), step.env_tokens])
    step.env_masks = np.concatenate([np.zeros(len(tokens), step.env_masks.dtype), step.env_masks])
    self._response_token_count += len(tokens)

  def token_stream(self) -> np.ndarray:
    """The conversation's tokens so far: the prompt the sampler saw (left padding stripped), then
    each turn's sampled tokens and the environment's tokens."""
    trajectory = self.agent.trajectory
    prompt = np.asarray(trajectory.prompt_tokens, np.int32)
    pieces = [prompt[np.argmax(prompt != self.tokenizer.pad_id()) :]]
    for step in trajectory.steps:
      pieces += [
        np.asarray(t, np.int32)
        for t in (getattr(step, "assistant_tokens", None), getattr(step, "env_tokens", None))
        if t is not None
      ]
    return np.concatenate(pieces)

  def _check_and_set_context_limit_reached(self) -> bool:
    if self._model_just_answered:  # the check right after the model call, before the response is recorded
      self._model_just_answered = False
      return False
    return super()._check_and_set_context_limit_reached()


def joined_assistant_turns(conversation: list[dict]) -> list[dict]:
  """The conversation with its first assistant message holding every assistant turn's text, which
  is what Tunix hands the reward functions as the completion."""
  turns = [str(m["content"]) for m in conversation if m["role"] == "assistant"]
  if len(turns) < 2:
    return conversation
  first = next(i for i, m in enumerate(conversation) if m["role"] == "assistant")
  out = list(conversation)
  out[first] = {**out[first], "content": "\n".join(turns)}
  return out


# Marks a conversation's demonstration turns, which rewards and metrics leave out (a str: Tunix
# requires every message field to be one).
EXAMPLE = "example"


def without_examples(conversation: list[dict]) -> list[dict]:
  """The conversation less its example turns: what rewards and tool metrics see."""
  return [m for m in conversation if not m.get(EXAMPLE)]


MALFORMED_CALL = "<malformed tool call>"  # the call ToolCallParser makes of a malformed one


class MalformedCall(base_tool.BaseTool):
  """Answers a malformed tool call (the environment's tool MALFORMED_CALL) with an error text."""

  def get_json_schema(self) -> dict[str, Any]:
    return {"type": "function", "function": {"name": self.name, "parameters": {}}}

  def apply(self, **kwargs) -> base_tool.ToolOutput:
    expected = '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'
    return base_tool.ToolOutput(
      name=self.name, error=f"malformed tool call: {kwargs.get('problem')}; expected {expected}"
    )


class ToolCallParser(qwen_parser.QwenToolParser):
  """Tunix's Qwen tool-call format, <tool_call>{"name": ..., "arguments": ...}</tool_call>, where a
  malformed call (not JSON, not an object with a "name" string and "arguments", or a <tool_call>
  without its </tool_call>) becomes a call of MALFORMED_CALL whose `problem` says what is wrong, so it
  gets an error turn and counts as a failed call (docs/decisions.md, "Tool-call parser")."""

  def parse(self, model_response: str) -> list[base_tool.ToolCall]:
    calls = []
    rest = model_response
    while (start := rest.find(self.tool_call_begin)) != -1:
      rest = rest[start + len(self.tool_call_begin) :]
      end = rest.find(self.tool_call_end)
      if end == -1:
        calls.append(_malformed(f"no {self.tool_call_end} after {self.tool_call_begin}"))
        break
      calls.append(_tool_call(rest[:end].strip()))
      rest = rest[end + len(self.tool_call_end) :]
    return calls


def _malformed(problem: str) -> base_tool.ToolCall:
  return base_tool.ToolCall(name=MALFORMED_CALL, arguments={"problem": problem})


def _tool_call(text: str) -> base_tool.ToolCall:
  try:
    call = json.loads(text)
  except json.JSONDecodeError as e:
    return _malformed(f"not JSON ({e})")
  if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
    return _malformed('not a JSON object with a "name" string and "arguments"')
  return base_tool.ToolCall(name=call["name"], arguments=call["arguments"])


class ConversationAgent:
  """One conversation, as Tunix's trajectory engine drives an agent (`reset`, `update_from_env`,
  `update_from_model`, `chat_completions`, `trajectory`, `get_current_step`); Tunix's agent classes
  are not used.

  The conversation: the system turn (the system prompt; with tools, their descriptions after a blank
  line), the data template's example turns (marked EXAMPLE), the user turn (the task's `prompts`,
  the user content the data template renders), then the model's replies and, with tools, the tools'
  answers ("Tool returned result: ..." tool turns). Without tools a reply is the episode's action.
  With tools a reply's calls are parsed by ToolCallParser (so the environment needs MALFORMED_CALL
  among its tools; agent_kwargs adds it) and made what Tunix's ToolEnvironment can take: a reply
  without calls, or with a `finish` call, ends the episode with the whole reply as its response
  ({"response": the reply}); any other call's arguments are a JSON object's text, and model-written
  arguments that are not an object (a string, a list, broken JSON) reach the tool as
  one `invalid_arguments` argument, which it answers with an error text instead of stopping training.
  The empty observation that ends an episode adds nothing."""

  def __init__(self, system_prompt: str, example_turns=(), tool_map=None):
    self.system_prompt = system_prompt
    self.example_turns = tuple(example_turns)
    self._calls = ToolCallParser() if tool_map else None
    tools_prompt = self._calls.get_tool_prompt(tool_manager.ToolManager(tool_map).get_tools()) if self._calls else ""
    self._system = (
      system_prompt.rstrip() + "\n\n" + tools_prompt
      if system_prompt and tools_prompt
      else (system_prompt or "") + tools_prompt
    )
    self.reset()

  def reset(self) -> None:
    self.trajectory = agent_types.Trajectory()
    self.chat_completions: list[dict[str, Any]] = [{"role": "system", "content": self._system}]
    self.chat_completions.extend({**turn, EXAMPLE: "yes"} for turn in self.example_turns)

  def get_current_step(self) -> agent_types.Step | None:
    return self.trajectory.steps[-1] if self.trajectory.steps else None

  def update_from_env(self, observation, reward: float, done: bool, info=None, **kwargs) -> None:
    if self.trajectory.task is None:
      self.trajectory.task = {"prompts": [observation]} if isinstance(observation, str) else copy.deepcopy(observation)
    step = self.get_current_step()
    if step is not None:
      step.observation, step.reward, step.done, step.info = observation, reward, done, info or {}
    if isinstance(observation, str):
      self.chat_completions.append({"role": "user", "content": observation})
    elif isinstance(observation, dict) and "tool_outputs" in observation:
      for call_id, output in observation["tool_outputs"].items():
        self.chat_completions.append(
          {"role": "tool", "tool_call_id": call_id, "content": "Tool returned result: " + (output or "")}
        )
    elif isinstance(observation, dict) and ("prompts" in observation or "question" in observation):
      user = observation["prompts"] if "prompts" in observation else observation["question"]
      self.chat_completions.append({"role": "user", "content": user or ""})

  def update_from_model(self, response: str, **kwargs) -> agent_types.Action:
    action = response if self._calls is None else [_call_dict(c, response) for c in self._parse_calls(response)]
    self.chat_completions.append({"role": "assistant", "content": response})
    self.trajectory.steps.append(
      agent_types.Step(
        chat_completions=copy.deepcopy(self.chat_completions),
        action=agent_types.Action(action=action),
        model_response=response,
      )
    )
    return agent_types.Action(action=action)

  def _parse_calls(self, response: str) -> list[base_tool.ToolCall]:
    assert self._calls is not None
    return self._calls.parse(response) or [base_tool.ToolCall(name="finish", arguments={"response": response})]


def _call_dict(call: base_tool.ToolCall, response: str) -> dict:
  """A parsed call as ToolEnvironment takes it (see ConversationAgent)."""
  args = call.arguments
  if call.name == "finish":
    args = {"response": response}
  else:
    args = _json_object_text(json.dumps(args) if isinstance(args, dict) else args)
  return {"id": str(uuid.uuid4()), "type": "function", "function": {"name": call.name, "arguments": args}}


def _json_object_text(arguments) -> str:
  """Tool-call arguments (a dict already turned into its JSON text) as the text of a JSON
  object; anything else wrapped as invalid_arguments."""
  if isinstance(arguments, str):
    try:
      if isinstance(json.loads(arguments), dict):
        return arguments
    except json.JSONDecodeError:
      pass
  return json.dumps({"invalid_arguments": arguments if isinstance(arguments, str) else repr(arguments)})


def agent_kwargs(tools: ToolsSection, tool_map, example_turns) -> dict:
  """The learner's agent and environment arguments: ConversationAgent, in a ToolEnvironment with
  tools (and MalformedCall as MALFORMED_CALL), else in Tunix's default environment."""
  if not tool_map:
    return dict(agent_class=ConversationAgent, agent_kwargs={"example_turns": example_turns})
  return dict(
    agent_class=ConversationAgent,
    agent_kwargs={"tool_map": tool_map, "example_turns": example_turns},
    env_class=tool_environment.ToolEnvironment,
    env_kwargs={"tool_map": {**tool_map, MALFORMED_CALL: MalformedCall}, "max_steps": tools.max_turns},
  )


def first_prompt_renderer(tools: ToolsSection, parser: ConfigChatParser, tool_map=None) -> Callable[[str], str]:
  """user turn -> the first prompt the agent sends to the sampler (system prompt with the tools'
  descriptions, example turns, user turn, generation prompt), which max_prompt_length must bound."""
  kwargs = agent_kwargs(tools, tool_map, parser.example_turns)
  opening = kwargs["agent_class"](system_prompt=parser.system_prompt, **kwargs["agent_kwargs"]).chat_completions
  return lambda user: parser.parse(
    [*opening, {"role": "user", "content": user}], add_generation_prompt=True, is_first_msg=True
  )
