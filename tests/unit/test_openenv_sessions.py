"""rl.agent=openenv with environment.id: OpenEnv harness sessions (tests/environments/openenv_sessions.py,
written with OpenEnv 0.10.0's harness API, played in OpenEnv's own venv by utils/bridges/openenv_bridge.py with
OpenEnv's own MCPHarnessAdapter and model step): a session's initial messages open the conversation, its
tools are the policy's functions and each call a call_tool whose result is the tool turn, the episode's
reward is the environment's (tool results, verify) as OpenEnv resolves it; sessions over an environment
server (StepEnvSessionAdapter) get its URL; what cannot load is refused at start in one line; an unscored,
inconsistent, raising or hanging session fails its episode and the bridge goes on; a tiny agentic run
trains on a factory's episodes; a bridge loading an environment dies with a trainer killed by SIGKILL."""

import json
import os
import subprocess
import sys
import time
import types

import pytest

from maxtext.configs import pyconfig
from maxtext.integration.tunix import user_agent
from maxtext.rl.episode_handouts import EpisodeFailed
from maxtext.rl.session_stitching import stitch
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils import env_server, errors, openenv_sessions
from tests.conftest import TINY_AGENTIC, assert_dies_with
from tests.unit.bridge_arena import Arena

ENVS = os.path.join(os.path.dirname(__file__), "..", "environments")
SESSIONS = os.path.join(ENVS, "openenv_sessions.py")
WORD_ENV = os.path.join(ENVS, "openenv_word.py")


def _section(python: str, name: str, args: str = "{}", max_turns: int = 4):
  return types.SimpleNamespace(id=f"{SESSIONS}:{name}", args=args, python=python, max_turns=max_turns)


def _arena(python, tokenizer, name, args="{}", timeout_s=60.0, base_url=None) -> Arena:
  return Arena(openenv_sessions.prepare(_section(python, name, args), 120, base_url), tokenizer, timeout_s)


@pytest.fixture(scope="module")
def sums(openenv_python, qwen3_tokenizer):
  """SumSessions' bridge, shared by the module's tests (a task's `flaw` field gives its session a flaw)."""
  arena = _arena(openenv_python, qwen3_tokenizer, "make_sums", '{"flaw": ""}', timeout_s=5.0)
  yield arena
  arena.close()


def _call(name: str, **arguments) -> str:
  return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _example(**fields) -> dict:
  return {**fields, "prompt": "Go.", "messages": [{"role": "user", "content": "Go."}]}


def test_a_sessions_messages_and_tools_make_the_episode_and_its_tool_result_the_reward(sums, qwen3_tokenizer):
  reward, calls = sums.play([_call("add", a=2, b=3), _call("submit", answer=5), "never asked"], _example(a=2, b=3))
  assert reward == 1.0 and len(calls) == 2  # submit's result was done: no third call
  first, second = (qwen3_tokenizer.decode(c.prompt_ids.tolist()) for c in calls)
  assert "<|im_start|>system\nUse the tools." in first  # the session's initial messages, not the run's
  assert "What is 2 + 3? Add them, then submit the sum.<|im_end|>" in first and "Go." not in first
  tools = [json.loads(line) for line in first.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()]
  assert [t["function"]["name"] for t in tools] == ["add", "submit"]  # list_tools, as functions
  assert "<tool_response>\n5\n</tool_response>" in second  # call_tool's result, the tool turn
  assert stitch(calls, budget=1024).counts.mismatched == 0  # one conversation, its tokens as sampled
  assert sums.play([_call("submit", answer=6)], _example(a=2, b=3))[0] == 0.0  # the wrong sum
  # a reply that calls no tool ends the episode; verify's reward (0.0: nothing submitted) is its reward
  reward, calls = sums.play(["I will not."], _example(a=1, b=1))
  assert reward == 0.0 and len(calls) == 1


def test_the_seed_is_the_examples_so_a_group_plays_one_task(sums, qwen3_tokenizer):
  """Without a and b in the task, the session draws them from its seed: one sum per example."""

  def asked(example):
    (call,) = sums.play(["No."], example)[1]
    return qwen3_tokenizer.decode(call.prompt_ids.tolist()).split("What is ")[1].split("?")[0]

  row = _example(question="q1")
  assert asked(row) == asked(dict(row))
  assert {asked(_example(question=f"q{i}")) for i in range(6)} != {asked(row)}


def test_sessions_over_an_environment_server_take_its_url_and_reward(openenv_python, qwen3_tokenizer):
  """OpenEnv's StepEnvSessionAdapter over the word server (GenericEnvClient): its say tool is a step,
  OpenEnv's default tool results and verify give the server's reward; base_url is the server's URL."""
  server = env_server.EnvServer(f"{openenv_python} {WORD_ENV} --port {{port}} --turns 3", wait_s=120)
  words = _arena(openenv_python, qwen3_tokenizer, "word_sessions", base_url=server.url)
  try:
    reward, calls = words.play([_call("say", word="stone"), _call("say", word="river")], _example(word="river"))
    assert reward == 1.0 and len(calls) == 2
    first, second = (qwen3_tokenizer.decode(c.prompt_ids.tolist()) for c in calls)
    assert "Go. Say the word river. Use the say tool.<|im_end|>" in first  # the reset observation's prompt
    assert '"prompt": "No. Try again: say river."' in second  # the step's observation, the tool turn
    assert words.play([_call("say", word="cloud")] * 3, _example(word="river"))[0] == 0.0  # three misses
  finally:
    words.close()
    server.close()


def test_a_session_that_is_unscored_inconsistent_raises_or_hangs_fails_its_episode(sums):
  submit = [_call("submit", answer=2)]
  unscored, calls = sums.play(submit, _example(a=1, b=1, flaw="unscored"))
  assert isinstance(unscored, EpisodeFailed) and "unscored" in str(unscored) and len(calls) == 1
  disagree, _ = sums.play(submit, _example(a=1, b=1, flaw="disagree"))
  assert isinstance(disagree, EpisodeFailed)
  assert "verify's env_reward 0.5 is not the reward the rollout's last tool result gave (1.0)" in str(disagree)
  raised, calls = sums.play(submit, _example(flaw="raises"))
  assert isinstance(raised, EpisodeFailed) and "no sandbox left for this episode" in str(raised) and not calls
  hung, _ = sums.play(submit, _example(a=1, b=1, flaw="hangs"))
  assert isinstance(hung, EpisodeFailed) and "ran past 5 s (rl.agent_timeout_s)" in str(hung)
  assert sums.play(submit, _example(a=1, b=1))[0] == 1.0  # the bridge takes the next one


def _refused(*overrides) -> str:
  cfg = pyconfig.initialize(["t", "rl.yml", "rl.use_agentic_rollout=true", "rl.agent=openenv", *overrides])
  with pytest.raises(errors.InputError) as raised:
    user_agent.load(cfg.agent, cfg.environment)
  return str(raised.value)


def test_a_factory_that_cannot_be_made_is_refused_at_start_in_one_line(openenv_python):
  python = f"environment.python={openenv_python}"
  message = _refused(f"environment.id={SESSIONS}:NotAFactory", python)
  assert message.startswith(f"rl.agent=openenv: environment.id={SESSIONS}:NotAFactory: NotAFactory made a ")
  assert "which has no create(); expected FILE.py:NAME" in message and "\n" not in message
  message = _refused(f"environment.id={SESSIONS}:broken_maker", 'environment.args={"size": 3}', python)
  assert message.endswith("broken_maker(size=3) failed: ValueError: size 3 is not a size this environment has")
  assert "defines no nothing" in _refused(f"environment.id={SESSIONS}:nothing", python)
  assert "OpenEnv is not installed there" in _refused(f"environment.id={SESSIONS}:SumSessions")  # our venv
  for overrides, expected in [
    (["environment.id=sessions.py"], "expected FILE.py:NAME"),
    ([f"environment.id={SESSIONS}.missing.py:make"], "file not found"),
    ([f"environment.id={SESSIONS}:make_sums", "environment.args=nope"], "environment.args=.nope.: not JSON"),
    (
      [],
      "expected environment.url .a running OpenEnv server., environment.command .one the run starts. or environment.id",
    ),
  ]:
    with pytest.raises(errors.InputError, match=expected):
      pyconfig.initialize(["t", "rl.yml", "rl.use_agentic_rollout=true", "rl.agent=openenv", *overrides])


def test_agentic_grpo_trains_on_a_factorys_harness_sessions(tmp_path, openenv_python):
  rc = train_rl.main(
    [
      *TINY_AGENTIC,
      "rl.agent=openenv",
      f"environment.id={SESSIONS}:SumSessions",
      f"environment.python={openenv_python}",
      f"base_output_directory={tmp_path}",
      "run_name=sessions",
      "max_prompt_length=320",  # the session's opening with its two tools' descriptions: 230 tokens
    ]
  )
  assert rc == 0
  episodes = [json.loads(line) for line in (tmp_path / "sessions" / "episodes.jsonl").read_text().splitlines()]
  assert len(episodes) == 4 and all(e["status"] == "trained" for e in episodes)
  for e in episodes:
    system = e["messages"][0]
    assert system["role"] == "system" and system["content"].startswith("Use the tools.")  # the session's own
    assert '"name": "submit"' in system["content"]  # its tools, as the model's tool prompt offers them
    assert e["messages"][1]["content"].startswith("What is ")
    assert e["reward"] in (0.0, 1.0)  # the environment's


def test_a_bridge_loading_dies_with_a_trainer_killed_by_sigkill(tmp_path):
  """A trainer killed by SIGKILL while a bridge loads its environment (env_server.run_bridge, as
  prepare runs it): the bridge's process goes too."""
  pid_file = tmp_path / "pid"
  loads = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
  script = tmp_path / "trainer.py"
  script.write_text(
    "import sys\nfrom maxtext.utils import env_server\n"
    f"env_server.run_bridge([sys.executable, '-c', {loads!r}, {str(pid_file)!r}], 'k', 'w', 600)\n"
  )
  trainer = subprocess.Popen([sys.executable, str(script)])
  try:
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text()) and time.monotonic() < deadline:
      time.sleep(0.1)
    assert_dies_with(trainer, int(pid_file.read_text()), "the bridge")
  finally:
    trainer.kill()
