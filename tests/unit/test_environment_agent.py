"""A TRL environment (GRPOTrainer's environment_factory, as TRL documents it) as rl.agent: its tool loop
against a session of a scripted policy (reset's observation in the prompt, a method called with the
model's arguments on the episode's own instance, its result as the tool turn, get_reward the reward,
the calls stitched), what rl.agent refuses at start, and a tiny agentic GRPO run that trains on it."""

import asyncio
import json

import openai
import pytest

from maxtext.configs import pyconfig
from maxtext.integration.tunix import user_agent
from maxtext.integration.tunix.tool_format import QwenToolFormat
from maxtext.rl.session_stitching import stitch
from maxtext.trainers.post_train.rl import train_rl
from maxtext.utils import environment_agent, errors
from tests.unit.test_openai_server import scripted_server

ENVIRONMENT = '''
class Adder:
  """TRL's environment_factory form: reset, public methods as tools, get_reward."""

  def reset(self, **row):
    self.question, self.total, self.calls = row["question"], 0, 0
    return " Use the add tool."

  def add(self, a: int, b: int) -> int:
    """Adds two integers and remembers the sum.

    Args:
      a: the first integer.
      b: the second integer.
    """
    self.calls += 1
    self.total = a + b
    return self.total

  def _helper(self):
    return "not a tool"

  def get_reward(self) -> float:
    return float(self.total == 5) + 0.25 * self.calls
'''


def _factory(tmp_path, source=ENVIRONMENT, name="Adder"):
  path = tmp_path / "env.py"
  path.write_text(source)
  namespace: dict = {}
  exec(compile(source, str(path), "exec"), namespace)
  return path, namespace[name]


def test_the_tool_loop_runs_as_trls_reset_tools_and_get_reward(tmp_path, qwen3_tokenizer):
  _, factory = _factory(tmp_path)
  call = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
  server = scripted_server(qwen3_tokenizer, [call, "The sum is 5."], tool_format=QwenToolFormat())
  url = server.start("127.0.0.1", 0).removesuffix("/v1")
  try:
    session = server.open_session()
    example = {
      "question": "What is 2 + 3?",
      "answer": "5",
      "prompt": "What is 2 + 3?",
      "messages": [{"role": "user", "content": "What is 2 + 3?"}],
    }

    async def episode():
      async with openai.AsyncOpenAI(base_url=f"{url}/sessions/{session}/v1", api_key="x", max_retries=0) as client:
        return await environment_agent.episode(factory)(client, "m", example)

    assert asyncio.run(episode()) == 1.25  # the sum was 5, after one call
    first, second = server.session(session).calls
    text = qwen3_tokenizer.decode(first.prompt_ids.tolist())
    assert "What is 2 + 3? Use the add tool.<|im_end|>" in text  # reset's observation, appended
    tools = [json.loads(line) for line in text.split("<tools>\n")[1].split("\n</tools>")[0].splitlines()]
    assert [t["function"]["name"] for t in tools] == ["add"]  # neither reset, get_reward nor _helper
    assert "<tool_response>\n5\n</tool_response>" in qwen3_tokenizer.decode(second.prompt_ids.tolist())
    assert stitch([first, second], budget=1024).counts.mismatched == 0
  finally:
    server.stop()


@pytest.mark.parametrize(
  "source, expected",
  [
    (
      "class Adder:\n  def add(self, a: int) -> int:\n    return a\n",
      "Adder has no reset(); expected a TRL environment_factory",
    ),
    (
      "class Adder:\n  def reset(self, **row):\n    pass\n\n  def add(self, a) -> int:\n    return a\n",
      "tool method Adder.add: ",
    ),
  ],
)
def test_an_environment_that_is_not_trls_form_is_refused_at_start_naming_it(tmp_path, source, expected):
  path, _ = _factory(tmp_path, source)
  cfg = pyconfig.initialize(["t", "rl.yml", "rl.use_agentic_rollout=true", f"rl.agent={path}:Adder"])
  with pytest.raises(errors.InputError) as raised:
    user_agent.load(cfg.agent)
  assert str(raised.value).startswith(f"rl.agent={path}:Adder: {expected}"), str(raised.value)


def test_agentic_grpo_trains_on_a_trl_environment(tmp_path):
  """A tiny run: every episode is the environment's (reset with its example, so get_reward's value is
  what the episode trains with) and none fails."""
  marks = tmp_path / "marks"
  marks.mkdir()
  path = tmp_path / "env.py"
  path.write_text(
    "import hashlib, os\n"
    "class Echo:\n"
    "  def reset(self, **row):\n"
    "    self.question = row['question']\n"
    f"    name = os.path.join({str(marks)!r}, hashlib.sha1(self.question.encode()).hexdigest())\n"
    "    open(name, 'w').write(self.question)\n"
    "  def get_reward(self) -> float:\n"
    "    return float(len(self.question))\n"
  )
  args = [
    "model_name=qwen3-tiny",
    "rl.use_agentic_rollout=true",
    "num_batches=1",
    "batch_size=2",
    "rl.num_generations=2",
    "max_response_length=16",
    "num_test_batches=0",
    "dataset_name=random_digit",  # 32 rows: GSM8K's take seconds to load and render
    f"rl.agent={path}:Echo",
    f"base_output_directory={tmp_path}",
    "run_name=env",
  ]
  assert train_rl.main(["train_rl", "rl.yml", *args]) == 0
  episodes = [json.loads(line) for line in (tmp_path / "env" / "episodes.jsonl").read_text().splitlines()]
  assert len(episodes) == 4 and all(e["status"] == "trained" for e in episodes)
  questions = [p.read_text() for p in marks.iterdir()]
  assert len(questions) == 2  # one per prompt of the batch, each group's two episodes reset with it
  for e in episodes:
    user = next(m["content"] for m in e["messages"] if m["role"] == "user")
    (question,) = [q for q in questions if q in user]
    assert e["reward"] == float(len(question))


def test_trls_dict_of_environments_picks_each_examples_by_its_environment_field(tmp_path, qwen3_tokenizer):
  source = ENVIRONMENT + (
    "\n\nclass Strict(Adder):\n"
    "  def reset(self, **row):\n"
    "    assert 'environment' not in row and 'messages' not in row, sorted(row)\n"
    "    self.total, self.calls = 5, 0\n"
    "\n\nENVS = {'adder': Adder, 'strict': Strict}\n"
  )
  path, factories = _factory(tmp_path, source, "ENVS")
  cfg = pyconfig.initialize(["t", "rl.yml", "rl.use_agentic_rollout=true", f"rl.agent={path}:ENVS"])
  assert user_agent.load(cfg.agent).name == "ENVS"  # TRL's multi-environment form is taken
  server = scripted_server(qwen3_tokenizer, "Five.", tool_format=QwenToolFormat())
  url = server.start("127.0.0.1", 0).removesuffix("/v1")
  try:
    example = {"question": "q", "prompt": "q", "messages": [{"role": "user", "content": "q"}]}

    async def episode(environment):
      async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
        return await environment_agent.episode(factories)(client, "m", {**example, "environment": environment})

    assert asyncio.run(episode("strict")) == 1.0  # Strict's reset ran (its total is 5), without the field
    assert asyncio.run(episode("adder")) == 0.0
    with pytest.raises(KeyError, match=r"environment 'chess' is none of \['adder', 'strict'\]"):
      asyncio.run(episode("chess"))
  finally:
    server.stop()
