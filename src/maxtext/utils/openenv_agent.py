"""An OpenEnv environment server (rl.agent=openenv: environment.url, or environment.command started by the
run) as rl.agent episodes, run in an agent worker (utils/agent_runner.py) as OpenEnv's EnvClient plays
one, over the server's WebSocket route (/ws: each connection its own environment instance):

- reset with the example's fields (the data row's columns and `prompt`, the user turn; OpenEnv's server
  passes reset() those its signature names, all of them where it takes **kwargs) and `seed`, a hash of
  those fields (openenv_bridge.seed), so that the samples of a prompt's group play the same task;
- the reset observation's text is appended to the last user message, as a TRL environment's reset string
  is; each reply of the policy is the action {action_field: the reply's text}, and the step's observation
  text the next user turn;
- an observation's text is its `observation_field`, else its one string field that is not empty, else
  its fields as JSON (OpenEnv's done, reward and metadata left out);
- an MCP environment (its action is OpenEnv's CallToolAction) offers its tools instead: a list_tools
  step after reset gives them to the policy as functions, each call of one is a call_tool step whose
  result is the tool turn, and a reply that calls no tool ends the episode;
- the episode ends at an observation that is done, after `max_turns` replies, or when a reply ran out of
  the response budget (finish_reason length, or no room left for the next turn);
- its reward is the sum of the steps' rewards, None where no step gave one (the run's reward functions
  then judge the last reply).
An error frame from the server (an action it refused, a reset or step that raised), a closed connection
or a frame of another shape raises EnvironmentError: the episode fails, counted as the run counts
failed episodes; a step that never answers is the worker's time limit (rl.agent_timeout_s).

`describe` is the run's check at start (GET /health and /schema): the action must have one string field
the reply can fill, and no other required field. Only httpx, websockets and the openai client are
imported here (a worker loads no JAX).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from maxtext.utils import tool_conversation
from maxtext.utils.bridges.openenv_bridge import seed  # the reset seed: one per prompt's group

KEY = "rl.agent=openenv"
RESERVED = ("done", "reward", "metadata")  # OpenEnv's own fields of every observation


class EnvironmentError(RuntimeError):  # noqa: A001 (the environment's, not the OS's)
  """The environment server refused or broke the episode."""


@dataclasses.dataclass(frozen=True)
class OpenEnv:
  """Where the environment is served and how its actions and observations are read (checked by
  describe); picklable, for the agent workers."""

  url: str  # http://host:port
  action_field: str
  observation_field: str  # "": the observation's only string field, else its fields as JSON
  max_turns: int
  tools: bool = False  # an MCP environment: its tools offered as functions (its action is call_tool)

  @property
  def ws_url(self) -> str:
    return "ws" + self.url.removeprefix("http").rstrip("/") + "/ws"


def describe(url: str, field: str, observation_field: str, max_turns: int, timeout_s: float = 10.0) -> OpenEnv:
  """The environment at `url` checked (GET /health, GET /schema): ValueError naming the key, the URL
  and what was expected where it does not answer as an OpenEnv server, where its action has no field a
  reply can fill (action_field) or `observation_field` is not one of its observation's."""
  import httpx

  url = url.rstrip("/")
  try:
    health = httpx.get(f"{url}/health", timeout=timeout_s)
    schema = httpx.get(f"{url}/schema", timeout=timeout_s)
  except httpx.HTTPError as e:
    raise ValueError(f"environment.url={url}: no OpenEnv server answers there ({type(e).__name__}: {e})") from None
  if health.status_code != 200 or schema.status_code != 200:
    raise ValueError(
      f"environment.url={url}: GET /health gave {health.status_code} and GET /schema {schema.status_code}; "
      "expected an OpenEnv server (openenv.core.env_server.create_app)"
    )
  try:
    action, observation = schema.json()["action"], schema.json()["observation"]
    tools = action.get("properties", {}).get("type", {}).get("const") == "call_tool"
    chosen = "" if tools else action_field(action, field, url)
  except (KeyError, TypeError, AttributeError):
    raise ValueError(f"environment.url={url}: GET /schema is not OpenEnv's (action and observation schemas)") from None
  if tools and field:
    raise ValueError(f"environment.action_field={field}: {url} is an MCP environment, whose actions are tool calls")
  observed = sorted(n for n in schema.json().get("reset_observation", {}).get("properties", {}) if n not in RESERVED)
  observed = sorted(set(observed) | {n for n in observation.get("properties", {}) if n not in RESERVED})
  if observation_field and observation_field not in observed:
    raise ValueError(f"environment.observation_field={observation_field}: the observation of {url} has {observed}")
  return OpenEnv(url, chosen, observation_field, max_turns, tools)


def action_field(action: dict, field: str, url: str) -> str:
  """The field of the action (its JSON schema) that a reply fills: `field`, which must be one of its
  string fields, else (empty) its one required string field, else its one string field; ValueError
  naming the key where there is none, or where the action requires another field."""
  props, required = action.get("properties", {}), set(action.get("required", []))
  strings = [name for name, p in props.items() if p.get("type") == "string" and name not in RESERVED]
  fields = sorted(name for name in props if name not in RESERVED)
  if field:
    if field not in strings:
      raise ValueError(
        f"environment.action_field={field}: the action of {url} has no such string field; its fields: {fields}"
      )
    chosen = field
  else:
    candidates = [n for n in strings if n in required] or strings
    if len(candidates) != 1:
      raise ValueError(
        f"environment.action_field is empty and the action of {url} has {len(candidates)} string fields the reply "
        f"could fill ({sorted(candidates)}); name the one it fills"
      )
    (chosen,) = candidates
  others = sorted(required - {chosen})
  if others:
    raise ValueError(
      f"environment.action_field={chosen}: the action of {url} also requires {others}, which a reply's text does "
      "not fill; expected an action with one required string field"
    )
  return chosen


def text(observation: dict, field: str) -> str:
  """An observation's text (see the module docstring)."""
  values = {k: v for k, v in observation.items() if k not in RESERVED}
  if field:
    return str(values.get(field, ""))
  strings = [v for v in values.values() if isinstance(v, str) and v]
  if len(strings) <= 1:
    return strings[0] if strings else ""
  return json.dumps(values, sort_keys=True, default=str)


async def _call(ws, message: dict) -> dict:
  await ws.send(json.dumps(message))
  frame = json.loads(await ws.recv())
  if not isinstance(frame, dict) or frame.get("type") != "observation" or not isinstance(frame.get("data"), dict):
    data = frame.get("data") if isinstance(frame, dict) else frame
    raise EnvironmentError(f"the environment answered {message['type']} with {json.dumps(data)[:500]}")
  data = frame["data"]
  if not isinstance(data.get("observation"), dict):
    raise EnvironmentError(f"the environment's {message['type']} gave no observation: {json.dumps(data)[:500]}")
  return data


def episode(env: OpenEnv):
  """The async agent function `run(client, model, example)` of the environment (see the module's
  docstring)."""
  import websockets

  async def run(client, model: str, example: dict[str, Any]) -> float | None:
    row = {k: v for k, v in example.items() if k != "messages"}
    messages = [dict(m) for m in example["messages"]]
    rewards: list[float] = []

    async def step(ws, action: dict) -> dict:
      data = await _call(ws, {"type": "step", "data": action})
      if data.get("reward") is not None:
        rewards.append(float(data["reward"]))
      return data

    try:
      async with websockets.connect(env.ws_url, max_size=2**24) as ws:
        data = await _call(ws, {"type": "reset", "data": {**row, "seed": seed(row)}})
        messages[-1]["content"] = messages[-1]["content"] + text(data["observation"], env.observation_field)
        if env.tools and not data.get("done"):
          await _with_tools(ws, client, model, step, messages, env.max_turns)
        elif not env.tools:
          for _ in range(env.max_turns if not data.get("done") else 0):
            reply = await tool_conversation.ask(client, model, messages, len(example["messages"]))
            if reply is None:
              break
            choice = reply.choices[0]
            content = choice.message.content or ""
            messages.append({"role": "assistant", "content": content})
            data = await step(ws, {env.action_field: content})
            if data.get("done") or choice.finish_reason == "length":
              break
            messages.append({"role": "user", "content": text(data["observation"], env.observation_field)})
        await ws.send(json.dumps({"type": "close"}))
    except websockets.ConnectionClosed as e:
      raise EnvironmentError(f"the environment at {env.ws_url} closed the episode's connection ({e})") from None
    return sum(rewards) if rewards else None

  return run


async def _with_tools(ws, client, model: str, step, messages: list[dict], max_turns: int) -> None:
  """An MCP environment's conversation: its tools (a list_tools step) offered to the policy as
  functions, each call a call_tool step whose result is the tool turn, until a reply calls no tool, an
  observation is done or max_turns replies."""
  listed = await step(ws, {"type": "list_tools"})
  tools = [
    {
      "type": "function",
      "function": {"name": t["name"], "description": t.get("description", ""), "parameters": t["input_schema"]},
    }
    for t in listed["observation"].get("tools", [])
  ]

  async def call(name: str, arguments: str) -> tuple[str, bool]:
    try:
      parsed = json.loads(arguments)
    except json.JSONDecodeError as e:
      return f"Error: the arguments are not JSON ({e})", False
    data = await step(ws, {"type": "call_tool", "tool_name": name, "arguments": parsed})
    return tool_result(data["observation"]), bool(data.get("done"))

  await tool_conversation.converse(client, model, messages, tools, call, max_turns)


def tool_result(observation: dict) -> str:
  """A call_tool observation as the tool turn's text: its error's message, else the text of its
  result's content items, else the result as JSON."""
  error = observation.get("error")
  if error:
    return f"Error: {error.get('message', error) if isinstance(error, dict) else error}"
  result = observation.get("result")
  if isinstance(result, dict):
    items = [c.get("text") for c in result.get("content") or [] if isinstance(c, dict) and c.get("type") == "text"]
    if items:
      return "\n".join(str(t) for t in items)
    if "data" in result and result["data"] is not None:
      result = result["data"]
  return result if isinstance(result, str) else json.dumps(result, default=str)
