"""rl.agent: a user's async agent written against the `openai` client, trained by agentic GRPO through
the policy served over HTTP (integration/tunix/user_agent.py), on qwen3-tiny; its refusals at start."""

import json
import logging
import subprocess
import sys

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


def _rows(path):
  with open(path, encoding="utf-8") as f:
    return [json.loads(line) for line in f]


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
    assert r["agent/calls_per_episode"] <= 2 and r["agent/cut_tokens"] == 0
    # the rewards trained on are the agent's: 2 + len(answer) at least, where it did not fail
    assert r["agent/reward"] == r["rewards/sum"]
  assert max(r["agent/reward"] for r in rows) >= 2


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
    (["rl.agent=agent.txt"], "expected PATH.py:NAME"),
    (["rl.agent=missing.py:run"], "missing.py: file not found"),
    (["rl.agent={path}:run", "rollout_engine=vanilla"], "expected rollout_engine=batched"),
    (["rl.agent={path}:run", "rl.tools=[calculator]"], "expected rl.tools=[] and rl.tools_path empty"),
  ],
)
def test_agent_settings_that_cannot_work_are_refused_at_start(tmp_path, extra, expected):
  path = tmp_path / "agent.py"
  path.write_text("async def run(client, model, example):\n  return 1.0\n")
  with pytest.raises(pyconfig.ConfigError, match=expected.replace("[", r"\[").replace("]", r"\]")):
    make_config("rl.use_agentic_rollout=true", *[e.format(path=path) for e in extra])
