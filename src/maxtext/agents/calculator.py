"""The calculator agent written against the `openai` client with function calling, for
rl.agent=src/maxtext/agents/calculator.py:run: the conversation the run's own agent has with
rl.tools=[calculator] (the same system turn, tool description, example turns and tool turns), each
model turn a chat call with `tools`, each tool call answered by evaluating its expression here.
Judged by the run's reward functions (it returns None), as the run's own agent is."""

import json

from maxtext.utils import arithmetic

CALCULATOR = {
  "type": "function",
  "function": {
    "name": "calculator",
    "description": "Evaluates an arithmetic expression such as (48 / 2) * 3 + 1.",
    "parameters": {
      "type": "object",
      "required": ["expression"],
      "properties": {"expression": {"type": "string", "description": "arithmetic expression, e.g. (48 / 2) * 3"}},
    },
  },
}
MAX_TURNS = 2  # model turns, as rl.max_turns=2


def calculate(arguments: str) -> str:
  """A call's result as the run's calculator tool answers it: its value, or the error's text."""
  try:
    return arithmetic.result_text(str(json.loads(arguments)["expression"]))
  except (ValueError, ArithmeticError, TypeError, KeyError) as e:
    return f"Error: {type(e).__name__}: {e}"


async def run(client, model, example):
  messages = list(example["messages"])
  for _ in range(MAX_TURNS):
    reply = (await client.chat.completions.create(model=model, messages=messages, tools=[CALCULATOR])).choices[0]
    messages.append(reply.message.model_dump(exclude_none=True))
    if not reply.message.tool_calls:
      break
    for call in reply.message.tool_calls:
      result = calculate(call.function.arguments)
      messages.append({"role": "tool", "tool_call_id": call.id, "content": "Tool returned result: " + result})
  return None
