"""An OpenEnv MCP environment (OpenEnv's MCPEnvironment with FastMCP tools, served by its create_app with
CallToolAction as the action, as OpenEnv's MCP environments are), for the tests of rl.agent=openenv's
tool episodes. It runs in OpenEnv's own venv:

    .venv/envs/openenv/bin/python tests/environments/openenv_mcp.py --port 8000

reset(a=..., b=...) asks for a + b; the tools are add(a, b) and submit(answer), whose step is rewarded
1.0 where the answer is the sum (else 0.0) and ends the episode."""

import argparse
from typing import Any

import uvicorn
from fastmcp import FastMCP
from openenv.core.env_server.http_server import create_app
from openenv.core.env_server.mcp_environment import MCPEnvironment
from openenv.core.env_server.mcp_types import CallToolAction, CallToolObservation
from openenv.core.env_server.types import Observation, State


class SumEnvironment(MCPEnvironment):
  SUPPORTS_CONCURRENT_SESSIONS = True

  def __init__(self):
    mcp = FastMCP("sum")

    @mcp.tool()
    def add(a: int, b: int) -> int:
      """Adds two integers."""
      return a + b

    @mcp.tool()
    def submit(answer: int) -> str:
      """Submits the final answer."""
      return "submitted"

    super().__init__(mcp)
    self._state = State(step_count=0)
    self._sum = 0

  def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> Observation:
    self._sum = int(kwargs.get("a", 1)) + int(kwargs.get("b", 1))
    self._state = State(episode_id=episode_id, step_count=0)
    return CallToolObservation(tool_name="", result=" Use the tools, then submit the sum.", done=False, reward=None)

  async def step_async(self, action, timeout_s=None, **kwargs) -> Observation:
    observation = await super().step_async(action, timeout_s=timeout_s, **kwargs)
    if isinstance(action, CallToolAction) and action.tool_name == "submit":
      observation.reward = 1.0 if int(action.arguments.get("answer", -1)) == self._sum else 0.0
      observation.done = True
    return observation

  def _step_impl(self, action, timeout_s=None, **kwargs) -> Observation:
    raise ValueError(f"only tool calls are actions here, not {type(action).__name__}")

  @property
  def state(self) -> State:
    return self._state


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--port", type=int, required=True)
  args = parser.parse_args()
  app = create_app(SumEnvironment, CallToolAction, CallToolObservation, env_name="sum", max_concurrent_envs=64)
  uvicorn.run(app, host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
  main()
