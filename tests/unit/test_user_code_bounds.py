"""User code cannot hang, end or hold the trainer: reward functions (reward_functions_path) and tools
(rl.tools_path) run in killable worker processes (utils/worker_pool.py) under time limits, an exit or
a timeout is one error naming the function, threads they start die with their worker, and a tool's
output is cut before it is tokenized or logged. Real user files, real worker processes."""

import asyncio
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
from tunix.generate import tokenizer_adapter
from tunix.rl.agentic.environments import tool_environment
from tunix.rl.rollout import base_rollout

from maxtext import tasks
from maxtext.input_pipeline import datasets, rewards
from maxtext.input_pipeline.chat_parser import ConfigChatParser
from maxtext.integration.tunix import tools, trajectories
from maxtext.rl.episode import Episode
from maxtext.utils import errors
from tests.conftest import make_config, template_for

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _within(seconds: float, fn):
  """fn()'s result, or the exception it raised; the test fails if it has neither within `seconds` (the
  call is left in a daemon thread, so a hang fails the test instead of hanging it)."""
  out: dict = {}

  def run():
    try:
      out["result"] = fn()
    except BaseException as e:  # noqa: BLE001 (SystemExit too: it must not reach the test)
      out["raised"] = e

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(seconds)
  assert out, f"no result within {seconds} s"
  return out.get("raised", out.get("result"))


def _reward(tmp_path, body: str, *overrides: str):
  """The reward function `mine` of a user file whose body is `body`, as train_rl binds it."""
  path = tmp_path / "my_rewards.py"
  path.write_text(
    "import os, sys, threading, time\n"
    f"def mine(prompts, completions, tmvp_config, **kwargs):\n{textwrap.indent(textwrap.dedent(body), '  ')}"
  )
  cfg = make_config(f"reward_functions_path={path}", "reward_functions=[mine]", *overrides)
  [fn] = rewards.reward_functions(tasks.select(cfg.data.dataset_name), cfg.task, cfg.maxtext_view()).functions
  return fn, path


def test_a_reward_that_calls_sys_exit_is_one_error_naming_it_and_the_trainer_goes_on(tmp_path):
  fn, path = _reward(tmp_path, "sys.exit(0)\n")
  raised = _within(60, lambda: fn(["p", "p"], ["a", "b"]))
  assert isinstance(raised, rewards.RewardFunctionError), raised
  assert (
    str(raised) == f"reward_functions_path={path}: reward function mine: called sys.exit(0) on a batch of 2 completions"
  )


def test_a_reward_that_never_returns_is_stopped_at_reward_timeout_s_naming_it(tmp_path):
  fn, path = _reward(tmp_path, "while True:\n  time.sleep(1)\n", "reward_timeout_s=1")
  start = time.monotonic()
  raised = _within(30, lambda: fn(["p"], ["a"]))
  assert isinstance(raised, rewards.RewardFunctionError) and time.monotonic() - start < 15, raised
  assert str(raised) == (
    f"reward_functions_path={path}: reward function mine: no result within reward_timeout_s=1 s on a batch of 1 "
    "completions"
  )


def test_a_reward_that_returns_a_dict_is_refused_naming_it(tmp_path):
  fn, path = _reward(tmp_path, "return {i: 1.0 for i in range(len(completions))}\n")
  with pytest.raises(rewards.RewardFunctionError) as raised:
    fn(["p", "p"], ["a", "b"])
  assert str(raised.value) == (
    f"reward_functions_path={path}: reward function mine returned a dict; expected a list of one number per completion"
  )


def test_a_reward_runs_in_a_worker_process_with_the_config_view_and_the_examples_fields(tmp_path):
  """tmvp_config (the MaxText view of the config) and every field of the examples (strings, numpy
  arrays) cross into the worker; the reward runs outside the trainer's process."""
  fn, _ = _reward(
    tmp_path,
    "return [os.getpid() + tmvp_config.rl.num_generations + tmvp_config.num_generations * 0 + float(a) + len(q)\n"
    "        for q, a in zip(kwargs['question'], kwargs['answer_values'])]\n",
    "rl.num_generations=3",
  )
  [a, b] = fn(["p", "p"], ["x", "y"], question=["q", "qq"], answer_values=np.array([0.5, 1.5]), mode="train")
  pid = a - 3 - 0.5 - 1
  assert pid != os.getpid() and b == pid + 3 + 1.5 + 2
  view = make_config().maxtext_view()
  assert pickle.loads(pickle.dumps(view)).rl.num_generations == view.rl.num_generations


_THREADS = """
import sys
from maxtext import tasks
from maxtext.input_pipeline import datasets, rewards
from tests.conftest import make_config, template_for

cfg = make_config("reward_functions_path=" + sys.argv[1], "reward_functions=[mine]")
[fn] = rewards.reward_functions(tasks.select(cfg.data.dataset_name), cfg.task, cfg.maxtext_view()).functions
print(fn(["p", "p"], ["a", "b"]), flush=True)
"""


def test_a_reward_that_leaves_a_thread_running_does_not_keep_the_trainer_from_exiting(tmp_path):
  """A program that scores once with a reward that starts a (non-daemon) thread that never ends
  exits as soon as it returns."""
  _, path = _reward(
    tmp_path, "threading.Thread(target=time.sleep, args=(3600,)).start()\nreturn [1.0 for c in completions]\n"
  )
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "src"), ROOT]), JAX_PLATFORMS="cpu")
  start = time.monotonic()
  with subprocess.Popen(
    [sys.executable, "-c", _THREADS, str(path)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
  ) as program:
    try:
      out, _ = program.communicate(timeout=90)
    except subprocess.TimeoutExpired:
      program.kill()
      program.communicate()
      pytest.fail("the program did not exit")
  assert program.returncode == 0 and out.strip() == "[1.0, 1.0]" and time.monotonic() - start < 90


HUGE_TOOL = """
from tunix.rl.agentic.tools import base_tool
class Huge(base_tool.BaseTool):
  '''Returns 50 MB of text.'''
  def get_json_schema(self):
    return {'type': 'function', 'function': {'name': self.name, 'parameters': {}}}
  def apply(self, **kwargs):
    return base_tool.ToolOutput(name=self.name, output='x' * 50_000_000, error='e' * 50_000_000)
TOOLS = {'huge': Huge}
"""


def test_a_tool_returning_50_mb_is_cut_before_it_is_tokenized_and_logged(tmp_path, smollm2_tokenizer):
  """One episode whose tool call returns 50 MB of output (and of error text): the tool turn holds
  about rl.tool_output_max_chars (its default) of it, so the trained tokens and the trajectory record (what the
  trajectory log writes) stay small."""
  path = tmp_path / "huge_tools.py"
  path.write_text(HUGE_TOOL)
  cfg = make_config("rl.use_agentic_rollout=true", "rl.tools=[huge]", f"rl.tools_path={path}")
  cap = cfg.tools.tool_output_max_chars
  tool_map = tools.tool_map(cfg.tools)
  parser = ConfigChatParser(smollm2_tokenizer, "SYS")
  replies = ['<tool_call>{"name": "huge", "arguments": {}}</tool_call>', "<answer>done</answer>"]
  sampled: list[str] = []

  def model_call(messages, env=None, max_generation_steps=None, prompt_ids=None):
    sampled.append(replies[len(sampled)])
    tokens = np.asarray(
      smollm2_tokenizer.encode(sampled[-1], add_special_tokens=False) + [smollm2_tokenizer.eos_token_id]
    )
    return base_rollout.RolloutOutput(
      text=[sampled[-1]], logits=None, tokens=[tokens], left_padded_prompt_tokens=None, logprobs=None
    )

  agent = trajectories.ConversationAgent(system_prompt="SYS", tool_map=tool_map)
  env = tool_environment.ToolEnvironment({"prompts": "Go", "answer": "done"}, tool_map=tool_map, max_steps=3)
  engine = trajectories.TrajectoryEngine(
    agent,
    env,
    model_call=model_call,
    max_response_length=100_000_000,
    tokenizer=tokenizer_adapter.TokenizerAdapter(smollm2_tokenizer),
    chat_parser=parser,
  )
  record = _within(60, lambda: asyncio.run(engine.collect(mode="Token")))
  assert isinstance(record, Episode), record
  [tool_turn] = [m["content"] for m in record.conversation if m["role"] == "tool"]
  assert "[output truncated: 50000000 characters]" in tool_turn and len(tool_turn) < cap + 100
  assert len(record.completion_ids) < 3000
  assert len(pickle.dumps(record)) < 100_000


NAME = make_config().data.dataset_name


def _processed(tmp_path, tokenizer, body: str, *overrides: str):
  """datasets.to_examples of two rows through a dataset_processor_path whose process_data is `body`:
  (its result or what it raised, the file)."""
  path = tmp_path / "proc.py"
  path.write_text(
    "import sys, time\n"
    "def process_data(dataset_name, model_tokenizer, template_config, tmvp_config, x):\n"
    f"{textwrap.indent(textwrap.dedent(body), '  ')}"
  )
  cfg = make_config(f"dataset_processor_path={path}", *overrides)
  rows = [{"question": "1+1?", "answer": "2"}, {"question": "stop", "answer": "0"}]
  template = template_for(cfg, tokenizer)
  return _within(60, lambda: datasets.to_examples(cfg.data, template, NAME, rows, cfg.maxtext_view())), path


def test_a_dataset_processor_that_calls_sys_exit_is_one_error_naming_the_row(tmp_path, smollm2_tokenizer):
  raised, path = _processed(
    tmp_path, smollm2_tokenizer, "if x['question'] == 'stop':\n  sys.exit(0)\nreturn dict(x, prompts=x['question'])\n"
  )
  assert isinstance(raised, errors.InputError), raised
  assert str(raised) == f"dataset_processor_path={path}: process_data: called sys.exit(0) on dataset_name={NAME} row 1"


def test_a_dataset_processor_that_hangs_is_stopped_at_its_time_limit_naming_the_row(tmp_path, smollm2_tokenizer):
  start = time.monotonic()
  raised, path = _processed(
    tmp_path,
    smollm2_tokenizer,
    "while x['question'] == 'stop':\n  time.sleep(1)\nreturn dict(x, prompts=x['question'])\n",
    "dataset_processor_timeout_s=1",
  )
  assert isinstance(raised, errors.InputError) and time.monotonic() - start < 30, raised
  assert str(raised) == (
    f"dataset_processor_path={path}: process_data: no result within dataset_processor_timeout_s=1 s on "
    f"dataset_name={NAME} row 1"
  )


@pytest.mark.slow
def test_a_tiny_run_whose_reward_hangs_exits_2_with_one_line_naming_it(tmp_path):
  """train_rl on qwen3-tiny with a reward function that never returns: the run stops at the first
  batch's reward_timeout_s with exit code 2 and one line naming the function, within minutes."""
  path = tmp_path / "hang.py"
  path.write_text(
    "import time\ndef hang(prompts, completions, tmvp_config, **kwargs):\n  while True:\n    time.sleep(1)\n"
  )
  command = [
    sys.executable,
    "-m",
    "maxtext.trainers.post_train.rl.train_rl",
    "rl.yml",
    "model_name=qwen3-tiny",
    f"base_output_directory={tmp_path}",
    "num_batches=3",
    "batch_size=2",
    "rl.num_generations=2",
    "max_response_length=8",
    "num_test_batches=0",
    f"reward_functions_path={path}",
    "reward_functions=[hang]",
    "reward_timeout_s=3",
  ]
  env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "src"), JAX_PLATFORMS="cpu")
  with subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.PIPE, text=True) as run:
    try:
      _, err = run.communicate(timeout=540)
    except subprocess.TimeoutExpired:
      run.kill()
      run.communicate()
      pytest.fail("the run did not end")
  assert run.returncode == 2, err[-3000:]
  assert err.strip().splitlines()[-1] == (
    f"error: reward_functions_path={path}: reward function hang: no result within reward_timeout_s=3 s on a batch "
    "of 4 completions"
  )


def _pid_handler():
  """A worker's handler (WorkerPool's `load`): its process id."""
  return os.getpid


def test_a_closed_pool_has_killed_its_workers():
  import functools

  from maxtext.utils import worker_pool

  pool = worker_pool.WorkerPool(functools.partial(_pid_handler), 60, "a limit")
  pid = pool.call()
  (worker,) = pool._running
  pool.close()
  assert worker.process.poll() is not None and not pool._running  # killed and reaped
  assert pool.call() != pid  # a later call starts a new worker
  pool.close()
