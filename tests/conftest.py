"""Shared fixtures: configs built the way users build them, and the shipped tokenizers."""

import functools
import os

# Compiled programs are shared across the suite's runs, as jax_cache_dir shares them across train_rl runs
# (JAX reads this before its first compilation).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.expanduser("~/jax_cache"))

import pytest

from maxtext import assets
from maxtext.configs import pyconfig
from maxtext.input_pipeline.tokenizer import load_tokenizer


def make_config(*overrides, yaml="rl.yml"):
  return pyconfig.initialize(["train_rl", yaml, *overrides])


@functools.lru_cache(maxsize=None)
def _tokenizer(which):
  return load_tokenizer(assets.smollm2_gguf() if which == "smollm2" else assets.qwen3_tokenizer_dir())


@pytest.fixture(scope="session")
def smollm2_tokenizer():
  return _tokenizer("smollm2")


@pytest.fixture(scope="session")
def qwen3_tokenizer():
  return _tokenizer("qwen3")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """Each test module's compiled programs and cached arrays go when it ends, so a long suite's
  memory does not pile up."""
  yield
  import gc  # pylint: disable=import-outside-toplevel

  import jax  # pylint: disable=import-outside-toplevel

  jax.clear_caches()
  gc.collect()
