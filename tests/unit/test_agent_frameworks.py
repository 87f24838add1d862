"""Each agent framework's own documented agent, unchanged but for its base URL and key, against a
session of the served policy: the OpenAI Agents SDK (its default Responses model and
OpenAIChatCompletionsModel), LangGraph's ReAct agent with langchain-openai, smolagents'
ToolCallingAgent and pydantic-ai. The policy is scripted (a tool call, then the answer) so each
framework's tool loop runs: the tool is called with the model's arguments, its result reaches the
next prompt, the answer comes back, and the session's calls stitch into one conversation with no
mismatched call (what rl.agent trains), but for smolagents, which rewrites its own history."""

import asyncio

import agents
import langchain_openai
import openai
import pydantic_ai
import pytest
import smolagents
from langchain_core.tools import tool
from langgraph import prebuilt
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from maxtext.integration.tunix.tool_format import QwenToolFormat
from maxtext.rl.session_stitching import stitch
from tests.unit.test_openai_server import scripted_server

KEY = "sk-test-key"


def _call(name: str, arguments: str) -> str:
  return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


@pytest.fixture
def serve(qwen3_tokenizer):
  """serve(replies) -> (server, the base URL of a fresh session of it)."""
  started = []

  def serve(replies):
    server = scripted_server(qwen3_tokenizer, replies, tool_format=QwenToolFormat(), api_key=KEY)
    url = server.start("127.0.0.1", 0).removesuffix("/v1")
    started.append(server)
    session = server.open_session()
    return server, session, f"{url}/sessions/{session}/v1"

  yield serve
  for server in started:
    server.stop()


def _stitched(server, session, calls: int, tool_output: str, mismatched: int = 0) -> str:
  """The session's last prompt, once its `calls` calls are checked to stitch with `mismatched` left
  out and the tool's output is checked to be in that prompt as a tool response."""
  record = server.session(session).calls
  assert len(record) == calls
  stitched = stitch(record, budget=4096)
  assert (stitched.counts.mismatched, stitched.counts.calls) == (mismatched, calls - mismatched), stitched.counts
  last_prompt = server.tokenizer.decode(record[-1].prompt_ids.tolist())
  assert (
    f"<tool_response>\n{tool_output}\n</tool_response>" in last_prompt or f"Observation:\n{tool_output}" in last_prompt
  )
  return last_prompt


def add(a: int, b: int) -> int:
  """Adds two integers.

  Args:
    a: the first integer.
    b: the second integer.
  """
  return a + b


@pytest.mark.parametrize(
  "responses_model, streamed",
  [(True, False), (True, True), (False, False)],
  ids=["responses", "responses_streamed", "chat_completions"],
)
def test_the_openai_agents_sdk(serve, responses_model, streamed):
  server, session, url = serve([_call("add", '{"a": 2, "b": 3}'), "The sum is 5."])
  client = openai.AsyncOpenAI(base_url=url, api_key=KEY, max_retries=0)
  model = (agents.OpenAIResponsesModel if responses_model else agents.OpenAIChatCompletionsModel)("m", client)
  agent = agents.Agent(name="adder", instructions="Be brief.", tools=[agents.function_tool(add)], model=model)
  config = agents.RunConfig(tracing_disabled=True)
  if streamed:

    async def run_streamed():
      result = agents.Runner.run_streamed(agent, "What is 2 + 3?", run_config=config)
      async for _ in result.stream_events():
        pass
      return result

    result = asyncio.run(run_streamed())
  else:
    result = asyncio.run(agents.Runner.run(agent, "What is 2 + 3?", run_config=config))
  assert result.final_output == "The sum is 5."
  assert [i.output for i in result.new_items if i.type == "tool_call_output_item"] == [5]
  assert "Be brief." in _stitched(server, session, 2, "5")


def test_langgraph_react_agent_with_langchain_openai(serve):
  server, session, url = serve([_call("add", '{"a": 2, "b": 3}'), "The sum is 5."])
  llm = langchain_openai.ChatOpenAI(model="m", base_url=url, api_key=KEY, max_retries=0)
  graph = prebuilt.create_react_agent(llm, tools=[tool(add)])
  out = graph.invoke({"messages": [("user", "What is 2 + 3?")]})
  assert out["messages"][-1].content == "The sum is 5."
  assert [m.content for m in out["messages"] if m.type == "tool"] == ["5"]
  _stitched(server, session, 2, "5")


def test_smolagents_tool_calling_agent(serve):
  # smolagents asks with tool_choice "required": the server opens the reply with the call's opening
  # (context, not sampled), and the policy writes the rest of it.
  opening = QwenToolFormat().call_opening(None)
  replies = [
    _call(name, arguments).removeprefix(opening)
    for name, arguments in [("add", '{"a": 2, "b": 3}'), ("final_answer", '{"answer": "5"}')]
  ]
  server, session, url = serve(replies)
  model = smolagents.OpenAIServerModel(model_id="m", api_base=url, api_key=KEY)
  agent = smolagents.ToolCallingAgent(tools=[smolagents.tool(add)], model=model, max_steps=3)
  assert str(agent.run("What is 2 + 3?")) == "5"
  # smolagents writes its memory back as text of its own (the reply as "Calling tools: [...]", the
  # result as a user "Observation:"), not as the tokens sampled: its second call extends no earlier
  # one and is left out as mismatched (rl.session_stitching), as the docs say.
  last = _stitched(server, session, 2, "5", mismatched=1)
  assert "Calling tools:\n[{" in last


def test_pydantic_ai_agent(serve):
  server, session, url = serve([_call("add", '{"a": 2, "b": 3}'), "The sum is 5."])
  model = OpenAIChatModel("m", provider=OpenAIProvider(base_url=url, api_key=KEY))
  agent = pydantic_ai.Agent(model, instructions="Be brief.")
  agent.tool_plain(add)
  assert agent.run_sync("What is 2 + 3?").output == "The sum is 5."
  _stitched(server, session, 2, "5")
