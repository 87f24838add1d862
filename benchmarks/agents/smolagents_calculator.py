"""smolagents' documented tool-calling agent with a calculator tool, unchanged but for the episode's
client (its base URL and key), for rl.agent: benchmarks/agent_memory.py measures what its worker
processes hold."""

import smolagents


@smolagents.tool
def calculator(expression: str) -> str:
  """Evaluates an arithmetic expression of integers, + - * / and parentheses.

  Args:
    expression: the expression, such as "12 * (3 + 4)".
  """
  if set(expression) - set("0123456789+-*/() "):
    return "error: only integers, + - * / and parentheses"
  return str(eval(expression))  # noqa: S307 (the characters are checked above)


async def run(client, model, example):
  llm = smolagents.OpenAIServerModel(model_id=model, api_base=str(client.base_url), api_key=client.api_key)
  agent = smolagents.ToolCallingAgent(tools=[calculator], model=llm, max_steps=2)
  agent.run(example["prompt"])
  return None  # the run's reward functions judge the conversation
