"""The tool loop of an episode that a worker drives through the served policy (utils/environment_agent.py's
TRL environments, utils/openenv_agent.py's OpenEnv environments): ask, run each tool call the reply
makes, append its result as the tool turn, and ask again.

Only the openai client is imported here (a worker loads no JAX)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import openai

# call(name, arguments): the tool turn's text for a call (its arguments as the model wrote them, JSON
# text) and whether the episode is done after it
Call = Callable[[str, str], Awaitable[tuple[str, bool]]]


async def ask(client, model: str, messages: list[dict], opening: int, **options):
  """The policy's reply to `messages`, or None where the response budget is used up by what the turns
  after the first `opening` messages added (the server's 400 naming the budget); other errors raise."""
  try:
    return await client.chat.completions.create(model=model, messages=messages, **options)
  except openai.BadRequestError as e:
    if "budget" in str(e) and len(messages) > opening:
      return None
    raise


async def converse(client, model: str, messages: list[dict], tools: list[dict], call: Call, turns: int | None) -> None:
  """Appends to `messages` the replies to them and the tool turns of the calls the replies make (each
  run by `call`), until a reply calls no tool or is cut (finish_reason length), the budget is used up,
  a call says the episode is done, or `turns` replies (None: no bound)."""
  opening = len(messages)
  replies = 0
  while turns is None or replies < turns:
    reply = await ask(client, model, messages, opening, **({"tools": tools} if tools else {}))
    if reply is None:
      return
    replies += 1
    choice = reply.choices[0]
    message = choice.message
    messages.append(message.model_dump(exclude_none=True))
    if not message.tool_calls or choice.finish_reason == "length":
      return
    done = False
    for tool_call in message.tool_calls:
      name = tool_call.function.name
      content, done = await call(name, tool_call.function.arguments or "{}")
      messages.append({"role": "tool", "tool_call_id": tool_call.id, "name": name, "content": content})
      if done:
        return
