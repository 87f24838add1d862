"""rl.agent=openenv against a real OpenEnv server (tests/environments/openenv_word.py: an Environment
written with OpenEnv 0.10.0's own API, served by its create_app in OpenEnv's own venv, on loopback): an
episode resets it with the example, each reply of the policy is its action, its observations the next
turns and the sum of its rewards the episode's; what the run refuses at start, in one line; a tiny
agentic GRPO run that starts the server itself, trains on its episodes and stops it; and an environment
that hangs or raises fails its episodes, counted, without ending the run."""

import asyncio
import json
import os
import socket
import sys

import openai
import pytest

from maxtext.configs import pyconfig
from maxtext.integration.tunix import user_agent
from maxtext.integration.tunix.tool_format import QwenToolFormat
from maxtext.rl.session_stitching import stitch
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils import env_server, errors, openenv_agent
from tests.conftest import TINY_AGENTIC, assert_dies_with
from tests.unit.test_openai_server import scripted_server

ENV = os.path.join(os.path.dirname(__file__), "..", "environments", "openenv_word.py")


@pytest.fixture(scope="module")
def word_env(openenv_python):
  server = env_server.EnvServer(f"{openenv_python} {ENV} --port {{port}} --turns 2", wait_s=120)
  yield server
  server.close()


def _play(url: str, env: openenv_agent.OpenEnv, example: dict):
  async def episode():
    async with openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0) as client:
      return await openenv_agent.episode(env)(client, "m", example)

  return asyncio.run(episode())


def test_an_episode_resets_with_the_example_and_steps_with_each_reply(word_env, qwen3_tokenizer):
  env = openenv_agent.describe(word_env.url, "", "", max_turns=4)
  assert env.action_field == "message"  # the action's one required string field
  server = scripted_server(qwen3_tokenizer, ["A stone.", "A river."])
  url = server.start("127.0.0.1", 0).removesuffix("/v1")
  try:
    session = server.open_session()
    example = {
      "question": "Play.",
      "word": "river",
      "prompt": "Play.",
      "messages": [{"role": "user", "content": "Play."}],
    }
    assert _play(f"{url}/sessions/{session}/v1", env, example) == 1.0  # 0.0 for the miss, 1.0 for the hit
    first, second = server.session(session).calls  # done after the hit: no third call
    assert "Play. Say the word river.<|im_end|>" in qwen3_tokenizer.decode(first.prompt_ids.tolist())
    second_text = qwen3_tokenizer.decode(second.prompt_ids.tolist())
    assert "A stone.<|im_end|>\n<|im_start|>user\nNo. Try again: say river.<|im_end|>" in second_text
    assert stitch([first, second], budget=1024).counts.mismatched == 0
    # the same example resets with the same seed (a group plays one task); another with another
    row = {k: v for k, v in example.items() if k != "messages"}
    assert openenv_agent.seed(row) == openenv_agent.seed(dict(row)) != openenv_agent.seed({**row, "question": "x"})
  finally:
    server.stop()


def test_max_turns_bounds_an_episode_and_no_reward_is_none(word_env, qwen3_tokenizer):
  env = openenv_agent.describe(word_env.url, "message", "prompt", max_turns=1)
  server = scripted_server(qwen3_tokenizer, "Nothing.")
  url = server.start("127.0.0.1", 0).removesuffix("/v1")
  try:
    session = server.open_session()
    example = {"word": "cloud", "prompt": "Go.", "messages": [{"role": "user", "content": "Go."}]}
    assert _play(f"{url}/sessions/{session}/v1", env, example) == 0.0  # one step, a miss
    assert len(server.session(session).calls) == 1
  finally:
    server.stop()
  assert openenv_agent.text({"prompt": "p", "tries": 1, "metadata": {}}, "") == "p"  # the one string field
  assert openenv_agent.text({"a": "x", "b": "y", "metadata": {}}, "") == '{"a": "x", "b": "y"}'


def test_an_error_frame_of_the_environment_fails_the_episode(word_env, qwen3_tokenizer):
  env = openenv_agent.OpenEnv(word_env.url, "wrong_field", "", 2)  # an action the server refuses
  server = scripted_server(qwen3_tokenizer, "Hi.")
  url = server.start("127.0.0.1", 0).removesuffix("/v1")
  try:
    example = {"word": "apple", "prompt": "Go.", "messages": [{"role": "user", "content": "Go."}]}
    with pytest.raises(openenv_agent.EnvironmentError, match=r"answered step with .*VALIDATION_ERROR"):
      _play(f"{url}/v1", env, example)
  finally:
    server.stop()


def _refused(*overrides) -> str:
  cfg = pyconfig.initialize(["t", "rl.yml", "rl.use_agentic_rollout=true", "rl.agent=openenv", *overrides])
  with pytest.raises(errors.InputError) as raised:
    user_agent.load(cfg.agent, cfg.environment)
  message = str(raised.value)
  return message


def test_what_is_not_an_openenv_server_is_refused_at_start_in_one_line(word_env):
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]  # nothing listens there
  message = _refused(f"environment.url=http://127.0.0.1:{port}")
  assert message.startswith(f"rl.agent=openenv: environment.url=http://127.0.0.1:{port}: no OpenEnv server answers")
  assert "\n" not in message
  message = _refused(f"environment.url={word_env.url}", "environment.action_field=tries")
  assert message == (
    f"rl.agent=openenv: environment.action_field=tries: the action of {word_env.url} has no such string field; "
    "its fields: ['message']"
  )
  message = _refused(f"environment.url={word_env.url}", "environment.observation_field=score")
  assert message.endswith(
    "environment.observation_field=score: the observation of " + word_env.url + " has ['prompt', 'tries']"
  )
  exits = f"{sys.executable} -c \"import sys; print('no such env'); sys.exit(3)\""
  message = _refused(f"environment.command={exits}")
  assert message.startswith(f"environment.command={exits}: exited with 3 before serving") and "no such env" in message
  with pytest.raises(errors.InputError, match=r"expected one of environment.url .* not both"):
    pyconfig.initialize(
      [
        "t",
        "rl.yml",
        "rl.use_agentic_rollout=true",
        "rl.agent=openenv",
        "environment.url=http://a:1",
        "environment.command=x",
      ]
    )


def test_an_action_that_a_reply_cannot_fill_is_refused(word_env):
  """An action with two required string fields (OpenEnv's schema of the test server's action, with a
  second field added) names them."""
  import httpx

  schema = httpx.get(f"{word_env.url}/schema").json()
  schema["action"]["properties"]["target"] = {"type": "string"}
  schema["action"]["required"] = ["message", "target"]
  with pytest.raises(ValueError, match=r"has 2 string fields the reply could fill \(\['message', 'target'\]\)"):
    openenv_agent.action_field(schema["action"], "", word_env.url)
  with pytest.raises(ValueError, match=r"also requires \['target'\], which a reply's text does not fill"):
    openenv_agent.action_field(schema["action"], "message", word_env.url)


def _run(tmp_path, name, command, *overrides):
  args = [
    *TINY_AGENTIC,
    "rl.agent=openenv",
    f"environment.command={command}",
    f"base_output_directory={tmp_path}",
    f"run_name={name}",
    *overrides,
  ]
  rc = train_rl.main(args)
  lines = (tmp_path / name / "episodes.jsonl").read_text().splitlines() if rc == 0 else []
  return rc, [json.loads(line) for line in lines]


def test_agentic_grpo_trains_on_an_openenv_server_it_starts_and_stops(tmp_path, openenv_python):
  rc, episodes = _run(tmp_path, "env", f"{openenv_python} {ENV} --port {{port}} --turns 2")
  assert rc == 0
  assert len(episodes) == 4 and all(e["status"] == "trained" for e in episodes)
  for e in episodes:
    users = [m["content"] for m in e["messages"] if m["role"] == "user"]
    assert "Say the word " in users[0]  # reset's observation, appended to the question
    assert e["reward"] in (0.0, 1.0)  # the environment's: a hit, or two misses
    assert len(users) <= 2 and e["calls"]["calls"] == len([m for m in e["messages"] if m["role"] == "assistant"])
  for group in {e["group"] for e in episodes}:  # a group's samples play one word
    words = {
      next(m["content"] for m in e["messages"] if m["role"] == "user").split("Say the word ")[1]
      for e in episodes
      if e["group"] == group
    }
    assert len(words) == 1


@pytest.mark.slow
def test_an_environment_that_hangs_fails_its_episodes_and_the_run_goes_on(tmp_path, openenv_python):
  command = f"{openenv_python} {ENV} --port {{port}} --hang-steps"
  rc, episodes = _run(tmp_path, "hang", command, "rl.agent_timeout_s=20", "rl.agent_max_failures=8")
  assert rc == 0
  assert len(episodes) == 4 and all(e["status"] == "failed" for e in episodes)
  assert all("rl.agent_timeout_s=20" in e["failure"] for e in episodes)


MCP_ENV = os.path.join(os.path.dirname(__file__), "..", "environments", "openenv_mcp.py")


def test_an_mcp_environments_tools_are_offered_and_each_call_is_a_step(openenv_python, qwen3_tokenizer):
  """OpenEnv's MCPEnvironment (FastMCP tools, CallToolAction): its tools come to the policy as functions,
  a call's result is the tool turn, and the submit step's reward ends the episode."""
  env_process = env_server.EnvServer(f"{openenv_python} {MCP_ENV} --port {{port}}", wait_s=120)
  add = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
  submit = '<tool_call>\n{"name": "submit", "arguments": {"answer": 5}}\n</tool_call>'
  server = scripted_server(qwen3_tokenizer, [add, submit, "Done."], tool_format=QwenToolFormat())
  url = server.start("127.0.0.1", 0).removesuffix("/v1")
  try:
    env = openenv_agent.describe(env_process.url, "", "", max_turns=4)
    assert env.tools and env.action_field == ""
    session = server.open_session()
    example = {"a": 2, "b": 3, "prompt": "Add.", "messages": [{"role": "user", "content": "What is 2 + 3?"}]}
    assert _play(f"{url}/sessions/{session}/v1", env, example) == 1.0
    first, second = server.session(session).calls  # submit's step was done: no third call
    text = qwen3_tokenizer.decode(first.prompt_ids.tolist())
    assert "What is 2 + 3? Use the tools, then submit the sum.<|im_end|>" in text
    tools = [json.loads(line) for line in text.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()]
    assert [t["function"]["name"] for t in tools] == ["add", "submit"]
    assert "<tool_response>\n5\n</tool_response>" in qwen3_tokenizer.decode(second.prompt_ids.tolist())
    assert stitch([first, second], budget=1024).counts.mismatched == 0
    with pytest.raises(ValueError, match=r"is an MCP environment, whose actions are tool calls"):
      openenv_agent.describe(env_process.url, "message", "", max_turns=4)
  finally:
    server.stop()
    env_process.close()


def test_the_environment_server_dies_with_a_trainer_killed_by_sigkill(tmp_path, openenv_python):
  """A process that started the server (as the run does) killed with SIGKILL: the server goes too."""
  import subprocess

  script = tmp_path / "starts.py"
  script.write_text(
    "import sys, time\n"
    "from maxtext.utils import env_server\n"
    "server = env_server.EnvServer(sys.argv[1], 120)\n"
    "print(server._child.process.pid, flush=True)\n"
    "time.sleep(600)\n"
  )
  command = f"{openenv_python} {ENV} --port {{port}}"
  starter = subprocess.Popen([sys.executable, str(script), command], stdout=subprocess.PIPE, text=True)
  try:
    assert_dies_with(starter, int(starter.stdout.readline()), "the environment server")
  finally:
    starter.kill()
