"""How agentic conversations are collected and what is trained and rewarded of them.

- TrajectoryEngine: one episode of an agent in its environment, for Tunix's rollout orchestrator, with
  full-length responses kept and later turns sampled from the conversation's exact token stream;
- ConversationAgent: the conversation (system turn, the data template's example turns, the templated
  `prompts` field as the user turn, replies, with rl.tools the tools' answers), where malformed
  tool-call arguments reach the tool as an error instead of stopping training and a malformed tool
  call is answered with an error text (ToolCallParser);
- what rewards and metrics see: the conversation without example turns, every assistant turn joined;
- the first prompt (system prompt with the tools' descriptions, example turns, user turn), which
  max_prompt_length must bound.

"""

from __future__ import annotations

import asyncio
import copy
import json
import time
import uuid
from collections.abc import Callable
from typing import Any

import numpy as np
from tunix.rl.agentic.agents import agent_types
from tunix.rl.agentic.environments import tool_environment
from tunix.rl.agentic.parser.tool_parser import qwen_parser
from tunix.rl.agentic.tools import base_tool, tool_manager
from tunix.rl.rollout import base_rollout

from maxtext.configs.sections import ToolsSection
from maxtext.input_pipeline.chat_parser import ConfigChatParser
from maxtext.integration.tunix import rollout
from maxtext.rl.episode import Episode

_Status = agent_types.TrajectoryStatus


class TrajectoryEngine:
  """Runs one agent-environment episode for Tunix's rollout orchestrator (`engine_cls`, built with
  the learner's engine arguments; `collect("Token")` is what the agentic learner trains on,
  `collect("Trajectory")` the agent's Trajectory). Tunix's TrajectoryCollectEngine is not used.

  An episode: the environment's reset observation opens the agent's conversation; then each turn the
  model answers (`model_call(messages, env, max_generation_steps=..., prompt_ids=...)`, in an executor
  thread), the agent turns the answer into an action, the environment steps on it (in an executor
  thread, bounded by what is left of `timeout` seconds) and the agent records what it returned. It
  ends when the environment says done (SUCCEEDED), after the environment's `max_steps` turns
  (MAX_STEPS_REACHED), when the response budget is spent (MAX_CONTEXT_LIMIT_REACHED), or past
  `timeout` (ENV_TIMEOUT in a step, else TIMEOUT).

  Response budget: `max_response_length` tokens of sampled and environment tokens together; each model
  call may sample what is left. A completion that spends the whole budget is recorded and trained:
  the budget ends the episode only before the next model call (docs/decisions.md, "Trajectory engine").

  Token in, token out: the trainer trains on the first prompt's tokens followed by each turn's sampled
  tokens and the environment's tokens, and every later turn is sampled from exactly that token stream
  (`prompt_ids`), not from the conversation re-rendered as text and re-tokenized, which differs
  wherever sampled tokens re-tokenize differently. The environment's tokens start with what the
  template writes after a turn's EOS token (the parser's `turn_end_suffix`, "\n" in ChatML), so the
  stream is the template's rendering of the conversation.

  With `overlong_filter`, an episode that ends with a status in `filter_statuses` trains on no token
  (its masks are zeros)."""

  def __init__(
    self,
    agent,
    env,
    *,
    model_call: Callable[..., base_rollout.RolloutOutput],
    tokenizer,
    chat_parser: ConfigChatParser,
    max_response_length: int,
    timeout: float = 1800.0,
    overlong_filter: bool = False,
    filter_statuses=None,
  ):
    self.agent, self.env = agent, env
    self._model_call = model_call
    self._tokenizer, self._parser = tokenizer, chat_parser
    self._budget, self._timeout = max_response_length, timeout
    self._filter = (
      set(
        filter_statuses
        or (_Status.MAX_STEPS_REACHED, _Status.MAX_CONTEXT_LIMIT_REACHED, _Status.TIMEOUT, _Status.ENV_TIMEOUT)
      )
      if overlong_filter
      else set()
    )
    self._max_steps = getattr(env, "max_steps", 1)
    self._spent = 0  # response tokens so far: sampled and the environment's
    # The first prompt's tokens: as the sampler returned them (left-padded), else as the parser renders it.
    self.prompt_tokens = np.zeros(0, np.int32)
    self._start = 0.0
    self._versions: list[np.ndarray | None] = []  # each turn's sampled tokens' weights versions (None: not tagged)
    self.env_time = dict.fromkeys(("reset_latency", "reset_cpu_time", "step_latency", "step_cpu_time"), 0.0)

  async def collect(self, mode: str = "Token"):
    if mode not in ("Token", "Trajectory"):
      raise ValueError(f"TrajectoryEngine.collect: mode {mode!r}; expected Token or Trajectory")
    try:
      trajectory = await self._episode()
    finally:
      await asyncio.get_running_loop().run_in_executor(None, self.env.close)
    g = 0.0
    for step in reversed(trajectory.steps):
      g = step.reward + g
      step.mc_return = g
    trajectory.reward = float(sum(s.reward for s in trajectory.steps))
    if mode == "Trajectory":
      trajectory.env_time = self.env_time
      return trajectory
    return self._token_record(trajectory)

  async def _episode(self) -> agent_types.Trajectory:
    obs, _ = await self._timed("reset", self.env.reset)
    self.agent.reset()
    self.agent.update_from_env(observation=obs, reward=0.0, done=False, info={})
    trajectory = self.agent.trajectory
    first = self._parser.parse(self.agent.chat_completions, add_generation_prompt=True, is_first_msg=True)
    self.prompt_tokens = np.asarray(self._tokenizer.encode(first, add_special_tokens=False), np.int32)
    self._start = time.perf_counter()
    trajectory.status = _Status.RUNNING
    while trajectory.status == _Status.RUNNING:
      if len(trajectory.steps) >= self._max_steps:
        trajectory.status = _Status.MAX_STEPS_REACHED
      elif self._spent >= self._budget:
        trajectory.status = _Status.MAX_CONTEXT_LIMIT_REACHED
      elif await self._turn(trajectory):
        trajectory.status = _Status.SUCCEEDED if trajectory.status == _Status.RUNNING else trajectory.status
    return trajectory

  async def _turn(self, trajectory) -> bool:
    """One model turn and the environment's answer; whether the episode is done."""
    loop = asyncio.get_running_loop()
    kwargs = {"prompt_ids": self.token_stream()} if trajectory.steps else {}
    messages = self.agent.chat_completions
    out = await loop.run_in_executor(
      None,
      lambda: self._model_call(messages, self.env, max_generation_steps=self._budget - self._spent, **kwargs),
    )
    if not trajectory.steps and out.left_padded_prompt_tokens is not None:
      self.prompt_tokens = np.asarray(out.left_padded_prompt_tokens[0])
    sampled = np.asarray(out.tokens[0])
    versions = rollout.versions_of(out)
    self._versions.append(np.asarray(versions[0], np.int32) if versions else None)
    self._spent += len(sampled)
    action = self.agent.update_from_model(out.text[0]).action
    step = self.agent.get_current_step()
    step.assistant_tokens, step.assistant_masks = sampled, np.ones_like(sampled)
    if out.logprobs is not None:
      step.logprobs = out.logprobs[0]
    left = self._timeout - (time.perf_counter() - self._start)
    try:
      obs, reward, done, info = await self._timed("step", self.env.step, action, timeout=left)
    except TimeoutError:
      trajectory.status = _Status.ENV_TIMEOUT
      step.done = True
      return True
    self.agent.update_from_env(obs, reward, done, info)
    timed_out = time.perf_counter() - self._start > self._timeout
    if not done and not timed_out:
      self._add_env_tokens(step)
    if timed_out:
      trajectory.status = _Status.TIMEOUT
      step.done = True
      return True
    return bool(done)

  def _add_env_tokens(self, step) -> None:
    """The tokens of the messages the environment added after the model's turn (the turn-end suffix
    first, then each message as the template renders it, ending with the generation prompt), their
    text as data (text_as_data.TextAsData: a tool output spelling <|im_start|> is not a turn)."""
    added: list[dict] = []
    for message in reversed(self.agent.chat_completions):
      if message["role"] == "assistant":
        break
      added.insert(0, message)
    if not added:
      return
    tokens = self._parser.encode_added(added)  # tool outputs are data: never control tokens
    suffix = self._parser.turn_end_suffix
    tokens = (self._tokenizer.encode(suffix, add_special_tokens=False) if suffix else []) + list(tokens)
    step.env_tokens = np.asarray(tokens, np.int32)
    step.env_masks = np.zeros(len(tokens), np.int32)
    self._spent += len(tokens)

  async def _timed(self, what: str, fn, *args, timeout: float | None = None):
    """fn(*args) in an executor thread, its wall and CPU time added to env_time[what_*]."""

    def clocked():
      cpu = time.thread_time()
      return fn(*args), time.thread_time() - cpu

    wall = time.perf_counter()
    future = asyncio.get_running_loop().run_in_executor(None, clocked)
    result, cpu = await (future if timeout is None else asyncio.wait_for(future, timeout))
    self.env_time[f"{what}_latency"] += time.perf_counter() - wall
    self.env_time[f"{what}_cpu_time"] += cpu
    return result

  def token_stream(self) -> np.ndarray:
    """The conversation's tokens so far: the prompt the sampler saw (left padding stripped), then
    each turn's sampled tokens and the environment's tokens."""
    pieces = [self._prompt()]
    for step in self.agent.trajectory.steps:
      pieces += [np.asarray(t, np.int32) for t in (step.assistant_tokens, step.env_tokens) if t is not None]
    return np.concatenate(pieces)

  def _prompt(self) -> np.ndarray:
    """The first prompt as the sampler saw it, its left padding stripped."""
    prompt = np.asarray(self.prompt_tokens, np.int32)
    return prompt[np.argmax(prompt != self._tokenizer.pad_id()) :]

  def _token_record(self, trajectory) -> Episode:
    """What the agentic learner trains on (rl.episode.Episode): the completion's tokens after the
    prompt (sampled: mask 1, the environment's: mask 0), the sampler's log-probs (0 for the
    environment's tokens) and versions where the engine tags them, the conversation and its reward,
    ending, policy version and group."""
    tokens, masks, logprobs, versions = [], [], [], []
    turn_versions = [v for v in self._versions if v is not None]
    tagged = len(turn_versions) == len(self._versions)
    for i, step in enumerate(trajectory.steps):
      if step.assistant_tokens is not None and len(step.assistant_tokens):
        tokens.append(step.assistant_tokens)
        masks.append(step.assistant_masks)
        logprobs.append(np.zeros(len(step.assistant_tokens)) if step.logprobs is None else step.logprobs)
        if tagged:
          versions.append(turn_versions[i])
      if step.env_tokens is not None and len(step.env_tokens):
        tokens.append(step.env_tokens)
        masks.append(step.env_masks)
        logprobs.append(np.zeros(len(step.env_tokens)))
        versions.append(np.full(len(step.env_tokens), -1, np.int32))
    mask = np.concatenate(masks).astype(np.int32) if masks else np.array([], np.int32)
    has_logps = any(step.logprobs is not None for step in trajectory.steps)
    return Episode(
      prompt_ids=self._prompt(),
      completion_ids=np.concatenate(tokens).astype(np.int32) if tokens else np.array([], np.int32),
      completion_mask=np.zeros_like(mask) if trajectory.status in self._filter else mask,
      logprobs=(np.concatenate(logprobs) if logprobs else np.zeros(0, np.float32)) if has_logps else None,
      versions=(np.concatenate(versions).astype(np.int32) if versions else np.zeros(0, np.int32)) if tagged else None,
      version=self.env.task.get("policy_version"),
      conversation=self.agent.chat_completions,
      example=trajectory.task,
      group_id=self.env.extra_kwargs.get("group_id"),
      ending=trajectory.status.name,
      trajectory_reward=trajectory.reward,
      timings={"env_time": self.env_time, "reward_time": {"reward_latency": 0.0, "reward_cpu_time": 0.0}},
    )


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
