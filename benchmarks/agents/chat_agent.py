"""The run's own single-turn agent, written against the `openai` client for rl.agent: one chat call
with the user turn the data template writes (no system turn), judged by the run's reward functions
(it returns None). benchmarks/agentic_vs_standard.py's agentic1http configuration trains it."""


async def run(client, model, example):
  messages = [{"role": "user", "content": example["prompt"]}]
  await client.chat.completions.create(model=model, messages=messages)
  return None
