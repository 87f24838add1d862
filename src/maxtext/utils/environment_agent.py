"""A TRL environment (GRPOTrainer's `environment_factory`) as an rl.agent episode, run in an agent worker
(utils/agent_runner.py) as TRL runs it in its tool loop:

- one instance per episode, made by the factory (a class, or any callable returning one; a dict of
  them, TRL's multi-environment form, picks each example's by its `environment` field);
- `reset(**row)` with the example's fields (the data row's columns, and `prompt`, the user turn):
  a string it returns is appended to the last user message (TRL: `content + observation`);
- the instance's public methods (the functions of its class not starting with "_", but reset and
  get_reward) are the tools, their schemas transformers' get_json_schema's, as TRL offers them;
- the conversation goes through the episode's client with those tools until a reply makes no tool
  call or its budget ends it (finish_reason length, or no room left after the tool results); each
  call runs on the instance with the model's arguments (an async method is awaited) and its result
  comes back as a tool message of str(result), an exception as str({"error": ...}), as in TRL;
- the reward is `get_reward()` where the class defines it (awaited when async), else None (the run's
  reward functions judge the last reply).

Only this, the openai client (utils/tool_conversation.py's loop) and transformers' schema helper are
imported here (a worker loads no JAX).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Any

from maxtext.utils import tool_conversation

RESERVED = ("reset", "get_reward")
FORM = (
  "a TRL environment_factory: a class (or callable) whose instances have reset(**row) -> str | None, public "
  "methods as tools and optionally get_reward() -> float"
)


def tool_methods(cls: type) -> list[str]:
  """The names of the methods of `cls` that are tools, as TRL lists them."""
  return [
    name
    for name, _ in inspect.getmembers(cls, predicate=inspect.isfunction)
    if name not in RESERVED and not name.startswith("_")
  ]


def check(cls: type, where: str) -> None:
  """A ValueError naming `where` for a class that is not an environment: no reset, or a tool method
  whose schema cannot be built (an argument without a type hint, no docstring or no Args line for an
  argument). Inspects the class only: no instance is made."""
  import types

  from transformers.utils import get_json_schema

  if not callable(getattr(cls, "reset", None)):
    raise ValueError(f"{where}: {cls.__name__} has no reset(); expected {FORM}")
  for name in tool_methods(cls):
    try:
      get_json_schema(types.MethodType(getattr(cls, name), object()))
    except Exception as e:  # noqa: BLE001 (transformers' reasons, named)
      raise ValueError(
        f"{where}: tool method {cls.__name__}.{name}: {' '.join(str(e).split())} (a tool method needs a type hint "
        "on every argument and a Google-style docstring with an Args: line for each)"
      ) from None


def schemas(instance: Any) -> list[dict]:
  """The OpenAI function schemas of an instance's tools (transformers' get_json_schema of each
  bound method: type hints and a Google-style docstring)."""
  from transformers.utils import get_json_schema

  return [get_json_schema(getattr(instance, name)) for name in tool_methods(type(instance))]


async def _maybe_await(value):
  return await value if inspect.isawaitable(value) else value


def episode(factory: Callable[[], Any] | dict[str, Callable[[], Any]]) -> Callable:
  """The async agent function `run(client, model, example)` of `factory` (see the module docstring);
  a dict of them (TRL's multi-environment form): each example's `environment` field names its own,
  and that field is not passed to reset."""

  async def run(client, model: str, example: dict) -> float | None:
    if isinstance(factory, dict):
      name = example.get("environment")
      if name not in factory:
        raise KeyError(f"the example's environment {name!r} is none of {sorted(factory)}")
      chosen = factory[name]
    else:
      chosen = factory
    env = chosen()
    if not callable(getattr(env, "reset", None)):
      raise TypeError(f"{chosen!r} made {type(env).__name__!r}, which has no reset(); expected {FORM}")
    left_out = ("messages", "environment") if isinstance(factory, dict) else ("messages",)
    row = {k: v for k, v in example.items() if k not in left_out}
    observation = env.reset(**row)
    messages = [dict(m) for m in example["messages"]]
    if isinstance(observation, str):
      messages[-1]["content"] = messages[-1]["content"] + observation
    methods = {name: getattr(env, name) for name in tool_methods(type(env))}

    async def call(name: str, arguments: str) -> tuple[str, bool]:
      try:
        if name not in methods:
          raise ValueError(f"Tool {name} not found.")
        result: Any = await _maybe_await(methods[name](**json.loads(arguments)))
      except Exception as e:  # noqa: BLE001 (the tool's fault, shown to the model as TRL shows it)
        result = {"error": str(e)}
      return str(result), False

    await tool_conversation.converse(client, model, messages, schemas(env), call, turns=None)
    get_reward = getattr(env, "get_reward", None)
    return None if get_reward is None else float(await _maybe_await(get_reward()))

  return run
