"""OpenEnv harness sessions written with OpenEnv 0.10.0's own harness API (openenv.core.harness:
ResourceSessionFactory, ResourceSession, ToolResult, VerifyResult; StepEnvSessionAdapter over an
environment server's client), for the tests of rl.agent=openenv with environment.id. They load in OpenEnv's
own venv (.venv/envs/openenv), where utils/bridges/openenv_bridge.py plays them.

- `SumSessions`: each session asks for a + b (drawn from the seed; the task's `a` and `b` where it has
  them); its tools are add(a, b) and submit(answer), whose result carries the reward (1.0 for the sum,
  else 0.0) and ends the episode; verify forwards it (0.0 where nothing was submitted).
- `word_sessions(base_url)`: sessions over an OpenEnv environment server (tests/environments/openenv_word.py)
  through OpenEnv's StepEnvSessionAdapter and GenericEnvClient: its one tool say(word) is a step, and
  OpenEnv's default tool results and verify give the server's reward.
- `make_sums(flaw=...)`: SumSessions with a flaw (a task's `flaw` field chooses its own), for the failure
  tests: "unscored" (no reward anywhere), "disagree" (verify's reward is not the tool result's), "raises"
  (create raises), "hangs" (submit never returns).
- `NotAFactory`, `broken_maker`: what the run refuses at start.
"""

from __future__ import annotations

import random
import time
from typing import Any

from openenv.core.env_server.mcp_types import Tool
from openenv.core.generic_client import GenericEnvClient
from openenv.core.harness import (
  ResourceSession,
  ResourceSessionFactory,
  StepEnvSessionAdapter,
  ToolResult,
  VerifyResult,
)

ADD = Tool(
  name="add",
  description="Adds two integers.",
  input_schema={
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
  },
)
SUBMIT = Tool(
  name="submit",
  description="Submits the final answer.",
  input_schema={"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"]},
)


class SumSession(ResourceSession):
  def __init__(self, a: int, b: int, flaw: str):
    self.a, self.b, self.flaw = a, b, flaw
    self.reward: float | None = None

  def initial_messages(self) -> list[dict[str, Any]]:
    return [
      {"role": "system", "content": "Use the tools."},
      {"role": "user", "content": f"What is {self.a} + {self.b}? Add them, then submit the sum."},
    ]

  def list_tools(self) -> list[Tool]:
    return [ADD, SUBMIT]

  def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
    if name == "add":
      return ToolResult(data=int(arguments["a"]) + int(arguments["b"]))
    if name == "submit":
      if self.flaw == "hangs":
        time.sleep(3600)
      self.reward = 1.0 if int(arguments["answer"]) == self.a + self.b else 0.0
      metadata = {} if self.flaw == "unscored" else {"reward": self.reward}
      return ToolResult(data="submitted", done=True, metadata=metadata)
    raise KeyError(f"Unknown tool: {name}")

  def verify(self, transcript: list[dict[str, Any]], final_state: Any | None = None) -> VerifyResult:
    if self.flaw == "unscored":
      return VerifyResult(env_reward=None, done=True)
    if self.flaw == "disagree":
      return VerifyResult(env_reward=0.5, done=True)
    reward = 0.0 if self.reward is None else self.reward  # a rollout that never submitted scores 0
    return VerifyResult(env_reward=reward, done=self.reward is not None, metrics={"turns": len(transcript)})

  def close(self) -> None:
    pass


class SumSessions(ResourceSessionFactory[SumSession]):
  def __init__(self, flaw: str = ""):
    self.flaw = flaw

  def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> SumSession:
    task = task or {}
    flaw = task.get("flaw", self.flaw)
    if flaw == "raises":
      raise RuntimeError("no sandbox left for this episode")
    draw = random.Random(seed)
    return SumSession(int(task.get("a", draw.randint(1, 9))), int(task.get("b", draw.randint(1, 9))), flaw)


def make_sums(flaw: str = "") -> SumSessions:
  return SumSessions(flaw)


SAY = Tool(
  name="say",
  description="Says a word to the environment.",
  input_schema={"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
)


class WordSessions(ResourceSessionFactory[StepEnvSessionAdapter]):
  def __init__(self, base_url: str):
    self.base_url = base_url

  def create(self, task: Any, seed: int | None = None, episode_id: str | None = None) -> StepEnvSessionAdapter:
    return StepEnvSessionAdapter(
      GenericEnvClient(base_url=self.base_url),
      task=task,
      seed=seed,
      episode_id=episode_id,
      tool_specs=[SAY],
      action_builder=lambda name, arguments: {"message": arguments["word"]},
      initial_messages_builder=lambda result, task: [
        {"role": "user", "content": f"{task['prompt']} {result.observation['prompt'].strip()} Use the say tool."}
      ],
      reset_kwargs={"word": task["word"]} if "word" in task else {},
    )


def word_sessions(base_url: str) -> WordSessions:
  return WordSessions(base_url)


class NotAFactory:
  pass


def broken_maker(size: int = 1):
  raise ValueError(f"size {size} is not a size this environment has")
