"""rl.agent: a user's async agent written against the `openai` client, trained by agentic GRPO through
the policy served over HTTP (integration/tunix/user_agent.py), on qwen3-tiny; its refusals at start."""

import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from maxtext.configs import pyconfig
from maxtext.integration.tunix import user_agent
from maxtext.trainers.post_train.rl import train_rl
from tests.conftest import make_config

AGENT = '''
async def run(client, model, example):
  """Two chat calls, the second continuing the first; fails on purpose for one question in three."""
  if sum(map(ord, example["question"])) % 3 == 0:
    raise RuntimeError("planned failure of " + example["question"][:20])
  assert example["question"] in example["prompt"]  # the user turn as the data template writes it
  messages = [{"role": "user", "content": "Question: " + example["question"]}]
  first = await client.chat.completions.create(model=model, messages=messages, max_tokens=6)
  messages += [first.choices[0].message, {"role": "user", "content": "Check it."}]
  second = await client.chat.completions.create(model=model, messages=messages, max_tokens=6, logprobs=True)
  assert len(second.choices[0].logprobs.content) == second.usage.completion_tokens
  return float(second.usage.completion_tokens + len(example["answer"]))
'''

TINY = [
  "model_name=qwen3-tiny",
  "rl.use_agentic_rollout=true",
  "num_batches=2",
  "batch_size=2",
  "rl.num_generations=2",
  "max_response_length=32",
  "num_test_batches=0",
]


MIXED = '''
import hashlib, os

MARKS = {marks!r}


def _nth(example):
  """How many episodes of this question started before this one (0, 1, 2), across worker processes."""
  key = hashlib.sha1(example["question"].encode()).hexdigest()
  for i in range(3):
    try:
      os.close(os.open(os.path.join(MARKS, f"{{key}}.{{i}}"), os.O_CREAT | os.O_EXCL))
      return i
    except FileExistsError:
      pass
  raise AssertionError("more than 3 episodes of one question")


async def run(client, model, example):
  """Of each question's three episodes: the first raises before its first call; the second asks with
  the example's messages; the third adds a line to the user turn, so its group's first prompts differ
  near their end. The first question asked at all gets a long line there: a prompt over
  max_prompt_length."""
  nth = _nth(example)
  if nth == 0:
    raise RuntimeError("planned failure before the first call")
  messages = [dict(m) for m in example["messages"]]
  if nth == 2:
    line = " Be brief."
    try:
      os.close(os.open(os.path.join(MARKS, "long"), os.O_CREAT | os.O_EXCL))
      line = " Be brief." * 35
    except FileExistsError:
      pass
    messages[-1]["content"] += line
  reply = await client.chat.completions.create(model=model, messages=messages, max_tokens=4)
  return float(reply.usage.completion_tokens)
'''


def _rows(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


@pytest.mark.slow  # the fast mixed-group test below trains an agent through the served policy with failures too
def test_a_users_openai_agent_trains_through_the_served_policy_and_its_failures_are_counted(tmp_path, caplog):
  agent = tmp_path / "agent.py"
  agent.write_text(AGENT)
  args = [*TINY, f"rl.agent={agent}:run", f"base_output_directory={tmp_path}", "run_name=agent"]
  with caplog.at_level(logging.WARNING):
    assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  rows = _rows(tmp_path / "agent" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2]
  failed = sum(r["agent/failed_episodes"] for r in rows)
  assert 0 < failed < 8  # some of the 8 episodes raised, and they did not stop the run
  assert "planned failure of" in caplog.text  # the first failure, with its traceback
  for r in rows:
    assert r["agent/calls_per_episode"] <= 2 and r["agent/cut_tokens"] == 0 and r["staleness/max"] == 0
    # the rewards trained on are the agent's: 2 + len(answer) at least, where it did not fail (a failed
    # episode takes its group's others' mean)
    assert r["agent/failed_episodes"] > 0 or r["agent/reward"] == r["rewards/sum"]
  assert max(r["agent/reward"] for r in rows) >= 2


def test_a_group_with_a_failed_episode_and_first_prompts_that_differ_trains(tmp_path, caplog):
  """One episode of every group raises before its first call, another's first prompt differs from its
  sibling's near its end, and one is over max_prompt_length: the run trains both steps, each failure
  counted with its reason, each trained episode scored under its own context (episodes.jsonl shows
  all of it)."""
  (tmp_path / "marks").mkdir()
  agent = tmp_path / "agent.py"
  agent.write_text(MIXED.format(marks=str(tmp_path / "marks")))
  args = [a for a in TINY if not a.startswith("max_response_length=")] + ["max_response_length=64"]
  args += ["rl.num_generations=3", "max_prompt_length=160", f"rl.agent={agent}:run", "rl.agent_max_failures=8"]
  args += ["rl.sampler_is=token"]  # the trainer rescores every trained token: sampler_trainer/* compare
  with caplog.at_level(logging.WARNING), caplog.at_level(logging.INFO, logger=user_agent.__name__):
    assert train_rl.main(["train_rl", "rl.yml", *args, f"base_output_directory={tmp_path}", "run_name=mixed"]) == 0
  rows = _rows(tmp_path / "mixed" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2]
  # every trained token rescored by the trainer in its row as laid out has the sampler's log-prob: each
  # was scored after exactly the tokens it was sampled after (with the context tokens replaced, it fails)
  assert all(r["sampler_trainer/logp_diff_max"] < 1e-4 for r in rows)
  # two groups a step, one raising episode each, and one episode over the prompt budget in the run
  assert [r["agent/failed_episodes"] for r in rows] in ([3, 2], [2, 3])
  episodes = _rows(tmp_path / "mixed" / "episodes.jsonl")
  assert len(episodes) == 12 and sorted({e["step"] for e in episodes}) == [1, 2]
  failed = [e for e in episodes if e["status"] == "failed"]
  assert sum("planned failure before the first call" in e["failure"] for e in failed) == 4
  [long] = [e for e in failed if "max_prompt_length" in e["failure"]]
  assert "more than max_prompt_length=160" in long["failure"] and long["trained_tokens"] == 0
  assert all(e["trained_tokens"] == 0 and e["completion_tokens"] == 0 for e in failed)
  trained = [e for e in episodes if e["status"] == "trained"]
  assert len(trained) == 7 and all(0 < e["trained_tokens"] <= 4 for e in trained)
  # in the three groups where two trained, the prompts part where the third's added line begins: the
  # rest of each one's prompt is context in its completion, the added line in the third's only
  with_context = [e for e in trained if e["completion_tokens"] > e["trained_tokens"]]
  assert len(with_context) == 6
  assert sum("Be brief." in e["tokens"].split("«")[0] for e in with_context) == 3
  assert all(e["messages"][-1]["role"] == "assistant" and e["calls"]["calls"] == 1 for e in trained)
  for e in trained:  # the reward trained on is the agent's own: its sampled tokens
    assert e["reward"] == e["trained_tokens"]
  report = (tmp_path / "mixed" / "report.md").read_text()
  assert "| agent/failed_episodes |" in report and "episodes.jsonl" in report
  assert "planned failure before the first call" in caplog.text
  # the start says what the agent's first prompt needs (measured from its first call), once
  assert len(re.findall(r"rl\.agent's first prompt has \d+ tokens .* max_prompt_length=160", caplog.text)) == 1


@pytest.mark.slow  # a process of its own (45 s); the fast test above counts failures within the budget
def test_more_failed_episodes_than_the_budget_stop_the_run_in_one_line(tmp_path):
  agent = tmp_path / "agent.py"
  agent.write_text("async def run(client, model, example):\n  raise ValueError('no luck')\n")
  args = [*TINY, f"rl.agent={agent}:run", "rl.agent_max_failures=1", f"base_output_directory={tmp_path}"]
  command = [sys.executable, "-m", "maxtext.trainers.post_train.rl.train_rl", "rl.yml", *args, "run_name=failing"]
  done = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
  assert done.returncode == 2, done.stderr[-3000:]
  assert done.stderr.splitlines()[-1] == (
    f"error: rl.agent={agent}:run: 2 episodes failed, more than rl.agent_max_failures=1; the first (its "
    "traceback is logged above): ValueError: no luck"
  )
  assert "raise ValueError('no luck')" in done.stderr  # the first failure's traceback, logged


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _taken(base: str, going) -> Iterator[dict]:
  """The episodes a process of the user's takes from rl.agent=http while going() and until training
  has ended (410)."""
  while going():
    try:
      taken = httpx.post(f"{base}/episodes/next", json={"wait_s": 1}, timeout=30)
    except httpx.TransportError:  # not serving yet, or no longer
      time.sleep(0.2)
      continue
    if taken.status_code == 410:
      return
    if taken.status_code == 200:
      yield taken.json()


def _drive(base: str, trainer: subprocess.Popen, deadline: float) -> dict[str, list]:
  """A process of the user's (this test) driving rl.agent=http's episodes until training ends: one chat
  call per episode with the example's messages, then the reward 2 + len(answer) posted; an error
  posted for one question in three."""
  seen: dict[str, list] = {"rewards": [], "errors": []}
  for episode in _taken(base, lambda: time.monotonic() < deadline and trainer.poll() is None):
    example, url = episode["example"], f"{base}/sessions/{episode['session']}/reward"
    if sum(map(ord, example["question"])) % 3 == 0:
      httpx.post(url, json={"error": "planned failure"}, timeout=30).raise_for_status()
      seen["errors"].append(example["question"])
      continue
    client = openai.OpenAI(base_url=episode["base_url"], api_key="x", max_retries=0, timeout=120)
    client.chat.completions.create(model=episode["model"], messages=example["messages"], max_tokens=6)
    reward = 2.0 + len(example["answer"])
    httpx.post(url, json={"reward": reward}, timeout=30).raise_for_status()
    seen["rewards"].append(reward)
  return seen


def _drive_mixed(base: str, done: threading.Event, seen: dict) -> None:
  """A process of the user's for rl.agent=http: of each question's two episodes the first fails before
  any call (the first question's is taken and abandoned, as by a process that died; the others post an
  error); the second makes one call and posts its sampled token count."""
  asked: set[str] = set()
  for episode in _taken(base, lambda: not done.is_set()):
    question, url = episode["example"]["question"], f"{base}/sessions/{episode['session']}/reward"
    if question not in asked:
      asked.add(question)
      if len(asked) == 1:
        seen["abandoned"] = episode["session"]
        continue
      httpx.post(url, json={"error": "planned failure"}, timeout=30).raise_for_status()
      continue
    client = openai.OpenAI(base_url=episode["base_url"], api_key="x", max_retries=0, timeout=120)
    reply = client.chat.completions.create(
      model=episode["model"], messages=episode["example"]["messages"], max_tokens=4
    )
    httpx.post(url, json={"reward": float(reply.usage.completion_tokens)}, timeout=30).raise_for_status()


@pytest.mark.slow  # a training run (45 s); the fast suite keeps failed episodes in a group (the mixed-group test
# above), the hand-out API's posted errors and timeouts (test_episode_handouts) and the verifiers bridge's
# failed episodes over it (test_verifiers_env)
def test_over_http_a_group_with_a_failed_episode_trains(tmp_path):
  """rl.agent=http in this process, a thread of the test as the user's process: one episode of every
  group fails before its first call (an error posted, or taken by a process that dies), and the run
  trains both steps, each failure counted with its reason."""
  port = _free_port()
  args = [*TINY, "rl.agent=http", f"rl.agent_port={port}", "rl.agent_timeout_s=5", "run_name=mixed_http"]
  done: threading.Event = threading.Event()
  seen: dict = {}
  driver = threading.Thread(target=_drive_mixed, args=(f"http://127.0.0.1:{port}", done, seen), daemon=True)
  driver.start()
  try:
    assert train_rl.main(["train_rl", "rl.yml", *args, f"base_output_directory={tmp_path}"]) == 0
  finally:
    done.set()
    driver.join(timeout=60)
  rows = _rows(tmp_path / "mixed_http" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2] and [r["agent/failed_episodes"] for r in rows] == [2, 2]
  failures = sorted(
    e["failure"].splitlines()[0] for e in _rows(tmp_path / "mixed_http" / "episodes.jsonl") if e["failure"]
  )
  assert failures == ["its process posted an error: planned failure"] * 3 + [
    "no reward posted within rl.agent_timeout_s=5 s of taking the episode"
  ]
  for r in rows:  # the others trained on their own rewards: their sampled tokens
    assert 1 <= r["agent/reward"] <= 4


@pytest.mark.slow  # a training process of its own (about a minute)
def test_processes_of_the_users_take_the_episodes_over_http_and_post_rewards(tmp_path):
  """On a trainer and a sampler of their own (two host devices), one step off policy: the weight sync
  after step 1 pauses the batcher while episodes of step 2 may be in flight."""
  port = _free_port()
  args = [*TINY, "rl.agent=http", f"rl.agent_port={port}", "rl.agent_timeout_s=60", "run_name=http"]
  args += ["rl.off_policy_steps=1", "trainer_devices_fraction=0.5", "sampler_devices_fraction=0.5"]
  command = [sys.executable, "-m", "maxtext.trainers.post_train.rl.train_rl", "rl.yml", *args]
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2", JAX_PLATFORMS="cpu")
  with open(tmp_path / "log.txt", "w", encoding="utf-8") as log_file:
    trainer = subprocess.Popen(
      command + [f"base_output_directory={tmp_path}"], stdout=log_file, stderr=log_file, env=env
    )
    try:
      seen = _drive(f"http://127.0.0.1:{port}", trainer, time.monotonic() + 600)
      assert trainer.wait(timeout=120) == 0, (tmp_path / "log.txt").read_text()[-3000:]
    finally:
      trainer.kill()
  log = (tmp_path / "log.txt").read_text()
  assert f"take episodes at POST http://127.0.0.1:{port}/episodes/next" in log
  rows = _rows(tmp_path / "http" / "metrics.jsonl")
  assert [r["step"] for r in rows] == [1, 2]
  assert sum(r["agent/failed_episodes"] for r in rows) == len(seen["errors"]) > 0
  assert "its process posted an error: planned failure" in log  # the first failure, logged
  for r in rows:  # a group whose episodes all failed has no baseline: its rewards are 0
    assert r["agent/failed_episodes"] < 4 or r["agent/reward"] == 0
  # the last step's 4 episodes (none failed) trained on the rewards posted last
  assert rows[-1]["agent/failed_episodes"] == 0
  assert rows[-1]["agent/reward"] * 4 == pytest.approx(sum(seen["rewards"][-4:]))
  for r in rows:
    assert r["agent/calls_per_episode"] <= 1 and r["staleness/max"] <= 1
    assert r["agent/failed_episodes"] > 0 or r["agent/reward"] == r["rewards/sum"]


@pytest.mark.parametrize(
  "text, expected",
  [
    ("def run(client, model, example):\n  return 1.0\n", "run is not an async function"),
    ("async def run(client):\n  return 1.0\n", "run(client) cannot take (client, model, example)"),
    ("async def other(client, model, example):\n  return 1.0\n", "defines no run"),
  ],
)
def test_an_agent_that_is_not_the_form_we_take_is_refused_naming_it(tmp_path, text, expected):
  path = tmp_path / "agent.py"
  path.write_text(text)
  cfg = make_config("rl.use_agentic_rollout=true", f"rl.agent={path}:run")
  with pytest.raises(user_agent.errors.InputError) as raised:
    user_agent.load(cfg.agent)
  message = str(raised.value)
  assert message.startswith(f"rl.agent={path}:run: ") and expected in message
  assert "async def NAME(client, model, example)" in message


@pytest.mark.parametrize(
  "extra, expected",
  [
    (
      ["rl.agent=agent.txt"],
      "expected PATH.py:NAME, a Python file and the async function in it, http, openenv or verifiers",
    ),
    (["rl.agent=missing.py:run"], "missing.py: file not found"),
    (["rl.agent={path}:run", "rollout_engine=vanilla"], "expected rollout_engine=batched"),
    (["rl.agent={path}:run", "rl.tools=[calculator]"], "expected rl.tools=[] and rl.tools_path empty"),
    (["rl.agent=http", "rl.agent_port=70000"], "rl.agent_port=70000: expected a TCP port from 0 to 65535"),
  ],
)
def test_agent_settings_that_cannot_work_are_refused_at_start(tmp_path, extra, expected):
  path = tmp_path / "agent.py"
  path.write_text("async def run(client, model, example):\n  return 1.0\n")
  with pytest.raises(pyconfig.ConfigError, match=expected.replace("[", r"\[").replace("]", r"\]")):
    make_config("rl.use_agentic_rollout=true", *[e.format(path=path) for e in extra])


FRAMEWORKS = '''
import hashlib, os, time

import agents
import langchain_openai
import pydantic_ai
import smolagents
from langchain_core.tools import tool
from langgraph import prebuilt
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

MARKS = {marks!r}


def add(a: int, b: int) -> int:
  """Adds two integers.

  Args:
    a: the first integer.
    b: the second integer.
  """
  return a + b


def _nth(question):
  """The question's number among the run's questions (0, 1, ...) in the order first asked, the same
  for all its episodes, across worker processes."""
  mine = os.path.join(MARKS, hashlib.sha1(question.encode()).hexdigest())
  try:
    os.close(os.open(mine, os.O_CREAT | os.O_EXCL))
  except FileExistsError:
    for _ in range(1000):
      text = open(mine).read()
      if text:
        return int(text)
      time.sleep(0.01)
    raise
  for i in range(64):
    try:
      os.close(os.open(os.path.join(MARKS, f"n{{i}}"), os.O_CREAT | os.O_EXCL))
      break
    except FileExistsError:
      pass
  with open(mine, "w") as f:
    f.write(str(i))
  return i


async def run(client, model, example):
  """Each group one framework's documented agent, in turn: the OpenAI Agents SDK (its chat
  completions model), LangGraph's ReAct agent, pydantic-ai and smolagents (a group's episodes share
  their framework, so their first prompts differ only in the sampled replies)."""
  framework = ("agents", "langgraph", "pydantic_ai", "smolagents")[_nth(example["question"]) % 4]
  open(os.path.join(MARKS, framework), "a").close()
  question = example["question"]
  if framework == "agents":
    llm = agents.OpenAIChatCompletionsModel(model, client)
    agent = agents.Agent(name="solver", instructions="Be brief.", tools=[agents.function_tool(add)], model=llm)
    out = await agents.Runner.run(agent, question, max_turns=2, run_config=agents.RunConfig(tracing_disabled=True))
    text = str(out.final_output)
  elif framework == "langgraph":
    llm = langchain_openai.ChatOpenAI(model=model, base_url=str(client.base_url), api_key=client.api_key, max_retries=0)
    out = await prebuilt.create_react_agent(llm, tools=[tool(add)]).ainvoke({{"messages": [("user", question)]}})
    text = str(out["messages"][-1].content)
  elif framework == "pydantic_ai":
    llm = OpenAIChatModel(model, provider=OpenAIProvider(openai_client=client))
    text = str((await pydantic_ai.Agent(llm, tools=[add]).run(question)).output)
  else:
    llm = smolagents.OpenAIServerModel(model_id=model, api_base=str(client.base_url), api_key=client.api_key)
    text = str(smolagents.ToolCallingAgent(tools=[smolagents.tool(add)], model=llm, max_steps=1).run(question))
  return float(len(text) % 5)
'''


@pytest.mark.slow  # a training run whose workers import four agent frameworks (about two minutes)
def test_each_frameworks_documented_agent_trains_through_the_served_policy(tmp_path):
  """The frameworks' own agents, unchanged but for the episode's client, in one tiny agentic GRPO run
  of four groups, one per framework: every episode trains (none fails)."""
  (tmp_path / "marks").mkdir()
  agent = tmp_path / "agent.py"
  agent.write_text(FRAMEWORKS.format(marks=str(tmp_path / "marks")))
  args = [a for a in TINY if not a.startswith(("num_batches=", "batch_size=", "max_response_length="))]
  args += ["num_batches=1", "batch_size=4", "max_prompt_length=1536", "max_response_length=64"]
  args += [f"rl.agent={agent}:run", f"base_output_directory={tmp_path}", "run_name=frameworks"]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  episodes = _rows(tmp_path / "frameworks" / "episodes.jsonl")
  assert len(episodes) == 8 and [e["failure"] for e in episodes if e["status"] != "trained"] == []
  assert {"agents", "langgraph", "pydantic_ai", "smolagents"} <= {p.name for p in (tmp_path / "marks").iterdir()}
  assert all(e["trained_tokens"] > 0 for e in episodes)
